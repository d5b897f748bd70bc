#include "send/delta_writer.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "common/file_util.h"
#include "common/stopwatch.h"
#include "receive/journal.h"
#include "refit/kernels/diff.h"

namespace refit::internal {

namespace {

// Slot states. A queued slot is computed by whichever thread claims it first (a worker, or the
// caller while it waits for an older slot).
enum SlotState : int { kIdle = 0, kQueued, kRunning, kDone };

constexpr size_t kSlotsPerThread = 4;
constexpr uint64_t kInlineChunkBytes = 64 << 10;  // a worker hand-off costs more than this
constexpr uint64_t kMinBytesPerThread = 1 << 20;

}  // namespace

// One chunk in flight: its inputs, reusable scratch, and the encoded result awaiting commit.
struct DeltaWriter::Slot {
  std::atomic<int> state{kIdle};
  DeltaWriter* owner = nullptr;  // the writer that queued it (set before the state says so)
  uint64_t bytes = 0;            // tensor bytes of the chunk
  std::shared_ptr<const SliceSource> src;
  Box rel;
  // Scratch is overwritten before it is read: no zero-fill when it grows.
  kernels::UninitVector<uint8_t> old_scratch;
  kernels::UninitVector<uint8_t> new_scratch;
  kernels::PositionList positions;
  kernels::ValueList old_values;  // the changed elements' bits, packed (encode input, ABI 1.2)
  kernels::ValueList new_values;
  kernels::UninitVector<uint8_t> best;
  kernels::UninitVector<uint8_t> trial;
  std::vector<uint64_t> sizes;
  // Results.
  Status status;
  RecordHeader header;
  refit_encode_input_t in{};
  const Encoding* chosen = nullptr;  // null: dense
  uint64_t encoded_len = 0;
  double diff_seconds = 0;
  double encode_seconds = 0;
};

DeltaWriter::Workspace::Workspace() = default;
DeltaWriter::Workspace::~Workspace() = default;

DeltaWriter::DeltaWriter(EncodingCache& encodings, std::string encoding, uint64_t chunk_bytes,
                         uint64_t bucket_bytes, Metadata payload_metadata, FlushFn flush,
                         unsigned threads, Workspace* workspace)
    : encodings_(encodings),
      encoding_(std::move(encoding)),
      chunk_bytes_(std::max<uint64_t>(chunk_bytes, 1024)),
      bucket_bytes_(std::max<uint64_t>(bucket_bytes, 1024)),
      builder_(std::move(payload_metadata)),
      flush_(std::move(flush)),
      threads_(ResolveThreadCount(threads)),
      ws_(workspace != nullptr ? workspace : &own_workspace_) {
  // One allocation per payload instead of a reallocation chain while records are appended.
  if (bucket_bytes_ <= (1ull << 30)) builder_.Reserve(bucket_bytes_);
}

DeltaWriter::~DeltaWriter() {
  // After an error: queued chunks are dropped, not computed; running ones finish first (they
  // use this writer). Tasks left in a lent workspace's pool then find no slot queued, or one a
  // later writer queued, which they compute for that writer (Slot::owner).
  for (auto& slot : ws_->slots) {
    int queued = kQueued;
    slot->state.compare_exchange_strong(queued, kDone);
  }
  if (ws_ == &own_workspace_) {
    own_workspace_.pool.reset();
    return;
  }
  std::unique_lock<std::mutex> lock(slot_mu_);
  slot_cv_.wait(lock, [&] {
    return std::none_of(ws_->slots.begin(), ws_->slots.end(), [](const auto& slot) {
      return slot->state.load(std::memory_order_acquire) == kRunning;
    });
  });
}

void DeltaWriter::ExpectBytes(uint64_t bytes) {
  if (prepared_) return;
  threads_ = static_cast<unsigned>(
      std::clamp<uint64_t>(bytes / kMinBytesPerThread, 1, std::max(threads_, 1u)));
  // A fresh buffer page costs more to fault in than a file page read through a mapping (12 vs
  // 2 us here): each thread's two read buffers must be reused several times to pay off.
  read_through_files_ = bytes >= 8 * chunk_bytes_ * threads_;
}

Status DeltaWriter::Prepare() {
  if (prepared_) return Status::OK();
  REFIT_ASSIGN_OR_RAISE(dense_, encodings_.Get("dense"));
  if (encoding_ == kAutoEncoding) {
    REFIT_ASSIGN_OR_RAISE(auto_, encodings_.Auto());
    // Measured here, before any worker runs, so the numbers are not taken on a busy core; other
    // dtypes are measured when their first record comes.
    if (auto_->mode == AutoMode::kLink) REFIT_RETURN_NOT_OK(auto_->Costs(DType::kBF16).status());
  } else if (encoding_ != "dense") {
    REFIT_ASSIGN_OR_RAISE(single_, encodings_.Get(encoding_));
  }
  // More slots than threads: while the caller commits a finished slot (copying its record into
  // the payload, staging its changes) the others go on with queued ones instead of idling.
  const size_t slots = threads_ > 1 ? kSlotsPerThread * threads_ : 1;
  // The caller computes too: threads - 1 workers. A lent workspace made for another thread count
  // is made again.
  if (ws_->slots.size() != slots || ws_->pool_threads != threads_ - 1) {
    ws_->pool.reset();
    ws_->slots.clear();
    for (size_t i = 0; i < slots; ++i) ws_->slots.push_back(std::make_unique<Slot>());
    if (threads_ > 1) ws_->pool = std::make_unique<WorkerPool>(threads_ - 1);
    ws_->pool_threads = threads_ - 1;
  }
  max_in_flight_bytes_ = 2 * threads_ * chunk_bytes_;
  prepared_ = true;
  return Status::OK();
}

Status DeltaWriter::Add(const SliceSource& s) {
  REFIT_RETURN_NOT_OK(Prepare());
  const uint32_t elem = SizeOf(s.dtype);
  Box rel;
  rel.offset.assign(s.local_box.extent.size(), 0);
  rel.extent = s.local_box.extent;
  uint64_t n = BoxElements(rel);
  counters.total_elements += n;
  counters.model_bytes += n * elem;
  auto src = std::make_shared<const SliceSource>(s);
  for (const Box& chunk : SplitBox(rel, std::max<uint64_t>(chunk_bytes_ / elem, 1))) {
    const uint64_t bytes = BoxElements(chunk) * elem;
    // Commits stay in order: room is made by committing the oldest chunks.
    while (pending_ == ws_->slots.size() ||
           (pending_ > 0 && in_flight_bytes_ + bytes > max_in_flight_bytes_)) {
      REFIT_RETURN_NOT_OK(CommitOldest());
    }
    Slot& slot = *ws_->slots[(head_ + pending_) % ws_->slots.size()];
    slot.src = src;
    slot.rel = chunk;
    slot.bytes = bytes;
    ++pending_;
    in_flight_bytes_ += bytes;
    Submit(slot);
    if (!ws_->pool) REFIT_RETURN_NOT_OK(CommitOldest());
  }
  return Status::OK();
}

void DeltaWriter::Submit(Slot& slot) {
  if (!ws_->pool || slot.bytes < kInlineChunkBytes) {
    slot.state.store(kRunning, std::memory_order_relaxed);
    RunClaimed(slot);
    return;
  }
  // A task may find its slot already taken (by the caller) or even refilled since, by this
  // writer or a later one lent the same workspace: it then runs whatever that slot holds now if
  // still queued, for the writer that queued it, else nothing.
  slot.owner = this;
  slot.state.store(kQueued, std::memory_order_release);
  ws_->pool->Submit([&slot] {
    if (Claim(slot)) slot.owner->RunClaimed(slot);
  });
}

bool DeltaWriter::Claim(Slot& slot) {
  int queued = kQueued;
  return slot.state.compare_exchange_strong(queued, kRunning, std::memory_order_acquire);
}

void DeltaWriter::RunClaimed(Slot& slot) {
  Compute(slot);
  std::lock_guard<std::mutex> lock(slot_mu_);
  slot.state.store(kDone, std::memory_order_release);
  slot_cv_.notify_all();
}

void DeltaWriter::Await(Slot& slot) {
  if (Claim(slot)) return RunClaimed(slot);
  // A worker has it: compute later queued chunks meanwhile instead of sleeping.
  for (size_t k = 1; k < pending_; ++k) {
    if (slot.state.load(std::memory_order_acquire) == kDone) return;
    Slot& later = *ws_->slots[(head_ + k) % ws_->slots.size()];
    if (Claim(later)) RunClaimed(later);
  }
  std::unique_lock<std::mutex> lock(slot_mu_);
  slot_cv_.wait(lock, [&] { return slot.state.load(std::memory_order_acquire) == kDone; });
}

namespace {

// Encodes `in` into `out` (resized to the encoding's bound); the encoded length.
Result<uint64_t> EncodeInto(const Encoding& enc, const refit_encode_input_t& in,
                            kernels::UninitVector<uint8_t>& out) {
  REFIT_ASSIGN_OR_RAISE(uint64_t cap, enc.MaxEncodedSize(in));
  if (cap == 0) return Status::Internal("encoding '" + enc.name() + "' cannot size its output");
  kernels::ResizeDiscarding(out, cap);
  return enc.Encode(in, out.data(), cap);
}

}  // namespace

void DeltaWriter::Compute(Slot& slot) {
  const SliceSource& s = *slot.src;
  const Box& rel = slot.rel;
  const uint32_t elem = SizeOf(s.dtype);
  const uint64_t n = BoxElements(rel);
  slot.status = Status::OK();
  slot.chosen = nullptr;
  slot.encoded_len = 0;

  Stopwatch diff_clock;
  const uint8_t* new_bits = nullptr;
  const uint8_t* old_bits = nullptr;
  ReadBits(slot, &new_bits, &old_bits);
  if (!slot.status.ok()) return;
  // Only an encoder (and a changes sink) reads the packed values (a dense record copies the bits
  // at commit).
  const bool encoder = single_ != nullptr || auto_ != nullptr;
  // A delta's bits in checkpoint and baseline files are read through the files into this
  // thread's buffers (file_util.h: a mapping's pages fault once each); a record left dense is
  // copied at commit from where the bits are.
  const uint8_t* new_in_place = new_bits;
  const uint8_t* old_in_place = old_bits;
  if (old_bits != nullptr && encoder && read_through_files_) {
    slot.status = ReadThroughFiles(n * elem, &new_bits, &old_bits, old_overlay_);
    if (!slot.status.ok()) return;
  }
  slot.status = AdvanceOldBits(slot, old_in_place, old_bits, n * elem);
  if (!slot.status.ok()) return;
  const bool encodes = encoder || changes_ != nullptr;
  uint64_t digest = 0;
  const uint64_t changed = DiffAndDigest(slot, new_bits, old_bits, encodes, &digest);
  slot.diff_seconds = diff_clock.Seconds();
  slot.encode_seconds = 0;
  RecordHeader& h = slot.header;
  h = RecordHeader();
  h.changed = changed;
  if (changed == 0) return;

  Stopwatch encode_clock;
  FillEncodeInput(slot, new_bits, old_bits, encodes);
  h.tensor = s.tensor;
  h.dtype = s.dtype;
  h.shape = s.canonical_shape;
  h.box_offset = rel.offset;
  for (size_t d = 0; d < rel.offset.size(); ++d) h.box_offset[d] += s.canonical_offset[d];
  h.box_extent = rel.extent;
  h.digest = digest;
  h.create = old_bits == nullptr;

  // Encoded into scratch first: a record the encoding would make at least as large as the bits
  // themselves is sent dense instead (never bigger, always applies). Full syncs are dense; the
  // dense copy is made at commit, straight into the payload.
  if (old_bits == nullptr || !encoder) return;
  if (single_ != nullptr) {
    EncodeSingle(slot, n * elem);
  } else if (auto_->mode == AutoMode::kLink) {
    EncodeLink(slot, n * elem);
  } else {
    EncodeAuto(slot, n * elem);
  }
  if (slot.chosen == nullptr) {
    slot.in.new_bits = new_in_place;
    slot.in.old_bits = old_in_place;
  }
  slot.encode_seconds = encode_clock.Seconds();
}

Status DeltaWriter::ReadThroughFiles(uint64_t bytes, const uint8_t** new_bits,
                                     const uint8_t** old_bits, RedoOverlay* old_overlay) {
  thread_local kernels::UninitVector<uint8_t> new_read;
  thread_local kernels::UninitVector<uint8_t> old_read;
  const auto read = [bytes](const uint8_t** bits, kernels::UninitVector<uint8_t>& buffer,
                            RedoOverlay* overlay) {
    FileRange file;
    // A populated mapping (a long-lived sender's baseline) is read where it is.
    if (!FindMappedFile(*bits, bytes, &file) || file.warm) return Status::OK();
    if (buffer.size() < bytes) kernels::ResizeDiscarding(buffer, bytes);
    REFIT_RETURN_NOT_OK(overlay != nullptr ? overlay->ReadPatched(*bits, bytes, buffer.data())
                                           : PreadMapped(file, buffer.data(), bytes));
    *bits = buffer.data();
    return Status::OK();
  };
  REFIT_RETURN_NOT_OK(read(new_bits, new_read, nullptr));
  return read(old_bits, old_read, old_overlay);
}

Status DeltaWriter::AdvanceOldBits(Slot& slot, const uint8_t* old_in_place, const uint8_t* old_bits,
                                   uint64_t bytes) {
  if (old_overlay_ == nullptr || old_in_place == nullptr) return Status::OK();
  // Gathered (ReadBits) or read through the file (ReadThroughFiles): written as it was read.
  if (old_in_place == slot.old_scratch.data() || old_bits != old_in_place) return Status::OK();
  return old_overlay_->ApplyInPlace(old_in_place, bytes);
}

void DeltaWriter::ReadBits(Slot& slot, const uint8_t** new_bits, const uint8_t** old_bits) {
  const SliceSource& s = *slot.src;
  const uint32_t elem = SizeOf(s.dtype);
  const uint64_t n = BoxElements(slot.rel);
  Box local = slot.rel;
  for (size_t d = 0; d < local.offset.size(); ++d) local.offset[d] += s.local_box.offset[d];
  // Contiguous boxes are read in place; others are gathered once into scratch.
  if (BoxIsContiguous(s.local_shape, local)) {
    uint64_t start = BoxStartElement(s.local_shape, local) * elem;
    *new_bits = s.new_bits + start;
    if (s.old_bits != nullptr) *old_bits = s.old_bits + start;
    return;
  }
  kernels::ResizeDiscarding(slot.new_scratch, n * elem);
  GatherBox(s.new_bits, s.local_shape, local, elem, slot.new_scratch.data());
  *new_bits = slot.new_scratch.data();
  if (s.old_bits != nullptr) {
    if (old_overlay_ != nullptr) {
      // The baseline's pending changes in the box go into the file before it is gathered.
      ForEachRun(s.local_shape, local, [&](uint64_t start, uint64_t count) {
        if (slot.status.ok()) {
          slot.status = old_overlay_->ApplyInPlace(s.old_bits + start * elem, count * elem);
        }
      });
      if (!slot.status.ok()) return;
    }
    kernels::ResizeDiscarding(slot.old_scratch, n * elem);
    GatherBox(s.old_bits, s.local_shape, local, elem, slot.old_scratch.data());
    *old_bits = slot.old_scratch.data();
  }
}

uint64_t DeltaWriter::DiffAndDigest(Slot& slot, const uint8_t* new_bits, const uint8_t* old_bits,
                                    bool encodes, uint64_t* digest) {
  const uint32_t elem = SizeOf(slot.src->dtype);
  const uint64_t n = BoxElements(slot.rel);
  slot.positions.clear();
  slot.old_values.clear();
  slot.new_values.clear();
  if (old_bits == nullptr) {
    // A create record: every element counts as changed.
    *digest = kernels::Digest64(new_bits, n * elem);
    return n;
  }
  // One pass: each block of the new bits is digested while the diff has it in cache, and the
  // changed elements' bits are copied out of it for the encoder.
  kernels::ChangedValues values;
  if (encodes) values = {&slot.old_values, &slot.new_values};
  const kernels::DiffDigest d =
      kernels::DiffPositionsAndDigest(old_bits, new_bits, n, elem, &slot.positions, values);
  *digest = d.digest;
  return d.changed;
}

void DeltaWriter::FillEncodeInput(Slot& slot, const uint8_t* new_bits, const uint8_t* old_bits,
                                  bool encodes) {
  const SliceSource& s = *slot.src;
  refit_encode_input_t& in = slot.in;
  in = refit_encode_input_t{};
  in.struct_size = sizeof(in);
  in.dtype = static_cast<int32_t>(s.dtype);
  in.elem_size = SizeOf(s.dtype);
  in.n_elems = BoxElements(slot.rel);
  in.old_bits = old_bits;
  in.new_bits = new_bits;
  in.positions = old_bits != nullptr ? slot.positions.data() : nullptr;
  in.n_changed = slot.header.changed;
  if (old_bits != nullptr && encodes) {
    in.old_values = slot.old_values.data();
    in.new_values = slot.new_values.data();
  }
}

void DeltaWriter::EncodeSingle(Slot& slot, uint64_t dense_bytes) {
  Result<uint64_t> written = EncodeInto(*single_, slot.in, slot.best);
  if (!written.ok()) {
    slot.status = written.status();
    return;
  }
  if (written.value() < dense_bytes) {
    slot.chosen = single_;
    slot.encoded_len = written.value();
  }
}

void DeltaWriter::EncodeLink(Slot& slot, uint64_t dense_bytes) {
  // One encode: the pick is predicted from (dtype, elements, changes) alone, so it does not
  // depend on which thread runs the record.
  Result<const std::vector<EncodingCost>*> costs = auto_->Costs(static_cast<DType>(slot.in.dtype));
  if (!costs.ok()) {
    slot.status = costs.status();
    return;
  }
  const size_t pick =
      CheapestEncoding(**costs, slot.in.n_elems, slot.in.n_changed, auto_->link_bandwidth);
  Result<uint64_t> written = EncodeInto(*auto_->candidates[pick], slot.in, slot.best);
  if (!written.ok()) {
    slot.status = written.status();
    return;
  }
  if (written.value() < dense_bytes) {
    slot.chosen = auto_->candidates[pick];
    slot.encoded_len = written.value();
  }
}

void DeltaWriter::EncodeAuto(Slot& slot, uint64_t dense_bytes) {
  // Every candidate runs; the smallest so far stays in `best`.
  const auto& cands = auto_->candidates;
  slot.sizes.assign(cands.size(), UINT64_MAX);
  size_t smallest = cands.size();
  for (size_t i = 0; i < cands.size(); ++i) {
    Result<uint64_t> written = EncodeInto(*cands[i], slot.in, slot.trial);
    if (!written.ok()) {
      slot.status = written.status();
      return;
    }
    slot.sizes[i] = written.value();
    if (smallest == cands.size() || written.value() < slot.sizes[smallest]) {
      smallest = i;
      std::swap(slot.best, slot.trial);
    }
  }
  // `fastest`: the first candidate (cheapest to apply first) within the budget of the smallest,
  // re-encoded into `best` unless it is the smallest itself.
  size_t pick = smallest;
  if (auto_->mode == AutoMode::kFastest && smallest < cands.size()) {
    const double limit = static_cast<double>(slot.sizes[smallest]) * auto_->budget;
    for (size_t i = 0; i < cands.size(); ++i) {
      if (static_cast<double>(slot.sizes[i]) <= limit) {
        pick = i;
        break;
      }
    }
    if (pick != smallest) {
      Result<uint64_t> written = EncodeInto(*cands[pick], slot.in, slot.best);
      if (!written.ok()) {
        slot.status = written.status();
        return;
      }
    }
  }
  if (pick < cands.size() && slot.sizes[pick] < dense_bytes) {
    slot.chosen = cands[pick];
    slot.encoded_len = slot.sizes[pick];
  }
}

Status DeltaWriter::CommitOldest() {
  Slot& slot = *ws_->slots[head_];
  Await(slot);
  head_ = (head_ + 1) % ws_->slots.size();
  --pending_;
  in_flight_bytes_ -= slot.bytes;
  slot.state.store(kIdle, std::memory_order_relaxed);
  Status st = Commit(slot);
  slot.src.reset();
  TrimScratch(slot);
  if (!st.ok()) return st.WithContext("tensor '" + slot.header.tensor + "'");
  return st;
}

// A window of slots each keeping the scratch of the largest chunk it ever held could grow to
// several times what is in flight: a slot keeps at most three chunks' worth.
void DeltaWriter::TrimScratch(Slot& slot) {
  auto bytes = [](const auto& v) { return v.capacity() * sizeof(v[0]); };
  const uint64_t held = bytes(slot.old_scratch) + bytes(slot.new_scratch) + bytes(slot.positions) +
                        bytes(slot.old_values) + bytes(slot.new_values) + bytes(slot.best) +
                        bytes(slot.trial);
  if (ws_->slots.size() == 1 || held <= 3 * chunk_bytes_) return;
  slot.old_scratch = {};
  slot.new_scratch = {};
  slot.positions = {};
  slot.old_values = {};
  slot.new_values = {};
  slot.best = {};
  slot.trial = {};
}

Status DeltaWriter::Commit(Slot& slot) {
  REFIT_RETURN_NOT_OK(CommitRecord(slot));
  // Streaming: a payload is handed on once it covers stream_bytes of the model, whatever its
  // size, so receivers can compute it while later chunks are still diffed.
  streamed_bytes_ += slot.bytes;
  if (stream_bytes_ == 0 || streamed_bytes_ < stream_bytes_) return Status::OK();
  return Flush();
}

Status DeltaWriter::CommitRecord(Slot& slot) {
  diff_seconds += slot.diff_seconds;
  encode_seconds += slot.encode_seconds;
  if (!slot.status.ok()) {
    slot.header.tensor = slot.src->tensor;
    return slot.status;
  }
  RecordHeader& h = slot.header;
  const uint64_t changed = h.changed;
  if (changed == 0) {
    h.tensor = slot.src->tensor;
    return Status::OK();
  }
  std::string tensor = h.tensor;
  if (slot.chosen != nullptr) {
    if (!builder_.empty() && builder_.data_bytes() + slot.encoded_len > bucket_bytes_) {
      REFIT_RETURN_NOT_OK(Flush());
    }
    h.encoding = slot.chosen->name();
    h.op = slot.chosen->op();
    builder_.Add(std::move(h), slot.best.data(), slot.encoded_len);
  } else {
    Stopwatch clock;
    REFIT_ASSIGN_OR_RAISE(uint64_t cap, dense_->MaxEncodedSize(slot.in));
    if (cap == 0) return Status::Internal("encoding 'dense' cannot size its output");
    if (!builder_.empty() && builder_.data_bytes() + cap > bucket_bytes_)
      REFIT_RETURN_NOT_OK(Flush());
    h.encoding = dense_->name();
    h.op = dense_->op();
    if (BitsAreTheCallers(slot)) {
      // A dense record is the bits verbatim (docs/wire-format.md): copied once, by Flush, on
      // every thread when the payload is the last one.
      builder_.AddBorrowed(std::move(h), static_cast<const uint8_t*>(slot.in.new_bits), cap);
    } else {
      uint8_t* out = builder_.AddInPlace(std::move(h), cap);
      REFIT_ASSIGN_OR_RAISE(uint64_t written, dense_->Encode(slot.in, out, cap));
      builder_.TrimLast(written);
    }
    encode_seconds += clock.Seconds();
  }
  slot.header.tensor = std::move(tensor);  // for the caller's error context
  if (changes_ && !slot.header.create) {
    const SliceSource& src = *slot.src;
    Box local = slot.rel;
    for (size_t d = 0; d < local.offset.size(); ++d) local.offset[d] += src.local_box.offset[d];
    REFIT_RETURN_NOT_OK(
        changes_(src, local, slot.positions.data(), slot.positions.size(), slot.new_values.data()));
  }
  counters.changed_elements += changed;
  counters.changed_bytes += changed * SizeOf(slot.src->dtype);
  ++counters.records;
  return Status::OK();
}

Status DeltaWriter::DrainSlots() {
  while (pending_ > 0) REFIT_RETURN_NOT_OK(CommitOldest());
  return Status::OK();
}

bool DeltaWriter::BitsAreTheCallers(const Slot& slot) {
  const auto* bits = static_cast<const uint8_t*>(slot.in.new_bits);
  const uint8_t* scratch = slot.new_scratch.data();
  return bits != nullptr && (bits < scratch || bits >= scratch + slot.new_scratch.size());
}

Status DeltaWriter::Flush() {
  streamed_bytes_ = 0;
  if (builder_.empty()) return Status::OK();
  uint64_t n = builder_.num_records();
  // With no chunk in flight (the last payload) the workers are idle and help assemble it.
  std::vector<uint8_t> reuse = spare_ ? spare_() : std::vector<uint8_t>();
  REFIT_ASSIGN_OR_RAISE(std::vector<uint8_t> payload,
                        pending_ == 0 ? builder_.Finish(ws_->pool.get(), threads_, std::move(reuse))
                                      : builder_.Finish(nullptr, 1, std::move(reuse)));
  Status st = flush_(std::move(payload), n);
  if (bucket_bytes_ <= (1ull << 30)) builder_.Reserve(bucket_bytes_);
  return st;
}

Status DeltaWriter::Finish() {
  REFIT_RETURN_NOT_OK(DrainSlots());
  return Flush();
}

}  // namespace refit::internal
