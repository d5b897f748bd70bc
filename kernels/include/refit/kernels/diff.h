// Bitwise diff, digest and copy kernels (pure compute: no config, no registry, no allocation
// beyond the output vectors the caller passes).
//
// Diffs compare bit patterns, never float values: NaN payloads, +0/-0 and every other bit pattern
// are distinct values here.
#pragma once

#include <cstdint>
#include <vector>

namespace refit::kernels {

// Appends to *positions every index i in [0, n) where the elem_size-byte elements of old_bits and
// new_bits differ bitwise, in ascending order; returns how many were appended.
// elem_size is 1, 2, 4 or 8.
uint64_t DiffPositions(const void* old_bits, const void* new_bits, uint64_t n, uint32_t elem_size,
                       std::vector<uint64_t>* positions);

// Number of elements that differ bitwise (no positions materialized).
uint64_t CountDiff(const void* old_bits, const void* new_bits, uint64_t n, uint32_t elem_size);

// xxh3-64 (seed 0) of len bytes: the per-record digest of the wire format.
uint64_t Digest64(const void* data, uint64_t len);

// Streaming xxh3-64 for data that arrives in pieces (non-contiguous boxes); equals Digest64 of the
// concatenation.
class DigestStream {
 public:
  DigestStream();
  ~DigestStream();
  DigestStream(const DigestStream&) = delete;
  DigestStream& operator=(const DigestStream&) = delete;
  void Update(const void* data, uint64_t len);
  uint64_t Final() const;

 private:
  void* state_;  // XXH3_state_t, kept out of this header
};

}  // namespace refit::kernels
