// The `deltas_zstd` encoding: the `deltas` stream (plugins/common/deltas/deltas_stream.h)
// compressed in one zstd frame (or one lz4 block).
//
// Payload (all integers little-endian):
//   u8  format version (1)
//   u8  codec: 1 = zstd, 2 = lz4
//   u16 reserved (0)
//   u64 raw_size, the size of the deltas stream
//   the compressed deltas stream (exactly one frame, nothing after it)
#include <memory>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "deltas/deltas_stream.h"
#include "refit/kernels/buffer.h"
#include "refit/sdk/encoding_util.hpp"
#include "refit/sdk/plugin.hpp"

namespace {

using refit::Result;
using refit::Status;
using refit::codec::Codec;
using refit::sdk::LoadLE;
using refit::sdk::StoreLE;

constexpr uint8_t kFormatVersion = 1;
constexpr uint64_t kHeaderBytes = 12;

const refit_config_key_t kKeys[] = {
    {"codec", REFIT_CFG_STRING, "\"zstd\"", "compressor of the deltas stream: \"zstd\" or \"lz4\""},
    {"level", REFIT_CFG_INT, "1",
     "zstd level (negative: faster; 1..22: smaller); lz4 accepts only 1"},
};

class DeltasZstdEncoding {
 public:
  static constexpr refit_op_t kOp = REFIT_OP_OVERWRITE;
  // Relative cost of applying a record (zstd, then gap decoding); `auto` tries cheaper encodings
  // first.
  static constexpr uint32_t kApplyCost = 40;

  DeltasZstdEncoding(Codec codec, int level) : codec_(codec), level_(level) {}

  static Result<std::unique_ptr<DeltasZstdEncoding>> Create(const refit::sdk::ConfigView& cfg) {
    REFIT_ASSIGN_OR_RAISE(refit::codec::CodecSetting setting, refit::codec::CodecFromConfig(cfg));
    if (setting.codec == Codec::kNone) {
      return Status::Invalid(
          "config key 'codec' of deltas_zstd must be \"zstd\" or \"lz4\" "
          "(uncompressed is the `deltas` encoding)");
    }
    return std::make_unique<DeltasZstdEncoding>(setting.codec, setting.level);
  }

  uint64_t MaxEncodedSize(const refit_encode_input_t& in) const {
    if (!refit::sdk::CheckEncodeInput(in).ok() || refit::sdk::IsFullSync(in)) return 0;
    uint64_t stream = 0;
    if (!refit::deltas::StreamBytesBound(in, &stream)) return 0;
    const uint64_t bound = refit::codec::CompressBound(codec_, stream);
    uint64_t total = 0;
    if (bound == 0 || !refit::sdk::CheckedAdd(bound, kHeaderBytes, &total)) return 0;
    return total;
  }

  Result<uint64_t> Encode(const refit_encode_input_t& in, uint8_t* out, uint64_t cap) const {
    REFIT_RETURN_NOT_OK(refit::sdk::CheckEncodeInput(in).status());
    if (refit::sdk::IsFullSync(in)) return refit::sdk::RefuseFullSync("deltas_zstd");
    REFIT_RETURN_NOT_OK(refit::deltas::CheckPositions(in, "deltas_zstd"));
    REFIT_ASSIGN_OR_RAISE(refit::deltas::StreamPlan plan, refit::deltas::PlanStream(in));
    if (cap < kHeaderBytes) return refit::sdk::OutputTooSmall(kHeaderBytes + 1, cap);
    refit::kernels::UninitVector<uint8_t> raw(plan.total_bytes);  // written in full below
    refit::deltas::WriteStream(in, plan, raw.data());
    Result<uint64_t> body = refit::codec::Compress(codec_, level_, raw.data(), raw.size(),
                                                   out + kHeaderBytes, cap - kHeaderBytes);
    if (!body.ok()) {
      return Status::Invalid(
          "deltas_zstd: output buffer of " + std::to_string(cap) +
          " bytes is too small or compression failed: " + body.status().message());
    }
    out[0] = kFormatVersion;
    out[1] = static_cast<uint8_t>(codec_);
    StoreLE<uint16_t>(out + 2, 0);
    StoreLE<uint64_t>(out + 4, plan.total_bytes);
    return kHeaderBytes + *body;
  }

  // The payload's deltas stream, decompressed (its header checked, its size bounded by the run).
  static Result<refit::kernels::UninitVector<uint8_t>> Decompressed(
      const uint8_t* payload, uint64_t len, const refit_decode_target_t& t) {
    REFIT_RETURN_NOT_OK(refit::sdk::CheckDecodeTarget(t).status());
    if (len < kHeaderBytes || payload == nullptr) {
      return Status::Corrupt("deltas_zstd payload has " + std::to_string(len) +
                             " bytes, shorter than its " + std::to_string(kHeaderBytes) +
                             "-byte header");
    }
    if (payload[0] != kFormatVersion) {
      return Status::Unsupported("deltas_zstd payload format version " +
                                 std::to_string(payload[0]) + " (this build reads version " +
                                 std::to_string(kFormatVersion) + ")");
    }
    Codec codec = Codec::kNone;
    if (!refit::codec::CodecFromByte(payload[1], &codec) || codec == Codec::kNone) {
      return Status::Corrupt("deltas_zstd payload codec " + std::to_string(payload[1]) +
                             " is not 1 (zstd) or 2 (lz4)");
    }
    if (LoadLE<uint16_t>(payload + 2) != 0) {
      return Status::Corrupt("deltas_zstd payload reserved header bytes are not zero");
    }
    const uint64_t raw_size = LoadLE<uint64_t>(payload + 4);
    // Bounds the allocation by the target, whatever the header claims.
    uint64_t max_raw = 0;
    if (!refit::deltas::MaxStreamBytes(t.n_elems, t.elem_size, &max_raw) || raw_size > max_raw ||
        raw_size < refit::deltas::kStreamHeaderBytes) {
      return Status::Corrupt("deltas_zstd payload claims a " + std::to_string(raw_size) +
                             "-byte deltas stream, impossible for a run of " +
                             std::to_string(t.n_elems) + " elements");
    }
    refit::kernels::UninitVector<uint8_t> raw(raw_size);  // filled by Decompress or refused
    Status st = refit::codec::Decompress(codec, payload + kHeaderBytes, len - kHeaderBytes,
                                         raw.data(), raw_size);
    if (!st.ok()) return Status::Corrupt("deltas_zstd payload: " + st.message());
    return raw;
  }

  Status Decode(const uint8_t* payload, uint64_t len, const refit_decode_target_t& t) const {
    REFIT_ASSIGN_OR_RAISE(refit::kernels::UninitVector<uint8_t> raw, Decompressed(payload, len, t));
    return refit::deltas::ApplyStream(raw.data(), raw.size(), t, "deltas_zstd payload stream");
  }

  Result<uint64_t> DecodeChanges(const uint8_t* payload, uint64_t len,
                                 const refit_decode_target_t& old, uint64_t* positions,
                                 uint8_t* values, uint64_t capacity) const {
    REFIT_ASSIGN_OR_RAISE(refit::kernels::UninitVector<uint8_t> raw,
                          Decompressed(payload, len, old));
    return refit::deltas::ListStream(raw.data(), raw.size(), old, "deltas_zstd payload stream",
                                     positions, values, capacity);
  }

 private:
  Codec codec_;
  int level_;
};

}  // namespace

REFIT_PLUGIN("deltas_zstd", "0.1.0",
             refit::sdk::MakeEncoding<DeltasZstdEncoding>(
                 "deltas_zstd",
                 "the deltas stream compressed with zstd (level configurable) or lz4 (overwrite)",
                 &kKeys))
