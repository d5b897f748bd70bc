// Bitwise diff, digest and copy kernels (pure compute: no config, no registry, no allocation
// beyond the output vectors the caller passes).
//
// Diffs compare bit patterns, never float values: NaN payloads, +0/-0 and every other bit pattern
// are distinct values here.
#pragma once

#include <cstdint>
#include <vector>

#include "refit/kernels/buffer.h"

namespace refit::kernels {

// Appends to *positions every index i in [0, n) where the elem_size-byte elements of old_bits and
// new_bits differ bitwise, in ascending order; returns how many were appended.
// elem_size is 1, 2, 4 or 8.
uint64_t DiffPositions(const void* old_bits, const void* new_bits, uint64_t n, uint32_t elem_size,
                       std::vector<uint64_t>* positions);

// Number of elements that differ bitwise (no positions materialized).
uint64_t CountDiff(const void* old_bits, const void* new_bits, uint64_t n, uint32_t elem_size);

// xxh3-64 (XXH3_64bits, no seed) of len bytes: the per-record digest of the wire format. Runs
// the xxh3 inner loop of the active SIMD level (dispatch.h); the value is the same at every level.
uint64_t Digest64(const void* data, uint64_t len);

// DiffPositions and Digest64(new_bits, n * elem_size) in one pass: the buffers are walked in
// cache-sized blocks, each diffed and then fed to a streaming digest while it is still in cache,
// so new_bits is read from memory once instead of twice. Same positions, same digest.
struct DiffDigest {
  uint64_t changed = 0;  // positions appended
  uint64_t digest = 0;   // Digest64 of new_bits
};
// Where the diff also appends the old and the new bits of each changed element, packed in
// position order, copied while its block is in cache (an encoder reading them avoids a cache
// miss per change). Null members: not wanted.
struct ChangedValues {
  ValueList* old_values = nullptr;
  ValueList* new_values = nullptr;
};
// Positions are appended to *positions as by DiffPositions.
DiffDigest DiffPositionsAndDigest(const void* old_bits, const void* new_bits, uint64_t n,
                                  uint32_t elem_size, PositionList* positions,
                                  ChangedValues values = {});

// Digest64 of n elements of old_bits with `count` changes patched in: positions strictly
// ascending and < n, their new bits packed in `values` (elem_size each). old_bits is not written:
// each block is copied into a cache-resident buffer, patched and digested there, so a record is
// verified from its old bits and its changes in one read pass. positions_valid is false (digest
// unspecified) when the positions are not strictly ascending or reach n.
struct PatchedDigest {
  uint64_t digest = 0;
  bool positions_valid = false;
};
PatchedDigest DigestPatched(const void* old_bits, uint64_t n, uint32_t elem_size,
                            const uint64_t* positions, uint64_t count, const void* values);

enum class SimdLevel : int;  // dispatch.h

// Streaming xxh3-64 for data that arrives in pieces (non-contiguous boxes); equals Digest64 of the
// concatenation.
class DigestStream {
 public:
  DigestStream();                          // the active level
  explicit DigestStream(SimdLevel level);  // an explicit one (tests); unsupported: the best
  ~DigestStream();
  DigestStream(const DigestStream&) = delete;
  DigestStream& operator=(const DigestStream&) = delete;
  void Update(const void* data, uint64_t len);
  uint64_t Final() const;

 private:
  void* state_;  // XXH3_state_t, kept out of this header
  void (*update_)(void* state, const void* data, uint64_t len);
};

}  // namespace refit::kernels
