#include "common/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "common/stopwatch.h"

namespace refit::internal {
namespace {

// One write() moves at most this much: Linux caps a single transfer near 2 GiB anyway.
constexpr uint64_t kMaxWriteChunk = uint64_t{1} << 30;
// Create retries making the parent directories this often when a concurrent remover (the disk
// transport prunes empty directories) deletes them between our mkdir and our create.
constexpr int kMaxCreateAttempts = 8;

// openat2 is retried this often when a concurrent rename makes it answer EAGAIN.
constexpr int kMaxOpenat2Attempts = 8;

// Process-wide, so two writers of one path in this process never pick the same temporary name.
std::atomic<uint64_t> g_tmp_counter{0};

// Some filesystems (and FUSE or network mounts) refuse fsync on a directory with EINVAL or
// ENOTSUP: they give no way to order directory updates, so durability of the entry is then the
// filesystem's business, and failing every write on them would make refit unusable there.
bool DirectorySyncUnsupported(int err) { return err == EINVAL || err == ENOTSUP; }

// Whether openat2 may be tried: cleared once the kernel lacks it (ENOSYS), after which every
// resolution walks component by component. A seccomp filter's EPERM falls back call by call (an
// EPERM can also be the file's own answer, and the walk then gives that answer again).
std::atomic<bool> g_try_openat2{true};

// One message for every object a confined open refuses: it must not tell a writer of the directory
// anything about what a planted link points at (no size, no target, not even its kind).
constexpr char kNotRegular[] =
    "not a regular file of its own (symbolic links, FIFOs, devices, sockets and directories are "
    "refused)";
constexpr char kNotDirectory[] = "not a directory of its own (symbolic links are not followed)";

std::vector<std::string> SplitComponents(const std::string& rel) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= rel.size() && !rel.empty()) {
    size_t slash = rel.find('/', start);
    if (slash == std::string::npos) slash = rel.size();
    out.push_back(rel.substr(start, slash - start));
    start = slash + 1;
  }
  return out;
}

// openat of `rel` beneath root_fd that follows no symlink on the way nor at the end; -1 and errno
// on failure (ELOOP or ENOTDIR where a link or a non-directory is in the way). `rel` is already
// validated (no "..", no leading '/').
int OpenBeneath(int root_fd, const std::string& rel, int flags, mode_t mode = 0) {
  flags |= O_NOFOLLOW | O_CLOEXEC;
#ifdef SYS_openat2
  if (g_try_openat2.load(std::memory_order_relaxed)) {
    struct open_how how {};
    how.flags = static_cast<uint64_t>(flags);
    how.mode = (flags & O_CREAT) != 0 ? mode : 0;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS;
    long fd = -1;
    // EAGAIN: a concurrent rename raced the resolution; past a few, the walk below decides.
    for (int attempt = 0; attempt < kMaxOpenat2Attempts; ++attempt) {
      fd = ::syscall(SYS_openat2, root_fd, rel.c_str(), &how, sizeof(how));
      if (fd >= 0 || (errno != EINTR && errno != EAGAIN)) break;
    }
    if (fd >= 0 || (errno != ENOSYS && errno != EPERM && errno != EAGAIN && errno != EINTR)) {
      return static_cast<int>(fd);
    }
    if (errno == ENOSYS) g_try_openat2.store(false, std::memory_order_relaxed);
  }
#endif
  const std::vector<std::string> parts = SplitComponents(rel);
  if (parts.empty()) {
    errno = EINVAL;
    return -1;
  }
  ScopedFd dir(::dup(root_fd));
  if (dir.get() < 0) return -1;
  int fd = -1;
  for (size_t i = 0; i < parts.size(); ++i) {
    const bool last = i + 1 == parts.size();
    do {
      fd = ::openat(dir.get(), parts[i].c_str(),
                    last ? flags : O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, mode);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0 || last) break;
    dir.reset(fd);
  }
  // Closing the walked directory must not clobber the caller's errno.
  const int err = errno;
  dir.reset(-1);
  errno = err;
  return fd;
}

// The directory part of a relative path ("" for a bare name) and its last component.
std::pair<std::string, std::string> SplitLast(const std::string& rel) {
  const size_t slash = rel.rfind('/');
  if (slash == std::string::npos) return {"", rel};
  return {rel.substr(0, slash), rel.substr(slash + 1)};
}

}  // namespace

std::string Errno(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

std::string ParentDir(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

namespace {

// Writes all of data at `offset` (pwrite), or at the file position when offset < 0 (write).
Status WriteLoop(int fd, const uint8_t* data, uint64_t len, int64_t offset,
                 const std::string& path) {
  const uint64_t total = len;
  while (len > 0) {
    const uint64_t chunk = std::min(len, kMaxWriteChunk);
    ssize_t n = offset < 0 ? ::write(fd, data, chunk) : ::pwrite(fd, data, chunk, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IoError(Errno("write", path) + " (at byte " + std::to_string(total - len) +
                             " of " + std::to_string(total) + ")");
    }
    if (n == 0) return Status::IoError("write " + path + ": no progress");
    data += n;
    len -= static_cast<uint64_t>(n);
    if (offset >= 0) offset += n;
  }
  return Status::OK();
}

}  // namespace

Status WriteAll(int fd, const uint8_t* data, uint64_t len, const std::string& path) {
  return WriteLoop(fd, data, len, -1, path);
}

Status WriteAllAt(int fd, const uint8_t* data, uint64_t len, uint64_t offset,
                  const std::string& path) {
  return WriteLoop(fd, data, len, static_cast<int64_t>(offset), path);
}

Status ReadAllAt(int fd, uint8_t* out, uint64_t len, uint64_t offset, const std::string& path) {
  const uint64_t end = offset + len;
  while (len > 0) {
    const ssize_t n = ::pread(fd, out, std::min(len, kMaxWriteChunk), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return Status::IoError(Errno("read", path) + " (at byte " + std::to_string(offset) + ")");
    if (n == 0) {
      return Status::IoError(path + ": short read: the file ends at byte " +
                             std::to_string(offset) + ", before byte " + std::to_string(end));
    }
    out += n;
    len -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

Status FsyncFd(int fd, const std::string& path) {
  if (::fsync(fd) != 0) return Status::IoError(Errno("fsync", path));
  return Status::OK();
}

Status FsyncPath(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IoError(Errno("open", path));
  int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && !DirectorySyncUnsupported(err)) {
    errno = err;
    return Status::IoError(Errno("fsync", path));
  }
  return Status::OK();
}

Status MakeDirs(const std::string& dir, bool durable) {
  if (dir.empty()) return Status::Invalid("cannot create a directory with an empty path");
  // Each prefix ending before a '/', then the whole path: "a/b/c" creates a, a/b, a/b/c.
  for (size_t end = dir.find('/', 1);; end = dir.find('/', end + 1)) {
    const std::string partial = dir.substr(0, end);
    if (!partial.empty() && partial.back() != '/') {
      if (::mkdir(partial.c_str(), 0755) == 0) {
        if (durable) REFIT_RETURN_NOT_OK(FsyncPath(ParentDir(partial)));
      } else if (errno != EEXIST) {
        // A file in the way of a parent shows up here, as ENOTDIR on the next component.
        return Status::IoError(Errno("mkdir", partial));
      }
    }
    if (end == std::string::npos) break;
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return Status::IoError(Errno("stat", dir));
  if (!S_ISDIR(st.st_mode)) return Status::IoError(dir + ": exists and is not a directory");
  return Status::OK();
}

std::string TempPathFor(const std::string& path) {
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(g_tmp_counter++);
}

Status ReplaceFile(const std::string& from, const std::string& to, bool durable) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    const int err = errno;
    const std::string message = "rename " + from + " to " + to + ": " + std::strerror(err);
    return err == ENOENT ? Status::NotFound(message) : Status::IoError(message);
  }
  return durable ? FsyncPath(ParentDir(to)) : Status::OK();
}

Result<std::unique_ptr<AtomicFile>> AtomicFile::Create(const std::string& path,
                                                       AtomicFileOptions options) {
  std::unique_ptr<AtomicFile> file(new AtomicFile());
  file->path_ = path;
  file->tmp_path_ = TempPathFor(path);
  file->durable_ = options.durable;
  for (int attempt = 0;; ++attempt) {
    // O_EXCL: a name left by a crashed writer with our pid is never written through.
    file->fd_ = ::open(file->tmp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (file->fd_ >= 0) return file;
    if (errno != ENOENT || !options.make_parents || attempt + 1 >= kMaxCreateAttempts) {
      return Status::IoError(Errno("create", file->tmp_path_));
    }
    REFIT_RETURN_NOT_OK(MakeDirs(ParentDir(path), options.durable));
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_path_.c_str());
}

Status AtomicFile::Write(const uint8_t* data, uint64_t len) {
  if (fd_ < 0) return Status::Internal(tmp_path_ + ": write after commit");
  return WriteAll(fd_, data, len, tmp_path_);
}

Status AtomicFile::Commit() {
  if (fd_ < 0) return Status::Internal(tmp_path_ + ": committed twice");
  if (durable_) REFIT_RETURN_NOT_OK(FsyncFd(fd_, tmp_path_));
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) return Status::IoError(Errno("close", tmp_path_));
  REFIT_RETURN_NOT_OK(ReplaceFile(tmp_path_, path_, durable_));
  committed_ = true;
  return Status::OK();
}

Status WriteFileAtomic(const std::string& path, std::string_view contents, bool durable) {
  AtomicFileOptions options;
  options.durable = durable;
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<AtomicFile> file, AtomicFile::Create(path, options));
  REFIT_RETURN_NOT_OK(
      file->Write(reinterpret_cast<const uint8_t*>(contents.data()), contents.size()));
  return file->Commit();
}

namespace {

// What an operator named where a file is expected, said in one line: a directory is the common
// mistake (a checkpoint folder instead of its .safetensors file), and mmap would report it as
// "No such device".
Status NotARegularFile(const std::string& path, const struct stat& st) {
  if (S_ISDIR(st.st_mode)) return Status::Invalid(path + ": is a directory");
  return Status::Invalid(path + ": not a regular file");
}

// fstat of the fd opened for `path`, which must be a regular file.
Status StatRegularFile(int fd, const std::string& path, struct stat* st) {
  if (::fstat(fd, st) != 0) return Status::IoError(path + ": cannot stat: " + std::strerror(errno));
  return S_ISREG(st->st_mode) ? Status::OK() : NotARegularFile(path, *st);
}

}  // namespace

Result<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes) {
  // O_NONBLOCK: a FIFO in place of the file must not wait for a writer forever.
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return Status::NotFound(path + ": no such file");
    return Status::IoError(Errno("open", path));
  }
  struct stat st {};
  REFIT_RETURN_NOT_OK(StatRegularFile(fd.get(), path, &st));
  std::string out;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IoError(Errno("read", path));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {
      return Status::Corrupt(path + ": larger than " + std::to_string(max_bytes) + " bytes");
    }
  }
  return out;
}

namespace {

// Every live MappedFile by the address of its mapping, for FindMappedFile.
struct MappedFileEntry {
  uint64_t size = 0;
  int fd = -1;
  bool writable = false;
  bool warm = false;
  const std::string* path = nullptr;  // the MappedFile's own, for error messages
};
std::shared_mutex g_mapped_mu;
std::atomic<uint64_t> g_registration_bytes{16ull << 20};
std::map<uintptr_t, MappedFileEntry>& MappedFiles() {
  static auto* files = new std::map<uintptr_t, MappedFileEntry>();  // never destroyed: used at exit
  return *files;
}

}  // namespace

bool FindMappedFile(const void* begin, uint64_t bytes, FileRange* out) {
  const auto at = reinterpret_cast<uintptr_t>(begin);
  std::shared_lock<std::shared_mutex> lock(g_mapped_mu);
  const auto& files = MappedFiles();
  auto it = files.upper_bound(at);
  if (it == files.begin()) return false;
  --it;
  const uint64_t offset = at - it->first;
  if (offset > it->second.size || bytes > it->second.size - offset) return false;
  *out = {it->second.fd,       offset,          it->second.size,
          it->second.writable, it->second.warm, it->second.path};
  return true;
}

Status PreadMapped(const FileRange& file, uint8_t* out, uint64_t bytes) {
  return ReadAllAt(file.fd, out, bytes, file.offset, *file.path);
}

Status PwriteMapped(const FileRange& file, const uint8_t* data, uint64_t bytes) {
  if (!file.writable) return Status::Internal(*file.path + ": written through a read-only mapping");
  return WriteAllAt(file.fd, data, bytes, file.offset, *file.path);
}

Result<bool> OverwriteInMappedFile(uint8_t* base, uint32_t elem, const uint64_t* positions,
                                   uint64_t count, const uint8_t* values) {
  if (count == 0) return true;
  const uint64_t first = positions[0] * elem;
  FileRange file;
  if (!FindMappedFile(base + first, elem, &file) || !file.writable) return false;
  const uint64_t base_offset = file.offset - first;  // of base in the file
  thread_local std::vector<uint8_t> span;
  if (span.size() < kOverwriteSpanBytes) span.resize(kOverwriteSpanBytes);
  // A span runs from a change to a change, never further: the bytes between belong to the same
  // caller's range (a record's box), while other threads may be writing the rest of a shared page.
  for (uint64_t k = 0; k < count;) {
    const uint64_t start = base_offset + positions[k] * elem;
    uint64_t last_end = start + elem;
    uint64_t end_k = k + 1;
    // Ascending positions close enough to the previous one join the span while it fits.
    for (; end_k < count; ++end_k) {
      const uint64_t at = base_offset + positions[end_k] * elem;
      if (at < last_end - elem || at > last_end + kOverwriteGapBytes ||
          at + elem - start > kOverwriteSpanBytes) {
        break;
      }
      last_end = at + elem;
    }
    if (last_end > file.file_size) {
      return Status::Internal(*file.path + ": patched write past the mapped file's end");
    }
    if (file.warm) {  // its pages are mapped: no copy through the kernel
      std::memcpy(span.data(), base + (start - base_offset), last_end - start);
    } else {
      REFIT_RETURN_NOT_OK(ReadAllAt(file.fd, span.data(), last_end - start, start, *file.path));
    }
    for (uint64_t j = k; j < end_k; ++j) {
      std::memcpy(span.data() + (base_offset + positions[j] * elem - start), values + j * elem,
                  elem);
    }
    REFIT_RETURN_NOT_OK(WriteAllAt(file.fd, span.data(), last_end - start, start, *file.path));
    k = end_k;
  }
  return true;
}

Result<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path, bool writable) {
  // O_NONBLOCK: a FIFO must not block the open (fstat below refuses it).
  ScopedFd fd(
      ::open(path.c_str(), (writable ? O_RDWR | O_NOFOLLOW : O_RDONLY) | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return Status::NotFound(path + ": no such file");
    if (errno == EISDIR) return Status::Invalid(path + ": is a directory");  // opened for writing
    if (errno == ELOOP && writable) {
      return Status::Invalid(path + ": a symbolic link; not opened for writing");
    }
    return Status::IoError(path + ": cannot open: " + std::strerror(errno));
  }
  struct stat st {};
  REFIT_RETURN_NOT_OK(StatRegularFile(fd.get(), path, &st));
  std::unique_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = static_cast<uint64_t>(st.st_size);
  file->writable_ = writable;
  // mmap of 0 bytes fails: an empty file is an empty mapping.
  if (file->size_ > 0) {
    void* base = ::mmap(nullptr, file->size_, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                        writable ? MAP_SHARED : MAP_PRIVATE, fd.get(), 0);
    if (base == MAP_FAILED) return Status::IoError(path + ": cannot mmap: " + std::strerror(errno));
    file->data_ = static_cast<uint8_t*>(base);
    if (file->size_ >= g_registration_bytes.load()) {
      file->fd_ = fd.release();
      std::unique_lock<std::shared_mutex> lock(g_mapped_mu);
      MappedFiles()[reinterpret_cast<uintptr_t>(file->data_)] = {file->size_, file->fd_, writable,
                                                                 false, &file->path_};
    }
  }
  return file;  // a smaller one's fd is closed: the mapping keeps the file referenced
}

MappedFile::~MappedFile() {
  if (fd_ >= 0) {
    std::unique_lock<std::shared_mutex> lock(g_mapped_mu);
    MappedFiles().erase(reinterpret_cast<uintptr_t>(data_));
  }
  if (data_ != nullptr) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
}

Status MappedFile::Sync() {
  if (!writable_ || data_ == nullptr) return Status::OK();
  // The whole file: a registered one's pages are written through the mapping and with pwrite
  // (OverwriteInMappedFile); msync of a shared mapping syncs the file's range all the same.
  const int rc = fd_ >= 0 ? ::fdatasync(fd_) : ::msync(data_, size_, MS_SYNC);
  if (rc != 0) return Status::IoError(path_ + ": sync failed: " + std::strerror(errno));
  return Status::OK();
}

Status MappedFile::PopulateForReading() {
  // Unregistered: read in place already.
  if (populate_tried_ || data_ == nullptr || fd_ < 0) return Status::OK();
  populate_tried_ = true;
#ifndef MADV_POPULATE_READ
  constexpr int MADV_POPULATE_READ = 22;  // Linux 5.14; older headers lack it
#endif
  if (::madvise(data_, size_, MADV_POPULATE_READ) != 0) {
    if (errno == EINVAL) return Status::OK();  // an older kernel: pread stays
    return Status::IoError(path_ + ": cannot map its pages for reading: " + std::strerror(errno));
  }
  MarkReadInPlace();
  return Status::OK();
}

void MappedFile::MarkReadInPlace() {
  std::unique_lock<std::shared_mutex> lock(g_mapped_mu);
  auto it = MappedFiles().find(reinterpret_cast<uintptr_t>(data_));
  if (it != MappedFiles().end()) it->second.warm = true;
}

Status MappedFile::ReadInPlaceIfCheaper(bool* in_place, ReadCosts* costs) {
  *in_place = false;
  if (costs != nullptr) *costs = ReadCosts();
  const char* forced = std::getenv("REFIT_FILE_READS");
  const std::string mode = forced != nullptr ? forced : "auto";
  if (mode != "auto" && mode != "pread" && mode != "mapping") {
    return Status::Invalid("REFIT_FILE_READS must be auto, pread or mapping, got '" + mode + "'");
  }
  // A file smaller than four probes gives no probe worth timing: it stays as it is.
  constexpr uint64_t kProbeBytes = 4 << 20;
  constexpr uint64_t kPage = 4096;
  if (fd_ < 0) {  // not registered: nothing copies it out
    *in_place = true;
    return Status::OK();
  }
  if (mode == "pread") return Status::OK();
  if (mode == "auto") {
    if (size_ < 4 * kProbeBytes) return Status::OK();
    // Two parts of the file, so that the copy leaves nothing of the faulted part in the CPU's
    // caches. (A part not in the page cache is read from disk by the untimed copy but within the
    // timed faults: a file cold on disk keeps pread.)
    const uint64_t copied_at = size_ / 4 / kPage * kPage;
    const uint64_t faulted_at = size_ / 2 / kPage * kPage;
    std::unique_ptr<uint8_t[]> buffer(new uint8_t[kProbeBytes]);
    // The first copy faults the buffer in (it is timed the second time).
    REFIT_RETURN_NOT_OK(ReadAllAt(fd_, buffer.get(), kProbeBytes, copied_at, path_));
    Stopwatch copy;
    REFIT_RETURN_NOT_OK(ReadAllAt(fd_, buffer.get(), kProbeBytes, copied_at, path_));
    const double copy_s = copy.Seconds();
    Stopwatch fault;
    uint64_t sum = 0;
    const volatile uint8_t* pages = data_ + faulted_at;
    for (uint64_t at = 0; at < kProbeBytes; at += kPage) sum += pages[at];
    const double fault_s = fault.Seconds();
    (void)sum;
    const double per_gb = 1e9 / static_cast<double>(kProbeBytes);
    if (costs != nullptr) *costs = {fault_s * per_gb, copy_s * per_gb};
    if (fault_s >= copy_s) return Status::OK();
  }
  MarkReadInPlace();
  *in_place = true;
  return Status::OK();
}

void SetOpenat2ForTesting(bool enabled) { g_try_openat2.store(enabled); }

void SetMappedFileRegistrationBytesForTesting(uint64_t bytes) { g_registration_bytes.store(bytes); }

Result<std::unique_ptr<ConfinedDir>> ConfinedDir::Open(const std::string& dir, bool create) {
  if (dir.empty()) return Status::Invalid("cannot open a directory with an empty path");
  if (create) REFIT_RETURN_NOT_OK(MakeDirs(dir));
  std::unique_ptr<ConfinedDir> out(new ConfinedDir());
  out->path_ = dir;
  out->fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (out->fd_ < 0) {
    if (errno == ENOENT) return Status::NotFound(dir + ": no such directory");
    return Status::IoError(Errno("open directory", dir));
  }
  return out;
}

ConfinedDir::~ConfinedDir() {
  if (fd_ >= 0) ::close(fd_);
}

std::string ConfinedDir::Describe(const std::string& rel) const {
  return rel.empty() ? path_ : path_ + "/" + rel;
}

Status ConfinedDir::ValidateRelative(const std::string& rel) {
  if (!rel.empty() && rel[0] == '/') {
    return Status::Invalid("'" + rel + "': must be relative (no leading '/')");
  }
  for (const std::string& part : SplitComponents(rel)) {
    if (part.empty() || part == "." || part == "..") {
      return Status::Invalid("'" + rel + "': empty, '.' or '..' path component");
    }
  }
  return Status::OK();
}

Result<int> ConfinedDir::OpenDir(const std::string& rel, bool create, bool durable) const {
  REFIT_RETURN_NOT_OK(ValidateRelative(rel));
  auto refused = [&](const std::string& at) {
    return Status::Invalid(Describe(at) + ": " + kNotDirectory);
  };
  if (rel.empty()) {
    // A fresh open, not dup(): a dup shares the file offset, so one listing would leave the next
    // starting at the end.
    int fd = ::openat(fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Status::IoError(Errno("open directory", path_));
    return fd;
  }
  if (!create) {
    int fd = OpenBeneath(fd_, rel, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) return fd;
    // ENOTDIR: a file, or (in the walk) a link, on the way: no directory of its own is there.
    if (errno == ENOENT || errno == ENOTDIR) {
      return Status::NotFound(Describe(rel) + ": no such directory");
    }
    if (errno == ELOOP || errno == EXDEV) return refused(rel);
    return Status::IoError(Errno("open directory", Describe(rel)));
  }
  // One component at a time, so each one made is opened (never followed) right after.
  ScopedFd dir(::dup(fd_));
  if (dir.get() < 0) return Status::IoError(Errno("dup", path_));
  std::string walked;
  for (const std::string& part : SplitComponents(rel)) {
    walked += walked.empty() ? part : "/" + part;
    int next = ::openat(dir.get(), part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0 && errno == ENOENT) {
      if (::mkdirat(dir.get(), part.c_str(), 0755) == 0) {
        if (durable) REFIT_RETURN_NOT_OK(FsyncFd(dir.get(), Describe(walked)));
      } else if (errno != EEXIST) {
        return Status::IoError(Errno("mkdir", Describe(walked)));
      }
      next = ::openat(dir.get(), part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (next < 0) {
      if (errno == ELOOP || errno == ENOTDIR) return refused(walked);
      if (errno == ENOENT) return Status::NotFound(Describe(walked) + ": removed while created");
      return Status::IoError(Errno("open directory", Describe(walked)));
    }
    dir.reset(next);
  }
  return dir.release();
}

Result<int> ConfinedDir::OpenFile(const std::string& rel) const {
  REFIT_RETURN_NOT_OK(ValidateRelative(rel));
  if (rel.empty()) return Status::Invalid(path_ + ": " + kNotRegular);
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  ScopedFd fd(OpenBeneath(fd_, rel, O_RDONLY | O_NONBLOCK | O_NOCTTY));
  if (fd.get() < 0) {
    // ENOTDIR: a file, or (in the walk) a link, in place of a directory on the way.
    if (errno == ENOENT || errno == ENOTDIR) {
      return Status::NotFound(Describe(rel) + ": no such file");
    }
    if (errno == ELOOP || errno == EXDEV || errno == ENXIO) {
      return Status::Invalid(Describe(rel) + ": " + kNotRegular);
    }
    return Status::IoError(Errno("open", Describe(rel)));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::IoError(Errno("stat", Describe(rel)));
  if (!S_ISREG(st.st_mode)) return Status::Invalid(Describe(rel) + ": " + kNotRegular);
  return fd.release();
}

Status ConfinedDir::WriteAtomic(const std::string& rel, const uint8_t* data, uint64_t len,
                                bool durable, bool make_parents) const {
  REFIT_RETURN_NOT_OK(ValidateRelative(rel));
  if (rel.empty()) return Status::Invalid(path_ + ": cannot write the root directory as a file");
  const auto [parent_rel, name] = SplitLast(rel);
  for (int attempt = 0;; ++attempt) {
    Result<int> parent_fd = OpenDir(parent_rel, make_parents, durable);
    if (!parent_fd.ok()) {
      // A concurrent remover pruned a directory we had just made: make it again.
      if (make_parents && parent_fd.status().code() == StatusCode::kNotFound &&
          attempt + 1 < kMaxCreateAttempts) {
        continue;
      }
      return parent_fd.status();
    }
    ScopedFd parent(parent_fd.value());
    const std::string tmp = TempPathFor(name);
    const std::string tmp_path = Describe(parent_rel.empty() ? tmp : parent_rel + "/" + tmp);
    // O_EXCL | O_NOFOLLOW: a name planted in the way (a link included) is never written through.
    ScopedFd fd(::openat(parent.get(), tmp.c_str(),
                         O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (fd.get() < 0) {
      // The directory was pruned by a concurrent remover between our open and our create.
      if (errno == ENOENT && make_parents && attempt + 1 < kMaxCreateAttempts) continue;
      return Status::IoError(Errno("create", tmp_path));
    }
    Status st = WriteAll(fd.get(), data, len, tmp_path);
    if (st.ok() && durable) st = FsyncFd(fd.get(), tmp_path);
    if (st.ok() && ::close(fd.release()) != 0) st = Status::IoError(Errno("close", tmp_path));
    // rename replaces whatever entry holds the name (a link as itself), never its target.
    if (st.ok() && ::renameat(parent.get(), tmp.c_str(), parent.get(), name.c_str()) != 0) {
      st = Status::IoError("rename " + tmp_path + " to " + Describe(rel) + ": " +
                           std::strerror(errno));
    }
    if (!st.ok()) {
      ::unlinkat(parent.get(), tmp.c_str(), 0);
      return st;
    }
    return durable ? FsyncFd(parent.get(), Describe(parent_rel)) : Status::OK();
  }
}

Status ConfinedDir::WriteAtomic(const std::string& rel, std::string_view contents, bool durable,
                                bool make_parents) const {
  return WriteAtomic(rel, reinterpret_cast<const uint8_t*>(contents.data()), contents.size(),
                     durable, make_parents);
}

Result<std::string> ConfinedDir::ReadSmallFile(const std::string& rel, uint64_t max_bytes) const {
  REFIT_ASSIGN_OR_RAISE(int raw, OpenFile(rel));
  ScopedFd fd(raw);
  std::string out;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IoError(Errno("read", Describe(rel)));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {
      return Status::Corrupt(Describe(rel) + ": larger than " + std::to_string(max_bytes) +
                             " bytes");
    }
  }
  return out;
}

Status ConfinedDir::Remove(const std::string& rel, bool directory) const {
  REFIT_RETURN_NOT_OK(ValidateRelative(rel));
  if (rel.empty()) return Status::Invalid(path_ + ": cannot remove the root directory");
  const auto [parent_rel, name] = SplitLast(rel);
  REFIT_ASSIGN_OR_RAISE(int parent_fd, OpenDir(parent_rel));
  ScopedFd parent(parent_fd);
  // unlinkat acts on the entry itself: a link is removed, its target never.
  if (::unlinkat(parent.get(), name.c_str(), directory ? AT_REMOVEDIR : 0) != 0) {
    if (errno == ENOENT) return Status::NotFound(Describe(rel) + ": no such file");
    return Status::IoError(Errno(directory ? "rmdir" : "unlink", Describe(rel)));
  }
  return Status::OK();
}

}  // namespace refit::internal
