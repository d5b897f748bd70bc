#include "receive/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/file_util.h"
#include "refit/kernels/diff.h"

namespace refit::internal {

namespace {

// File: header, then entries. Header: magic, version, base, xxh3 of the preceding 20 bytes.
// Entry: u32 body length, u64 xxh3 of the body, body. Body: u16 id length, id, u16 name length,
// name, u32 ndim, ndim x (u64 offset, u64 extent), u32 element size, u64 count, count x u64
// positions, count x element-size values. Little-endian throughout.
constexpr char kMagic[4] = {'R', 'F', 'J', '1'};
constexpr uint64_t kHeaderBytes = 4 + 8 + 8 + 8;
constexpr uint64_t kEntryPrefixBytes = 4 + 8;
constexpr uint32_t kMaxEntryBytes = 1u << 31;

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

Status ReadExactly(int fd, uint64_t offset, uint8_t* buf, uint64_t n, const std::string& path) {
  while (n > 0) {
    ssize_t got = ::pread(fd, buf, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return Status::IoError(path + ": short read");
    buf += got;
    n -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return Status::OK();
}

std::string Header(uint64_t version, uint64_t base) {
  std::string h;
  Put(h, kMagic, 4);
  PutInt(h, version);
  PutInt(h, base);
  PutInt(h, kernels::Digest64(h.data(), h.size()));
  return h;
}

}  // namespace

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

Result<std::unique_ptr<ApplyJournal>> ApplyJournal::Open(const std::string& path, uint64_t version,
                                                         uint64_t base, bool durable) {
  std::unique_ptr<ApplyJournal> j(new ApplyJournal());
  j->path_ = path;
  j->durable_ = durable;
  // O_NOFOLLOW | O_NONBLOCK: a link planted in the state directory must not carry journal writes
  // elsewhere, and a FIFO must not block the open; only a regular file is a journal.
  j->fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (j->fd_ < 0) return Status::IoError(path + ": open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(j->fd_, &st) != 0) return Status::IoError(path + ": stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return Status::Invalid(path + ": not a regular file");
  const std::string header = Header(version, base);
  bool resume = false;
  if (static_cast<uint64_t>(st.st_size) >= kHeaderBytes) {
    std::string existing(kHeaderBytes, '\0');
    REFIT_RETURN_NOT_OK(
        ReadExactly(j->fd_, 0, reinterpret_cast<uint8_t*>(existing.data()), kHeaderBytes, path));
    resume = existing == header;
  }
  if (resume) {
    REFIT_RETURN_NOT_OK(j->Load(static_cast<uint64_t>(st.st_size)));
  } else {
    // Another version's journal (already committed or abandoned) or a torn header: start over.
    if (::ftruncate(j->fd_, 0) != 0) return Status::IoError(path + ": " + std::strerror(errno));
    REFIT_RETURN_NOT_OK(
        WriteAll(j->fd_, reinterpret_cast<const uint8_t*>(header.data()), header.size(), path));
    if (durable && ::fdatasync(j->fd_) != 0) {
      return Status::IoError(path + ": fdatasync: " + std::strerror(errno));
    }
  }
  if (::lseek(j->fd_, 0, SEEK_END) < 0) return Status::IoError(path + ": " + std::strerror(errno));
  return j;
}

ApplyJournal::~ApplyJournal() {
  if (fd_ >= 0) ::close(fd_);
}

Status ApplyJournal::Load(uint64_t file_size) {
  uint64_t at = kHeaderBytes;
  std::vector<uint8_t> body;
  while (file_size - at >= kEntryPrefixBytes) {
    uint8_t prefix[kEntryPrefixBytes];
    REFIT_RETURN_NOT_OK(ReadExactly(fd_, at, prefix, kEntryPrefixBytes, path_));
    uint32_t len;
    uint64_t digest;
    std::memcpy(&len, prefix, 4);
    std::memcpy(&digest, prefix + 4, 8);
    if (len > kMaxEntryBytes || file_size - at - kEntryPrefixBytes < len) break;  // torn tail
    body.resize(len);
    REFIT_RETURN_NOT_OK(ReadExactly(fd_, at + kEntryPrefixBytes, body.data(), len, path_));
    if (kernels::Digest64(body.data(), len) != digest) break;  // torn tail
    Entry e;
    Reader r(body.data(), len);
    uint16_t id_len = 0, name_len = 0;
    uint32_t ndim = 0;
    uint64_t count = 0;
    const uint8_t* bytes = nullptr;
    bool ok = r.Int(&id_len) && r.Bytes(id_len, &bytes);
    if (ok) e.id.assign(reinterpret_cast<const char*>(bytes), id_len);
    ok = ok && r.Int(&name_len) && r.Bytes(name_len, &bytes);
    if (ok) e.tensor.assign(reinterpret_cast<const char*>(bytes), name_len);
    ok = ok && r.Int(&ndim) && ndim <= 64;
    for (uint32_t d = 0; ok && d < ndim; ++d) {
      uint64_t off = 0, ext = 0;
      ok = r.Int(&off) && r.Int(&ext);
      e.box.offset.push_back(off);
      e.box.extent.push_back(ext);
    }
    ok = ok && r.Int(&e.elem_size) && e.elem_size >= 1 && e.elem_size <= 8 && r.Int(&count) &&
         count <= len / 8;
    if (ok) {
      e.positions.resize(count);
      ok = r.Bytes(count * 8, &bytes);
      if (ok && count > 0) std::memcpy(e.positions.data(), bytes, count * 8);
      ok = ok && r.Bytes(count * e.elem_size, &bytes) && r.Done();
      if (ok) e.values.assign(bytes, bytes + count * e.elem_size);
    }
    if (!ok) {
      return Status::Corrupt(path_ + ": journal entry at byte " + std::to_string(at) +
                             " is malformed (its checksum matched)");
    }
    ids_.insert(e.id);
    loaded_.push_back(std::move(e));
    at += kEntryPrefixBytes + len;
  }
  resumed_ = loaded_.size();
  if (at != file_size && ::ftruncate(fd_, static_cast<off_t>(at)) != 0) {
    return Status::IoError(path_ + ": cutting a torn entry: " + std::strerror(errno));
  }
  return Status::OK();
}

Status ApplyJournal::Append(const std::string& record_id, const std::string& tensor, const Box& box,
                            uint32_t elem_size, const std::vector<uint64_t>& positions,
                            const uint8_t* values) {
  if (record_id.size() > UINT16_MAX || tensor.size() > UINT16_MAX) {
    return Status::Invalid("journal: record id or tensor name too long");
  }
  std::string body;
  PutInt(body, static_cast<uint16_t>(record_id.size()));
  body += record_id;
  PutInt(body, static_cast<uint16_t>(tensor.size()));
  body += tensor;
  PutInt(body, static_cast<uint32_t>(box.offset.size()));
  for (size_t d = 0; d < box.offset.size(); ++d) {
    PutInt(body, box.offset[d]);
    PutInt(body, box.extent[d]);
  }
  PutInt(body, elem_size);
  PutInt(body, static_cast<uint64_t>(positions.size()));
  Put(body, positions.data(), positions.size() * 8);
  Put(body, values, positions.size() * elem_size);
  if (body.size() > kMaxEntryBytes) {
    return Status::Invalid("journal: entry of " + std::to_string(body.size()) +
                           " bytes (lower sender.chunk_bytes)");
  }
  std::string entry;
  PutInt(entry, static_cast<uint32_t>(body.size()));
  PutInt(entry, kernels::Digest64(body.data(), body.size()));
  entry += body;
  REFIT_RETURN_NOT_OK(
      WriteAll(fd_, reinterpret_cast<const uint8_t*>(entry.data()), entry.size(), path_));
  if (durable_ && ::fdatasync(fd_) != 0) {
    return Status::IoError(path_ + ": fdatasync: " + std::strerror(errno));
  }
  ids_.insert(record_id);
  return Status::OK();
}

Status ApplyJournal::Replay(const std::map<std::string, TensorView*>& tensors) const {
  for (const Entry& e : loaded_) {
    auto it = tensors.find(e.tensor);
    if (it == tensors.end()) {
      return Status::Corrupt(path_ + ": journal names tensor '" + e.tensor +
                             "' the model does not have");
    }
    TensorView& t = *it->second;
    if (e.box.offset.size() != t.shape.size() || SizeOf(t.dtype) != e.elem_size) {
      return Status::Corrupt(path_ + ": journal entry does not fit tensor '" + e.tensor + "'");
    }
    uint64_t n = 1;
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (e.box.offset[d] > t.shape[d] || e.box.extent[d] > t.shape[d] - e.box.offset[d]) {
        return Status::Corrupt(path_ + ": journal box falls outside tensor '" + e.tensor + "'");
      }
      n *= e.box.extent[d];
    }
    for (size_t i = 0; i < e.positions.size(); ++i) {
      if (e.positions[i] >= n) {
        return Status::Corrupt(path_ + ": journal position outside its box in '" + e.tensor + "'");
      }
      const uint64_t index = BoxElementIndex(t.shape, e.box, e.positions[i]);
      std::memcpy(t.bytes() + index * e.elem_size, e.values.data() + i * e.elem_size, e.elem_size);
    }
  }
  return Status::OK();
}

Status ApplyJournal::Remove() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (::unlink(path_.c_str()) != 0 && errno != ENOENT) {
    return Status::IoError(path_ + ": unlink: " + std::strerror(errno));
  }
  return Status::OK();
}

}  // namespace refit::internal
