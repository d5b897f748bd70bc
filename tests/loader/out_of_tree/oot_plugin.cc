// An out-of-tree encoding, written only against refit's SDK: positions and new values of the
// changed elements, in this plugin's own little format (all integers little-endian):
//
//   "OOT1" | u32 elem_size | u64 n_elems | u64 count | count x u64 position | count x value
//
// Positions are strictly increasing; a full sync lists every position.
#include <cstring>
#include <memory>
#include <refit/sdk/plugin.hpp>
#include <string>

namespace {

constexpr char kMagic[4] = {'O', 'O', 'T', '1'};
constexpr uint64_t kHeaderBytes = 4 + 4 + 8 + 8;

void PutLe(uint8_t* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

uint64_t GetLe(const uint8_t* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= static_cast<uint64_t>(in[i]) << (8 * i);
  return value;
}

class OotOverwrite {
 public:
  static constexpr refit_op_t kOp = REFIT_OP_OVERWRITE;

  static refit::Result<std::unique_ptr<OotOverwrite>> Create(const refit::sdk::ConfigView&) {
    return std::make_unique<OotOverwrite>();
  }

  uint64_t MaxEncodedSize(const refit_encode_input_t& in) const {
    return kHeaderBytes + Count(in) * (8 + in.elem_size);
  }

  refit::Result<uint64_t> Encode(const refit_encode_input_t& in, uint8_t* out, uint64_t cap) const {
    const uint64_t count = Count(in);
    const uint64_t size = kHeaderBytes + count * (8 + in.elem_size);
    if (size > cap) return refit::Status::Invalid("oot_overwrite: output buffer too small");
    std::memcpy(out, kMagic, 4);
    PutLe(out + 4, in.elem_size, 4);
    PutLe(out + 8, in.n_elems, 8);
    PutLe(out + 16, count, 8);
    uint8_t* positions = out + kHeaderBytes;
    uint8_t* values = positions + count * 8;
    const auto* new_bits = static_cast<const uint8_t*>(in.new_bits);
    for (uint64_t i = 0; i < count; ++i) {
      const uint64_t pos = in.old_bits == nullptr ? i : in.positions[i];
      PutLe(positions + i * 8, pos, 8);
      std::memcpy(values + i * in.elem_size, new_bits + pos * in.elem_size, in.elem_size);
    }
    return size;
  }

  // The payload is untrusted: every field is checked before the target is touched.
  refit::Status Decode(const uint8_t* payload, uint64_t len,
                       const refit_decode_target_t& target) const {
    if (len < kHeaderBytes || std::memcmp(payload, kMagic, 4) != 0) {
      return refit::Status::Corrupt("oot_overwrite: not an OOT1 payload");
    }
    const uint64_t elem_size = GetLe(payload + 4, 4);
    const uint64_t n_elems = GetLe(payload + 8, 8);
    const uint64_t count = GetLe(payload + 16, 8);
    if (elem_size != target.elem_size || n_elems != target.n_elems) {
      return refit::Status::Corrupt("oot_overwrite: payload is for " + std::to_string(n_elems) +
                                    " elements of " + std::to_string(elem_size) +
                                    " bytes, the target has " + std::to_string(target.n_elems) +
                                    " of " + std::to_string(target.elem_size));
    }
    // count <= n_elems bounds the products below (the target's size fits in memory).
    if (count > n_elems || len - kHeaderBytes != count * (8 + elem_size)) {
      return refit::Status::Corrupt("oot_overwrite: payload length " + std::to_string(len) +
                                    " does not match " + std::to_string(count) + " changes");
    }
    const uint8_t* positions = payload + kHeaderBytes;
    for (uint64_t i = 0; i < count; ++i) {
      const uint64_t pos = GetLe(positions + i * 8, 8);
      if (pos >= n_elems || (i > 0 && pos <= GetLe(positions + (i - 1) * 8, 8))) {
        return refit::Status::Corrupt("oot_overwrite: position " + std::to_string(i) +
                                      " is out of order or out of range");
      }
    }
    const uint8_t* values = positions + count * 8;
    auto* bits = static_cast<uint8_t*>(target.bits);
    for (uint64_t i = 0; i < count; ++i) {
      const uint64_t pos = GetLe(positions + i * 8, 8);
      std::memcpy(bits + pos * elem_size, values + i * elem_size, elem_size);
    }
    return refit::Status::OK();
  }

 private:
  static uint64_t Count(const refit_encode_input_t& in) {
    return in.old_bits == nullptr ? in.n_elems : in.n_changed;
  }
};

}  // namespace

REFIT_PLUGIN("oot", "0.1.0",
             refit::sdk::MakeEncoding<OotOverwrite>(
                 "oot_overwrite", "out-of-tree test encoding: u64 positions + new values", nullptr,
                 REFIT_ENC_CAP_FULL_SYNC))
