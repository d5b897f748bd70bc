#include "engine.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

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
  Status st = WriteAll(fd, reinterpret_cast<const uint8_t*>(plan.header.data()),
                       plan.header.size(), path);
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
  ASSIGN_OR_RAISE(std::unique_ptr<Encoding> enc,
                  registry_.CreateEncoding(name, has_section ? config_ : nullptr,
                                           has_section ? section : ""));
  const Encoding* raw = enc.get();
  encodings_[name] = std::move(enc);
  return raw;
}

// ---------------------------------------------------------------- sender side

DeltaWriter::DeltaWriter(EncodingCache& encodings, std::string encoding, uint64_t chunk_bytes,
                         uint64_t bucket_bytes, Metadata payload_metadata, FlushFn flush)
    : encodings_(encodings),
      encoding_(std::move(encoding)),
      chunk_bytes_(std::max<uint64_t>(chunk_bytes, 1024)),
      bucket_bytes_(std::max<uint64_t>(bucket_bytes, 1024)),
      builder_(std::move(payload_metadata)),
      flush_(std::move(flush)) {
  // One allocation per payload instead of a reallocation chain while records are appended.
  if (bucket_bytes_ <= (1ull << 30)) builder_.Reserve(bucket_bytes_);
}

Status DeltaWriter::Add(const SliceSource& s) {
  const uint32_t elem = SizeOf(s.dtype);
  Box rel;
  rel.offset.assign(s.local_box.extent.size(), 0);
  rel.extent = s.local_box.extent;
  uint64_t n = BoxElements(rel);
  total_elements += n;
  model_bytes += n * elem;
  for (const Box& chunk : SplitBox(rel, std::max<uint64_t>(chunk_bytes_ / elem, 1))) {
    RETURN_NOT_OK(AddChunk(s, chunk).WithContext("tensor '" + s.tensor + "'"));
  }
  return Status::OK();
}

Status DeltaWriter::AddChunk(const SliceSource& s, const Box& rel) {
  const uint32_t elem = SizeOf(s.dtype);
  const uint64_t n = BoxElements(rel);
  Box local = rel;
  for (size_t d = 0; d < rel.offset.size(); ++d) local.offset[d] += s.local_box.offset[d];

  // Contiguous boxes are read in place; others are gathered once into scratch.
  const uint8_t* new_bits;
  const uint8_t* old_bits = nullptr;
  Stopwatch diff_clock;
  if (BoxIsContiguous(s.local_shape, local)) {
    uint64_t start = BoxStartElement(s.local_shape, local) * elem;
    new_bits = s.new_bits + start;
    if (s.old_bits != nullptr) old_bits = s.old_bits + start;
  } else {
    new_scratch_.resize(n * elem);
    GatherBox(s.new_bits, s.local_shape, local, elem, new_scratch_.data());
    new_bits = new_scratch_.data();
    if (s.old_bits != nullptr) {
      old_scratch_.resize(n * elem);
      GatherBox(s.old_bits, s.local_shape, local, elem, old_scratch_.data());
      old_bits = old_scratch_.data();
    }
  }
  positions_.clear();
  uint64_t changed = n;
  if (old_bits != nullptr) {
    changed = kernels::DiffPositions(old_bits, new_bits, n, elem, &positions_);
  }
  diff_seconds += diff_clock.Seconds();
  if (changed == 0) return Status::OK();

  Stopwatch encode_clock;
  refit_encode_input_t in{};
  in.struct_size = sizeof(in);
  in.dtype = static_cast<int32_t>(s.dtype);
  in.elem_size = elem;
  in.n_elems = n;
  in.old_bits = old_bits;
  in.new_bits = new_bits;
  in.positions = old_bits != nullptr ? positions_.data() : nullptr;
  in.n_changed = changed;

  RecordHeader h;
  h.tensor = s.tensor;
  h.dtype = s.dtype;
  h.shape = s.canonical_shape;
  h.box_offset = rel.offset;
  for (size_t d = 0; d < rel.offset.size(); ++d) h.box_offset[d] += s.canonical_offset[d];
  h.box_extent = rel.extent;
  h.changed = changed;
  h.digest = kernels::Digest64(new_bits, n * elem);
  h.create = old_bits == nullptr;

  // The chosen encoding goes to scratch first: a record it would make larger than the bits
  // themselves is sent dense instead (never bigger, always applies). Full syncs are dense.
  if (old_bits != nullptr && encoding_ != "dense") {
    ASSIGN_OR_RAISE(const Encoding* enc, encodings_.Get(encoding_));
    uint64_t cap = enc->MaxEncodedSize(in);
    if (cap == 0) return Status::Internal("encoding '" + enc->name() + "' cannot size its output");
    encoded_.resize(cap);
    ASSIGN_OR_RAISE(uint64_t written, enc->Encode(in, encoded_.data(), cap));
    if (written < n * elem) {
      if (!builder_.empty() && builder_.data_bytes() + written > bucket_bytes_) {
        RETURN_NOT_OK(Flush());
      }
      h.encoding = enc->name();
      h.op = enc->op();
      builder_.Add(std::move(h), encoded_.data(), written);
      encode_seconds += encode_clock.Seconds();
      changed_elements += changed;
      changed_bytes += changed * elem;
      ++records;
      return Status::OK();
    }
  }
  ASSIGN_OR_RAISE(const Encoding* dense, encodings_.Get("dense"));
  uint64_t cap = dense->MaxEncodedSize(in);
  if (cap == 0) return Status::Internal("encoding 'dense' cannot size its output");
  if (!builder_.empty() && builder_.data_bytes() + cap > bucket_bytes_) RETURN_NOT_OK(Flush());
  h.encoding = dense->name();
  h.op = dense->op();
  uint8_t* out = builder_.AddInPlace(std::move(h), cap);
  ASSIGN_OR_RAISE(uint64_t written, dense->Encode(in, out, cap));
  builder_.TrimLast(written);
  encode_seconds += encode_clock.Seconds();
  changed_elements += changed;
  changed_bytes += changed * elem;
  ++records;
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

Status DeltaWriter::Finish() { return Flush(); }

AsyncPutter::AsyncPutter(PutFn put)
    : put_(std::move(put)), thread_([this] { Run(); }) {}

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

Status ApplyPayload(const Payload& payload, EncodingCache& encodings, const TensorResolver& resolve,
                    uint64_t max_record_bytes, std::vector<uint8_t>& scratch, ApplyStats* stats) {
  const auto& records = payload.records();
  for (size_t i = 0; i < records.size(); ++i) {
    const RecordHeader& r = records[i];
    auto where = [&] {
      return payload.label() + ": record " + std::to_string(i) + " ('" + r.tensor + "')";
    };
    Result<ApplyTarget> target_r = resolve(r);
    if (!target_r.ok()) return target_r.status().WithContext(where());
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
        return Status::Corrupt(where() + ": box falls outside the target tensor " +
                               ShapeToString(target.shape));
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
    RETURN_NOT_OK(enc->Decode(payload.record_bytes(r), r.data_end - r.data_begin, t)
                      .WithContext(where()));
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
