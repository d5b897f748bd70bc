// The bitwise diff and digest kernels against plain scalar references.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "refit/kernels/diff.h"

namespace refit::kernels {
namespace {

// The obvious definition: elements compared as bytes.
std::vector<uint64_t> ReferencePositions(const std::vector<uint8_t>& a,
                                         const std::vector<uint8_t>& b, uint64_t n,
                                         uint32_t elem_size) {
  std::vector<uint64_t> out;
  for (uint64_t i = 0; i < n; ++i) {
    if (std::memcmp(a.data() + i * elem_size, b.data() + i * elem_size, elem_size) != 0) {
      out.push_back(i);
    }
  }
  return out;
}

struct Case {
  uint32_t elem_size;
  double density;
  uint64_t n;
};

std::string CaseName(const Case& c) {
  return "elem" + std::to_string(c.elem_size) + " density " + std::to_string(c.density) + " n " +
         std::to_string(c.n);
}

// Flips one random bit of roughly density * n random elements (exactly all when density is 1).
void Mutate(std::vector<uint8_t>* bits, uint64_t n, uint32_t elem_size, double density,
            std::mt19937_64* rng) {
  if (n == 0) return;
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  for (uint64_t i = 0; i < n; ++i) {
    if (density >= 1.0 || coin(*rng) < density) {
      const uint64_t bit = (*rng)() % (elem_size * 8);
      (*bits)[i * elem_size + bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    }
  }
}

TEST(DiffKernels, MatchScalarReferenceOnRandomData) {
  std::mt19937_64 rng(0x5eed);
  const uint64_t lengths[] = {0, 1, 63, 64, 65, 127, 128, 129, 1000, 1000003};
  const double densities[] = {0.0, 1e-4, 0.01, 0.5, 1.0};
  for (uint32_t elem_size : {1u, 2u, 4u, 8u}) {
    for (uint64_t n : lengths) {
      for (double density : densities) {
        const Case c{elem_size, density, n};
        std::vector<uint8_t> old_bits(n * elem_size + 1);  // +1: data() is never null
        for (auto& byte : old_bits) byte = static_cast<uint8_t>(rng());
        std::vector<uint8_t> new_bits = old_bits;
        Mutate(&new_bits, n, elem_size, density, &rng);
        const std::vector<uint64_t> want = ReferencePositions(old_bits, new_bits, n, elem_size);

        std::vector<uint64_t> got = {42};  // appends: existing entries stay
        const uint64_t appended =
            DiffPositions(old_bits.data(), new_bits.data(), n, elem_size, &got);
        ASSERT_EQ(appended, want.size()) << CaseName(c);
        ASSERT_EQ(got.size(), want.size() + 1) << CaseName(c);
        EXPECT_EQ(got[0], 42u) << CaseName(c);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + 1)) << CaseName(c);
        EXPECT_EQ(CountDiff(old_bits.data(), new_bits.data(), n, elem_size), want.size())
            << CaseName(c);
      }
    }
  }
}

TEST(DiffKernels, EveryPositionOfABlockAndUnalignedBuffers) {
  // A single change at each position of a few blocks, with buffers at odd addresses.
  for (uint32_t elem_size : {1u, 2u, 4u, 8u}) {
    const uint64_t n = 200;
    std::vector<uint8_t> storage_a(n * elem_size + 3, 0x5a), storage_b = storage_a;
    uint8_t* a = storage_a.data() + 3;
    uint8_t* b = storage_b.data() + 3;
    for (uint64_t i = 0; i < n; ++i) {
      for (uint32_t byte = 0; byte < elem_size; ++byte) {
        b[i * elem_size + byte] ^= 0x80;
        std::vector<uint64_t> got;
        ASSERT_EQ(DiffPositions(a, b, n, elem_size, &got), 1u);
        EXPECT_EQ(got[0], i) << "elem " << elem_size << " byte " << byte;
        EXPECT_EQ(CountDiff(a, b, n, elem_size), 1u);
        b[i * elem_size + byte] ^= 0x80;
      }
    }
  }
}

// Float values that compare equal (or unequal to themselves) are still different bit patterns.
TEST(DiffKernels, ComparesBitPatternsNotFloatValues) {
  const uint32_t kPosZero32 = 0x00000000, kNegZero32 = 0x80000000;
  const uint32_t kQuietNan32 = 0x7fc00000, kNanPayload32 = 0x7fc00001, kSignalingNan32 = 0x7f800001;
  const std::vector<uint32_t> old32 = {kPosZero32, kQuietNan32, kQuietNan32, kSignalingNan32,
                                       kQuietNan32};
  const std::vector<uint32_t> new32 = {kNegZero32, kNanPayload32, kQuietNan32, kQuietNan32,
                                       0xffc00000};
  std::vector<uint64_t> got;
  EXPECT_EQ(DiffPositions(old32.data(), new32.data(), old32.size(), 4, &got), 4u);
  EXPECT_EQ(got, (std::vector<uint64_t>{0, 1, 3, 4}));

  const std::vector<uint64_t> old64 = {0x0000000000000000ull, 0x7ff8000000000000ull,
                                       0x7ff8000000000000ull};
  const std::vector<uint64_t> new64 = {0x8000000000000000ull, 0x7ff8000000000001ull,
                                       0x7ff8000000000000ull};
  got.clear();
  EXPECT_EQ(DiffPositions(old64.data(), new64.data(), old64.size(), 8, &got), 2u);
  EXPECT_EQ(got, (std::vector<uint64_t>{0, 1}));

  // bf16: +0 / -0 and two NaN payloads.
  const std::vector<uint16_t> old16 = {0x0000, 0x7fc0, 0x3f80};
  const std::vector<uint16_t> new16 = {0x8000, 0x7fc1, 0x3f80};
  EXPECT_EQ(CountDiff(old16.data(), new16.data(), old16.size(), 2), 2u);

  // A 64-bit element differing only in its high half, and only in its low half.
  const std::vector<uint64_t> high = {0x0000000100000000ull, 0x0000000000000001ull};
  const std::vector<uint64_t> zero = {0, 0};
  EXPECT_EQ(CountDiff(high.data(), zero.data(), 2, 8), 2u);
}

TEST(Digest, StreamOverPiecesEqualsOneShot) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> data(100003);
  for (auto& byte : data) byte = static_cast<uint8_t>(rng());
  const uint64_t whole = Digest64(data.data(), data.size());
  for (uint64_t piece : {1ull, 7ull, 64ull, 239ull, 4096ull, 100003ull}) {
    DigestStream stream;
    for (uint64_t off = 0; off < data.size(); off += piece) {
      stream.Update(data.data() + off, std::min<uint64_t>(piece, data.size() - off));
    }
    EXPECT_EQ(stream.Final(), whole) << "piece " << piece;
  }
  DigestStream empty;
  EXPECT_EQ(empty.Final(), Digest64(nullptr, 0));
  empty.Update(nullptr, 0);
  EXPECT_EQ(empty.Final(), Digest64(nullptr, 0));
  // Sensitive to a single bit.
  data[5000] ^= 1;
  EXPECT_NE(Digest64(data.data(), data.size()), whole);
}

// The old bits with the changes patched in digest as the patched copy does, for every element
// size, around the patch blocks' edges (16 KiB), with changes in the first and last elements.
TEST(Digest, PatchedEqualsDigestOfThePatchedCopy) {
  std::mt19937_64 rng(0x9a7c);
  const uint64_t lengths[] = {1, 2, 100, 8191, 8192, 8193, 40000, 300001};
  for (uint32_t elem_size : {1u, 2u, 4u, 8u}) {
    for (uint64_t n : lengths) {
      for (double density : {0.0, 0.001, 0.015, 0.5, 1.0}) {
        const Case c{elem_size, density, n};
        std::vector<uint8_t> old_bits(n * elem_size);
        for (auto& b : old_bits) b = static_cast<uint8_t>(rng());
        std::vector<uint8_t> new_bits = old_bits;
        Mutate(&new_bits, n, elem_size, density, &rng);
        if (density > 0) new_bits[0] ^= 1, new_bits[n * elem_size - 1] ^= 0x80;
        const std::vector<uint64_t> positions =
            ReferencePositions(old_bits, new_bits, n, elem_size);
        std::vector<uint8_t> values;
        for (uint64_t p : positions) {
          values.insert(values.end(), new_bits.begin() + p * elem_size,
                        new_bits.begin() + (p + 1) * elem_size);
        }
        const std::vector<uint8_t> before = old_bits;
        const PatchedDigest pd = DigestPatched(old_bits.data(), n, elem_size, positions.data(),
                                               positions.size(), values.data());
        ASSERT_TRUE(pd.positions_valid) << CaseName(c);
        EXPECT_EQ(pd.digest, Digest64(new_bits.data(), new_bits.size())) << CaseName(c);
        EXPECT_TRUE(old_bits == before) << CaseName(c) << ": the old bits were written";
      }
    }
  }
}

// Positions out of order, repeated or past the end are reported, not patched somewhere.
TEST(Digest, PatchedRefusesBadPositions) {
  std::vector<uint8_t> old_bits(20000 * 2, 7);
  const std::vector<uint8_t> values(8, 1);
  const std::vector<std::vector<uint64_t>> bad = {
      {5, 4}, {5, 5}, {20000}, {3, 19999, 20000}, {9000, 100}, {0, 8192, 8191}};
  for (const auto& positions : bad) {
    const PatchedDigest pd =
        DigestPatched(old_bits.data(), 20000, 2, positions.data(), positions.size(), values.data());
    EXPECT_FALSE(pd.positions_valid) << positions.size() << " positions, first " << positions[0];
  }
}

// Digested as the changes are listed (decode_changes' progress), in steps of any size, the same
// digest as at once: steps inside a block, on its edges and past several blocks.
TEST(Digest, PatchedInStepsEqualsPatchedAtOnce) {
  std::mt19937_64 rng(0x51e9);
  for (uint32_t elem_size : {1u, 2u, 4u, 8u}) {
    for (uint64_t n : {uint64_t{1}, uint64_t{8193}, uint64_t{300001}}) {
      std::vector<uint8_t> old_bits(n * elem_size);
      for (auto& b : old_bits) b = static_cast<uint8_t>(rng());
      std::vector<uint8_t> new_bits = old_bits;
      Mutate(&new_bits, n, elem_size, 0.02, &rng);
      new_bits[n * elem_size - 1] ^= 0x80;
      const std::vector<uint64_t> positions = ReferencePositions(old_bits, new_bits, n, elem_size);
      std::vector<uint8_t> values;
      for (uint64_t p : positions) {
        values.insert(values.end(), new_bits.begin() + p * elem_size,
                      new_bits.begin() + (p + 1) * elem_size);
      }
      for (uint64_t step : {uint64_t{1000}, uint64_t{16384}, uint64_t{70000}}) {
        PatchedDigester digester(old_bits.data(), n, elem_size, positions.data(), values.data(),
                                 positions.size());
        uint64_t listed = 0;
        for (uint64_t done = step; done < n + step; done += step) {
          while (listed < positions.size() && positions[listed] < done) ++listed;
          digester.Advance(done, listed);
        }
        const PatchedDigest pd = digester.Finish(positions.size());
        ASSERT_TRUE(pd.positions_valid) << elem_size << " " << n << " " << step;
        EXPECT_EQ(pd.digest, Digest64(new_bits.data(), new_bits.size()));
      }
    }
  }
}

// A change listed below a block already digested (the decoder said it was done with it) makes
// the positions invalid: it is neither patched below the block buffer nor left out.
TEST(Digest, PatchedInStepsRefusesAChangeListedAfterItsBlock) {
  std::vector<uint8_t> old_bits(40000 * 2, 7);
  const std::vector<uint64_t> positions = {3, 100, 20000};
  const std::vector<uint8_t> values(6, 1);
  PatchedDigester digester(old_bits.data(), 40000, 2, positions.data(), values.data(), 3);
  digester.Advance(/*done=*/16384, /*listed=*/1);  // says 100 is not a change
  digester.Advance(40000, 3);
  EXPECT_FALSE(digester.Finish(3).positions_valid);
  // Progress past the end and beyond the room is clamped, not read.
  PatchedDigester past(old_bits.data(), 40000, 2, positions.data(), values.data(), 3);
  past.Advance(UINT64_MAX, 1000);
  const PatchedDigest pd = past.Finish(3);
  EXPECT_TRUE(pd.positions_valid);
  std::vector<uint8_t> patched = old_bits;
  for (uint64_t p : positions) patched[2 * p] = patched[2 * p + 1] = 1;
  EXPECT_EQ(pd.digest, Digest64(patched.data(), patched.size()));
}

TEST(Digest, KnownValue) {
  // xxh3-64 of the empty input (XXH3_64bits, no seed): the wire format depends on this exact
  // function.
  EXPECT_EQ(Digest64("", 0), 0x2d06800538d394c2ull);
}

}  // namespace
}  // namespace refit::kernels
