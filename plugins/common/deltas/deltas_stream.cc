#include "deltas/deltas_stream.h"

#include <cstring>
#include <string>

#include "refit/kernels/coding.h"
#include "refit/sdk/encoding_util.hpp"

namespace refit::deltas {

using sdk::CheckedAdd;
using sdk::CheckedMul;
using sdk::LoadLE;
using sdk::StoreLE;

Status CheckPositions(const refit_encode_input_t& in, const char* encoding) {
  uint64_t next_allowed = 0;
  for (uint64_t j = 0; j < in.n_changed; ++j) {
    const uint64_t pos = in.positions[j];
    if (pos < next_allowed || pos >= in.n_elems) {
      return Status::Invalid(std::string(encoding) + ": position " + std::to_string(j) + " (" +
                             std::to_string(pos) + ") is out of range [0, " +
                             std::to_string(in.n_elems) + ") or not strictly increasing");
    }
    next_allowed = pos + 1;
  }
  return Status::OK();
}

Result<StreamPlan> PlanStream(const refit_encode_input_t& in) {
  const kernels::GapStats stats = kernels::ComputeGapStats(in.positions, in.n_changed);
  StreamPlan plan;
  plan.gap_width = kernels::ChooseGapWidth(stats);
  // A gap takes at most 4 + 8 bytes: if k * 12 fits, the stream size below cannot overflow.
  uint64_t worst_gaps = 0;
  uint64_t values = 0;
  if (!CheckedMul(in.n_changed, 4 + kernels::kGapEscapeBytes, &worst_gaps) ||
      !CheckedMul(in.n_changed, in.elem_size, &values)) {
    return Status::Invalid(std::to_string(in.n_changed) + " changes overflow the payload size");
  }
  plan.gap_bytes = kernels::GapStreamBytes(stats, plan.gap_width);
  if (!CheckedAdd(kStreamHeaderBytes + plan.gap_bytes, values, &plan.total_bytes)) {
    return Status::Invalid(std::to_string(in.n_changed) + " changes overflow the payload size");
  }
  return plan;
}

void WriteStream(const refit_encode_input_t& in, const StreamPlan& plan, uint8_t* out) {
  out[0] = kStreamVersion;
  out[1] = static_cast<uint8_t>(plan.gap_width);
  StoreLE<uint16_t>(out + 2, 0);
  StoreLE<uint64_t>(out + 4, in.n_changed);
  StoreLE<uint64_t>(out + 12, plan.gap_bytes);
  uint8_t* gaps = out + kStreamHeaderBytes;
  kernels::EncodeGaps(in.positions, in.n_changed, plan.gap_width, gaps);
  kernels::GatherValues(in.new_bits, sdk::PackedNewValues(in), in.elem_size, in.positions,
                        in.n_changed, gaps + plan.gap_bytes);
}

bool StreamBytesBound(const refit_encode_input_t& in, uint64_t* bytes) {
  uint64_t per_change = 0;
  uint64_t body = 0;
  return CheckedAdd(1 + kernels::kGapEscapeBytes, in.elem_size, &per_change) &&
         CheckedMul(in.n_changed, per_change, &body) && CheckedAdd(body, kStreamHeaderBytes, bytes);
}

bool MaxStreamBytes(uint64_t n_elems, uint32_t elem_size, uint64_t* bytes) {
  uint64_t per_elem = 0;
  uint64_t body = 0;
  return CheckedAdd(4 + kernels::kGapEscapeBytes, elem_size, &per_elem) &&
         CheckedMul(n_elems, per_elem, &body) && CheckedAdd(body, kStreamHeaderBytes, bytes);
}

namespace {

// The gap stream's width, and k bounded by its bytes (checked before anything is allocated).
Status CheckGaps(uint64_t gap_bytes, uint64_t k, uint32_t width, uint64_t n_elems,
                 const char* what) {
  if (width != 1 && width != 2 && width != 4) {
    return Status::Corrupt(std::string(what) + " gap width " + std::to_string(width) +
                           " is not 1, 2 or 4");
  }
  // Every gap takes at least `width` bytes: this bounds k by the payload before allocating.
  if (k > n_elems || k > gap_bytes / width) {
    return Status::Corrupt(std::string(what) + " claims " + std::to_string(k) + " changes in " +
                           std::to_string(gap_bytes) + " gap bytes for a run of " +
                           std::to_string(n_elems) + " elements");
  }
  return Status::OK();
}

}  // namespace

Status DecodePositions(const uint8_t* gaps, uint64_t gap_bytes, uint64_t k, uint32_t width,
                       uint64_t n_elems, const char* what, kernels::PositionList* positions) {
  REFIT_RETURN_NOT_OK(CheckGaps(gap_bytes, k, width, n_elems, what));
  positions->resize(k);
  return DecodePositionsInto(gaps, gap_bytes, k, width, n_elems, what, positions->data());
}

Status DecodePositionsInto(const uint8_t* gaps, uint64_t gap_bytes, uint64_t k, uint32_t width,
                           uint64_t n_elems, const char* what, uint64_t* positions) {
  REFIT_RETURN_NOT_OK(CheckGaps(gap_bytes, k, width, n_elems, what));
  const kernels::GapDecodeResult r =
      kernels::DecodeGaps(gaps, gap_bytes, k, width, n_elems, positions);
  if (r.error != kernels::GapDecodeError::kOk) {
    return Status::Corrupt(std::string(what) + ": " + kernels::GapDecodeErrorText(r.error) +
                           " (gap " + std::to_string(r.index) + " of " + std::to_string(k) +
                           ", run of " + std::to_string(n_elems) + " elements)");
  }
  return Status::OK();
}

namespace {

// A stream's parts, its header checked against the run (positions not yet decoded).
struct StreamParts {
  uint32_t width = 0;
  uint64_t k = 0;
  const uint8_t* gaps = nullptr;
  uint64_t gap_bytes = 0;
  const uint8_t* values = nullptr;
};

Result<StreamParts> CheckStream(const uint8_t* stream, uint64_t len, const refit_decode_target_t& t,
                                const char* what) {
  if (len < kStreamHeaderBytes || stream == nullptr) {
    return Status::Corrupt(std::string(what) + " has " + std::to_string(len) +
                           " bytes, shorter than its " + std::to_string(kStreamHeaderBytes) +
                           "-byte header");
  }
  if (stream[0] != kStreamVersion) {
    return Status::Unsupported(std::string(what) + " format version " + std::to_string(stream[0]) +
                               " (this build reads version " + std::to_string(kStreamVersion) +
                               ")");
  }
  const uint32_t width = stream[1];
  if (LoadLE<uint16_t>(stream + 2) != 0) {
    return Status::Corrupt(std::string(what) + " reserved header bytes are not zero");
  }
  const uint64_t k = LoadLE<uint64_t>(stream + 4);
  const uint64_t gap_bytes = LoadLE<uint64_t>(stream + 12);
  uint64_t values = 0;
  uint64_t expected = 0;
  if (k > t.n_elems || !CheckedMul(k, t.elem_size, &values) ||
      !CheckedAdd(kStreamHeaderBytes, gap_bytes, &expected) ||
      !CheckedAdd(expected, values, &expected) || expected != len) {
    return Status::Corrupt(std::string(what) + " has " + std::to_string(len) +
                           " bytes, which does not match its header (" + std::to_string(k) +
                           " changes of " + std::to_string(t.elem_size) + "-byte elements, " +
                           std::to_string(gap_bytes) + " gap bytes, run of " +
                           std::to_string(t.n_elems) + " elements)");
  }
  return StreamParts{width, k, stream + kStreamHeaderBytes, gap_bytes,
                     stream + kStreamHeaderBytes + gap_bytes};
}

}  // namespace

Status ApplyStream(const uint8_t* stream, uint64_t len, const refit_decode_target_t& t,
                   const char* what) {
  REFIT_ASSIGN_OR_RAISE(StreamParts parts, CheckStream(stream, len, t, what));
  kernels::PositionList positions;
  REFIT_RETURN_NOT_OK(DecodePositions(parts.gaps, parts.gap_bytes, parts.k, parts.width, t.n_elems,
                                      what, &positions));
  kernels::ScatterOverwrite(t.bits, t.elem_size, positions.data(), parts.k, parts.values);
  return Status::OK();
}

Result<uint64_t> ListStream(const uint8_t* stream, uint64_t len, const refit_decode_target_t& old,
                            const char* what, uint64_t* positions, uint8_t* values,
                            uint64_t capacity) {
  REFIT_ASSIGN_OR_RAISE(StreamParts parts, CheckStream(stream, len, old, what));
  if (parts.k > capacity) {
    return sdk::MoreChangesThanDeclared(what, parts.k, capacity);
  }
  REFIT_RETURN_NOT_OK(DecodePositionsInto(parts.gaps, parts.gap_bytes, parts.k, parts.width,
                                          old.n_elems, what, positions));
  if (parts.k > 0) std::memcpy(values, parts.values, parts.k * old.elem_size);
  return parts.k;
}

}  // namespace refit::deltas
