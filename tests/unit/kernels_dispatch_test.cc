// Every SIMD level this CPU has, against the scalar reference and a byte-compare definition.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "refit/kernels/buffer.h"
#include "refit/kernels/diff.h"
#include "refit/kernels/dispatch.h"

namespace refit::kernels {
namespace {

constexpr SimdLevel kAllLevels[] = {SimdLevel::kScalar, SimdLevel::kSse2, SimdLevel::kAvx2,
                                    SimdLevel::kAvx512};

std::vector<SimdLevel> SupportedLevels() {
  std::vector<SimdLevel> out;
  for (SimdLevel level : kAllLevels) {
    if (SimdLevelSupported(level)) out.push_back(level);
  }
  return out;
}

std::vector<uint64_t> BytewisePositions(const uint8_t* a, const uint8_t* b, uint64_t n,
                                        uint32_t elem_size) {
  std::vector<uint64_t> out;
  for (uint64_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i * elem_size, b + i * elem_size, elem_size) != 0) out.push_back(i);
  }
  return out;
}

// Random old bits (n elements of es bytes after `misalign` bytes) and new bits with about
// `density` of the elements changed, each by one bit anywhere in it: catches a compare of the
// wrong lane width.
void MakeDiffPair(std::mt19937_64& rng, uint64_t n, uint32_t es, double density, uint64_t misalign,
                  std::vector<uint8_t>* a, std::vector<uint8_t>* b) {
  a->resize(n * es + misalign);
  for (auto& x : *a) x = static_cast<uint8_t>(rng());
  *b = *a;
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  for (uint64_t i = 0; i < n; ++i) {
    if (density >= 1.0 || coin(rng) < density) {
      const uint64_t bit = rng() % (es * 8);
      (*b)[misalign + i * es + bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    }
  }
}

TEST(KernelDispatch, LevelsAreConsistent) {
  EXPECT_TRUE(SimdLevelSupported(SimdLevel::kScalar));
  EXPECT_TRUE(SimdLevelSupported(BestSimdLevel()));
  EXPECT_TRUE(SimdLevelSupported(ActiveSimdLevel()));
  for (SimdLevel level : kAllLevels) {
    EXPECT_STRNE(SimdLevelName(level), "unknown");
    if (SimdLevelSupported(level)) {
      EXPECT_GE(static_cast<int>(BestSimdLevel()), static_cast<int>(level));
    }
  }
#if defined(__x86_64__)
  EXPECT_TRUE(SimdLevelSupported(SimdLevel::kSse2));
  EXPECT_EQ(SimdLevelSupported(SimdLevel::kAvx2), __builtin_cpu_supports("avx2") != 0);
#endif
}

// Every level, every element size, lengths around the 64-element block, unaligned starts, a
// range of densities including the all-changed and the nothing-changed runs.
TEST(KernelDispatch, EveryLevelMatchesTheReference) {
  std::mt19937_64 rng(7);
  for (SimdLevel level : SupportedLevels()) {
    for (uint32_t es : {1u, 2u, 4u, 8u}) {
      for (uint64_t n : {0ull, 1ull, 63ull, 64ull, 65ull, 127ull, 1000ull, 4099ull}) {
        for (double density : {0.0, 0.01, 0.3, 1.0}) {
          for (uint64_t misalign : {0ull, 3ull}) {
            std::vector<uint8_t> a, b;
            MakeDiffPair(rng, n, es, density, misalign, &a, &b);
            const uint8_t* pa = a.data() + misalign;
            const uint8_t* pb = b.data() + misalign;
            const std::string what = std::string(SimdLevelName(level)) + " elem " +
                                     std::to_string(es) + " n " + std::to_string(n) + " density " +
                                     std::to_string(density);
            const std::vector<uint64_t> want = BytewisePositions(pa, pb, n, es);
            std::vector<uint64_t> got = {42};  // appends after what is there
            EXPECT_EQ(DiffPositionsAt(level, pa, pb, n, es, &got), want.size()) << what;
            ASSERT_EQ(got.size(), want.size() + 1) << what;
            EXPECT_EQ(got[0], 42u) << what;
            EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + 1)) << what;
            EXPECT_EQ(CountDiffAt(level, pa, pb, n, es), want.size()) << what;
          }
        }
      }
    }
  }
}

// Every single lane of a block, per level: a wrong shuffle or pack order shows up as a wrong
// position here.
TEST(KernelDispatch, EachLaneOfABlockMapsToItsPosition) {
  for (SimdLevel level : SupportedLevels()) {
    for (uint32_t es : {1u, 2u, 4u, 8u}) {
      const uint64_t n = 128;
      std::vector<uint8_t> a(n * es, 0x5a);
      for (uint64_t i = 0; i < n; ++i) {
        for (uint32_t byte = 0; byte < es; ++byte) {
          std::vector<uint8_t> b = a;
          b[i * es + byte] ^= 0x80;
          std::vector<uint64_t> got;
          ASSERT_EQ(DiffPositionsAt(level, a.data(), b.data(), n, es, &got), 1u)
              << SimdLevelName(level) << " elem " << es << " lane " << i << " byte " << byte;
          EXPECT_EQ(got[0], i) << SimdLevelName(level) << " elem " << es << " byte " << byte;
          EXPECT_EQ(CountDiffAt(level, a.data(), b.data(), n, es), 1u);
        }
      }
    }
  }
}

// xxh3 values from the reference library (libxxhash's XXH3_64bits) for bytes i * 31 + 7: the
// short (<= 240 bytes) and the long paths, the latter run by each level's vector loop.
TEST(KernelDispatch, DigestMatchesTheReferenceAtEveryLevel) {
  std::vector<uint8_t> data(100000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 31 + 7);
  const std::pair<uint64_t, uint64_t> known[] = {{3, 0x15f7093b173d005cull},
                                                 {200, 0x12fdb864685f344dull},
                                                 {1000, 0x989765d0ea7a5ecdull},
                                                 {100000, 0xccf90df7e7e37036ull}};
  for (SimdLevel level : kAllLevels) {  // an unsupported level runs the best supported one
    for (const auto& [len, want] : known) {
      EXPECT_EQ(Digest64At(level, data.data(), len), want) << SimdLevelName(level) << " " << len;
    }
  }
  EXPECT_EQ(Digest64(data.data(), 1000), 0x989765d0ea7a5ecdull);
}

TEST(KernelDispatch, DigestStreamIsTheSameAtEveryLevel) {
  std::mt19937_64 rng(11);
  std::vector<uint8_t> data(70001);
  for (auto& byte : data) byte = static_cast<uint8_t>(rng());
  for (SimdLevel level : SupportedLevels()) {
    for (uint64_t len : {0ull, 1ull, 240ull, 241ull, 1024ull, 16389ull, 70001ull}) {
      const uint64_t want = Digest64At(SimdLevel::kScalar, data.data(), len);
      EXPECT_EQ(Digest64At(level, data.data(), len), want) << SimdLevelName(level) << " " << len;
      for (uint64_t piece : {1ull, 100ull, 256ull, 16384ull}) {
        DigestStream stream(level);
        for (uint64_t off = 0; off < len; off += piece) {
          stream.Update(data.data() + off, std::min<uint64_t>(piece, len - off));
        }
        EXPECT_EQ(stream.Final(), want) << SimdLevelName(level) << " " << len << " by " << piece;
      }
    }
  }
}

// The fused walk against the separate kernels: lengths around its 16 KiB blocks (and the
// 64-element mask blocks inside them), every level, element size and density.
TEST(KernelDispatch, DiffAndDigestInOnePassMatchesTheSeparateKernels) {
  std::mt19937_64 rng(13);
  for (SimdLevel level : SupportedLevels()) {
    for (uint32_t es : {1u, 2u, 4u, 8u}) {
      const uint64_t walk = 16384 / es;
      for (uint64_t n :
           {uint64_t{0}, uint64_t{1}, uint64_t{63}, walk - 1, walk, walk + 1, 3 * walk + 65}) {
        for (double density : {0.0, 0.01, 0.5, 1.0}) {
          for (uint64_t misalign : {0ull, 3ull}) {
            std::vector<uint8_t> a, b;
            MakeDiffPair(rng, n, es, density, misalign, &a, &b);
            const uint8_t* pa = a.data() + misalign;
            const uint8_t* pb = b.data() + misalign;
            const std::string what = std::string(SimdLevelName(level)) + " elem " +
                                     std::to_string(es) + " n " + std::to_string(n) + " density " +
                                     std::to_string(density);
            const std::vector<uint64_t> want = BytewisePositions(pa, pb, n, es);
            PositionList got = {42};  // appends after what is there
            const DiffDigest r = DiffPositionsAndDigestAt(level, pa, pb, n, es, &got);
            EXPECT_EQ(r.changed, want.size()) << what;
            ASSERT_EQ(got.size(), want.size() + 1) << what;
            EXPECT_EQ(got[0], 42u) << what;
            EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + 1)) << what;
            EXPECT_EQ(r.digest, Digest64At(SimdLevel::kScalar, pb, n * es)) << what;
            // With the changed elements' bits copied out too (appended after one element that
            // is there): the same positions and digest, and exactly the bits at the positions.
            ValueList old_values(es, 0xEE);
            ValueList new_values(es, 0xEE);
            PositionList again;
            const DiffDigest with_values = DiffPositionsAndDigestAt(
                level, pa, pb, n, es, &again, ChangedValues{&old_values, &new_values});
            EXPECT_EQ(with_values.digest, r.digest) << what;
            ASSERT_EQ(again.size(), want.size()) << what;
            ASSERT_EQ(old_values.size(), (want.size() + 1) * es) << what;
            ASSERT_EQ(new_values.size(), (want.size() + 1) * es) << what;
            EXPECT_EQ(old_values[0], 0xEE) << what;
            for (size_t j = 0; j < want.size(); ++j) {
              ASSERT_EQ(std::memcmp(old_values.data() + (j + 1) * es, pa + want[j] * es, es), 0)
                  << what << " old value " << j;
              ASSERT_EQ(std::memcmp(new_values.data() + (j + 1) * es, pb + want[j] * es, es), 0)
                  << what << " new value " << j;
            }
          }
        }
      }
    }
  }
  // The default entry point: the active level, the same answer.
  std::vector<uint8_t> a(40000, 1);
  std::vector<uint8_t> b = a;
  b[7] = 2;
  b[39999] = 3;
  PositionList got;
  const DiffDigest r = DiffPositionsAndDigest(a.data(), b.data(), 20000, 2, &got);
  EXPECT_EQ(r.changed, 2u);
  EXPECT_EQ(got, (PositionList{3, 19999}));
  EXPECT_EQ(r.digest, Digest64(b.data(), b.size()));
}

// Scratch vectors: resize does not zero, but growth keeps what was written.
TEST(KernelDispatch, UninitVectorKeepsContentsAcrossGrowth) {
  UninitVector<uint64_t> v;
  for (uint64_t i = 0; i < 1000; ++i) {
    v.resize(i + 1);
    v[i] = i * 7;
  }
  v.resize(100000);
  for (uint64_t i = 0; i < 1000; ++i) ASSERT_EQ(v[i], i * 7);
  UninitVector<uint8_t> bytes(3, 9);  // an explicit value is still honoured
  EXPECT_EQ(bytes, (UninitVector<uint8_t>{9, 9, 9}));
}

// Whether this kernel offers transparent huge pages to regions advised for them.
bool HugePagesOnAdvice() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(f, modes);
  return modes.find("[always]") != std::string::npos ||
         modes.find("[madvise]") != std::string::npos;
}

// The smaps entry of the mapping holding `p`: whether the kernel would back it by huge pages.
bool MappingIsHugePageEligible(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {  // a mapping's first line
      inside = at >= lo && at < hi;
    } else if (inside && line.rfind("THPeligible:", 0) == 0) {
      return line.find('1') != std::string::npos;
    }
  }
  return false;
}

// Large scratch is mapped on its own, 2 MiB aligned and advised for huge pages; small scratch
// comes from the heap as before; growth across the threshold keeps what was written.
TEST(KernelDispatch, LargeUninitVectorsAreHugePageAlignedAndKeepContents) {
  UninitVector<uint8_t> small(kHugeBufferBytes - 1);
  UninitVector<uint64_t> v(1000);
  for (uint64_t i = 0; i < v.size(); ++i) v[i] = i * 11;
  v.resize(kHugeBufferBytes / sizeof(uint64_t) + 3);  // crosses the threshold: mapped
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % kHugeBufferBytes, 0u);
  for (uint64_t i = 0; i < 1000; ++i) ASSERT_EQ(v[i], i * 11);
  v.back() = 5;  // the last element of a size not a multiple of 2 MiB is inside the mapping
  v.resize(10);
  v.shrink_to_fit();  // back under the threshold: from the heap again
  EXPECT_EQ(v[9], 99u);
  if (!HugePagesOnAdvice()) GTEST_SKIP() << "this kernel offers no transparent huge pages";
  UninitVector<uint8_t> big(3 * kHugeBufferBytes);
  EXPECT_TRUE(MappingIsHugePageEligible(big.data()));
  EXPECT_TRUE(MappingIsHugePageEligible(big.data() + big.size() - 1));
}

// A large ReusedVector's buffer is kept when freed and handed to the next one of about its size
// (up to a quarter more than asked), not to a much smaller one; one larger than the cache is
// unmapped.
TEST(KernelDispatch, ReusedVectorsKeepTheirBuffersForTheNextOfAboutTheirSize) {
  const size_t size = 37 * kHugeBufferBytes + 5;  // an unusual size: no other test keeps one
  const size_t kept_before = ReusedBufferCacheBytes();
  const uint8_t* storage = nullptr;
  {
    ReusedVector<uint8_t> v(size, 7);
    storage = v.data();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(storage) % kHugeBufferBytes, 0u);
  }
  EXPECT_EQ(ReusedBufferCacheBytes(), kept_before + 38 * kHugeBufferBytes);
  {
    ReusedVector<uint8_t> much_smaller(20 * kHugeBufferBytes);
    EXPECT_NE(much_smaller.data(), storage);
  }
  {
    ReusedVector<uint8_t> v(36 * kHugeBufferBytes);  // 38 MiB <= 36 MiB + a quarter
    EXPECT_EQ(v.data(), storage);
    v.assign(v.size(), 9);  // the whole kept mapping is usable
    EXPECT_EQ(v.back(), 9);
  }
  const size_t kept = ReusedBufferCacheBytes();
  { ReusedVector<uint8_t> huge(kReusedBufferCacheBytes + kHugeBufferBytes); }
  EXPECT_EQ(ReusedBufferCacheBytes(), kept) << "a buffer larger than the cache was kept";
}

long MinorFaultsSoFar() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// A growable buffer keeps what was written when it grows, page aligned, and its written pages are
// moved rather than copied: growing 16 MiB of content faults in (next to) none of it again, where
// a copy into fresh memory would fault in 4096 pages.
TEST(KernelDispatch, GrowableBufferKeepsItsContentWithoutCopyingIt) {
  constexpr size_t kWritten = size_t{16} << 20;
  auto* p = static_cast<uint64_t*>(MapGrowableBuffer(kWritten));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  for (size_t i = 0; i < kWritten / 8; ++i) p[i] = i * 0x9E3779B97F4A7C15ull;
  const long faults_before = MinorFaultsSoFar();
  p = static_cast<uint64_t*>(GrowMappedBuffer(p, kWritten, 4 * kWritten));
  const long faults_during_growth = MinorFaultsSoFar() - faults_before;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  EXPECT_LT(faults_during_growth, 64) << "the grown buffer's content was copied";
  for (size_t i = 0; i < kWritten / 8; ++i) ASSERT_EQ(p[i], i * 0x9E3779B97F4A7C15ull) << i;
  p[4 * kWritten / 8 - 1] = 7;  // the grown part is usable to its last byte
  EXPECT_EQ(p[4 * kWritten / 8 - 1], 7u);
  UnmapGrowableBuffer(p, 4 * kWritten);
}

// Capacity reserved for a std::vector is advised for huge pages where whole 2 MiB pages lie.
TEST(KernelDispatch, CapacityReservedWithHugePagesIsEligible) {
  std::vector<uint8_t> v(100, 7);
  ReserveWithHugePages(v, 8 * kHugeBufferBytes);
  ASSERT_GE(v.capacity(), 8 * kHugeBufferBytes);
  EXPECT_EQ(v, std::vector<uint8_t>(100, 7));
  const uint8_t* capacity = v.data();
  ReserveWithHugePages(v, 10);  // enough room already: nothing moves
  EXPECT_EQ(v.data(), capacity);
  if (!HugePagesOnAdvice()) GTEST_SKIP() << "this kernel offers no transparent huge pages";
  EXPECT_TRUE(MappingIsHugePageEligible(v.data() + 4 * kHugeBufferBytes));
}

// REFIT_KERNELS forces the level (ctest runs this binary's kernel tests once per level name).
TEST(KernelDispatch, EnvironmentForcesTheLevel) {
  const char* forced = std::getenv("REFIT_KERNELS");
  if (forced == nullptr) {
    EXPECT_EQ(ActiveSimdLevel(), BestSimdLevel());
    return;
  }
  for (SimdLevel level : kAllLevels) {
    if (std::string(forced) != SimdLevelName(level)) continue;
    // A level the CPU lacks falls back to the best one it has.
    EXPECT_EQ(ActiveSimdLevel(), SimdLevelSupported(level) ? level : BestSimdLevel()) << forced;
    return;
  }
  EXPECT_EQ(ActiveSimdLevel(), BestSimdLevel()) << "unknown name " << forced << " is ignored";
}

TEST(KernelDispatch, DefaultEntryPointsUseTheActiveLevel) {
  std::vector<uint8_t> a(4096, 1);
  std::vector<uint8_t> b = a;
  b[5] = 2;
  b[4000] = 3;
  std::vector<uint64_t> got;
  EXPECT_EQ(DiffPositions(a.data(), b.data(), 2048, 2, &got), 2u);
  EXPECT_EQ(got, (std::vector<uint64_t>{2, 2000}));
  EXPECT_EQ(CountDiff(a.data(), b.data(), 4096, 1), 2u);
}

}  // namespace
}  // namespace refit::kernels
