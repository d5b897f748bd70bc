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

// DigestPatched while the changes are being listed (decode_changes' progress, ABI 1.7): each
// Advance digests the blocks below element `done` with the first `listed` changes patched in,
// just after the decoder read them (still in cache); Finish digests the rest. The same digest and
// validity as DigestPatched; a change listed below a block already digested makes the positions
// invalid.
class PatchedDigester {
 public:
  // positions and values: the lists being filled, at most `capacity` changes.
  PatchedDigester(const void* old_bits, uint64_t n, uint32_t elem_size, const uint64_t* positions,
                  const void* values, uint64_t capacity);
  PatchedDigester(const PatchedDigester&) = delete;
  PatchedDigester& operator=(const PatchedDigester&) = delete;
  // Every change below `done` is among the first `listed`; arguments never decrease.
  void Advance(uint64_t done, uint64_t listed);
  // All `count` changes are listed.
  PatchedDigest Finish(uint64_t count);

 private:
  void DigestBlock(uint64_t m, uint64_t listed);

  static constexpr uint64_t kBlockBytes = uint64_t{16} << 10;
  const uint8_t* old_;
  uint64_t n_;
  uint32_t elem_;
  int elem_index_;
  const uint64_t* positions_;
  const uint8_t* values_;
  uint64_t capacity_;
  uint64_t per_block_;
  uint64_t first_ = 0;         // the next element to digest
  uint64_t k_ = 0;             // the next change to patch in
  uint64_t next_allowed_ = 0;  // the lowest position the next change may have
  bool valid_;
  DigestStream digest_;
  alignas(64) uint8_t block_[kBlockBytes];
};

}  // namespace refit::kernels
