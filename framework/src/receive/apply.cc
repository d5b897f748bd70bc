#include "receive/apply.h"

#include <algorithm>
#include <cstring>

#include "faults/faults.h"
#include "receive/journal.h"
#include "refit/kernels/diff.h"

namespace refit::internal {

// An xor/step record made exactly-once: decoded into scratch against a copy of the old bits and
// verified, then the elements it changes are journaled (an idempotent overwrite entry) before
// they are written into the target. A record an interrupted attempt journaled was replayed
// already and is skipped.
Status ApplyJournaled(const Payload& payload, size_t index, const Encoding& enc,
                      const std::string& where, TensorView& target, const Box& box,
                      std::vector<uint8_t>& scratch, ApplyJournal& journal, ApplyStats* stats) {
  const RecordHeader& r = payload.records()[index];
  const std::string id = payload.label() + "#" + std::to_string(index);
  if (journal.Has(id)) {
    if (stats != nullptr) ++stats->resumed_skipped_records;
    return Status::OK();
  }
  const uint32_t elem = SizeOf(r.dtype);
  const uint64_t bytes = BoxElements(box) * elem;
  scratch.resize(2 * bytes);
  uint8_t* old_bits = scratch.data();
  uint8_t* new_bits = scratch.data() + bytes;
  GatherBox(target.bytes(), target.shape, box, elem, old_bits);
  std::memcpy(new_bits, old_bits, bytes);
  refit_decode_target_t t{};
  t.struct_size = sizeof(t);
  t.dtype = static_cast<int32_t>(r.dtype);
  t.elem_size = elem;
  t.n_elems = BoxElements(box);
  t.bits = new_bits;
  REFIT_RETURN_NOT_OK(
      enc.Decode(payload.record_bytes(r), r.data_end - r.data_begin, t).WithContext(where));
  const uint64_t digest = kernels::Digest64(new_bits, bytes);
  if (digest != r.digest) {
    return Status::Corrupt(where + ": digest mismatch after apply (expected " +
                           HexDigest(r.digest) + ", got " + HexDigest(digest) + ")");
  }
  std::vector<uint64_t> positions;
  kernels::DiffPositions(old_bits, new_bits, t.n_elems, elem, &positions);
  std::vector<uint8_t> values(positions.size() * elem);
  for (size_t k = 0; k < positions.size(); ++k) {
    std::memcpy(values.data() + k * elem, new_bits + positions[k] * elem, elem);
  }
  REFIT_RETURN_NOT_OK(
      journal.Append(id, target.name, box, elem, positions, values.data()).WithContext(where));
  if (stats != nullptr) ++stats->journaled_records;
  MaybeKillAt("receiver.journaled");
  ScatterBox(new_bits, target.shape, box, elem, target.bytes());
  return Status::OK();
}

namespace {

// Every rejection is one line naming the payload, the record and its tensor (names were checked
// printable by Payload::Parse).
std::string RecordWhere(const Payload& payload, size_t index) {
  return payload.label() + ": record " + std::to_string(index) + " ('" +
         payload.records()[index].tensor + "')";
}

// The resolved target fits the record: same dtype, a box of the record's extent inside the
// tensor, and no larger than the receiver's cap.
Status CheckTarget(const Payload& payload, size_t index, const TensorView& target, const Box& box,
                   uint64_t max_record_bytes) {
  const RecordHeader& r = payload.records()[index];
  if (target.dtype != r.dtype) {
    return Status::Corrupt(RecordWhere(payload, index) + ": record is " +
                           std::string(NameOf(r.dtype)) + " but the target tensor is " +
                           std::string(NameOf(target.dtype)));
  }
  if (box.extent != r.box_extent || box.offset.size() != target.shape.size()) {
    return Status::Internal(RecordWhere(payload, index) +
                            ": resolver returned a box of another extent");
  }
  for (size_t d = 0; d < box.offset.size(); ++d) {
    if (box.offset[d] > target.shape[d] || box.extent[d] > target.shape[d] - box.offset[d]) {
      return Status::Corrupt(RecordWhere(payload, index) + ": box at " + ShapeToString(box.offset) +
                             " of extent " + ShapeToString(box.extent) +
                             " falls outside target tensor '" + target.name + "' " +
                             ShapeToString(target.shape));
    }
  }
  const uint32_t elem = SizeOf(r.dtype);
  const uint64_t n = BoxElements(box);
  if (n > max_record_bytes / elem) {
    return Status::Invalid(RecordWhere(payload, index) + ": box of " + std::to_string(n * elem) +
                           " bytes exceeds the receiver cap of " +
                           std::to_string(max_record_bytes) + " (lower the sender chunk_bytes)");
  }
  return Status::OK();
}

// Decodes a record straight into the target (through scratch when its box is not contiguous)
// and verifies the digest of the result.
Status ApplyInPlace(const Payload& payload, size_t index, const Encoding& enc, TensorView& target,
                    const Box& box, std::vector<uint8_t>& scratch) {
  const RecordHeader& r = payload.records()[index];
  const uint32_t elem = SizeOf(r.dtype);
  const uint64_t n = BoxElements(box);
  const bool contiguous = BoxIsContiguous(target.shape, box);
  uint8_t* bits;
  if (contiguous) {
    bits = target.bytes() + BoxStartElement(target.shape, box) * elem;
  } else {
    scratch.resize(n * elem);
    GatherBox(target.bytes(), target.shape, box, elem, scratch.data());
    bits = scratch.data();
  }
  refit_decode_target_t t{};
  t.struct_size = sizeof(t);
  t.dtype = static_cast<int32_t>(r.dtype);
  t.elem_size = elem;
  t.n_elems = n;
  t.bits = bits;
  REFIT_RETURN_NOT_OK(enc.Decode(payload.record_bytes(r), r.data_end - r.data_begin, t)
                          .WithContext(RecordWhere(payload, index)));
  uint64_t digest = kernels::Digest64(bits, n * elem);
  if (digest != r.digest) {
    return Status::Corrupt(RecordWhere(payload, index) +
                           ": digest mismatch after apply (expected " + HexDigest(r.digest) +
                           ", got " + HexDigest(digest) + ")");
  }
  if (!contiguous) ScatterBox(bits, target.shape, box, elem, target.bytes());
  return Status::OK();
}

}  // namespace

Status ApplyPayload(const Payload& payload, EncodingCache& encodings, const TensorResolver& resolve,
                    uint64_t max_record_bytes, std::vector<uint8_t>& scratch, ApplyStats* stats,
                    ApplyJournal* journal) {
  const auto& records = payload.records();
  for (size_t i = 0; i < records.size(); ++i) {
    const RecordHeader& r = records[i];
    Result<ApplyTarget> target_r = resolve(r);
    if (!target_r.ok()) return target_r.status().WithContext(RecordWhere(payload, i));
    if (target_r.value().tensor == nullptr) continue;  // another receiver shard's record
    TensorView& target = *target_r.value().tensor;
    const Box& box = target_r.value().box;
    REFIT_RETURN_NOT_OK(CheckTarget(payload, i, target, box, max_record_bytes));
    Result<const Encoding*> enc_r = encodings.Get(r.encoding);
    if (!enc_r.ok()) return enc_r.status().WithContext(RecordWhere(payload, i));
    const Encoding* enc = enc_r.value();
    if (enc->op() != r.op) {
      return Status::Corrupt(RecordWhere(payload, i) + ": op does not match encoding '" +
                             r.encoding + "'");
    }
    if (journal != nullptr && r.op != REFIT_OP_OVERWRITE) {
      REFIT_RETURN_NOT_OK(ApplyJournaled(payload, i, *enc, RecordWhere(payload, i), target, box,
                                         scratch, *journal, stats));
    } else {
      REFIT_RETURN_NOT_OK(ApplyInPlace(payload, i, *enc, target, box, scratch));
    }
    if (stats != nullptr) {
      ++stats->counters.records;
      stats->counters.changed_elements += r.changed;
    }
  }
  return Status::OK();
}

TensorResolver CanonicalResolver(std::map<std::string, TensorView*> tensors) {
  return [tensors = std::move(tensors)](const RecordHeader& r) -> Result<ApplyTarget> {
    auto it = tensors.find(r.tensor);
    if (it == tensors.end()) {
      return Status::NotFound("tensor '" + r.tensor + "' does not exist in the receiver's model");
    }
    if (it->second->shape != r.shape) {
      return Status::Corrupt("record shape " + ShapeToString(r.shape) +
                             " differs from the receiver's " + ShapeToString(it->second->shape));
    }
    return ApplyTarget{it->second, Box{r.box_offset, r.box_extent}};
  };
}

}  // namespace refit::internal
