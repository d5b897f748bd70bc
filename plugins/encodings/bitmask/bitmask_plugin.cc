// The `bitmask` encoding: one bit per element (LSB-first) saying which changed, then the new bits
// of the changed elements. Smaller than gap-coded positions once changes are dense (above ~1/32
// for 4-byte values, where a gap would need more than a bit per element).
//
// Payload (all integers little-endian):
//   u8  format version (1)
//   u8  reserved (0)
//   u16 reserved (0)
//   u64 k, the number of set bits
//   ceil(n_elems / 8) bytes: element i is bit (i % 8) of byte i / 8; bits past n_elems are zero
//   k * elem_size bytes: the new bits of the changed elements, in position order
#include <memory>
#include <string>
#include <vector>

#include "deltas/deltas_stream.h"
#include "refit/kernels/buffer.h"
#include "refit/kernels/coding.h"
#include "refit/sdk/encoding_util.hpp"
#include "refit/sdk/plugin.hpp"

namespace {

using refit::Result;
using refit::Status;
using refit::sdk::CheckedAdd;
using refit::sdk::CheckedMul;
using refit::sdk::LoadLE;
using refit::sdk::StoreLE;

constexpr uint8_t kFormatVersion = 1;
constexpr uint64_t kHeaderBytes = 12;

// kHeaderBytes + mask + k * elem_size, or false on overflow.
bool PayloadBytes(uint64_t n_elems, uint64_t k, uint32_t elem_size, uint64_t* total) {
  uint64_t values = 0;
  return CheckedMul(k, elem_size, &values) &&
         CheckedAdd(kHeaderBytes + refit::kernels::BitmaskBytes(n_elems), values, total);
}

class BitmaskEncoding {
 public:
  static constexpr refit_op_t kOp = REFIT_OP_OVERWRITE;
  // Relative cost of applying a record (a walk over a change bitmask); `auto` tries cheaper
  // encodings first.
  static constexpr uint32_t kApplyCost = 20;

  static Result<std::unique_ptr<BitmaskEncoding>> Create(const refit::sdk::ConfigView& /*cfg*/) {
    return std::make_unique<BitmaskEncoding>();
  }

  uint64_t MaxEncodedSize(const refit_encode_input_t& in) const {
    if (!refit::sdk::CheckEncodeInput(in).ok() || refit::sdk::IsFullSync(in)) return 0;
    uint64_t total = 0;
    return PayloadBytes(in.n_elems, in.n_changed, in.elem_size, &total) ? total : 0;
  }

  Result<uint64_t> Encode(const refit_encode_input_t& in, uint8_t* out, uint64_t cap) const {
    REFIT_RETURN_NOT_OK(refit::sdk::CheckEncodeInput(in).status());
    if (refit::sdk::IsFullSync(in)) return refit::sdk::RefuseFullSync("bitmask");
    uint64_t total = 0;
    if (!PayloadBytes(in.n_elems, in.n_changed, in.elem_size, &total)) {
      return Status::Invalid(std::to_string(in.n_changed) + " changes overflow the payload size");
    }
    if (total > cap) return refit::sdk::OutputTooSmall(total, cap);
    REFIT_RETURN_NOT_OK(refit::deltas::CheckPositions(in, "bitmask"));
    out[0] = kFormatVersion;
    out[1] = 0;
    StoreLE<uint16_t>(out + 2, 0);
    StoreLE<uint64_t>(out + 4, in.n_changed);
    uint8_t* mask = out + kHeaderBytes;
    refit::kernels::BuildBitmask(in.positions, in.n_changed, in.n_elems, mask);
    refit::kernels::GatherValues(in.new_bits, refit::sdk::PackedNewValues(in), in.elem_size,
                                 in.positions, in.n_changed,
                                 mask + refit::kernels::BitmaskBytes(in.n_elems));
    return total;
  }

  Status Decode(const uint8_t* payload, uint64_t len, const refit_decode_target_t& t) const {
    REFIT_RETURN_NOT_OK(refit::sdk::CheckDecodeTarget(t).status());
    if (len < kHeaderBytes || payload == nullptr) {
      return Status::Corrupt("bitmask payload has " + std::to_string(len) +
                             " bytes, shorter than its " + std::to_string(kHeaderBytes) +
                             "-byte header");
    }
    if (payload[0] != kFormatVersion) {
      return Status::Unsupported("bitmask payload format version " + std::to_string(payload[0]) +
                                 " (this build reads version " + std::to_string(kFormatVersion) +
                                 ")");
    }
    if (payload[1] != 0 || LoadLE<uint16_t>(payload + 2) != 0) {
      return Status::Corrupt("bitmask payload reserved header bytes are not zero");
    }
    const uint64_t k = LoadLE<uint64_t>(payload + 4);
    uint64_t expected = 0;
    if (k > t.n_elems || !PayloadBytes(t.n_elems, k, t.elem_size, &expected) || len != expected) {
      return Status::Corrupt("bitmask payload has " + std::to_string(len) +
                             " bytes, which does not match " + std::to_string(k) + " changes of " +
                             std::to_string(t.elem_size) + "-byte elements in a run of " +
                             std::to_string(t.n_elems) + " elements");
    }
    const uint8_t* mask = payload + kHeaderBytes;
    if (!refit::kernels::BitmaskTailClear(mask, t.n_elems)) {
      return Status::Corrupt("bitmask payload sets bits past the run's " +
                             std::to_string(t.n_elems) + " elements");
    }
    const uint64_t set = refit::kernels::BitmaskCount(mask, t.n_elems);
    if (set != k) {
      return Status::Corrupt("bitmask payload mask has " + std::to_string(set) +
                             " set bits but the header says " + std::to_string(k));
    }
    refit::kernels::PositionList positions(k);  // every slot written by BitmaskToPositions
    refit::kernels::BitmaskToPositions(mask, t.n_elems, positions.data());
    refit::kernels::ScatterOverwrite(t.bits, t.elem_size, positions.data(), k,
                                     mask + refit::kernels::BitmaskBytes(t.n_elems));
    return Status::OK();
  }
};

}  // namespace

REFIT_PLUGIN("bitmask", "0.1.0",
             refit::sdk::MakeEncoding<BitmaskEncoding>(
                 "bitmask",
                 "one bit per element (LSB-first) + new bits of the changed elements "
                 "(overwrite)"))
