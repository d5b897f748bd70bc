// The `deltas` encoding: gap-coded positions of the changed elements (narrowest width, escapes for
// long gaps), then their new bits. The stream format is plugins/common/deltas/deltas_stream.h,
// shared with deltas_zstd.
#include <memory>

#include "deltas/deltas_stream.h"
#include "refit/sdk/encoding_util.hpp"
#include "refit/sdk/plugin.hpp"

namespace {

using refit::Result;
using refit::Status;

class DeltasEncoding {
 public:
  static constexpr refit_op_t kOp = REFIT_OP_OVERWRITE;
  // Relative cost of applying a record (gap decoding before the scatter); `auto` tries cheaper
  // encodings first.
  static constexpr uint32_t kApplyCost = 30;

  static Result<std::unique_ptr<DeltasEncoding>> Create(const refit::sdk::ConfigView& /*cfg*/) {
    return std::make_unique<DeltasEncoding>();
  }

  uint64_t MaxEncodedSize(const refit_encode_input_t& in) const {
    if (!refit::sdk::CheckEncodeInput(in).ok() || refit::sdk::IsFullSync(in)) return 0;
    Result<refit::deltas::StreamPlan> plan = refit::deltas::PlanStream(in);
    return plan.ok() ? plan->total_bytes : 0;
  }

  Result<uint64_t> Encode(const refit_encode_input_t& in, uint8_t* out, uint64_t cap) const {
    REFIT_RETURN_NOT_OK(refit::sdk::CheckEncodeInput(in).status());
    if (refit::sdk::IsFullSync(in)) return refit::sdk::RefuseFullSync("deltas");
    REFIT_RETURN_NOT_OK(refit::deltas::CheckPositions(in, "deltas"));
    REFIT_ASSIGN_OR_RAISE(refit::deltas::StreamPlan plan, refit::deltas::PlanStream(in));
    if (plan.total_bytes > cap) return refit::sdk::OutputTooSmall(plan.total_bytes, cap);
    refit::deltas::WriteStream(in, plan, out);
    return plan.total_bytes;
  }

  Status Decode(const uint8_t* payload, uint64_t len, const refit_decode_target_t& t) const {
    REFIT_RETURN_NOT_OK(refit::sdk::CheckDecodeTarget(t).status());
    return refit::deltas::ApplyStream(payload, len, t, "deltas payload");
  }

  Result<uint64_t> DecodeChanges(const uint8_t* payload, uint64_t len,
                                 const refit_decode_target_t& old, uint64_t* positions,
                                 uint8_t* values, uint64_t capacity) const {
    REFIT_RETURN_NOT_OK(refit::sdk::CheckDecodeTarget(old).status());
    return refit::deltas::ListStream(payload, len, old, "deltas payload", positions, values,
                                     capacity);
  }
};

}  // namespace

REFIT_PLUGIN("deltas", "0.1.0",
             refit::sdk::MakeEncoding<DeltasEncoding>(
                 "deltas",
                 "gap-coded positions (u8/u16/u32 with escapes) + new bits of the changed "
                 "elements (overwrite)"))
