#include "common/file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

namespace refit::internal {
namespace {

// One write() moves at most this much: Linux caps a single transfer near 2 GiB anyway.
constexpr uint64_t kMaxWriteChunk = uint64_t{1} << 30;
// Create retries making the parent directories this often when a concurrent remover (the disk
// transport prunes empty directories) deletes them between our mkdir and our create.
constexpr int kMaxCreateAttempts = 8;

// Process-wide, so two writers of one path in this process never pick the same temporary name.
std::atomic<uint64_t> g_tmp_counter{0};

// Some filesystems (and FUSE or network mounts) refuse fsync on a directory with EINVAL or
// ENOTSUP: they give no way to order directory updates, so durability of the entry is then the
// filesystem's business, and failing every write on them would make refit unusable there.
bool DirectorySyncUnsupported(int err) { return err == EINVAL || err == ENOTSUP; }

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

Status WriteAll(int fd, const uint8_t* data, uint64_t len, const std::string& path) {
  const uint64_t total = len;
  while (len > 0) {
    ssize_t n = ::write(fd, data, std::min(len, kMaxWriteChunk));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IoError(Errno("write", path) + " (at byte " + std::to_string(total - len) +
                             " of " + std::to_string(total) + ")");
    }
    if (n == 0) return Status::IoError("write " + path + ": no progress");
    data += n;
    len -= static_cast<uint64_t>(n);
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

Result<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path, bool writable) {
  const int fd = ::open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound(path + ": no such file");
    return Status::IoError(path + ": cannot open: " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string err = std::strerror(errno);
    ::close(fd);
    return Status::IoError(path + ": cannot stat: " + err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::Invalid(path + ": not a regular file");
  }
  std::unique_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = static_cast<uint64_t>(st.st_size);
  file->writable_ = writable;
  // mmap of 0 bytes fails: an empty file is an empty mapping.
  if (file->size_ > 0) {
    void* base = ::mmap(nullptr, file->size_, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                        writable ? MAP_SHARED : MAP_PRIVATE, fd, 0);
    if (base == MAP_FAILED) {
      const std::string err = std::strerror(errno);
      ::close(fd);
      return Status::IoError(path + ": cannot mmap: " + err);
    }
    file->data_ = static_cast<uint8_t*>(base);
  }
  ::close(fd);  // the mapping keeps the file referenced
  return file;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

Status MappedFile::Sync() {
  if (!writable_ || data_ == nullptr) return Status::OK();
  if (::msync(data_, size_, MS_SYNC) != 0) {
    return Status::IoError(path_ + ": msync failed: " + std::strerror(errno));
  }
  return Status::OK();
}

}  // namespace refit::internal
