// Gap coding, bitmasks, byte planes and gather/scatter against obvious scalar definitions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "refit/kernels/coding.h"

namespace refit::kernels {
namespace {

// Up to k sorted distinct random positions in [0, n).
std::vector<uint64_t> RandomPositions(uint64_t n, uint64_t k, std::mt19937_64* rng) {
  std::vector<uint64_t> all;
  for (uint64_t j = 0; j < k; ++j) all.push_back((*rng)() % n);
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return all;
}

std::vector<uint8_t> Encode(const std::vector<uint64_t>& positions, uint32_t width) {
  const GapStats stats = ComputeGapStats(positions.data(), positions.size());
  std::vector<uint8_t> out(GapStreamBytes(stats, width));
  EXPECT_EQ(EncodeGaps(positions.data(), positions.size(), width, out.data()), out.size());
  return out;
}

TEST(GapCoding, RoundTripsAtEveryWidth) {
  std::mt19937_64 rng(1);
  for (uint64_t n : {1ull, 300ull, 70000ull, 1ull << 40}) {
    for (uint64_t k : {0ull, 1ull, 5ull, 200ull}) {
      std::vector<uint64_t> positions = RandomPositions(n, k, &rng);
      if (!positions.empty()) positions.back() = n - 1;  // the last element: the largest gap
      for (uint32_t width : {1u, 2u, 4u}) {
        const std::vector<uint8_t> stream = Encode(positions, width);
        std::vector<uint64_t> back(positions.size());
        const GapDecodeResult r =
            DecodeGaps(stream.data(), stream.size(), positions.size(), width, n, back.data());
        ASSERT_EQ(r.error, GapDecodeError::kOk)
            << GapDecodeErrorText(r.error) << " width " << width << " n " << n;
        EXPECT_EQ(back, positions) << "width " << width << " n " << n;
      }
    }
  }
}

TEST(GapCoding, EscapesAndWidthChoice) {
  // Gaps 0, 254 (fits u8), 255 (the u8 escape value itself must be escaped), 70000.
  const std::vector<uint64_t> positions = {0, 255, 511, 70512};
  const GapStats stats = ComputeGapStats(positions.data(), positions.size());
  EXPECT_EQ(stats.escapes_u8, 2u);
  EXPECT_EQ(stats.escapes_u16, 1u);
  EXPECT_EQ(stats.escapes_u32, 0u);
  EXPECT_EQ(GapStreamBytes(stats, 1), 4 + 2 * kGapEscapeBytes);
  EXPECT_EQ(GapStreamBytes(stats, 2), 8 + kGapEscapeBytes);
  EXPECT_EQ(GapStreamBytes(stats, 4), 16u);
  EXPECT_EQ(ChooseGapWidth(stats), 2u);  // 16 bytes at u16 and at u32: a tie goes narrower
  const std::vector<uint8_t> u8 = Encode(positions, 1);
  EXPECT_EQ(u8[0], 0);
  EXPECT_EQ(u8[1], 254);
  EXPECT_EQ(u8[2], 0xFF);  // escape, then 255 as u64
  EXPECT_EQ(u8[3], 255);
  // Dense positions: width 1 wins.
  const std::vector<uint64_t> dense = {3, 4, 10, 200};
  EXPECT_EQ(ChooseGapWidth(ComputeGapStats(dense.data(), dense.size())), 1u);
}

TEST(GapCoding, DecodeRefusesBadStreams) {
  const std::vector<uint64_t> positions = {2, 9, 300, 301};
  const std::vector<uint8_t> stream = Encode(positions, 1);
  std::vector<uint64_t> out(8);
  // Every strict prefix is truncated; an extra byte is trailing.
  for (size_t len = 0; len < stream.size(); ++len) {
    EXPECT_EQ(DecodeGaps(stream.data(), len, 4, 1, 1000, out.data()).error,
              GapDecodeError::kTruncated)
        << len;
  }
  std::vector<uint8_t> longer = stream;
  longer.push_back(0);
  EXPECT_EQ(DecodeGaps(longer.data(), longer.size(), 4, 1, 1000, out.data()).error,
            GapDecodeError::kTrailing);
  // The last position 301 is out of a run of 301 elements.
  EXPECT_EQ(DecodeGaps(stream.data(), stream.size(), 4, 1, 301, out.data()).error,
            GapDecodeError::kOutOfRange);
  EXPECT_EQ(DecodeGaps(stream.data(), stream.size(), 4, 3, 1000, out.data()).error,
            GapDecodeError::kBadWidth);
  // An escaped gap of 2^64 - 1 must not wrap around.
  std::vector<uint8_t> huge = {0x00, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
  EXPECT_EQ(DecodeGaps(huge.data(), huge.size(), 2, 1, ~uint64_t{0}, out.data()).error,
            GapDecodeError::kOutOfRange);
}

TEST(Bitmask, BuildScanAndCountMatchTheDefinition) {
  std::mt19937_64 rng(2);
  for (uint64_t n : {0ull, 1ull, 7ull, 8ull, 9ull, 64ull, 65ull, 1000ull}) {
    for (uint64_t k : {0ull, 1ull, 3ull, 500ull}) {
      const std::vector<uint64_t> positions =
          n == 0 ? std::vector<uint64_t>{} : RandomPositions(n, k, &rng);
      std::vector<uint8_t> mask(BitmaskBytes(n) + 1, 0xEE);  // + a guard byte
      BuildBitmask(positions.data(), positions.size(), n, mask.data());
      EXPECT_EQ(mask.back(), 0xEE) << "wrote past the mask";
      for (uint64_t i = 0; i < n; ++i) {
        const bool set = std::binary_search(positions.begin(), positions.end(), i);
        EXPECT_EQ(((mask[i / 8] >> (i % 8)) & 1) != 0, set) << "bit " << i;  // LSB-first
      }
      EXPECT_TRUE(BitmaskTailClear(mask.data(), n));
      EXPECT_EQ(BitmaskCount(mask.data(), n), positions.size());
      std::vector<uint64_t> back(positions.size());
      EXPECT_EQ(BitmaskToPositions(mask.data(), n, back.data()), positions.size());
      EXPECT_EQ(back, positions);
    }
  }
  uint8_t tail[2] = {0, 0x02};  // n = 9: bit 9 is past the end
  EXPECT_FALSE(BitmaskTailClear(tail, 9));
  EXPECT_TRUE(BitmaskTailClear(tail, 10));
  EXPECT_EQ(BitmaskCount(tail, 9), 0u);
}

TEST(BytePlanes, SplitAndMergeAreInverseAndOrdered) {
  std::mt19937_64 rng(3);
  for (uint32_t es : {1u, 2u, 4u, 8u}) {
    for (uint64_t k : {0ull, 1ull, 5ull, 333ull}) {
      std::vector<uint8_t> values(k * es);
      for (auto& v : values) v = static_cast<uint8_t>(rng());
      std::vector<uint8_t> planes(k * es);
      SplitBytePlanes(values.data(), k, es, planes.data());
      for (uint64_t j = 0; j < k; ++j) {
        for (uint32_t b = 0; b < es; ++b) {
          ASSERT_EQ(planes[b * k + j], values[j * es + b]) << "elem " << es << " j " << j;
        }
      }
      std::vector<uint8_t> back(k * es);
      MergeBytePlanes(planes.data(), k, es, back.data());
      EXPECT_EQ(back, values);
    }
  }
}

TEST(GatherScatter, OverwriteAndXorMatchTheDefinition) {
  std::mt19937_64 rng(4);
  // k below and well above the distance the loops prefetch ahead.
  for (const auto& [n, picks] : {std::pair<uint64_t, uint64_t>{500, 60}, {500, 5}, {20000, 3000}}) {
    for (uint32_t es : {1u, 2u, 4u, 8u}) {
      std::vector<uint8_t> old_bits(n * es);
      std::vector<uint8_t> new_bits(n * es);
      for (auto& v : old_bits) v = static_cast<uint8_t>(rng());
      for (auto& v : new_bits) v = static_cast<uint8_t>(rng());
      const std::vector<uint64_t> positions = RandomPositions(n, picks, &rng);
      const uint64_t k = positions.size();

      std::vector<uint8_t> values(k * es);
      GatherValues(new_bits.data(), es, positions.data(), k, values.data());
      std::vector<uint8_t> xors(k * es);
      GatherXor(old_bits.data(), new_bits.data(), es, positions.data(), k, xors.data());
      for (uint64_t j = 0; j < k; ++j) {
        for (uint32_t b = 0; b < es; ++b) {
          const uint64_t at = positions[j] * es + b;
          ASSERT_EQ(values[j * es + b], new_bits[at]);
          ASSERT_EQ(xors[j * es + b], old_bits[at] ^ new_bits[at]);
        }
      }

      // The fused gather + split writes exactly the planes of those XORs.
      std::vector<uint8_t> planes(k * es);
      SplitBytePlanes(xors.data(), k, es, planes.data());
      std::vector<uint8_t> fused_planes(k * es);
      GatherXorPlanes(old_bits.data(), new_bits.data(), es, positions.data(), k,
                      fused_planes.data());
      EXPECT_EQ(fused_planes, planes) << "elem " << es << " k " << k;

      // Overwrite, xor and swap turn old into new at the positions and leave the rest alone.
      std::vector<uint8_t> want = old_bits;
      for (uint64_t p : positions) std::memcpy(&want[p * es], &new_bits[p * es], es);
      std::vector<uint8_t> by_overwrite = old_bits;
      ScatterOverwrite(by_overwrite.data(), es, positions.data(), k, values.data());
      EXPECT_EQ(by_overwrite, want) << "elem " << es;
      std::vector<uint8_t> by_xor = old_bits;
      ScatterXor(by_xor.data(), es, positions.data(), k, xors.data());
      EXPECT_EQ(by_xor, want) << "elem " << es;
      ScatterXor(by_xor.data(), es, positions.data(), k, xors.data());
      EXPECT_EQ(by_xor, old_bits) << "xor twice is the identity";
      std::vector<uint8_t> by_swap = old_bits;
      std::vector<uint8_t> swapped = values;
      ScatterSwap(by_swap.data(), es, positions.data(), k, swapped.data());
      EXPECT_EQ(by_swap, want) << "elem " << es;
      std::vector<uint8_t> old_values(k * es);
      for (uint64_t j = 0; j < k; ++j) {
        std::memcpy(&old_values[j * es], &old_bits[positions[j] * es], es);
      }
      EXPECT_EQ(swapped, old_values) << "the old bits come out";
      ScatterSwap(by_swap.data(), es, positions.data(), k, swapped.data());
      EXPECT_EQ(by_swap, old_bits) << "swapped twice is the identity";
      EXPECT_EQ(swapped, values);
    }
  }
}

}  // namespace
}  // namespace refit::kernels
