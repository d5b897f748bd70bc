// The order-0 information bound of a delta (the yardstick for every encoding in
// docs/benchmarks.md), header-only so benchmarks can call it: for one record/tensor, log2 C(n, k)
// bits for the positions plus k times the order-0 entropy of the changed elements' XOR patterns
// (old ^ new).
//
// Counts go through floating point here (lgamma, log2 of frequencies); element values never do:
// the XOR patterns are only histogrammed as integers.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <unordered_map>

namespace refit::ctx {

struct Order0Bound {
  double position_bits = 0;  // log2 C(n, k)
  double value_bits = 0;     // k * H0(xor patterns)
  double total_bits() const { return position_bits + value_bits; }
  double total_bytes() const { return total_bits() / 8; }
};

// log2 of the binomial coefficient C(n, k).
inline double Log2Binomial(uint64_t n, uint64_t k) {
  if (k == 0 || k >= n) return 0;
  const double nd = static_cast<double>(n);
  const double kd = static_cast<double>(k);
  return (std::lgamma(nd + 1) - std::lgamma(kd + 1) - std::lgamma(nd - kd + 1)) / std::log(2.0);
}

// The bound of one record: old_bits/new_bits hold n elements of elem_size (1, 2, 4 or 8) bytes;
// positions are the k indices where they differ.
inline Order0Bound ComputeOrder0Bound(const void* old_bits, const void* new_bits,
                                      uint32_t elem_size, uint64_t n, const uint64_t* positions,
                                      uint64_t k) {
  Order0Bound bound;
  bound.position_bits = Log2Binomial(n, k);
  if (k == 0) return bound;
  std::unordered_map<uint64_t, uint64_t> freq;
  const auto* o = static_cast<const uint8_t*>(old_bits);
  const auto* w = static_cast<const uint8_t*>(new_bits);
  for (uint64_t j = 0; j < k; ++j) {
    uint64_t a = 0;
    uint64_t b = 0;
    std::memcpy(&a, o + positions[j] * elem_size, elem_size);
    std::memcpy(&b, w + positions[j] * elem_size, elem_size);
    ++freq[a ^ b];
  }
  const double kd = static_cast<double>(k);
  double bits = 0;
  for (const auto& [pattern, count] : freq) {
    const double c = static_cast<double>(count);
    bits -= c * std::log2(c / kd);
  }
  bound.value_bits = bits;
  return bound;
}

}  // namespace refit::ctx
