#include "receive/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <thread>

#include "common/file_util.h"
#include "faults/faults.h"
#include "refit/kernels/buffer.h"
#include "refit/kernels/coding.h"
#include "refit/kernels/diff.h"

namespace refit::internal {

namespace {

// File: header, then entries. Header: magic, checkpoint version, the writing boot's id (36
// bytes, zero-padded), xxh3 of the preceding bytes. Entry: u32 body length, u64 xxh3 of the
// body, body. Body: u16 id length, id, u16 name length, name, u32 ndim, ndim x (u64 offset, u64
// extent), u32 element size, u8 position coding, u64 count, the positions, count x element-size
// values. Position coding 4 or 8: count fixed-width positions; kGapCoded + w (w = 1, 2, 4): a u64
// byte length, then a gap stream of that many bytes at width w (kernels/coding.h), for strictly
// increasing positions (the diff's order): at 1-2% density that is ~1.2 bytes a position instead
// of 4, and the log's bytes are what its fdatasync waits for. Little-endian throughout.
constexpr char kMagic[4] = {'R', 'F', 'L', '2'};
constexpr size_t kBootIdBytes = 36;
constexpr uint64_t kHeaderBytes = 4 + 8 + kBootIdBytes + 8;
constexpr uint64_t kEntryPrefixBytes = 4 + 8;
constexpr uint32_t kMaxEntryBytes = 1u << 31;
constexpr uint8_t kGapCoded = 0x10;

void Put(std::string& out, const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }
template <typename T>
void PutInt(std::string& out, T v) {
  Put(out, &v, sizeof(v));  // x86-64 / aarch64: little-endian hosts only, the only ones supported
}

// A bounds-checked reader over one entry body.
class Reader {
 public:
  Reader(const uint8_t* p, uint64_t n) : p_(p), n_(n) {}
  template <typename T>
  bool Int(T* v) {
    if (n_ - at_ < sizeof(T)) return false;
    std::memcpy(v, p_ + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool Bytes(uint64_t n, const uint8_t** out) {
    if (n_ - at_ < n) return false;
    *out = p_ + at_;
    at_ += n;
    return true;
  }
  bool Done() const { return at_ == n_; }

 private:
  const uint8_t* p_;
  uint64_t n_;
  uint64_t at_ = 0;
};

// One entry as stored: pointers into its body.
struct EntryView {
  std::string id;
  std::string tensor;
  Box box;
  uint32_t elem_size = 0;
  uint8_t position_coding = 0;
  uint64_t count = 0;
  const uint8_t* positions = nullptr;
  uint64_t positions_bytes = 0;
  const uint8_t* values = nullptr;

  bool gap_coded() const { return position_coding > kGapCoded; }
  // The positions, each checked < n (and, gap-coded, strictly increasing), into `out`.
  bool DecodePositions(uint64_t n, std::vector<uint64_t>& out) const {
    out.resize(count);
    if (gap_coded()) {
      return kernels::DecodeGaps(positions, positions_bytes, count, position_coding - kGapCoded, n,
                                 out.data())
                 .error == kernels::GapDecodeError::kOk;
    }
    for (uint64_t i = 0; i < count; ++i) {
      if (position_coding == 4) {
        uint32_t p;
        std::memcpy(&p, positions + 4 * i, 4);
        out[i] = p;
      } else {
        std::memcpy(&out[i], positions + 8 * i, 8);
      }
      if (out[i] >= n) return false;
    }
    return true;
  }
};

bool StrictlyIncreasing(const uint64_t* positions, uint64_t count) {
  for (uint64_t i = 1; i < count; ++i) {
    if (positions[i] <= positions[i - 1]) return false;
  }
  return true;
}

bool ValidPositionCoding(uint8_t c) {
  return c == 4 || c == 8 || c == kGapCoded + 1 || c == kGapCoded + 2 || c == kGapCoded + 4;
}

bool ParseEntry(const uint8_t* body, uint64_t len, EntryView* e) {
  Reader r(body, len);
  uint16_t id_len = 0, name_len = 0;
  uint32_t ndim = 0;
  const uint8_t* bytes = nullptr;
  if (!r.Int(&id_len) || !r.Bytes(id_len, &bytes)) return false;
  e->id.assign(reinterpret_cast<const char*>(bytes), id_len);
  if (!r.Int(&name_len) || !r.Bytes(name_len, &bytes)) return false;
  e->tensor.assign(reinterpret_cast<const char*>(bytes), name_len);
  if (!r.Int(&ndim) || ndim > 64) return false;
  for (uint32_t d = 0; d < ndim; ++d) {
    uint64_t off = 0, ext = 0;
    if (!r.Int(&off) || !r.Int(&ext)) return false;
    e->box.offset.push_back(off);
    e->box.extent.push_back(ext);
  }
  if (!r.Int(&e->elem_size) || e->elem_size < 1 || e->elem_size > 8) return false;
  if (!r.Int(&e->position_coding) || !ValidPositionCoding(e->position_coding)) return false;
  if (!r.Int(&e->count) || e->count > len) return false;
  if (e->gap_coded()) {
    if (!r.Int(&e->positions_bytes) || e->positions_bytes > len) return false;
  } else {
    e->positions_bytes = e->count * e->position_coding;
  }
  return r.Bytes(e->positions_bytes, &e->positions) &&
         r.Bytes(e->count * e->elem_size, &e->values) && r.Done();
}

std::string Header(uint64_t version, const std::string& boot_id) {
  std::string h;
  Put(h, kMagic, 4);
  PutInt(h, version);
  std::string boot = boot_id.substr(0, kBootIdBytes);
  boot.resize(kBootIdBytes, '\0');
  h += boot;
  PutInt(h, kernels::Digest64(h.data(), h.size()));
  return h;
}

// Calls fn(offset, body, len) for each whole entry at offsets >= from; returns where the valid
// entries end (a torn or checksum-failing tail is not an entry).
template <typename Fn>
Result<uint64_t> ForEachEntry(int fd, const std::string& path, uint64_t from, uint64_t size,
                              Fn&& fn) {
  uint64_t at = from;
  std::vector<uint8_t> body;
  while (size - at >= kEntryPrefixBytes) {
    uint8_t prefix[kEntryPrefixBytes];
    REFIT_RETURN_NOT_OK(ReadAllAt(fd, prefix, kEntryPrefixBytes, at, path));
    uint32_t len;
    uint64_t digest;
    std::memcpy(&len, prefix, 4);
    std::memcpy(&digest, prefix + 4, 8);
    if (len > kMaxEntryBytes || size - at - kEntryPrefixBytes < len) break;  // torn tail
    body.resize(len);
    REFIT_RETURN_NOT_OK(ReadAllAt(fd, body.data(), len, at + kEntryPrefixBytes, path));
    if (kernels::Digest64(body.data(), len) != digest) break;  // torn tail
    REFIT_RETURN_NOT_OK(fn(at, body.data(), static_cast<uint64_t>(len)));
    at += kEntryPrefixBytes + len;
  }
  return at;
}

}  // namespace

const std::string& CurrentBootId() {
  static const std::string id = [] {
    auto text = ReadSmallFile("/proc/sys/kernel/random/boot_id", 256);
    std::string s = text.ok() ? text.value() : std::string();
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  }();
  return id;
}

uint64_t RedoLog::HeaderBytes() { return kHeaderBytes; }

namespace {
// A contiguous box's changes from its first element `base`: through the file where it lies in a
// writable MappedFile (file_util.h), else stored into memory.
Status OverwriteContiguous(uint8_t* base, uint32_t elem, const uint64_t* positions, uint64_t count,
                           const uint8_t* values) {
  REFIT_ASSIGN_OR_RAISE(bool written, OverwriteInMappedFile(base, elem, positions, count, values));
  if (!written) kernels::ScatterOverwrite(base, elem, positions, count, values);
  return Status::OK();
}
}  // namespace

Status OverwriteBox(const TensorView& tensor, const Box& box, uint32_t elem,
                    const uint64_t* positions, uint64_t count, const uint8_t* values) {
  uint8_t* bytes = tensor.bytes();
  // A contiguous box (the common case) maps a position by one addition.
  if (BoxIsContiguous(tensor.shape, box)) {
    return OverwriteContiguous(bytes + BoxStartElement(tensor.shape, box) * elem, elem, positions,
                               count, values);
  }
  for (uint64_t i = 0; i < count; ++i) {
    std::memcpy(bytes + BoxElementIndex(tensor.shape, box, positions[i]) * elem, values + i * elem,
                elem);
  }
  return Status::OK();
}

uint64_t BoxElementIndex(const Shape& shape, const Box& box, uint64_t i) {
  uint64_t index = 0;
  uint64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    const uint64_t extent = box.extent[d];
    const uint64_t coord = box.offset[d] + (extent == 0 ? 0 : i % extent);
    if (extent != 0) i /= extent;
    index += coord * stride;
    stride *= shape[d];
  }
  return index;
}

Result<std::unique_ptr<RedoLog>> RedoLog::Open(const std::string& path, bool durable,
                                               uint64_t clean_bytes) {
  std::unique_ptr<RedoLog> log(new RedoLog());
  log->path_ = path;
  log->durable_ = durable;
  // O_NOFOLLOW | O_NONBLOCK: a link planted in the state directory must not carry log writes
  // elsewhere, and a FIFO must not block the open; only a regular file is a log.
  log->fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (log->fd_ < 0) return Status::IoError(path + ": open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(log->fd_, &st) != 0) return Status::IoError(path + ": stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return Status::Invalid(path + ": not a regular file");
  log->size_ = static_cast<uint64_t>(st.st_size);
  bool valid = false;
  if (log->size_ >= kHeaderBytes) {
    std::string h(kHeaderBytes, '\0');
    REFIT_RETURN_NOT_OK(
        ReadAllAt(log->fd_, reinterpret_cast<uint8_t*>(h.data()), kHeaderBytes, 0, path));
    uint64_t digest;
    std::memcpy(&digest, h.data() + kHeaderBytes - 8, 8);
    valid = std::memcmp(h.data(), kMagic, 4) == 0 &&
            kernels::Digest64(h.data(), kHeaderBytes - 8) == digest;
    if (valid) {
      std::memcpy(&log->checkpoint_version_, h.data() + 4, 8);
      std::string boot = h.substr(12, kBootIdBytes);
      boot.resize(std::strlen(boot.c_str()));
      log->other_boot_ = boot != CurrentBootId();
    }
  }
  if (!valid) {
    // A new log, or a header torn before its first entry was written: nothing to replay.
    REFIT_RETURN_NOT_OK(log->WriteHeader(0));
    return log;
  }
  if (log->empty()) {
    if (log->other_boot_) REFIT_RETURN_NOT_OK(log->WriteHeader(log->checkpoint_version_));
  } else {
    const uint64_t from =
        clean_bytes >= kHeaderBytes && clean_bytes <= log->size_ ? clean_bytes : kHeaderBytes;
    REFIT_RETURN_NOT_OK(log->Index(from));
  }
  REFIT_RETURN_NOT_OK(log->LoadTail());
  return log;
}

RedoLog::~RedoLog() {
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (fd_ >= 0) ::close(fd_);
}

Status RedoLog::WriteHeader(uint64_t version) {
  const std::string header = Header(version, CurrentBootId());
  if (::ftruncate(fd_, 0) != 0) return Status::IoError(path_ + ": " + std::strerror(errno));
  REFIT_RETURN_NOT_OK(
      WriteAllAt(fd_, reinterpret_cast<const uint8_t*>(header.data()), header.size(), 0, path_));
  REFIT_RETURN_NOT_OK(Sync());
  checkpoint_version_ = version;
  other_boot_ = false;
  size_ = kHeaderBytes;
  {
    std::lock_guard<std::mutex> lock(ids_mu_);
    ids_.clear();
    interrupted_ = 0;
  }
  return LoadTail();
}

Status RedoLog::Index(uint64_t from) {
  REFIT_ASSIGN_OR_RAISE(
      uint64_t end,
      ForEachEntry(fd_, path_, from, size_, [&](uint64_t at, const uint8_t* body, uint64_t len) {
        EntryView e;
        if (!ParseEntry(body, len, &e)) {
          return Status::Corrupt(path_ + ": log entry at byte " + std::to_string(at) +
                                 " is malformed (its checksum matched)");
        }
        std::lock_guard<std::mutex> lock(ids_mu_);
        ids_.insert(e.id);
        ++interrupted_;
        return Status::OK();
      }));
  if (end != size_) {
    if (::ftruncate(fd_, static_cast<off_t>(end)) != 0) {
      return Status::IoError(path_ + ": cutting a torn entry: " + std::strerror(errno));
    }
    size_ = end;
  }
  return Status::OK();
}

Status RedoLog::Stage(const std::string& record_id, const std::string& tensor, const Box& box,
                      uint32_t elem_size, const uint64_t* positions, uint64_t count,
                      const uint8_t* values) {
  if (record_id.size() > UINT16_MAX || tensor.size() > UINT16_MAX) {
    return Status::Invalid("redo log: record id or tensor name too long");
  }
  // Positions are box-relative: gap-coded when strictly increasing (and smaller), else 4 bytes
  // each unless the box has 2^32 elements or more.
  const uint8_t width = BoxElements(box) <= UINT32_MAX ? 4 : 8;
  uint8_t coding = width;
  uint64_t positions_bytes = count * width;
  if (StrictlyIncreasing(positions, count)) {
    const kernels::GapStats stats = kernels::ComputeGapStats(positions, count);
    const uint32_t gap_width = kernels::ChooseGapWidth(stats);
    const uint64_t gap_bytes = 8 + kernels::GapStreamBytes(stats, gap_width);
    if (gap_bytes < positions_bytes) {
      coding = static_cast<uint8_t>(kGapCoded + gap_width);
      positions_bytes = gap_bytes;
    }
  }
  const uint64_t body_bytes = 2 + record_id.size() + 2 + tensor.size() + 4 +
                              16 * box.offset.size() + 4 + 1 + 8 + positions_bytes +
                              count * elem_size;
  if (body_bytes > kMaxEntryBytes) {
    return Status::Invalid("redo log: entry of " + std::to_string(body_bytes) +
                           " bytes (lower sender.chunk_bytes)");
  }
  // Written in place behind its prefix (length, digest), which is filled last.
  uint8_t* const entry = Grow(kEntryPrefixBytes + body_bytes);
  uint8_t* const body = entry + kEntryPrefixBytes;
  uint8_t* at = body;
  const auto put = [&at](const void* p, size_t n) {
    std::memcpy(at, p, n);
    at += n;
  };
  const auto put_int = [&put](auto v) { put(&v, sizeof(v)); };
  put_int(static_cast<uint16_t>(record_id.size()));
  put(record_id.data(), record_id.size());
  put_int(static_cast<uint16_t>(tensor.size()));
  put(tensor.data(), tensor.size());
  put_int(static_cast<uint32_t>(box.offset.size()));
  for (size_t d = 0; d < box.offset.size(); ++d) {
    put_int(box.offset[d]);
    put_int(box.extent[d]);
  }
  put_int(elem_size);
  put_int(coding);
  put_int(count);
  if (coding > kGapCoded) {
    put_int(positions_bytes - 8);
    kernels::EncodeGaps(positions, count, coding - kGapCoded, at);
    at += positions_bytes - 8;
  } else if (width == 8) {
    put(positions, count * 8);
  } else {
    for (uint64_t i = 0; i < count; ++i) put_int(static_cast<uint32_t>(positions[i]));
  }
  put(values, count * elem_size);
  const uint32_t len = static_cast<uint32_t>(body_bytes);
  const uint64_t digest = kernels::Digest64(body, body_bytes);
  std::memcpy(entry, &len, 4);
  std::memcpy(entry + 4, &digest, 8);
  staged_ids_.push_back(record_id);
  return Status::OK();
}

Status RedoLog::Flush(bool sync) {
  const uint64_t staged = staged_bytes();
  if (staged > 0) {
    REFIT_RETURN_NOT_OK(WriteStaged());
  } else if (!unsynced_ || !sync) {
    return Status::OK();
  }
  // A sync covers what earlier unsynced flushes wrote.
  if (sync) {
    REFIT_RETURN_NOT_OK(Sync());
  } else {
    unsynced_ = durable_;
  }
  size_ += staged;
  KeepTail();
  std::lock_guard<std::mutex> lock(ids_mu_);
  for (std::string& id : staged_ids_) ids_.insert(std::move(id));
  staged_ids_.clear();
  return Status::OK();
}

namespace {
// O_DIRECT writes start and end on this boundary (the common logical block sizes divide it).
constexpr uint64_t kDirectBlock = 4096;
uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }
}  // namespace

void UnmapLogBuffer::operator()(uint8_t* p) const { kernels::UnmapGrowableBuffer(p, bytes); }

void RedoLog::Reserve(uint64_t bytes) {
  const uint64_t need = RoundUp(bytes, kDirectBlock);  // room for the padding too
  const uint64_t held = buffer_.get_deleter().bytes;   // the mapping's size: its capacity
  if (need <= held) return;
  const uint64_t capacity = std::max({need, 2 * held, uint64_t{1} << 20});
  // Page aligned, as O_DIRECT needs (kDirectBlock divides the page size).
  void* grown = buffer_ == nullptr ? kernels::MapGrowableBuffer(capacity)
                                   : kernels::GrowMappedBuffer(buffer_.get(), held, capacity);
  (void)buffer_.release();  // moved by the kernel, not to be unmapped at its old address
  buffer_ = std::unique_ptr<uint8_t, UnmapLogBuffer>(static_cast<uint8_t*>(grown),
                                                     UnmapLogBuffer{capacity});
}

uint8_t* RedoLog::Grow(uint64_t n) {
  Reserve(buffer_size_ + n);
  uint8_t* at = buffer_.get() + buffer_size_;
  buffer_size_ += n;
  return at;
}

// After size_ moved: the bytes from the last block boundary to size_ stay at the buffer's front.
void RedoLog::KeepTail() {
  const uint64_t tail = size_ % kDirectBlock;
  if (tail > 0) std::memmove(buffer_.get(), buffer_.get() + buffer_size_ - tail, tail);
  buffer_size_ = tail_bytes_ = tail;
}

// Reads the tail from the file (after the header or the size changed by other means); the
// staged entries, if any, stay behind it.
Status RedoLog::LoadTail() {
  const uint64_t staged = staged_bytes();
  const uint64_t tail = size_ % kDirectBlock;
  Reserve(tail + staged);
  if (staged > 0 && tail != tail_bytes_) {
    std::memmove(buffer_.get() + tail, buffer_.get() + tail_bytes_, staged);
  }
  buffer_size_ = tail + staged;
  tail_bytes_ = tail;
  return tail == 0 ? Status::OK() : ReadAllAt(fd_, buffer_.get(), tail, size_ - tail, path_);
}

void RedoLog::UseDirectWrites() {
  if (!durable_ || direct_fd_ >= 0) return;
  // The path again, guarded like the first open (no link, no blocking on a FIFO), and used only
  // if it is still the file fd_ holds: something planted in between gets buffered writes to fd_.
  const int fd = ::open(path_.c_str(), O_WRONLY | O_DIRECT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return;
  struct stat held {
  }, opened{};
  if (::fstat(fd_, &held) != 0 || ::fstat(fd, &opened) != 0 || held.st_dev != opened.st_dev ||
      held.st_ino != opened.st_ino) {
    ::close(fd);
    return;
  }
  direct_fd_ = fd;
}

// Writes buffer_ (tail and staged entries, zero-padded to a block) at the tail's boundary; false
// when the filesystem refuses the O_DIRECT write itself (EINVAL: alignment), before any byte.
// The padding lies past size_ and is no entry: a later Flush overwrites it, a reopen cuts it.
Result<bool> RedoLog::WriteDirect() {
  const uint64_t padded = RoundUp(buffer_size_, kDirectBlock);
  std::memset(buffer_.get() + buffer_size_, 0, padded - buffer_size_);
  const uint64_t offset = size_ - tail_bytes_;
  for (uint64_t done = 0; done < padded;) {
    const ssize_t n = ::pwrite(direct_fd_, buffer_.get() + done, padded - done,
                               static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EINVAL && done == 0) return false;
    if (n <= 0) return Status::IoError(path_ + ": write: " + std::strerror(n < 0 ? errno : EIO));
    done += static_cast<uint64_t>(n);
  }
  return true;
}

Status RedoLog::WriteStaged() {
  if (direct_fd_ >= 0) {
    REFIT_ASSIGN_OR_RAISE(bool written, WriteDirect());
    if (written) return Status::OK();
    ::close(direct_fd_);  // buffered from now on
    direct_fd_ = -1;
  }
  return WriteAllAt(fd_, buffer_.get() + tail_bytes_, staged_bytes(), size_, path_);
}

Status RedoLog::TruncateTo(uint64_t size) {
  // Entries staged and not written yet belong to the dropped attempt too (a publish that failed
  // in this process).
  buffer_size_ = tail_bytes_;
  staged_ids_.clear();
  if (size < kHeaderBytes || size >= size_) return Status::OK();
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
    return Status::IoError(path_ + ": " + std::strerror(errno));
  }
  size_ = size;
  {
    std::lock_guard<std::mutex> lock(ids_mu_);
    ids_.clear();  // only the dropped attempt's ids are ever asked about
    interrupted_ = 0;
  }
  return LoadTail();
}

Result<uint64_t> RedoLog::EndOfEntry(const std::string& record_id, uint64_t from) const {
  uint64_t found = 0;
  REFIT_RETURN_NOT_OK(ForEachEntry(fd_, path_, std::max(from, kHeaderBytes), size_,
                                   [&](uint64_t at, const uint8_t* body, uint64_t len) {
                                     EntryView e;
                                     if (found == 0 && ParseEntry(body, len, &e) &&
                                         e.id == record_id) {
                                       found = at + kEntryPrefixBytes + len;
                                     }
                                     return Status::OK();
                                   })
                          .status());
  if (found == 0) return Status::NotFound(path_ + ": no entry '" + record_id + "'");
  return found;
}

Status RedoLog::Sync() {
  if (durable_ && ::fdatasync(fd_) != 0) {
    return Status::IoError(path_ + ": fdatasync: " + std::strerror(errno));
  }
  unsynced_ = false;
  return Status::OK();
}

void RedoLog::StartWriteback() { (void)::sync_file_range(fd_, 0, 0, SYNC_FILE_RANGE_WRITE); }

namespace {

// Writes one entry's values into its tensor (positions decoded into `positions`, reused).
// The box lies within a tensor of `shape` (same rank, checked by the caller).
bool BoxFits(const Shape& shape, const Box& box) {
  for (size_t d = 0; d < shape.size(); ++d) {
    if (box.offset[d] > shape[d] || box.extent[d] > shape[d] - box.offset[d]) return false;
  }
  return true;
}

Status ReplayEntry(const std::string& path, const std::map<std::string, TensorView*>& tensors,
                   const uint8_t* body, uint64_t len, std::vector<uint64_t>& positions) {
  EntryView e;
  if (!ParseEntry(body, len, &e)) return Status::Corrupt(path + ": malformed log entry");
  if (e.count == 0) return Status::OK();
  auto it = tensors.find(e.tensor);
  if (it == tensors.end()) {
    return Status::Corrupt(path + ": log names tensor '" + e.tensor + "' the model does not have");
  }
  TensorView& t = *it->second;
  if (e.box.offset.size() != t.shape.size() || SizeOf(t.dtype) != e.elem_size) {
    return Status::Corrupt(path + ": log entry does not fit tensor '" + e.tensor + "'");
  }
  if (!BoxFits(t.shape, e.box)) {
    return Status::Corrupt(path + ": log box falls outside tensor '" + e.tensor + "'");
  }
  const uint64_t n = BoxElements(e.box);
  if (!e.DecodePositions(n, positions)) {
    return Status::Corrupt(path + ": log position outside its box in '" + e.tensor + "'");
  }
  return OverwriteBox(t, e.box, e.elem_size, positions.data(), e.count, e.values);
}

// Replays a batch of entries (disjoint elements, so in any order) on `threads` threads, this
// one included; the first failure in log order.
Status ReplayBatch(const std::string& path, const std::map<std::string, TensorView*>& tensors,
                   const std::vector<std::vector<uint8_t>>& bodies, unsigned threads,
                   const std::function<void()>& after_entry) {
  std::vector<Status> failed(bodies.size());
  auto stripe = [&](size_t k) {
    std::vector<uint64_t> positions;
    for (size_t i = k; i < bodies.size(); i += threads) {
      failed[i] = ReplayEntry(path, tensors, bodies[i].data(), bodies[i].size(), positions);
      if (k == 0 && failed[i].ok()) after_entry();  // this thread's: a kill point
    }
  };
  std::vector<std::thread> workers;
  for (unsigned k = 1; k < threads && k < bodies.size(); ++k) workers.emplace_back(stripe, k);
  stripe(0);
  for (std::thread& w : workers) w.join();
  for (const Status& st : failed) REFIT_RETURN_NOT_OK(st);
  return Status::OK();
}

}  // namespace

Status RedoLog::Replay(const std::map<std::string, TensorView*>& tensors, uint64_t from,
                       uint64_t to, unsigned disjoint_threads) const {
  if (from < kHeaderBytes) from = kHeaderBytes;
  to = std::min(to, size_);
  if (from >= to) return Status::OK();
  // Killed after the first entry, a replay is redone from the start: entries are overwrites.
  bool first = true;
  const std::function<void()> killable = [&first] {
    if (first) MaybeKillAt("redo.replay");
    first = false;
  };
  if (disjoint_threads <= 1) {
    std::vector<uint64_t> positions;
    return ForEachEntry(fd_, path_, from, to,
                        [&](uint64_t, const uint8_t* body, uint64_t len) {
                          Status st = ReplayEntry(path_, tensors, body, len, positions);
                          if (st.ok()) killable();
                          return st;
                        })
        .status();
  }
  // Entries are read in batches of bounded size, each replayed in parallel.
  constexpr uint64_t kBatchBytes = 64ull << 20;
  std::vector<std::vector<uint8_t>> batch;
  uint64_t held = 0;
  Status st = ForEachEntry(fd_, path_, from, to,
                           [&](uint64_t, const uint8_t* body, uint64_t len) -> Status {
                             batch.emplace_back(body, body + len);
                             if ((held += len) < kBatchBytes) return Status::OK();
                             REFIT_RETURN_NOT_OK(
                                 ReplayBatch(path_, tensors, batch, disjoint_threads, killable));
                             batch.clear();
                             held = 0;
                             return Status::OK();
                           })
                  .status();
  REFIT_RETURN_NOT_OK(st);
  return ReplayBatch(path_, tensors, batch, disjoint_threads, killable);
}

Status RedoLog::MarkCurrentBoot() {
  if (!other_boot_) return Status::OK();
  const std::string header = Header(checkpoint_version_, CurrentBootId());
  REFIT_RETURN_NOT_OK(
      WriteAllAt(fd_, reinterpret_cast<const uint8_t*>(header.data()), header.size(), 0, path_));
  REFIT_RETURN_NOT_OK(Sync());
  other_boot_ = false;
  return LoadTail();  // the header may lie in the tail's block
}

Status RedoLog::Checkpoint(uint64_t version) { return WriteHeader(version); }

struct RedoOverlay::Item {
  std::vector<uint8_t> body;  // the entry's bytes; `entry` points into them
  EntryView entry;
  uint8_t* base = nullptr;           // the box's first element in its tensor's memory
  uint64_t elements = 0;             // of the box
  uintptr_t begin = 0, end = 0;      // addresses of the box's bytes
  std::atomic<uint64_t> written{0};  // changes written so far
};

RedoOverlay::~RedoOverlay() = default;

Result<std::unique_ptr<RedoOverlay>> RedoOverlay::Load(const RedoLog& log, uint64_t from,
                                                       uint64_t to,
                                                       const std::vector<TensorView>& tensors,
                                                       uint64_t max_bytes) {
  std::unique_ptr<RedoOverlay> overlay(new RedoOverlay());
  overlay->path_ = log.path_;
  std::map<std::string, const TensorView*> by_name;
  for (const TensorView& t : tensors) by_name[t.name] = &t;
  uint64_t held = 0;
  bool suits = true;
  std::vector<uint64_t> positions;
  REFIT_RETURN_NOT_OK(
      ForEachEntry(log.fd_, log.path_, std::max(from, kHeaderBytes), std::min(to, log.size_),
                   [&](uint64_t at, const uint8_t* body, uint64_t len) -> Status {
                     if (!suits) return Status::OK();
                     auto item = std::make_unique<Item>();
                     item->body.assign(body, body + len);
                     if (!ParseEntry(item->body.data(), len, &item->entry)) {
                       return Status::Corrupt(log.path_ + ": log entry at byte " +
                                              std::to_string(at) + " is malformed");
                     }
                     const EntryView& e = item->entry;
                     if (e.count == 0) return Status::OK();  // a marker
                     auto it = by_name.find(e.tensor);
                     if (it == by_name.end()) {
                       return Status::Corrupt(log.path_ + ": log names tensor '" + e.tensor +
                                              "' the file does not have");
                     }
                     const TensorView& t = *it->second;
                     item->elements = BoxElements(e.box);
                     held += len;
                     // Raw positions are checked for order here (gap-coded ones are increasing by
                     // construction, checked as they are decoded).
                     suits = held <= max_bytes && e.box.offset.size() == t.shape.size() &&
                             SizeOf(t.dtype) == e.elem_size && BoxFits(t.shape, e.box) &&
                             BoxIsContiguous(t.shape, e.box) &&
                             (e.gap_coded() ||
                              (e.DecodePositions(item->elements, positions) &&
                               StrictlyIncreasing(positions.data(), positions.size())));
                     if (!suits) return Status::OK();
                     item->base = t.bytes() + BoxStartElement(t.shape, e.box) * e.elem_size;
                     item->begin = reinterpret_cast<uintptr_t>(item->base);
                     item->end = item->begin + item->elements * e.elem_size;
                     overlay->changes_ += e.count;
                     overlay->items_.push_back(std::move(item));
                     return Status::OK();
                   })
          .status());
  if (!suits) return std::unique_ptr<RedoOverlay>();
  auto& items = overlay->items_;
  std::sort(items.begin(), items.end(),
            [](const auto& a, const auto& b) { return a->begin < b->begin; });
  for (size_t i = 1; i < items.size(); ++i) {
    if (items[i]->begin < items[i - 1]->end) return std::unique_ptr<RedoOverlay>();
  }
  return overlay;
}

// Calls fn(item, positions, count, values) for the changes of each entry lying in the range,
// positions box-relative and increasing, and counts them written.
template <typename Fn>
Status RedoOverlay::ForChangesIn(const uint8_t* begin, uint64_t bytes, Fn&& fn) {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(begin);
  const uintptr_t hi = lo + bytes;
  auto it = std::partition_point(items_.begin(), items_.end(),
                                 [lo](const std::unique_ptr<Item>& i) { return i->end <= lo; });
  thread_local std::vector<uint64_t> positions;
  for (; it != items_.end() && (*it)->begin < hi; ++it) {
    Item& item = **it;
    const EntryView& e = item.entry;
    if (!e.DecodePositions(item.elements, positions)) {
      return Status::Corrupt(path_ + ": log position outside its box in '" + e.tensor + "'");
    }
    const uint64_t first = lo > item.begin ? (lo - item.begin) / e.elem_size : 0;
    const uint64_t last = (std::min(hi, item.end) - item.begin) / e.elem_size;
    const auto a = std::lower_bound(positions.begin(), positions.end(), first);
    const auto b = std::lower_bound(a, positions.end(), last);
    if (a == b) continue;
    const uint64_t k = static_cast<uint64_t>(a - positions.begin());
    REFIT_RETURN_NOT_OK(fn(item, &*a, static_cast<uint64_t>(b - a), e.values + k * e.elem_size));
    item.written.fetch_add(static_cast<uint64_t>(b - a), std::memory_order_relaxed);
    if (!wrote_.exchange(true)) MaybeKillAt("redo.overlay_write");
  }
  return Status::OK();
}

Status RedoOverlay::ReadPatched(const uint8_t* begin, uint64_t bytes, uint8_t* copy) {
  FileRange file;
  if (!FindMappedFile(begin, bytes, &file) || !file.writable) {
    return Status::Internal(path_ + ": an overlay read memory that is no writable file");
  }
  // The range's changes: element indices in the copy, increasing (entries by address, positions
  // increasing), and their values. Its entries are of one tensor (a reader's chunk).
  thread_local std::vector<uint64_t> at;
  thread_local std::vector<uint8_t> values;
  at.clear();
  values.clear();
  uint32_t elem = 0;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(begin);
  REFIT_RETURN_NOT_OK(ForChangesIn(
      begin, bytes,
      [&](const Item& item, const uint64_t* positions, uint64_t count, const uint8_t* v) -> Status {
        const uint64_t base = item.begin - lo;  // bytes from the copy's start to the box's
        if ((elem != 0 && elem != item.entry.elem_size) || base % item.entry.elem_size != 0) {
          return Status::Internal(path_ + ": an overlay range is not one tensor's elements");
        }
        elem = item.entry.elem_size;
        for (uint64_t i = 0; i < count; ++i) at.push_back(base / elem + positions[i]);
        values.insert(values.end(), v, v + count * elem);
        return Status::OK();
      }));
  // Piece by piece: read, patched and written back while in cache (a span from a change to the
  // next within the gap, never further: other threads may be writing the rest of a shared page).
  uint64_t k = 0;
  for (uint64_t piece = 0; piece < bytes; piece += kOverwriteSpanBytes) {
    const uint64_t piece_end = std::min(bytes, piece + kOverwriteSpanBytes);
    REFIT_RETURN_NOT_OK(
        ReadAllAt(file.fd, copy + piece, piece_end - piece, file.offset + piece, *file.path));
    while (k < at.size() && (at[k] + 1) * elem <= piece_end) {
      const uint64_t start = at[k] * elem;
      uint64_t stop = start + elem;
      uint64_t j = k + 1;
      for (; j < at.size() && (at[j] + 1) * elem <= piece_end &&
             at[j] * elem <= stop + kOverwriteGapBytes;
           ++j) {
        stop = (at[j] + 1) * elem;
      }
      kernels::ScatterOverwrite(copy, elem, at.data() + k, j - k, values.data() + k * elem);
      REFIT_RETURN_NOT_OK(
          WriteAllAt(file.fd, copy + start, stop - start, file.offset + start, *file.path));
      k = j;
    }
  }
  if (k != at.size()) return Status::Internal(path_ + ": an overlay change was not written");
  return Status::OK();
}

Status RedoOverlay::ApplyInPlace(const uint8_t* begin, uint64_t bytes) {
  return ForChangesIn(
      begin, bytes,
      [](const Item& item, const uint64_t* positions, uint64_t count, const uint8_t* values) {
        return OverwriteContiguous(item.base, item.entry.elem_size, positions, count, values);
      });
}

Status RedoOverlay::ApplyRest() {
  for (const std::unique_ptr<Item>& item : items_) {
    if (item->written.load(std::memory_order_relaxed) >= item->entry.count) continue;
    REFIT_RETURN_NOT_OK(
        ApplyInPlace(reinterpret_cast<const uint8_t*>(item->begin), item->end - item->begin));
  }
  return Status::OK();
}

Status ReplayInto(const RedoLog& log, std::vector<TensorView> tensors, uint64_t from, uint64_t to,
                  unsigned disjoint_threads) {
  std::map<std::string, TensorView*> by_name;
  for (TensorView& t : tensors) by_name[t.name] = &t;
  return log.Replay(by_name, from, to, disjoint_threads);
}

Result<std::unique_ptr<RedoLog>> OpenRedoLog(const std::string& path, bool durable,
                                             uint64_t clean_bytes,
                                             const std::vector<TensorView>& tensors) {
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<RedoLog> log, RedoLog::Open(path, durable, clean_bytes));
  if (log->written_in_another_boot() && !log->empty()) {
    const uint64_t committed = clean_bytes >= RedoLog::HeaderBytes() && clean_bytes <= log->bytes()
                                   ? clean_bytes
                                   : log->bytes();
    REFIT_RETURN_NOT_OK(ReplayInto(*log, tensors, 0, committed));
    REFIT_RETURN_NOT_OK(log->MarkCurrentBoot());
  }
  return log;
}

namespace {
// The policy's rule, with the log counted `scale` times (2: halfway there).
bool CheckpointReached(const RedoLog& log, uint64_t version, uint64_t file_bytes,
                       const CheckpointPolicy& policy, uint64_t scale) {
  const uint64_t cap = policy.bytes != 0 ? policy.bytes : file_bytes;
  const uint64_t versions = version - log.checkpoint_version();
  return scale * versions >= policy.versions || scale * log.bytes() >= cap;
}
}  // namespace

bool CheckpointDue(const RedoLog& log, uint64_t version, uint64_t file_bytes,
                   const CheckpointPolicy& policy) {
  return !log.empty() && CheckpointReached(log, version, file_bytes, policy, 1);
}

Result<bool> CheckpointIfDue(RedoLog& log, uint64_t version, uint64_t file_bytes,
                             const CheckpointPolicy& policy, CheckpointWhen when,
                             const std::function<Status()>& sync_file) {
  if (log.empty()) return false;
  const uint64_t scale = when == CheckpointWhen::kHalfway ? 2 : 1;
  if (when != CheckpointWhen::kNow && !CheckpointReached(log, version, file_bytes, policy, scale)) {
    return false;
  }
  MaybeKillAt("redo.checkpoint");
  REFIT_RETURN_NOT_OK(sync_file());
  MaybeKillAt("redo.checkpoint_synced");
  REFIT_RETURN_NOT_OK(log.Checkpoint(version));
  return true;
}

}  // namespace refit::internal
