// The `ctx` codec: positions coded per class of the receiver's OLD value (its binary exponent),
// values as signed steps in the dtype's ordered integer representation, through an adaptive
// binary range coder (small records) or static per-record tables and rANS (large ones). Pure
// functions of their inputs (no state between calls, thread-safe).
//
// Everything is integer arithmetic on bit patterns: the ordered-integer map and the step are
// exactly invertible for every bit pattern (NaN payloads, +-0, inf, subnormals), so no value needs
// a special case; a large step simply costs its raw bits. See README.md for the payload format.
#pragma once

#include <cstdint>

#include "refit/kernels/dispatch.h"
#include "refit/plugin_abi.h"
#include "refit/sdk/encoding_util.hpp"
#include "refit/status.h"

namespace refit::ctx {

// Upper bound of Encode()'s output for `in` (0 when the input is invalid or a full sync).
uint64_t MaxEncodedSize(const refit_encode_input_t& in);

// Encodes the delta old -> new at in.positions into out[0, cap). Full syncs (old_bits == NULL)
// are unsupported. Fails cleanly (nothing written past cap) when cap is too small.
Result<uint64_t> Encode(const refit_encode_input_t& in, uint8_t* out, uint64_t cap);

// Applies a payload onto target (which holds the old bits). The payload is untrusted: its
// checksum, header and every count are validated before the first write, and no write ever
// leaves the target.
Status Decode(const uint8_t* payload, uint64_t len, const refit_decode_target_t& target);

// Decodes a payload against the old bits in `old` (only read) into its changes: their positions,
// strictly ascending, into positions[] and their new bits (elem_size each) into values[], both
// of room for `capacity` changes; returns how many. A payload of more changes is refused.
// `progress` is called after each chunk of elements (sdk::ListProgress: the host verifies it in
// cache).
Result<uint64_t> DecodeChanges(const uint8_t* payload, uint64_t len,
                               const refit_decode_target_t& old, uint64_t* positions,
                               uint8_t* values, uint64_t capacity,
                               const sdk::ListProgress& progress = {});

// How a coded (not literal) payload codes its changes: kAuto picks by record size (the adaptive
// range coder for small records, static tables + rANS from 2^12 changes on); tests and fuzz seeds
// force one form to reach both at any size, kTablesPerClass the table form with one slot per
// class (no merging of classes, see README.md) and kTablesExplicit the table form without
// geometric tables. The decoder reads any of them.
enum class CodedForm { kAuto, kAdaptive, kTables, kTablesPerClass, kTablesExplicit };

// Encode / Decode walking the elements at an explicit kernel level (an unsupported one runs the
// best supported one): scalar counts every element's class one by one (the reference), AVX2 and
// AVX-512 count blocks of 64 (ctx_blocks.h). The payload and the decoded bits are identical at
// every level; Encode / Decode use kernels::ActiveSimdLevel() (REFIT_KERNELS forces it).
Result<uint64_t> EncodeAt(kernels::SimdLevel level, const refit_encode_input_t& in, uint8_t* out,
                          uint64_t cap, CodedForm form = CodedForm::kAuto);
Status DecodeAt(kernels::SimdLevel level, const uint8_t* payload, uint64_t len,
                const refit_decode_target_t& target);
Result<uint64_t> DecodeChangesAt(kernels::SimdLevel level, const uint8_t* payload, uint64_t len,
                                 const refit_decode_target_t& old, uint64_t* positions,
                                 uint8_t* values, uint64_t capacity,
                                 const sdk::ListProgress& progress = {});

}  // namespace refit::ctx
