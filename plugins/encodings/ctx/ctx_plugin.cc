// The `ctx` encoding: positions coded per class of the receiver's old values (their binary
// exponent), values as signed steps in the ordered integer representation. The smallest
// encoding of the family; op `step` (applied exactly once). The codec is in ctx_codec.{h,cc}.
#include <memory>

#include "ctx_codec.h"
#include "refit/sdk/plugin.hpp"

namespace {

class CtxEncoding {
 public:
  static constexpr refit_op_t kOp = REFIT_OP_STEP;
  // Relative cost of applying a record (context-model decoding); `auto` tries cheaper encodings
  // first.
  static constexpr uint32_t kApplyCost = 60;

  static refit::Result<std::unique_ptr<CtxEncoding>> Create(const refit::sdk::ConfigView& /*cfg*/) {
    return std::make_unique<CtxEncoding>();
  }
  uint64_t MaxEncodedSize(const refit_encode_input_t& in) const {
    return refit::ctx::MaxEncodedSize(in);
  }
  refit::Result<uint64_t> Encode(const refit_encode_input_t& in, uint8_t* out, uint64_t cap) const {
    return refit::ctx::Encode(in, out, cap);
  }
  refit::Status Decode(const uint8_t* payload, uint64_t len,
                       const refit_decode_target_t& target) const {
    return refit::ctx::Decode(payload, len, target);
  }
  refit::Result<uint64_t> DecodeChanges(const uint8_t* payload, uint64_t len,
                                        const refit_decode_target_t& old, uint64_t* positions,
                                        uint8_t* values, uint64_t capacity,
                                        const refit::sdk::ListProgress& progress) const {
    return refit::ctx::DecodeChanges(payload, len, old, positions, values, capacity, progress);
  }
};

}  // namespace

REFIT_PLUGIN("ctx", "0.1.0",
             refit::sdk::MakeEncoding<CtxEncoding>(
                 "ctx",
                 "positions coded per class of the old value's exponent + signed ordered-integer "
                 "steps, adaptive range coder (step)"))
