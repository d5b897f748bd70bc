// The `dense` encoding: the payload is the run's new bits verbatim. Used for full syncs (no old
// bits on the receiver) and as the fallback when a delta would not be smaller.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "refit/sdk/encoding_util.hpp"
#include "refit/sdk/plugin.hpp"

namespace {

using refit::Result;
using refit::Status;

class DenseEncoding {
 public:
  static constexpr refit_op_t kOp = REFIT_OP_OVERWRITE;

  static Result<std::unique_ptr<DenseEncoding>> Create(const refit::sdk::ConfigView& /*cfg*/) {
    return std::make_unique<DenseEncoding>();
  }

  // At least 1: the host reads 0 as "cannot encode", but an empty run encodes to 0 bytes.
  uint64_t MaxEncodedSize(const refit_encode_input_t& in) const {
    Result<uint64_t> bytes = refit::sdk::CheckEncodeInput(in);
    return bytes.ok() ? std::max<uint64_t>(*bytes, 1) : 0;
  }

  Result<uint64_t> Encode(const refit_encode_input_t& in, uint8_t* out, uint64_t cap) const {
    REFIT_ASSIGN_OR_RAISE(uint64_t bytes, refit::sdk::CheckEncodeInput(in));
    if (bytes > cap) return refit::sdk::OutputTooSmall(bytes, cap);
    if (bytes > 0) std::memcpy(out, in.new_bits, bytes);
    return bytes;
  }

  Status Decode(const uint8_t* payload, uint64_t len, const refit_decode_target_t& t) const {
    REFIT_ASSIGN_OR_RAISE(uint64_t bytes, refit::sdk::CheckDecodeTarget(t));
    if (len != bytes) {
      return Status::Corrupt("dense payload has " + std::to_string(len) + " bytes, expected " +
                             std::to_string(bytes) + " (" + std::to_string(t.n_elems) + " x " +
                             std::to_string(t.elem_size) + ")");
    }
    if (bytes > 0) std::memcpy(t.bits, payload, bytes);
    return Status::OK();
  }
};

}  // namespace

REFIT_PLUGIN("dense", "0.1.0",
             refit::sdk::MakeEncoding<DenseEncoding>(
                 "dense", "all new bits verbatim; full sync and fallback (overwrite)", nullptr,
                 // Never smaller than a record of changes: `auto` would only waste a try on it.
                 REFIT_ENC_CAP_FULL_SYNC | REFIT_ENC_CAP_NOT_AUTO))
