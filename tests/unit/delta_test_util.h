// Test data for in-memory delta tests: pairs of tensor sets with controlled change densities.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "refit/registry.h"
#include "refit/tensor.h"

namespace refit::testing {

// The plugins of this build (LoadRegistry without a config); a failure fails the calling test.
inline std::shared_ptr<Registry> TestRegistry() {
  auto r = LoadRegistry(nullptr);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? r.value() : nullptr;
}

// Owns the bits of a base and a next version of a few tensors.
struct TensorPair {
  std::vector<std::vector<uint8_t>> base_bits, next_bits;
  std::vector<TensorView> base, next;

  // Adds a tensor of n elements whose next version differs in about density * n elements
  // (low-bit flips, like a BF16 cast after a small update).
  void Add(const std::string& name, DType dtype, uint64_t n, double density, uint64_t seed) {
    const uint32_t elem = SizeOf(dtype);
    std::vector<uint8_t> b(n * elem), x;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    auto next_random = [&s] {
      uint64_t z = (s += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      return z ^ (z >> 31);
    };
    for (auto& byte : b) byte = static_cast<uint8_t>(next_random());
    x = b;
    const uint64_t threshold = static_cast<uint64_t>(density * 18446744073709551615.0);
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t r = next_random();
      if (r < threshold || density >= 1.0) x[i * elem] ^= static_cast<uint8_t>(1 + (r >> 61));
    }
    base_bits.push_back(std::move(b));
    next_bits.push_back(std::move(x));
    TensorView bv;
    bv.name = name;
    bv.dtype = dtype;
    bv.shape = {n};
    TensorView nv = bv;
    base.push_back(bv);
    next.push_back(nv);
    for (size_t i = 0; i < base.size(); ++i) {  // vectors may have moved: refresh pointers
      base[i].data = base_bits[i].data();
      next[i].data = next_bits[i].data();
    }
  }
};

}  // namespace refit::testing
