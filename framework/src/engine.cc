#include "engine.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "journal.h"
#include "refit/kernels/diff.h"

namespace refit::internal {

namespace {

std::string Errno(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

Status WriteAll(int fd, const uint8_t* data, uint64_t len, const std::string& path) {
  while (len > 0) {
    ssize_t n = ::write(fd, data, std::min<uint64_t>(len, 1ull << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IoError(Errno("write", path));
    }
    data += n;
    len -= static_cast<uint64_t>(n);
  }
  return Status::OK();
}

std::string ParentDir(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

bool HoldsVersion(const SafetensorsFile& file, uint64_t version) {
  auto it = file.metadata().find(kVersionMetadataKey);
  return it != file.metadata().end() && it->second == std::to_string(version);
}

Status FsyncPath(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IoError(Errno("open", path));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Status::IoError(Errno("fsync", path));
  return Status::OK();
}

Status WriteFileAtomic(const std::string& path, std::string_view contents) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IoError(Errno("create", tmp));
  Status st = WriteAll(fd, reinterpret_cast<const uint8_t*>(contents.data()), contents.size(), tmp);
  if (st.ok() && ::fsync(fd) != 0) st = Status::IoError(Errno("fsync", tmp));
  ::close(fd);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = Status::IoError(Errno("rename to", path));
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  return FsyncPath(ParentDir(path));
}

Result<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound(path + ": no such file");
    return Status::IoError(Errno("open", path));
  }
  std::string out;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      return Status::IoError(Errno("read", path));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {
      ::close(fd);
      return Status::Corrupt(path + ": larger than " + std::to_string(max_bytes) + " bytes");
    }
  }
  ::close(fd);
  return out;
}

std::vector<TensorSpec> SpecsOf(const std::vector<TensorView>& tensors) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const TensorView& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  return specs;
}

Status CreateModelFile(const std::string& path, const std::vector<TensorSpec>& specs,
                       const SafetensorsFile* source, Metadata metadata) {
  std::vector<TensorView> layout;
  layout.reserve(specs.size());
  for (const TensorSpec& s : specs) {
    TensorView v;
    v.name = s.name;
    v.dtype = s.dtype;
    v.shape = s.shape;
    layout.push_back(std::move(v));
  }
  ASSIGN_OR_RAISE(SafetensorsLayout plan, PlanSafetensors(layout, metadata));
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IoError(Errno("create", path));
  Status st =
      WriteAll(fd, reinterpret_cast<const uint8_t*>(plan.header.data()), plan.header.size(), path);
  static const std::vector<uint8_t> zeros(1 << 20, 0);
  for (size_t i = 0; st.ok() && i < specs.size(); ++i) {
    const TensorView* src = source != nullptr ? source->Find(specs[i].name) : nullptr;
    uint64_t bytes = layout[i].nbytes();
    if (src != nullptr && src->dtype == specs[i].dtype && src->shape == specs[i].shape) {
      st = WriteAll(fd, src->bytes(), bytes, path);
    } else {
      for (uint64_t done = 0; st.ok() && done < bytes;) {
        uint64_t n = std::min<uint64_t>(zeros.size(), bytes - done);
        st = WriteAll(fd, zeros.data(), n, path);
        done += n;
      }
    }
  }
  if (st.ok() && ::fsync(fd) != 0) st = Status::IoError(Errno("fsync", path));
  ::close(fd);
  if (!st.ok()) ::unlink(path.c_str());
  return st;
}

// ---------------------------------------------------------------- encodings

Result<const Encoding*> EncodingCache::Get(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = encodings_.find(name);
  if (it != encodings_.end()) return it->second.get();
  std::string section = "encoding." + name;
  bool has_section = config_ != nullptr && !config_->KeysUnder(section).empty();
  ASSIGN_OR_RAISE(
      std::unique_ptr<Encoding> enc,
      registry_.CreateEncoding(name, has_section ? config_ : nullptr, has_section ? section : ""));
  const Encoding* raw = enc.get();
  encodings_[name] = std::move(enc);
  return raw;
}

const std::vector<std::string>& AutoPreferredOrder() {
  // Cheapest to apply first: a plain scatter, a bitmask walk, gap decoding, then the entropy
  // coded ones. "fastest" mode takes the first of these within the size budget.
  static const std::vector<std::string> order = {"indices",     "bitmask", "deltas",
                                                 "deltas_zstd", "xor",     "ctx"};
  return order;
}

std::vector<ConfigKeySpec> AutoConfigSpecs() {
  return {
      {"candidates", REFIT_CFG_STRING_LIST, "(every encoding but dense)",
       "encodings tried per record (default: every registered encoding but dense, cheapest to "
       "apply first: indices, bitmask, deltas, deltas_zstd, xor, ctx, then the rest by name)"},
      {"mode", REFIT_CFG_STRING, "\"smallest\"",
       "\"smallest\": the smallest record; \"fastest\": the first candidate within budget"},
      {"budget", REFIT_CFG_DOUBLE, "1.1",
       "mode fastest: largest accepted size as a multiple of the smallest candidate's"},
  };
}

Result<const AutoPolicy*> EncodingCache::Auto() {
  std::lock_guard<std::mutex> lock(auto_mu_);
  if (auto_) return auto_.get();
  const std::string section = std::string("encoding.") + kAutoEncoding;
  auto policy = std::make_unique<AutoPolicy>();
  std::vector<std::string> names;
  const std::string cand_key = section + ".candidates";
  auto where = [&](const std::string& key) {
    return config_ != nullptr ? config_->Where(key) + ": " : std::string();
  };
  if (config_ != nullptr && config_->Has(cand_key)) {
    ASSIGN_OR_RAISE(names, config_->GetStringList(cand_key, {}));
    if (names.empty()) return Status::Invalid(where(cand_key) + cand_key + " is empty");
    for (const std::string& name : names) {
      if (name == kAutoEncoding) {
        return Status::Invalid(where(cand_key) + cand_key + ": 'auto' cannot be its own candidate");
      }
      if (registry_.Find(REFIT_KIND_ENCODING, name) == nullptr) {
        std::string known;
        for (const ComponentInfo* c : registry_.List()) {
          if (c->kind == REFIT_KIND_ENCODING) known += (known.empty() ? "" : ", ") + c->name;
        }
        return Status::Invalid(where(cand_key) + cand_key + ": unknown encoding '" + name +
                               "' (known: " + known + ")");
      }
    }
  } else {
    std::vector<std::string> rest;
    for (const ComponentInfo* c : registry_.List()) {
      if (c->kind != REFIT_KIND_ENCODING || c->name == "dense" || c->name == kAutoEncoding) {
        continue;
      }
      const auto& order = AutoPreferredOrder();
      if (std::find(order.begin(), order.end(), c->name) == order.end()) rest.push_back(c->name);
    }
    for (const std::string& name : AutoPreferredOrder()) {
      if (registry_.Find(REFIT_KIND_ENCODING, name) != nullptr) names.push_back(name);
    }
    std::sort(rest.begin(), rest.end());
    names.insert(names.end(), rest.begin(), rest.end());
  }
  // xor/step encodings (xor, ctx) are candidates like any other: receivers journal their
  // records, so each is applied exactly once even across a crash (journal.h).
  for (const std::string& name : names) {
    ASSIGN_OR_RAISE(const Encoding* enc, Get(name));
    policy->candidates.push_back(enc);
  }
  if (config_ != nullptr) {
    const std::string mode_key = section + ".mode";
    ASSIGN_OR_RAISE(std::string mode, config_->GetString(mode_key, "smallest"));
    if (mode != "smallest" && mode != "fastest") {
      return Status::Invalid(where(mode_key) + mode_key + ": unknown mode '" + mode +
                             "' (smallest or fastest)");
    }
    policy->fastest = mode == "fastest";
    const std::string budget_key = section + ".budget";
    ASSIGN_OR_RAISE(policy->budget, config_->GetDouble(budget_key, 1.1));
    if (!(policy->budget >= 1.0) || policy->budget > 1e6) {
      return Status::Invalid(where(budget_key) + budget_key + " must be >= 1.0");
    }
  }
  auto_ = std::move(policy);
  return auto_.get();
}

// ---------------------------------------------------------------- worker pool

WorkerPool::WorkerPool(unsigned threads) {
  for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::Submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (head_ == queue_.size()) {  // drained: reuse the storage
      queue_.clear();
      head_ = 0;
    }
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void WorkerPool::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return head_ < queue_.size() || stop_; });
    if (head_ == queue_.size()) return;  // stop_ and nothing queued
    std::function<void()> task = std::move(queue_[head_++]);
    lock.unlock();
    task();
    lock.lock();
  }
}

// ---------------------------------------------------------------- sender side

// One chunk in flight: its inputs, reusable scratch, and the encoded result awaiting commit.
struct DeltaWriter::Slot {
  bool pending = false;  // submitted and not yet committed (caller's thread only)
  bool done = false;     // computed (guarded by slot_mu_)
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

unsigned DeltaWriter::ResolveThreads(int64_t configured) {
  if (configured > 0) return static_cast<unsigned>(std::min<int64_t>(configured, 256));
  return std::clamp(std::thread::hardware_concurrency(), 1u, 256u);
}

DeltaWriter::DeltaWriter(EncodingCache& encodings, std::string encoding, uint64_t chunk_bytes,
                         uint64_t bucket_bytes, Metadata payload_metadata, FlushFn flush,
                         unsigned threads)
    : encodings_(encodings),
      encoding_(std::move(encoding)),
      chunk_bytes_(std::max<uint64_t>(chunk_bytes, 1024)),
      bucket_bytes_(std::max<uint64_t>(bucket_bytes, 1024)),
      builder_(std::move(payload_metadata)),
      flush_(std::move(flush)),
      threads_(ResolveThreads(threads)) {
  // One allocation per payload instead of a reallocation chain while records are appended.
  if (bucket_bytes_ <= (1ull << 30)) builder_.Reserve(bucket_bytes_);
}

DeltaWriter::~DeltaWriter() {
  pool_.reset();  // runs what is queued (slots stay alive), then joins
}

Status DeltaWriter::Prepare() {
  if (prepared_) return Status::OK();
  ASSIGN_OR_RAISE(dense_, encodings_.Get("dense"));
  if (encoding_ == kAutoEncoding) {
    ASSIGN_OR_RAISE(auto_, encodings_.Auto());
  } else if (encoding_ != "dense") {
    ASSIGN_OR_RAISE(single_, encodings_.Get(encoding_));
  }
  for (unsigned i = 0; i < threads_; ++i) slots_.push_back(std::make_unique<Slot>());
  if (threads_ > 1) pool_ = std::make_unique<WorkerPool>(threads_);
  prepared_ = true;
  return Status::OK();
}

Status DeltaWriter::Add(const SliceSource& s) {
  RETURN_NOT_OK(Prepare());
  const uint32_t elem = SizeOf(s.dtype);
  Box rel;
  rel.offset.assign(s.local_box.extent.size(), 0);
  rel.extent = s.local_box.extent;
  uint64_t n = BoxElements(rel);
  total_elements += n;
  model_bytes += n * elem;
  auto src = std::make_shared<const SliceSource>(s);
  for (const Box& chunk : SplitBox(rel, std::max<uint64_t>(chunk_bytes_ / elem, 1))) {
    Slot& slot = *slots_[next_slot_];
    // Slots are used round-robin, so the one to reuse is the oldest: commits stay in order.
    if (slot.pending) RETURN_NOT_OK(WaitAndCommit(slot));
    slot.src = src;
    slot.rel = chunk;
    slot.pending = true;
    slot.done = false;
    next_slot_ = (next_slot_ + 1) % slots_.size();
    if (pool_) {
      pool_->Submit([this, &slot] {
        Compute(slot);
        std::lock_guard<std::mutex> lock(slot_mu_);
        slot.done = true;
        slot_cv_.notify_all();
      });
    } else {
      Compute(slot);
      slot.done = true;
      RETURN_NOT_OK(WaitAndCommit(slot));
    }
  }
  return Status::OK();
}

void DeltaWriter::Compute(Slot& slot) {
  const SliceSource& s = *slot.src;
  const Box& rel = slot.rel;
  const uint32_t elem = SizeOf(s.dtype);
  const uint64_t n = BoxElements(rel);
  Box local = rel;
  for (size_t d = 0; d < rel.offset.size(); ++d) local.offset[d] += s.local_box.offset[d];
  slot.status = Status::OK();
  slot.chosen = nullptr;
  slot.encoded_len = 0;

  // Contiguous boxes are read in place; others are gathered once into scratch.
  const uint8_t* new_bits;
  const uint8_t* old_bits = nullptr;
  Stopwatch diff_clock;
  if (BoxIsContiguous(s.local_shape, local)) {
    uint64_t start = BoxStartElement(s.local_shape, local) * elem;
    new_bits = s.new_bits + start;
    if (s.old_bits != nullptr) old_bits = s.old_bits + start;
  } else {
    slot.new_scratch.resize(n * elem);
    GatherBox(s.new_bits, s.local_shape, local, elem, slot.new_scratch.data());
    new_bits = slot.new_scratch.data();
    if (s.old_bits != nullptr) {
      slot.old_scratch.resize(n * elem);
      GatherBox(s.old_bits, s.local_shape, local, elem, slot.old_scratch.data());
      old_bits = slot.old_scratch.data();
    }
  }
  slot.positions.clear();
  slot.old_values.clear();
  slot.new_values.clear();
  uint64_t changed = n;
  uint64_t digest = 0;
  // Only an encoder reads the packed values (a dense record copies the bits at commit).
  const bool encodes = single_ != nullptr || auto_ != nullptr;
  if (old_bits != nullptr) {
    // One pass: each block of the new bits is digested while the diff has it in cache, and the
    // changed elements' bits are copied out of it for the encoder.
    kernels::ChangedValues values;
    if (encodes) values = {&slot.old_values, &slot.new_values};
    const kernels::DiffDigest d =
        kernels::DiffPositionsAndDigest(old_bits, new_bits, n, elem, &slot.positions, values);
    changed = d.changed;
    digest = d.digest;
  } else {
    digest = kernels::Digest64(new_bits, n * elem);
  }
  slot.diff_seconds = diff_clock.Seconds();
  slot.encode_seconds = 0;
  RecordHeader& h = slot.header;
  h = RecordHeader();
  h.changed = changed;
  if (changed == 0) return;

  Stopwatch encode_clock;
  refit_encode_input_t& in = slot.in;
  in = refit_encode_input_t{};
  in.struct_size = sizeof(in);
  in.dtype = static_cast<int32_t>(s.dtype);
  in.elem_size = elem;
  in.n_elems = n;
  in.old_bits = old_bits;
  in.new_bits = new_bits;
  in.positions = old_bits != nullptr ? slot.positions.data() : nullptr;
  in.n_changed = changed;
  if (old_bits != nullptr && encodes) {
    in.old_values = slot.old_values.data();
    in.new_values = slot.new_values.data();
  }

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
  if (old_bits == nullptr || !encodes) return;
  auto encode = [&](const Encoding* enc, kernels::UninitVector<uint8_t>& out) -> Result<uint64_t> {
    uint64_t cap = enc->MaxEncodedSize(in);
    if (cap == 0) return Status::Internal("encoding '" + enc->name() + "' cannot size its output");
    out.resize(cap);
    return enc->Encode(in, out.data(), cap);
  };
  const uint64_t dense_bytes = n * elem;
  if (single_ != nullptr) {
    Result<uint64_t> written = encode(single_, slot.best);
    if (!written.ok()) {
      slot.status = written.status();
      return;
    }
    if (written.value() < dense_bytes) {
      slot.chosen = single_;
      slot.encoded_len = written.value();
    }
  } else {
    // Every candidate runs; the smallest so far stays in `best`.
    const auto& cands = auto_->candidates;
    slot.sizes.assign(cands.size(), UINT64_MAX);
    size_t smallest = cands.size();
    for (size_t i = 0; i < cands.size(); ++i) {
      Result<uint64_t> written = encode(cands[i], slot.trial);
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
    size_t pick = smallest;
    if (auto_->fastest && smallest < cands.size()) {
      const double limit = static_cast<double>(slot.sizes[smallest]) * auto_->budget;
      for (size_t i = 0; i < cands.size(); ++i) {
        if (static_cast<double>(slot.sizes[i]) <= limit) {
          pick = i;
          break;
        }
      }
      if (pick != smallest) {
        Result<uint64_t> written = encode(cands[pick], slot.best);
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
  slot.encode_seconds = encode_clock.Seconds();
}

Status DeltaWriter::WaitAndCommit(Slot& slot) {
  {
    std::unique_lock<std::mutex> lock(slot_mu_);
    slot_cv_.wait(lock, [&] { return slot.done; });
  }
  slot.pending = false;
  Status st = Commit(slot);
  slot.src.reset();
  if (!st.ok()) return st.WithContext("tensor '" + slot.header.tensor + "'");
  return st;
}

Status DeltaWriter::Commit(Slot& slot) {
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
      RETURN_NOT_OK(Flush());
    }
    h.encoding = slot.chosen->name();
    h.op = slot.chosen->op();
    builder_.Add(std::move(h), slot.best.data(), slot.encoded_len);
  } else {
    Stopwatch clock;
    uint64_t cap = dense_->MaxEncodedSize(slot.in);
    if (cap == 0) return Status::Internal("encoding 'dense' cannot size its output");
    if (!builder_.empty() && builder_.data_bytes() + cap > bucket_bytes_) RETURN_NOT_OK(Flush());
    h.encoding = dense_->name();
    h.op = dense_->op();
    uint8_t* out = builder_.AddInPlace(std::move(h), cap);
    ASSIGN_OR_RAISE(uint64_t written, dense_->Encode(slot.in, out, cap));
    builder_.TrimLast(written);
    encode_seconds += clock.Seconds();
  }
  slot.header.tensor = std::move(tensor);  // for the caller's error context
  changed_elements += changed;
  changed_bytes += changed * SizeOf(slot.src->dtype);
  ++records;
  return Status::OK();
}

Status DeltaWriter::DrainSlots() {
  for (size_t k = 0; k < slots_.size(); ++k) {
    Slot& slot = *slots_[(next_slot_ + k) % slots_.size()];
    if (slot.pending) RETURN_NOT_OK(WaitAndCommit(slot));
  }
  return Status::OK();
}

Status DeltaWriter::Flush() {
  if (builder_.empty()) return Status::OK();
  uint64_t n = builder_.num_records();
  ASSIGN_OR_RAISE(std::vector<uint8_t> payload, builder_.Finish());
  Status st = flush_(std::move(payload), n);
  if (bucket_bytes_ <= (1ull << 30)) builder_.Reserve(bucket_bytes_);
  return st;
}

Status DeltaWriter::Finish() {
  RETURN_NOT_OK(DrainSlots());
  return Flush();
}

AsyncPutter::AsyncPutter(PutFn put) : put_(std::move(put)), thread_([this] { Run(); }) {}

AsyncPutter::~AsyncPutter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Status AsyncPutter::Submit(std::string key, std::vector<uint8_t>&& payload) {
  Stopwatch clock;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !has_work_ && !busy_; });
  wait_seconds_ += clock.Seconds();
  if (!error_.ok()) return error_;
  slot_key_ = std::move(key);
  slot_ = std::move(payload);
  has_work_ = true;
  cv_.notify_all();
  return Status::OK();
}

Status AsyncPutter::Drain() {
  Stopwatch clock;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !has_work_ && !busy_; });
  wait_seconds_ += clock.Seconds();
  return error_;
}

void AsyncPutter::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return has_work_ || stop_; });
    if (!has_work_ && stop_) return;
    std::vector<uint8_t> payload = std::move(slot_);
    std::string key = std::move(slot_key_);
    has_work_ = false;
    busy_ = true;
    lock.unlock();
    Status st = error_.ok() ? put_(key, payload) : Status::OK();
    payload.clear();
    payload.shrink_to_fit();
    lock.lock();
    if (!st.ok() && error_.ok()) error_ = st;
    busy_ = false;
    cv_.notify_all();
  }
}

// ---------------------------------------------------------------- receiver side

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
  RETURN_NOT_OK(
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
  RETURN_NOT_OK(
      journal.Append(id, target.name, box, elem, positions, values.data()).WithContext(where));
  if (stats != nullptr) ++stats->journaled_records;
  MaybeKillAt("receiver.journaled");
  ScatterBox(new_bits, target.shape, box, elem, target.bytes());
  return Status::OK();
}

Status ApplyPayload(const Payload& payload, EncodingCache& encodings, const TensorResolver& resolve,
                    uint64_t max_record_bytes, std::vector<uint8_t>& scratch, ApplyStats* stats,
                    ApplyJournal* journal) {
  const auto& records = payload.records();
  for (size_t i = 0; i < records.size(); ++i) {
    const RecordHeader& r = records[i];
    // Every rejection is one line naming the payload, the record and its tensor (names were
    // checked printable by Payload::Parse).
    auto where = [&] {
      return payload.label() + ": record " + std::to_string(i) + " ('" + r.tensor + "')";
    };
    Result<ApplyTarget> target_r = resolve(r);
    if (!target_r.ok()) return target_r.status().WithContext(where());
    if (target_r.value().tensor == nullptr) continue;  // another receiver shard's record
    TensorView& target = *target_r.value().tensor;
    const Box& box = target_r.value().box;
    if (target.dtype != r.dtype) {
      return Status::Corrupt(where() + ": record is " + std::string(NameOf(r.dtype)) +
                             " but the target tensor is " + std::string(NameOf(target.dtype)));
    }
    if (box.extent != r.box_extent || box.offset.size() != target.shape.size()) {
      return Status::Internal(where() + ": resolver returned a box of another extent");
    }
    for (size_t d = 0; d < box.offset.size(); ++d) {
      if (box.offset[d] > target.shape[d] || box.extent[d] > target.shape[d] - box.offset[d]) {
        return Status::Corrupt(where() + ": box at " + ShapeToString(box.offset) + " of extent " +
                               ShapeToString(box.extent) + " falls outside target tensor '" +
                               target.name + "' " + ShapeToString(target.shape));
      }
    }
    const uint32_t elem = SizeOf(r.dtype);
    const uint64_t n = BoxElements(box);
    if (n > max_record_bytes / elem) {
      return Status::Invalid(where() + ": box of " + std::to_string(n * elem) +
                             " bytes exceeds the receiver cap of " +
                             std::to_string(max_record_bytes) + " (lower the sender chunk_bytes)");
    }
    Result<const Encoding*> enc_r = encodings.Get(r.encoding);
    if (!enc_r.ok()) return enc_r.status().WithContext(where());
    const Encoding* enc = enc_r.value();
    if (enc->op() != r.op) {
      return Status::Corrupt(where() + ": op does not match encoding '" + r.encoding + "'");
    }
    if (journal != nullptr && r.op != REFIT_OP_OVERWRITE) {
      RETURN_NOT_OK(
          ApplyJournaled(payload, i, *enc, where(), target, box, scratch, *journal, stats));
      if (stats != nullptr) {
        ++stats->records;
        stats->changed_elements += r.changed;
      }
      continue;
    }
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
    RETURN_NOT_OK(
        enc->Decode(payload.record_bytes(r), r.data_end - r.data_begin, t).WithContext(where()));
    uint64_t digest = kernels::Digest64(bits, n * elem);
    if (digest != r.digest) {
      return Status::Corrupt(where() + ": digest mismatch after apply (expected " +
                             HexDigest(r.digest) + ", got " + HexDigest(digest) + ")");
    }
    if (!contiguous) ScatterBox(bits, target.shape, box, elem, target.bytes());
    if (stats != nullptr) {
      ++stats->records;
      stats->changed_elements += r.changed;
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
