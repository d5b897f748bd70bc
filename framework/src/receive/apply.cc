#include "receive/apply.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <mutex>

#include "common/file_util.h"
#include "common/stopwatch.h"
#include "common/worker_pool.h"
#include "faults/faults.h"
#include "receive/journal.h"
#include "refit/kernels/coding.h"
#include "refit/kernels/diff.h"

namespace refit::internal {

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

// Record r's run of n elements at `bits`, as an encoding's decode functions take it.
refit_decode_target_t RecordTarget(const RecordHeader& r, uint8_t* bits, uint64_t n) {
  refit_decode_target_t t{};
  t.struct_size = sizeof(t);
  t.dtype = static_cast<int32_t>(r.dtype);
  t.elem_size = SizeOf(r.dtype);
  t.n_elems = n;
  t.bits = bits;
  return t;
}

// Decodes record `index` over `bits` (n elements holding the box's current bits) in place.
Status DecodeRecord(const Payload& payload, size_t index, const Encoding& enc, uint8_t* bits,
                    uint64_t n) {
  const RecordHeader& r = payload.records()[index];
  return enc.Decode(payload.record_bytes(r), r.data_end - r.data_begin, RecordTarget(r, bits, n))
      .WithContext(RecordWhere(payload, index));
}

Status DigestMismatch(const Payload& payload, size_t index, uint64_t got) {
  return Status::Corrupt(RecordWhere(payload, index) + ": digest mismatch after apply (expected " +
                         HexDigest(payload.records()[index].digest) + ", got " + HexDigest(got) +
                         ")");
}

// A model file at least this many times a record's size is read and written through the file
// (below, the per-thread buffer would cost more page faults than the mapping's pages).
constexpr uint64_t kReadThroughRecords = 16;

// Decodes a record into scratch and writes it through its model file (file_util.h): a fresh page
// of a shared mapping costs a fault per 4 KiB, which a full sync into a new model file pays for
// every page. The old bits are read first unless the record overwrites every element; nothing
// is written unless the digest holds.
Status ApplyThroughFile(const Payload& payload, size_t index, const Encoding& enc,
                        const FileRange& file, uint64_t n, ApplyScratch& scratch) {
  const RecordHeader& r = payload.records()[index];
  const uint64_t bytes = n * SizeOf(r.dtype);
  if (scratch.size() < bytes) kernels::ResizeDiscarding(scratch, bytes);
  if (r.op != REFIT_OP_OVERWRITE || r.changed != n) {
    REFIT_RETURN_NOT_OK(
        PreadMapped(file, scratch.data(), bytes).WithContext(RecordWhere(payload, index)));
  }
  REFIT_RETURN_NOT_OK(DecodeRecord(payload, index, enc, scratch.data(), n));
  const uint64_t digest = kernels::Digest64(scratch.data(), bytes);
  if (digest != r.digest) return DigestMismatch(payload, index, digest);
  return PwriteMapped(file, scratch.data(), bytes).WithContext(RecordWhere(payload, index));
}

// Decodes a record straight into the target (through scratch when its box is not contiguous, or
// lies in a large model file) and verifies the digest of the result.
Status ApplyInPlace(const Payload& payload, size_t index, const Encoding& enc, TensorView& target,
                    const Box& box, ApplyScratch& scratch) {
  const RecordHeader& r = payload.records()[index];
  const uint32_t elem = SizeOf(r.dtype);
  const uint64_t n = BoxElements(box);
  const bool contiguous = BoxIsContiguous(target.shape, box);
  uint8_t* bits;
  FileRange file;
  if (contiguous &&
      FindMappedFile(target.bytes() + BoxStartElement(target.shape, box) * elem, n * elem, &file) &&
      file.writable && file.file_size >= kReadThroughRecords * n * elem) {
    return ApplyThroughFile(payload, index, enc, file, n, scratch);
  }
  if (contiguous) {
    bits = target.bytes() + BoxStartElement(target.shape, box) * elem;
  } else {
    kernels::ResizeDiscarding(scratch, n * elem);
    GatherBox(target.bytes(), target.shape, box, elem, scratch.data());
    bits = scratch.data();
  }
  REFIT_RETURN_NOT_OK(DecodeRecord(payload, index, enc, bits, n));
  uint64_t digest = kernels::Digest64(bits, n * elem);
  if (digest != r.digest) return DigestMismatch(payload, index, digest);
  if (!contiguous) ScatterBox(bits, target.shape, box, elem, target.bytes());
  return Status::OK();
}

}  // namespace

namespace {

// A record ready to apply: where it lands and the encoding that decodes it.
struct CheckedRecord {
  TensorView* tensor = nullptr;  // null: another receiver shard's record
  Box box;
  const Encoding* encoding = nullptr;
};

Result<std::vector<CheckedRecord>> CheckRecords(const Payload& payload, EncodingCache& encodings,
                                                const TensorResolver& resolve,
                                                uint64_t max_record_bytes) {
  const auto& records = payload.records();
  std::vector<CheckedRecord> checked(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    const RecordHeader& r = records[i];
    Result<ApplyTarget> target = resolve(r);
    if (!target.ok()) return target.status().WithContext(RecordWhere(payload, i));
    if (target.value().tensor == nullptr) continue;
    checked[i].tensor = target.value().tensor;
    checked[i].box = target.value().box;
    REFIT_RETURN_NOT_OK(
        CheckTarget(payload, i, *checked[i].tensor, checked[i].box, max_record_bytes));
    Result<const Encoding*> enc = encodings.Get(r.encoding);
    if (!enc.ok()) return enc.status().WithContext(RecordWhere(payload, i));
    if (enc.value()->op() != r.op) {
      return Status::Corrupt(RecordWhere(payload, i) + ": op does not match encoding '" +
                             r.encoding + "'");
    }
    checked[i].encoding = enc.value();
  }
  return checked;
}

}  // namespace

namespace {

// Applies records in `order`, each taken by the next free stripe (`next` counts the taken ones),
// counting into `stats` (this stripe's own); stops at the first failure and returns it with its
// record index (the other stripes then take no more records).
struct StripeResult {
  Status status;
  size_t failed_index = SIZE_MAX;
  ApplyStats stats;
};

struct StripeQueue {
  std::vector<size_t> order;  // record indices, largest first with several stripes
  std::atomic<size_t> next{0};
};

// A record's id in the log, and among attached memory's applied records: its payload's label and
// its index there.
std::string LogId(const std::string& label, size_t index) {
  return label + "#" + std::to_string(index);
}

void ApplyStripe(const Payload& payload, const std::vector<CheckedRecord>& checked,
                 StripeQueue& queue, ApplySink* sink, std::mutex& mu, ApplyScratch& scratch,
                 StripeResult* out) {
  const auto& records = payload.records();
  for (size_t k = queue.next.fetch_add(1); k < queue.order.size(); k = queue.next.fetch_add(1)) {
    const size_t i = queue.order[k];
    const RecordHeader& r = records[i];
    const CheckedRecord& c = checked[i];
    if (c.tensor == nullptr) continue;
    std::string id;
    if (sink != nullptr && sink->applied_ids != nullptr) {
      id = LogId(payload.label(), i);
      std::lock_guard<std::mutex> lock(mu);
      if (sink->applied_ids->count(id) != 0) {
        ++out->stats.resumed_skipped_records;
        continue;
      }
    }
    Status st = ApplyInPlace(payload, i, *c.encoding, *c.tensor, c.box, scratch);
    if (!st.ok()) {
      out->status = st;
      out->failed_index = i;
      queue.next.store(queue.order.size());
      return;
    }
    if (sink != nullptr && (sink->coverage != nullptr || sink->applied || !id.empty())) {
      std::lock_guard<std::mutex> lock(mu);
      if (!id.empty()) sink->applied_ids->insert(id);
      if (sink->coverage != nullptr) sink->coverage->Add(*c.tensor, c.box);
      if (sink->applied) sink->applied(*c.tensor, c.box, r.digest);
    }
    ++out->stats.counters.records;
    out->stats.counters.changed_elements += r.changed;
  }
}

}  // namespace

namespace {

// The order records are applied in: as written with one stripe; with several, largest box first
// (ties in payload order), so that the last records taken are small and the stripes end together.
std::vector<size_t> RecordOrder(const Payload& payload, size_t stripes) {
  const auto& records = payload.records();
  std::vector<size_t> order(records.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (stripes <= 1) return order;
  std::vector<uint64_t> bytes(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    uint64_t n = 1;
    for (uint64_t e : records[i].box_extent) n *= e;
    bytes[i] = n * SizeOf(records[i].dtype);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });
  return order;
}

// One record's effect on its target, computed and verified but not yet written: the positions
// (box-relative) of the elements it changes and their new bits. Listed changes (decode_changes)
// are in the record's slice of its window's buffers; a record decoded in place diffs into its own.
struct RecordChanges {
  const uint64_t* positions = nullptr;  // `count` of them, ascending
  const uint8_t* values = nullptr;      // packed, elem bytes each
  uint64_t count = 0;
  uint64_t* listed_positions = nullptr;  // room for the changes the header declares
  uint8_t* listed_values = nullptr;
  kernels::PositionList own_positions;  // a record decoded in place (not listed)
  kernels::ValueList own_values;
  bool logged_before = false;  // an interrupted attempt logged it: replayed, not applied again
  double decode_seconds = 0;
  double verify_seconds = 0;
};

// Room for the changes a record's header declares (a payload coding more is refused), at most its
// element count.
uint64_t ListCapacity(const RecordHeader& r, uint64_t n) {
  return std::min<uint64_t>(r.changed, n);
}

// The record's verification while its changes are listed (decode_changes' progress, ABI 1.7):
// each block of old bits is digested with its changes patched in just after the decoder read it.
struct ListingVerify {
  ListingVerify(const uint8_t* old_bits, uint64_t n, uint32_t elem, const uint64_t* positions,
                const uint8_t* values, uint64_t capacity)
      : digester(old_bits, n, elem, positions, values, capacity) {}
  kernels::PatchedDigester digester;
  double seconds = 0;  // spent digesting inside the decode
};

void OnListed(void* user, uint64_t done, uint64_t listed) {
  auto* verify = static_cast<ListingVerify*>(user);
  Stopwatch clock;
  verify->digester.Advance(done, listed);
  verify->seconds += clock.Seconds();
}

// The encoding lists the record's changes against the old bits (decode_changes), which are
// verified by digesting the old bits with the changes patched in, block by block in cache: as
// the encoding reports its progress (else once it returns), so the old bits are read once. No
// copy of the record. Unsupported: this payload decodes in place only.
Status ListChanges(const Payload& payload, size_t index, const Encoding& enc,
                   const uint8_t* old_bits, uint64_t n, const Stopwatch& decode,
                   RecordChanges* out) {
  const RecordHeader& r = payload.records()[index];
  const uint32_t elem = SizeOf(r.dtype);
  // Room for the changes the header declares (a payload coding more is refused), at most n.
  const uint64_t capacity = ListCapacity(r, n);
  // Read only: decode_changes never writes the target.
  const refit_decode_target_t old = RecordTarget(r, const_cast<uint8_t*>(old_bits), n);
  ListingVerify verify(old_bits, n, elem, out->listed_positions, out->listed_values, capacity);
  refit_decoded_changes_t listed{};
  listed.struct_size = sizeof(listed);
  listed.capacity = capacity;
  listed.positions = out->listed_positions;
  listed.values = out->listed_values;
  listed.progress = &OnListed;
  listed.progress_user = &verify;
  Status st = enc.DecodeChanges(payload.record_bytes(r), r.data_end - r.data_begin, old, &listed);
  if (!st.ok())
    return st.code() == StatusCode::kUnsupported ? st : st.WithContext(RecordWhere(payload, index));
  out->positions = out->listed_positions;
  out->values = out->listed_values;
  out->count = listed.count;
  out->decode_seconds = decode.Seconds() - verify.seconds;
  Stopwatch rest;
  const kernels::PatchedDigest pd = verify.digester.Finish(listed.count);
  out->verify_seconds = verify.seconds + rest.Seconds();
  if (!pd.positions_valid) {
    return Status::Internal(RecordWhere(payload, index) + ": encoding '" + enc.name() +
                            "' listed positions that are not ascending or fall outside the record");
  }
  if (pd.digest != r.digest) return DigestMismatch(payload, index, pd.digest);
  return Status::OK();
}

// Decodes a record into its verified changes against the target's current bits (read where they
// are when the box is contiguous, else gathered into scratch): listed by the encoding when it
// can, else decoded into a scratch copy of the old bits and diffed and digested in one pass.
Status ComputeChanges(const Payload& payload, size_t index, const Encoding& enc,
                      const TensorView& target, const Box& box, ApplyScratch& scratch,
                      RecordChanges* out) {
  const RecordHeader& r = payload.records()[index];
  const uint32_t elem = SizeOf(r.dtype);
  const uint64_t n = BoxElements(box);
  const uint64_t bytes = n * elem;
  const bool contiguous = BoxIsContiguous(target.shape, box);
  out->count = 0;
  Stopwatch decode;
  // The old bits when they are copied ([0, bytes): a gathered box, or a model file's bits read
  // through the file, file_util.h), then the decoded copy when the record is decoded in place.
  // Only what is used is touched: a fresh page costs a fault.
  const auto need_scratch = [&](uint64_t size) {
    if (scratch.size() < size) scratch.resize(size);  // keeps the old bits copied first
  };
  const uint8_t* old_bits = target.bytes() + BoxStartElement(target.shape, box) * elem;
  bool copied = true;
  FileRange file;
  // The buffer is faulted in once per thread and reused (a fresh page costs more than a file
  // page read through the mapping): worth it when the file is many records long and its
  // mapping is not populated already.
  if (contiguous && FindMappedFile(old_bits, bytes, &file) && !file.warm &&
      file.file_size >= kReadThroughRecords * bytes) {
    need_scratch(bytes);
    REFIT_RETURN_NOT_OK(
        PreadMapped(file, scratch.data(), bytes).WithContext(RecordWhere(payload, index)));
  } else if (!contiguous) {
    need_scratch(bytes);
    GatherBox(target.bytes(), target.shape, box, elem, scratch.data());
  } else {
    copied = false;  // memory: read where it is
  }
  if (copied) old_bits = scratch.data();
  if (enc.can_decode_changes()) {
    Status listed = ListChanges(payload, index, enc, old_bits, n, decode, out);
    if (listed.code() != StatusCode::kUnsupported) return listed;
    out->count = 0;
  }
  need_scratch(copied ? 2 * bytes : bytes);
  old_bits = copied ? scratch.data() : old_bits;  // the resize may have moved it
  uint8_t* new_bits = scratch.data() + (copied ? bytes : 0);
  std::memcpy(new_bits, old_bits, bytes);
  REFIT_RETURN_NOT_OK(DecodeRecord(payload, index, enc, new_bits, n));
  out->decode_seconds = decode.Seconds();
  Stopwatch verify;
  const kernels::DiffDigest dd = kernels::DiffPositionsAndDigest(
      old_bits, new_bits, n, elem, &out->own_positions, {nullptr, &out->own_values});
  out->positions = out->own_positions.data();
  out->values = out->own_values.data();
  out->count = out->own_positions.size();
  out->verify_seconds = verify.Seconds();
  if (dd.digest != r.digest) return DigestMismatch(payload, index, dd.digest);
  return Status::OK();
}

// Writes a record's verified changes into its target: only the changed elements are touched (a
// model file's through the file, file_util.h: OverwriteInMappedFile).
Status WriteChanges(const RecordChanges& c, TensorView& target, const Box& box, uint32_t elem) {
  return OverwriteBox(target, box, elem, c.positions, c.count, c.values);
}

// The most bytes of changes held (computed, not yet written) per window of records: two
// windows are held at once (one being logged while the next is computed). Small enough that a
// large payload is several windows, so only the last window's log sync is waited for whole.
constexpr uint64_t kMaxHeldChangeBytes = 8ull << 20;

// What record i's changes will hold once computed, from the count its header declares (records
// of another receiver shard hold nothing).
uint64_t DeclaredChangeBytes(const Payload& payload, const std::vector<CheckedRecord>& checked,
                             size_t i) {
  const RecordHeader& r = payload.records()[i];
  return checked[i].tensor == nullptr ? 0 : r.changed * (8 + SizeOf(r.dtype));
}

// Records [first, end) whose estimated changes (the changed count each header declares) fit
// kMaxHeldChangeBytes, at least one.
size_t WindowEnd(const Payload& payload, const std::vector<CheckedRecord>& checked, size_t first) {
  uint64_t held = 0;
  size_t end = first;
  for (; end < checked.size(); ++end) {
    const uint64_t bytes = DeclaredChangeBytes(payload, checked, end);
    if (end > first && held + bytes > kMaxHeldChangeBytes) break;
    held += bytes;
  }
  return end;
}

// Where a logged record's changes land and what is reported once they are written: a window
// outlives its payload when it is left as the tail (the tensors outlive both).
struct WindowRecord {
  TensorView* tensor = nullptr;  // null: another receiver shard's record
  Box box;
  uint32_t elem = 0;
  uint64_t changed = 0;
  uint64_t digest = 0;
};

// A window of records [first, end) and their verified changes.
struct Window {
  size_t first = 0;
  size_t end = 0;
  std::vector<RecordChanges> changes;
  // The listed changes of every record, each in its slice: two buffers per window, reused from
  // window to window, rather than two fresh ones per record.
  kernels::PositionList listed_positions;
  kernels::ValueList listed_values;
  std::vector<WindowRecord> records;  // filled when the window is staged to the log
  // Swapped into its targets before the commit (ComputeEarly's write_in_place): the changes'
  // values hold the targets' old bits. early_targets[i]: record first+i's target, a copy (the
  // tensor list it was computed over is gone by the commit); no data for none.
  bool written_early = false;
  std::vector<TensorView> early_targets;
  double compute_seconds = 0;
  // Thread seconds spent writing the previous window's changes in this window's compute section
  // (PreviousWindowWrite).
  double write_thread_seconds = 0;
};

// The previous window's changes, written by the stripes of the next window's compute section once
// they run out of records to compute (and the previous window's log sync has returned): the
// write of one window and the compute of the next share both cores rather than taking turns.
struct PreviousWindowWrite {
  Window* window = nullptr;
  std::future<Status>* syncing = nullptr;  // its log write and sync
  const std::string* label = nullptr;      // its payload's, for errors
  ApplyStats* stats = nullptr;             // where the sync's wait is counted
  std::once_flag waited;
  Status synced;                // what the sync returned (set once, under `waited`)
  std::vector<Status> failed;   // per record of the window
  std::atomic<size_t> next{0};  // records taken
  bool ran = false;             // the section ran (else the caller writes the window itself)
};

// Gives each record of the window that the receiver lists (decode_changes) its slice of the
// window's buffers, as large as its header declares.
void CutListSlices(const Payload& payload, const std::vector<CheckedRecord>& checked,
                   const std::vector<bool>& logged_before, Window& w) {
  const auto listed = [&](size_t i) {
    return checked[i].tensor != nullptr && !logged_before[i] &&
           checked[i].encoding->can_decode_changes();
  };
  uint64_t positions = 0, value_bytes = 0;
  for (size_t i = w.first; i < w.end; ++i) {
    if (!listed(i)) continue;
    const RecordHeader& r = payload.records()[i];
    const uint64_t capacity = ListCapacity(r, BoxElements(checked[i].box));
    positions += capacity;
    value_bytes += capacity * SizeOf(r.dtype);
  }
  kernels::ResizeDiscarding(w.listed_positions, positions);
  kernels::ResizeDiscarding(w.listed_values, value_bytes);
  positions = value_bytes = 0;
  for (size_t i = w.first; i < w.end; ++i) {
    RecordChanges& c = w.changes[i - w.first];
    c.listed_positions = nullptr;
    c.listed_values = nullptr;
    if (!listed(i)) continue;
    const RecordHeader& r = payload.records()[i];
    const uint64_t capacity = ListCapacity(r, BoxElements(checked[i].box));
    c.listed_positions = w.listed_positions.data() + positions;
    c.listed_values = w.listed_values.data() + value_bytes;
    positions += capacity;
    value_bytes += capacity * SizeOf(r.dtype);
  }
}

// Waits for the sync of the window logged last (`label`'s payload): its changes may be written
// from here, not before.
Status WaitLogged(std::future<Status>& syncing, const std::string& label, ApplyStats* stats) {
  Stopwatch wait;
  Status synced = syncing.get().WithContext(label);
  if (stats != nullptr) stats->log_sync_seconds += wait.Seconds();
  REFIT_RETURN_NOT_OK(synced);
  MaybeKillAt("receiver.journaled");
  return Status::OK();
}

// Writes record i of a logged window into its file (nothing for a record without a tensor or
// one an interrupted attempt logged, already written by the replay).
Status WriteLoggedRecord(const Window& w, size_t i) {
  const WindowRecord& r = w.records[i];
  if (r.tensor == nullptr || w.changes[i].logged_before) return Status::OK();
  return WriteChanges(w.changes[i], *r.tensor, r.box, r.elem);
}

// One stripe's part of writing the previous window: its log sync waited for once (by the first
// stripe to get here; the others wait for that), then the window's records taken one by one.
void WritePreviousWindow(PreviousWindowWrite& job) {
  std::call_once(job.waited, [&] { job.synced = WaitLogged(*job.syncing, *job.label, job.stats); });
  if (!job.synced.ok()) return;
  const Window& w = *job.window;
  for (size_t i = job.next.fetch_add(1); i < w.records.size(); i = job.next.fetch_add(1)) {
    job.failed[i] = WriteLoggedRecord(w, i);
  }
}

// Decodes and verifies a window's records in parallel stripes (into scratch, nothing written);
// with `write_prev`, the stripes then write the previous window's changes.
Status ComputeWindow(const Payload& payload, const std::vector<CheckedRecord>& checked,
                     const std::vector<bool>& logged_before,
                     const std::vector<size_t>& payload_order, ApplySink& sink,
                     ApplyScratch& scratch, Window& w, PreviousWindowWrite* write_prev = nullptr) {
  // Each window's buffers are reused (fresh ones cost a kernel page clear per 4 KiB).
  if (w.changes.size() < w.end - w.first) w.changes.resize(w.end - w.first);
  for (size_t i = 0; i < w.end - w.first; ++i) {
    RecordChanges& c = w.changes[i];
    c.count = 0;
    c.own_positions.clear();
    c.own_values.clear();
    c.logged_before = false;
    c.decode_seconds = c.verify_seconds = 0;
  }
  w.written_early = false;
  w.early_targets.clear();
  CutListSlices(payload, checked, logged_before, w);
  std::vector<Status> failures(w.end - w.first);
  const size_t stripes = sink.pool == nullptr ? 1 : std::min(sink.threads, w.end - w.first);
  // Each stripe takes the next record, largest first: records differ in size by 1000x.
  std::vector<size_t> order;
  for (size_t i : payload_order) {
    if (i >= w.first && i < w.end) order.push_back(i);
  }
  std::atomic<size_t> next{0};
  std::vector<double> write_seconds(std::max<size_t>(stripes, 1), 0.0);
  if (write_prev != nullptr) {
    write_prev->failed.assign(write_prev->window->records.size(), Status::OK());
    write_prev->ran = true;
  }
  Stopwatch compute;
  RunStripes(sink.pool, stripes, [&](size_t k) {
    thread_local ApplyScratch worker_scratch;
    ApplyScratch& own = k == 0 ? scratch : worker_scratch;
    for (size_t at = next.fetch_add(1); at < order.size(); at = next.fetch_add(1)) {
      const size_t i = order[at];
      const CheckedRecord& c = checked[i];
      RecordChanges& out = w.changes[i - w.first];
      if (c.tensor == nullptr) continue;
      out.logged_before = logged_before[i];
      if (out.logged_before) continue;
      failures[i - w.first] = ComputeChanges(payload, i, *c.encoding, *c.tensor, c.box, own, &out);
      if (!failures[i - w.first].ok()) {
        next.store(order.size());  // the others take no more
        break;
      }
    }
    // What is logged is also written, even when this window failed.
    if (write_prev != nullptr) {
      Stopwatch writing;
      WritePreviousWindow(*write_prev);
      write_seconds[k] = writing.Seconds();
    }
  });
  w.compute_seconds = compute.Seconds();
  w.write_thread_seconds = 0;
  for (double seconds : write_seconds) w.write_thread_seconds += seconds;
  for (const Status& st : failures) REFIT_RETURN_NOT_OK(st);
  return Status::OK();
}

// A record's changed values, writable: they lie in the window's own buffers.
uint8_t* MutableValues(RecordChanges& c) {
  return c.values == c.listed_values ? c.listed_values : c.own_values.data();
}

// Exchanges the changed elements of a box with `values` (attached memory: plain stores).
void SwapBox(const TensorView& tensor, const Box& box, uint32_t elem, const uint64_t* positions,
             uint64_t count, uint8_t* values) {
  uint8_t* bytes = tensor.bytes();
  if (BoxIsContiguous(tensor.shape, box)) {
    kernels::ScatterSwap(bytes + BoxStartElement(tensor.shape, box) * elem, elem, positions, count,
                         values);
    return;
  }
  uint8_t old_bits[8];
  for (uint64_t i = 0; i < count; ++i) {
    uint8_t* at = bytes + BoxElementIndex(tensor.shape, box, positions[i]) * elem;
    std::memcpy(old_bits, at, elem);
    std::memcpy(at, values + i * elem, elem);
    std::memcpy(values + i * elem, old_bits, elem);
  }
}

// Swaps a window written early with its targets, on `stripes` threads of `pool`: the first time
// its changes go in and its buffers get the old bits, the second time both are back.
void SwapWindow(Window& w, WorkerPool* pool, size_t stripes) {
  const size_t count = w.early_targets.size();
  stripes = pool == nullptr ? 1 : std::max<size_t>(1, std::min(stripes, count));
  RunStripes(pool, stripes, [&](size_t k) {
    for (size_t i = k; i < count; i += stripes) {
      RecordChanges& c = w.changes[i];
      if (w.early_targets[i].data == nullptr || c.count == 0) continue;
      SwapBox(w.early_targets[i], w.records[i].box, w.records[i].elem, c.positions, c.count,
              MutableValues(c));
    }
  });
}

// A window written early that the commit did not take: its targets' old bits go back.
void PutBackEarly(Window& w) {
  if (!w.written_early) return;
  SwapWindow(w, nullptr, 1);
  w.written_early = false;
}

// Keeps where a computed window's records land (a window may outlive its payload as the tail).
void KeepTargets(const Payload& payload, const std::vector<CheckedRecord>& checked, Window& w) {
  w.records.resize(w.end - w.first);
  for (size_t i = w.first; i < w.end; ++i) {
    const RecordHeader& r = payload.records()[i];
    w.records[i - w.first] = {checked[i].tensor, checked[i].box, SizeOf(r.dtype), r.changed,
                              r.digest};
  }
}

// Stages a window's entries in the log, then writes and syncs them (on the log's own thread,
// while the caller writes the previous window and computes the next).
Status LogWindow(const std::string& label, RedoLog& log, const Window& w) {
  for (size_t i = 0; i < w.records.size(); ++i) {
    const WindowRecord& r = w.records[i];
    const RecordChanges& c = w.changes[i];
    if (r.tensor == nullptr || c.logged_before) continue;
    REFIT_RETURN_NOT_OK(log.Stage(LogId(label, w.first + i), r.tensor->name, r.box, r.elem,
                                  c.positions, c.count, c.values));
  }
  return log.Flush();
}

// After a logged window's writes: the first failure, else its records reported.
Status ReportWritten(ApplySink& sink, const Window& w, const std::vector<Status>& failed,
                     ApplyStats* stats) {
  const size_t count = w.records.size();
  // The changes are logged: a failed write leaves the version to the log's replay.
  for (const Status& st : failed) REFIT_RETURN_NOT_OK(st);
  for (size_t i = 0; i < count; ++i) {
    const WindowRecord& r = w.records[i];
    if (r.tensor == nullptr) continue;
    if (stats != nullptr) {
      ++(w.changes[i].logged_before ? stats->resumed_skipped_records : stats->journaled_records);
      ++stats->counters.records;
      stats->counters.changed_elements += r.changed;
    }
    if (sink.coverage != nullptr) sink.coverage->Add(*r.tensor, r.box);
    if (sink.applied) sink.applied(*r.tensor, r.box, r.digest);
  }
  return Status::OK();
}

// Writes a window's changes into their targets on the sink's threads (records marked
// logged_before are left alone); what each record's write returned.
std::vector<Status> WriteWindowChanges(ApplySink& sink, const Window& w, ApplyStats* stats) {
  const size_t count = w.records.size();
  const size_t stripes = sink.pool == nullptr ? 1 : std::min(sink.threads, count);
  std::vector<Status> failed(count);
  Stopwatch write;
  RunStripes(sink.pool, stripes, [&](size_t k) {
    for (size_t i = k; i < count; i += stripes) failed[i] = WriteLoggedRecord(w, i);
  });
  if (stats != nullptr) stats->write_seconds += write.Seconds();
  return failed;
}

// Writes a logged (synced) window's changes into the file, then reports its records.
Status WriteWindow(ApplySink& sink, const Window& w, ApplyStats* stats) {
  return ReportWritten(sink, w, WriteWindowChanges(sink, w, stats), stats);
}

void AddComputeStats(const Window& w, ApplyStats* stats) {
  if (stats == nullptr) return;
  double decode = 0, verify = 0;
  for (size_t i = 0; i < w.end - w.first; ++i) {
    decode += w.changes[i].decode_seconds;
    verify += w.changes[i].verify_seconds;
  }
  // Stripes overlap (and write the previous window): the section's wall time is split by the
  // stages' shares of thread time.
  const double thread_seconds = decode + verify + w.write_thread_seconds;
  if (thread_seconds <= 0) {
    stats->decode_seconds += w.compute_seconds;
    return;
  }
  stats->decode_seconds += w.compute_seconds * decode / thread_seconds;
  stats->verify_seconds += w.compute_seconds * verify / thread_seconds;
  stats->write_seconds += w.compute_seconds * w.write_thread_seconds / thread_seconds;
}

}  // namespace

struct EarlyWindows {
  std::vector<std::unique_ptr<Window>> windows;  // a taken one is swapped for a spare
  WindowStash* stash = nullptr;                  // where they go back when dropped
};

struct WindowStash {
  std::vector<std::unique_ptr<Window>> windows;
};

void WindowStashDeleter::operator()(WindowStash* stash) const { delete stash; }

WindowStashPtr MakeWindowStash() { return WindowStashPtr(new WindowStash()); }

namespace {

// Two windows are in use at once (one logged, one computed), and those a receiver computed
// before the commit (receiver.early_bytes): no more than this many are kept.
constexpr size_t kStashedWindows = 16;

std::unique_ptr<Window> TakeWindow(WindowStash* stash) {
  if (stash == nullptr || stash->windows.empty()) return std::make_unique<Window>();
  std::unique_ptr<Window> w = std::move(stash->windows.back());
  stash->windows.pop_back();
  return w;
}

// `w` must be done with: logged, written, its log sync returned.
void ReturnWindow(WindowStash* stash, std::unique_ptr<Window> w) {
  if (stash != nullptr && w != nullptr && stash->windows.size() < kStashedWindows) {
    stash->windows.push_back(std::move(w));
  }
}

}  // namespace

namespace {
// Windows [from, end) of `early` put back, last first.
void PutBackEarlyFrom(EarlyWindows& early, size_t from) {
  for (size_t i = early.windows.size(); i-- > from;) PutBackEarly(*early.windows[i]);
}
}  // namespace

void EarlyWindowsDeleter::operator()(EarlyWindows* early) const {
  // Windows written before the commit that no apply took (a version that did not commit these
  // bytes): their targets get the old bits back.
  PutBackEarlyFrom(*early, 0);
  for (std::unique_ptr<Window>& w : early->windows) ReturnWindow(early->stash, std::move(w));
  delete early;
}

struct LoggedTail {
  // Held by pointer: the log's thread reads the window while it is handed on.
  std::unique_ptr<Window> window;  // logged (sync running), not written
  std::future<Status> syncing;     // its log write and sync
  std::string label;               // its payload's, for errors
  std::unique_ptr<Window> spare;   // buffers for the next payload's windows
};

void LoggedTailDeleter::operator()(LoggedTail* tail) const {
  // Never leaves a sync running on a log that may be closed next.
  if (tail->syncing.valid()) tail->syncing.wait();
  delete tail;
}

Status FinishLoggedTail(ApplySink& sink, ApplyStats* stats) {
  if (sink.tail == nullptr || !sink.tail->syncing.valid()) {
    sink.tail.reset();
    return Status::OK();
  }
  LoggedTailPtr tail = std::move(sink.tail);
  REFIT_RETURN_NOT_OK(WaitLogged(tail->syncing, tail->label, stats));
  REFIT_RETURN_NOT_OK(WriteWindow(sink, *tail->window, stats));
  ReturnWindow(sink.stash, std::move(tail->window));
  ReturnWindow(sink.stash, std::move(tail->spare));
  return Status::OK();
}

size_t EarlyWindowCount(const EarlyWindows* early) {
  return early == nullptr ? 0 : early->windows.size();
}

namespace {

// Moves window `index` of `early` into `w` when it was computed over the same records (the
// boundaries depend only on the payload); records an interrupted attempt logged are skipped.
bool TakeEarlyWindow(EarlyWindows* early, const std::vector<bool>& logged_before, size_t index,
                     std::unique_ptr<Window>& w) {
  if (early == nullptr || index >= early->windows.size()) return false;
  std::unique_ptr<Window>& e = early->windows[index];
  if (e->first != w->first || e->end != w->end) return false;
  std::swap(w, e);
  for (size_t i = w->first; i < w->end; ++i) {
    w->changes[i - w->first].logged_before = logged_before[i];
  }
  w->compute_seconds = 0;
  w->write_thread_seconds = 0;
  return true;
}

// A file's records, exactly once and durable through its redo log (journal.h), pipelined by
// windows of records: window i is decoded and verified in scratch (in parallel) while window
// i-1's changes are written and synced to the log on another thread; once that sync returned,
// window i's entries go to the log (another thread) while window i-1's changed elements (only
// those) are written into the file. No element is written before its entry is synced. With
// sink.defer_last_sync the last window is left in sink.tail, and a tail left by the previous
// payload is window "-1" here.
Status ApplyLogged(const Payload& payload, const std::vector<CheckedRecord>& checked,
                   ApplySink& sink, ApplyScratch& scratch, ApplyStats* stats) {
  RedoLog& log = *sink.journal;
  // Windows are moved by pointer only: the log's thread reads *prev while this one goes on.
  std::unique_ptr<Window> prev, cur;
  std::future<Status> syncing;  // prev's log write and sync
  std::string prev_label = payload.label();
  if (sink.tail != nullptr) {
    LoggedTailPtr tail = std::move(sink.tail);
    prev = std::move(tail->window);
    cur = std::move(tail->spare);
    syncing = std::move(tail->syncing);
    prev_label = std::move(tail->label);
  } else {
    prev = TakeWindow(sink.stash);
    cur = TakeWindow(sink.stash);
  }
  // Known before this payload's syncs run: the log's ids are not read while it writes (a tail's
  // ids are another payload's).
  std::vector<bool> logged_before(checked.size());
  for (size_t i = 0; i < checked.size(); ++i) logged_before[i] = log.Has(LogId(payload.label(), i));
  const std::vector<size_t> order = RecordOrder(payload, sink.pool == nullptr ? 1 : sink.threads);
  size_t window_index = 0;
  for (size_t first = 0;;) {
    const bool last = first == checked.size();  // nothing left: only prev to land
    if (last && sink.defer_last_sync && syncing.valid()) {
      sink.tail.reset(new LoggedTail{std::move(prev), std::move(syncing), std::move(prev_label),
                                     std::move(cur)});
      return Status::OK();
    }
    Status computed;
    const bool prev_logged = syncing.valid();
    PreviousWindowWrite write_prev;  // prev, written by cur's compute section
    write_prev.window = prev.get();
    write_prev.syncing = &syncing;
    write_prev.label = &prev_label;
    write_prev.stats = stats;
    if (!last) {
      cur->first = first;
      cur->end = WindowEnd(payload, checked, first);
      if (!TakeEarlyWindow(sink.early, logged_before, window_index++, cur)) {
        computed = ComputeWindow(payload, checked, logged_before, order, sink, scratch, *cur,
                                 prev_logged ? &write_prev : nullptr);
        AddComputeStats(*cur, stats);
      }
    }
    if (write_prev.ran) {
      REFIT_RETURN_NOT_OK(write_prev.synced);
    } else if (prev_logged) {
      REFIT_RETURN_NOT_OK(WaitLogged(syncing, prev_label, stats));
    }
    if (!last && computed.ok()) {
      KeepTargets(payload, checked, *cur);
      syncing = std::async(std::launch::async, [&log, w = cur.get(), label = payload.label()] {
        return LogWindow(label, log, *w);
      });
    }
    // What is logged is also written, even when the next window failed.
    if (write_prev.ran) {
      REFIT_RETURN_NOT_OK(ReportWritten(sink, *prev, write_prev.failed, stats));
    } else if (prev_logged) {
      REFIT_RETURN_NOT_OK(WriteWindow(sink, *prev, stats));
    }
    REFIT_RETURN_NOT_OK(computed);
    if (last) {
      ReturnWindow(sink.stash, std::move(prev));
      ReturnWindow(sink.stash, std::move(cur));
      return Status::OK();
    }
    prev_label = payload.label();
    first = cur->end;
    std::swap(prev, cur);
  }
}

// Attached memory (no journal: it outlives no crash, so records are applied once, by id): the
// windows computed before the commit (ComputeEarly, against these same bits) are written now,
// each record once (one an earlier attempt at the version applied is skipped) and marked
// applied. written[i]: record i is done here.
Status WriteEarlyUnlogged(const Payload& payload, const std::vector<CheckedRecord>& checked,
                          ApplySink& sink, ApplyStats* stats, std::vector<bool>& written) {
  std::vector<std::unique_ptr<Window>>& windows = sink.early->windows;
  for (size_t index = 0; index < windows.size(); ++index) {
    std::unique_ptr<Window>& w = windows[index];
    if (w->end > checked.size() || w->first >= w->end) {
      // Not this payload's windows: those written early go back before its records are applied.
      PutBackEarlyFrom(*sink.early, index);
      break;
    }
    KeepTargets(payload, checked, *w);
    const size_t count = w->end - w->first;
    std::vector<std::string> ids(count);
    for (size_t i = 0; i < count; ++i) {
      ids[i] = LogId(payload.label(), w->first + i);
      w->changes[i].logged_before = sink.applied_ids->count(ids[i]) != 0;  // not written again
    }
    // Written before the commit (receiver.write_early): taken as written.
    const std::vector<Status> failed =
        w->written_early ? std::vector<Status>(count) : WriteWindowChanges(sink, *w, stats);
    w->written_early = false;
    for (size_t i = 0; i < count; ++i) {
      const WindowRecord& r = w->records[i];
      written[w->first + i] = true;
      if (r.tensor == nullptr || !failed[i].ok()) continue;
      if (w->changes[i].logged_before) {
        if (stats != nullptr) ++stats->resumed_skipped_records;
        continue;
      }
      sink.applied_ids->insert(ids[i]);
      if (stats != nullptr) {
        ++stats->counters.records;
        stats->counters.changed_elements += r.changed;
      }
      if (sink.coverage != nullptr) sink.coverage->Add(*r.tensor, r.box);
      if (sink.applied) sink.applied(*r.tensor, r.box, r.digest);
    }
    for (const Status& st : failed) REFIT_RETURN_NOT_OK(st);
  }
  return Status::OK();
}

}  // namespace

Status ApplyPayload(const Payload& payload, EncodingCache& encodings, const TensorResolver& resolve,
                    uint64_t max_record_bytes, ApplyScratch& scratch, ApplyStats* stats,
                    ApplySink* sink) {
  REFIT_ASSIGN_OR_RAISE(std::vector<CheckedRecord> checked,
                        CheckRecords(payload, encodings, resolve, max_record_bytes));
  const size_t writing = std::count_if(checked.begin(), checked.end(),
                                       [](const CheckedRecord& c) { return c.tensor != nullptr; });
  if (writing > 0 && sink != nullptr && sink->before_write && !sink->began_writing) {
    sink->began_writing = true;
    REFIT_RETURN_NOT_OK(sink->before_write());
  }
  if (sink != nullptr && sink->journal != nullptr) {
    if (sink->early != nullptr &&
        std::any_of(sink->early->windows.begin(), sink->early->windows.end(),
                    [](const auto& w) { return w->written_early; })) {
      return Status::Internal(payload.label() +
                              ": changes written before the commit into a logged model");
    }
    return ApplyLogged(payload, checked, *sink, scratch, stats);
  }
  std::vector<bool> written_early;
  if (sink != nullptr && sink->early != nullptr && sink->applied_ids != nullptr) {
    written_early.assign(checked.size(), false);
    REFIT_RETURN_NOT_OK(WriteEarlyUnlogged(payload, checked, *sink, stats, written_early));
  }
  // Records of one payload write disjoint boxes: with a pool they are applied in parallel
  // stripes (this thread takes the first). The sink's hooks are serialized.
  WorkerPool* pool = sink != nullptr ? sink->pool : nullptr;
  const size_t stripes =
      pool == nullptr ? 1 : std::min<size_t>(std::max<size_t>(writing, 1), sink->threads);
  std::vector<StripeResult> results(stripes);
  std::mutex mu;
  StripeQueue queue;
  queue.order = RecordOrder(payload, stripes);
  if (!written_early.empty())
    std::erase_if(queue.order, [&](size_t i) { return written_early[i]; });
  RunStripes(pool, stripes, [&](size_t k) {
    thread_local ApplyScratch worker_scratch;
    ApplyStripe(payload, checked, queue, sink, mu, k == 0 ? scratch : worker_scratch, &results[k]);
  });
  const StripeResult* failed = nullptr;
  for (const StripeResult& r : results) {
    if (stats != nullptr) {
      stats->counters.records += r.stats.counters.records;
      stats->counters.changed_elements += r.stats.counters.changed_elements;
      stats->resumed_skipped_records += r.stats.resumed_skipped_records;
    }
    if (!r.status.ok() && (failed == nullptr || r.failed_index < failed->failed_index)) failed = &r;
  }
  return failed == nullptr ? Status::OK() : failed->status;
}

namespace {

// Swaps a verified window's changes into its targets before the commit (ComputeEarly's
// write_in_place), keeping a copy of each target's view to swap them back.
void WriteWindowEarly(const Payload& payload, const std::vector<CheckedRecord>& checked,
                      const ApplySink& sink, Window& w) {
  KeepTargets(payload, checked, w);
  w.early_targets.assign(w.end - w.first, TensorView{});
  for (size_t i = w.first; i < w.end; ++i) {
    if (checked[i].tensor != nullptr) w.early_targets[i - w.first] = *checked[i].tensor;
  }
  SwapWindow(w, sink.pool, sink.threads);
  w.written_early = true;
}

}  // namespace

Result<EarlyWindowsPtr> ComputeEarly(const Payload& payload, EncodingCache& encodings,
                                     const TensorResolver& resolve, uint64_t max_record_bytes,
                                     WorkerPool* pool, size_t threads, uint64_t max_held_bytes,
                                     bool write_in_place, ApplyScratch& scratch, WindowStash* stash,
                                     uint64_t* held_bytes) {
  *held_bytes = 0;
  REFIT_ASSIGN_OR_RAISE(std::vector<CheckedRecord> checked,
                        CheckRecords(payload, encodings, resolve, max_record_bytes));
  EarlyWindowsPtr early(new EarlyWindows);
  early->stash = stash;
  ApplySink sink;
  sink.pool = pool;
  sink.threads = threads;
  const std::vector<bool> logged_before(checked.size(), false);
  const std::vector<size_t> order = RecordOrder(payload, pool == nullptr ? 1 : threads);
  for (size_t first = 0; first < checked.size();) {
    const size_t end = WindowEnd(payload, checked, first);
    uint64_t declared = 0;  // what the window will hold
    for (size_t i = first; i < end; ++i) declared += DeclaredChangeBytes(payload, checked, i);
    if (*held_bytes + declared > max_held_bytes) break;
    early->windows.push_back(TakeWindow(stash));
    Window& w = *early->windows.back();
    w.first = first;
    w.end = end;
    REFIT_RETURN_NOT_OK(ComputeWindow(payload, checked, logged_before, order, sink, scratch, w));
    if (write_in_place) WriteWindowEarly(payload, checked, sink, w);
    *held_bytes += declared;
    first = w.end;
  }
  return early;
}

namespace {

bool BoxesOverlap(const Box& a, const Box& b) {
  for (size_t d = 0; d < a.offset.size(); ++d) {
    if (a.offset[d] >= b.offset[d] + b.extent[d] || b.offset[d] >= a.offset[d] + a.extent[d]) {
      return false;
    }
  }
  return true;
}

// Boxes inside one tensor cover it exactly once: no two overlap (a sweep along dimension 0, so
// a tensor cut into many row blocks costs n log n) and their sizes add up to the tensor's.
bool CoversExactlyOnce(std::vector<Box> boxes, uint64_t elements) {
  uint64_t total = 0;
  for (const Box& b : boxes) total += BoxElements(b);
  if (total != elements) return false;
  if (boxes.empty() || boxes.front().offset.empty()) return boxes.size() <= 1;
  std::sort(boxes.begin(), boxes.end(),
            [](const Box& a, const Box& b) { return a.offset[0] < b.offset[0]; });
  std::vector<const Box*> open;
  for (const Box& b : boxes) {
    std::erase_if(open, [&](const Box* o) { return o->offset[0] + o->extent[0] <= b.offset[0]; });
    for (const Box* o : open) {
      if (BoxesOverlap(*o, b)) return false;
    }
    open.push_back(&b);
  }
  return true;
}

}  // namespace

Status CoverageTracker::Check(const std::vector<TensorView>& tensors,
                              const std::map<std::string, uint64_t>* mapped) const {
  for (const TensorView& t : tensors) {
    auto it = boxes_.find(t.name);
    uint64_t elements = t.num_elements();
    if (mapped != nullptr) {
      auto m = mapped->find(t.name);
      elements = m == mapped->end() ? 0 : m->second;
    }
    if (elements == 0) continue;
    if (it == boxes_.end()) {
      return Status::Corrupt("full sync has no record for tensor '" + t.name + "' " +
                             ShapeToString(t.shape) + "; refused");
    }
    if (!CoversExactlyOnce(it->second, elements)) {
      return Status::Corrupt("full sync's records do not cover tensor '" + t.name + "' " +
                             ShapeToString(t.shape) + " exactly once; refused");
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
