// The `deltas` stream: gap-coded positions of the changed elements, then their new bits.
//
// Layout (all integers little-endian), kStreamHeaderBytes of header:
//   u8  format version (1)
//   u8  gap width w: 1, 2 or 4 (refit/kernels/coding.h: gaps >= the width's all-ones escape value
//       are written as the escape followed by the gap as u64)
//   u16 reserved (0)
//   u64 k, the number of changed elements
//   u64 gap_bytes, the length of the gap stream
//   gap_bytes  the gap stream
//   k * elem_size  the new bits of the changed elements, in position order
// The encoder picks the width giving the smallest gap stream.
//
// Used as is by `deltas`, compressed by `deltas_zstd`; the position helpers are shared with `xor`.
#pragma once

#include <cstdint>
#include <vector>

#include "refit/kernels/buffer.h"
#include "refit/plugin_abi.h"
#include "refit/status.h"

namespace refit::deltas {

constexpr uint8_t kStreamVersion = 1;
constexpr uint64_t kStreamHeaderBytes = 20;

// The host's positions must be strictly increasing and < n_elems: a bad one would make a payload
// every receiver rejects. `encoding` names the caller in the error.
Status CheckPositions(const refit_encode_input_t& in, const char* encoding);

// Gap width and stream sizes for an input (positions already checked).
struct StreamPlan {
  uint32_t gap_width = 1;
  uint64_t gap_bytes = 0;
  uint64_t total_bytes = 0;  // header + gaps + values
};
// Fails only on a size overflow.
Result<StreamPlan> PlanStream(const refit_encode_input_t& in);

// Writes the stream planned for in into out (plan.total_bytes of room).
void WriteStream(const refit_encode_input_t& in, const StreamPlan& plan, uint8_t* out);

// An upper bound of PlanStream(in).total_bytes from the counts alone (no pass over the positions:
// the chosen width is never larger than width 1, at most 1 + escape bytes per gap); false on
// overflow. Sizes output buffers.
bool StreamBytesBound(const refit_encode_input_t& in, uint64_t* bytes);

// The largest stream a decoder accepts for a run of n_elems elements of elem_size bytes (any
// width, every gap escaped at width 4); false on overflow. Bounds a decompressed size.
bool MaxStreamBytes(uint64_t n_elems, uint32_t elem_size, uint64_t* bytes);

// Decodes the gap stream of k positions into *positions after checking it (width, exact length,
// every position < n_elems). `what` prefixes the error ("deltas payload").
Status DecodePositions(const uint8_t* gaps, uint64_t gap_bytes, uint64_t k, uint32_t width,
                       uint64_t n_elems, const char* what, kernels::PositionList* positions);
// The same into positions[0, k), which the caller sized for k.
Status DecodePositionsInto(const uint8_t* gaps, uint64_t gap_bytes, uint64_t k, uint32_t width,
                           uint64_t n_elems, const char* what, uint64_t* positions);

// Validates the whole stream, then overwrites the changed elements of the target. Nothing is
// written unless everything checks out.
Status ApplyStream(const uint8_t* stream, uint64_t len, const refit_decode_target_t& target,
                   const char* what);

// Validates the whole stream like ApplyStream, then lists its changes (the encodings'
// DecodeChanges): positions and new bits into arrays of room for `capacity` changes (a stream of
// more is refused); returns how many. The target is not written.
Result<uint64_t> ListStream(const uint8_t* stream, uint64_t len, const refit_decode_target_t& old,
                            const char* what, uint64_t* positions, uint8_t* values,
                            uint64_t capacity);

}  // namespace refit::deltas
