#include "common/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace refit::internal {

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

}  // namespace refit::internal
