// Every SIMD level this CPU has, against the scalar reference and a byte-compare definition.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

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
            std::vector<uint8_t> a(n * es + misalign);
            for (auto& x : a) x = static_cast<uint8_t>(rng());
            std::vector<uint8_t> b = a;
            std::uniform_real_distribution<double> coin(0.0, 1.0);
            for (uint64_t i = 0; i < n; ++i) {
              if (density >= 1.0 || coin(rng) < density) {
                // One bit anywhere in the element: catches a compare of the wrong lane width.
                const uint64_t bit = rng() % (es * 8);
                b[misalign + i * es + bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
              }
            }
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
