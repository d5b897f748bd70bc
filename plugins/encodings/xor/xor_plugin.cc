// The `xor` encoding: positions as gaps (as in `deltas`), values as old XOR new bits of the
// changed elements split into byte planes, the whole body compressed. Decoding XORs onto the
// receiver's current bits, so a record is applied exactly once (op xor, not idempotent).
//
// Payload (all integers little-endian):
//   u8  format version (1)
//   u8  gap width: 1, 2 or 4 (refit/kernels/coding.h, escapes for long gaps)
//   u8  codec of the body: 0 = none, 1 = zstd, 2 = lz4
//   u8  reserved (0)
//   u64 k, the number of changed elements
//   u64 gap_bytes, the length of the gap stream
//   the body, compressed (exactly one frame): gap stream (gap_bytes), then elem_size planes of
//   k bytes each, plane b holding byte b (least significant first) of every XOR
// Near-ULP changes XOR only low mantissa bits, so the high planes are nearly all zero and
// compress to almost nothing.
#include <memory>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "deltas/deltas_stream.h"
#include "refit/kernels/buffer.h"
#include "refit/kernels/coding.h"
#include "refit/sdk/encoding_util.hpp"
#include "refit/sdk/plugin.hpp"

namespace {

using refit::Result;
using refit::Status;
using refit::codec::Codec;
using refit::sdk::CheckedAdd;
using refit::sdk::CheckedMul;
using refit::sdk::LoadLE;
using refit::sdk::StoreLE;

constexpr uint8_t kFormatVersion = 1;
constexpr uint64_t kHeaderBytes = 20;

const refit_config_key_t kKeys[] = {
    {"codec", REFIT_CFG_STRING, "\"zstd\"",
     "compressor of positions + byte planes: \"zstd\", \"lz4\" or \"none\""},
    {"level", REFIT_CFG_INT, "1",
     "zstd level (negative: faster; 1..22: smaller); lz4 and none accept only 1"},
};

class XorEncoding {
 public:
  static constexpr refit_op_t kOp = REFIT_OP_XOR;
  // Relative cost of applying a record (entropy decoding of xor planes); `auto` tries cheaper
  // encodings first.
  static constexpr uint32_t kApplyCost = 50;

  XorEncoding(Codec codec, int level) : codec_(codec), level_(level) {}

  static Result<std::unique_ptr<XorEncoding>> Create(const refit::sdk::ConfigView& cfg) {
    REFIT_ASSIGN_OR_RAISE(refit::codec::CodecSetting setting, refit::codec::CodecFromConfig(cfg));
    return std::make_unique<XorEncoding>(setting.codec, setting.level);
  }

  // XOR needs the receiver's old bits: a full sync is for `dense`.
  uint64_t MaxEncodedSize(const refit_encode_input_t& in) const {
    if (!refit::sdk::CheckEncodeInput(in).ok() || refit::sdk::IsFullSync(in)) return 0;
    uint64_t stream = 0;
    if (!refit::deltas::StreamBytesBound(in, &stream)) return 0;
    // The body is the stream without its header (same gaps, same value bytes).
    const uint64_t body = stream - refit::deltas::kStreamHeaderBytes;
    const uint64_t bound = refit::codec::CompressBound(codec_, body);
    uint64_t total = 0;
    if ((bound == 0 && body > 0) || !CheckedAdd(bound, kHeaderBytes, &total)) return 0;
    return total;
  }

  Result<uint64_t> Encode(const refit_encode_input_t& in, uint8_t* out, uint64_t cap) const {
    REFIT_RETURN_NOT_OK(refit::sdk::CheckEncodeInput(in).status());
    if (refit::sdk::IsFullSync(in)) return refit::sdk::RefuseFullSync("xor");
    REFIT_RETURN_NOT_OK(refit::deltas::CheckPositions(in, "xor"));
    REFIT_ASSIGN_OR_RAISE(refit::deltas::StreamPlan plan, refit::deltas::PlanStream(in));
    if (cap < kHeaderBytes) return refit::sdk::OutputTooSmall(kHeaderBytes + 1, cap);
    const uint64_t k = in.n_changed;
    const uint64_t value_bytes = k * in.elem_size;  // fits: checked by PlanStream
    refit::kernels::UninitVector<uint8_t> body(plan.gap_bytes + value_bytes);  // written in full
    refit::kernels::EncodeGaps(in.positions, k, plan.gap_width, body.data());
    const uint8_t* old_values = refit::sdk::PackedOldValues(in);
    const uint8_t* new_values = refit::sdk::PackedNewValues(in);
    if (old_values != nullptr && new_values != nullptr) {
      refit::kernels::XorPlanesOfValues(old_values, new_values, in.elem_size, k,
                                        body.data() + plan.gap_bytes);
    } else {
      refit::kernels::GatherXorPlanes(in.old_bits, in.new_bits, in.elem_size, in.positions, k,
                                      body.data() + plan.gap_bytes);
    }
    Result<uint64_t> packed = refit::codec::Compress(codec_, level_, body.data(), body.size(),
                                                     out + kHeaderBytes, cap - kHeaderBytes);
    if (!packed.ok()) {
      return Status::Invalid(
          "xor: output buffer of " + std::to_string(cap) +
          " bytes is too small or compression failed: " + packed.status().message());
    }
    out[0] = kFormatVersion;
    out[1] = static_cast<uint8_t>(plan.gap_width);
    out[2] = static_cast<uint8_t>(codec_);
    out[3] = 0;
    StoreLE<uint64_t>(out + 4, k);
    StoreLE<uint64_t>(out + 12, plan.gap_bytes);
    return kHeaderBytes + *packed;
  }

  Status Decode(const uint8_t* payload, uint64_t len, const refit_decode_target_t& t) const {
    REFIT_RETURN_NOT_OK(refit::sdk::CheckDecodeTarget(t).status());
    if (len < kHeaderBytes || payload == nullptr) {
      return Status::Corrupt("xor payload has " + std::to_string(len) +
                             " bytes, shorter than its " + std::to_string(kHeaderBytes) +
                             "-byte header");
    }
    if (payload[0] != kFormatVersion) {
      return Status::Unsupported("xor payload format version " + std::to_string(payload[0]) +
                                 " (this build reads version " + std::to_string(kFormatVersion) +
                                 ")");
    }
    const uint32_t width = payload[1];
    Codec codec = Codec::kNone;
    if (!refit::codec::CodecFromByte(payload[2], &codec)) {
      return Status::Corrupt("xor payload codec " + std::to_string(payload[2]) +
                             " is not 0 (none), 1 (zstd) or 2 (lz4)");
    }
    if (payload[3] != 0) return Status::Corrupt("xor payload reserved header byte is not zero");
    const uint64_t k = LoadLE<uint64_t>(payload + 4);
    const uint64_t gap_bytes = LoadLE<uint64_t>(payload + 12);
    // The body size follows from the header; bound it by the target before allocating.
    uint64_t value_bytes = 0;
    uint64_t body_bytes = 0;
    uint64_t max_body = 0;
    if (k > t.n_elems || !CheckedMul(k, t.elem_size, &value_bytes) ||
        !CheckedAdd(gap_bytes, value_bytes, &body_bytes) ||
        !refit::deltas::MaxStreamBytes(t.n_elems, t.elem_size, &max_body) ||
        body_bytes > max_body) {
      return Status::Corrupt("xor payload header (" + std::to_string(k) + " changes, " +
                             std::to_string(gap_bytes) + " gap bytes) is impossible for a run of " +
                             std::to_string(t.n_elems) + " elements");
    }
    // + 1: a valid pointer even when empty; filled by Decompress or refused.
    refit::kernels::UninitVector<uint8_t> body(body_bytes + 1);
    Status st = refit::codec::Decompress(codec, payload + kHeaderBytes, len - kHeaderBytes,
                                         body.data(), body_bytes);
    if (!st.ok()) return Status::Corrupt("xor payload: " + st.message());
    refit::kernels::PositionList positions;
    REFIT_RETURN_NOT_OK(refit::deltas::DecodePositions(body.data(), gap_bytes, k, width, t.n_elems,
                                                       "xor payload", &positions));
    refit::kernels::UninitVector<uint8_t> xors(value_bytes + 1);  // written by MergeBytePlanes
    refit::kernels::MergeBytePlanes(body.data() + gap_bytes, k, t.elem_size, xors.data());
    refit::kernels::ScatterXor(t.bits, t.elem_size, positions.data(), k, xors.data());
    return Status::OK();
  }

 private:
  Codec codec_;
  int level_;
};

}  // namespace

REFIT_PLUGIN("xor", "0.1.0",
             refit::sdk::MakeEncoding<XorEncoding>(
                 "xor",
                 "gap-coded positions + byte planes of old XOR new, compressed (xor: applied "
                 "exactly once)",
                 &kKeys))
