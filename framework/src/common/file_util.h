// File I/O used by every stage that writes to local disk: one rule for atomic replacement
// (tmp + fsync + rename + fsync of the parent directory), complete writes, directory creation
// and read-only mappings.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "refit/status.h"

namespace refit::internal {

// "what path: strerror(errno)".
std::string Errno(const std::string& what, const std::string& path);
// The directory holding `path` ("." for a bare name).
std::string ParentDir(const std::string& path);

// Writes all of `data`, retrying short writes and EINTR.
Status WriteAll(int fd, const uint8_t* data, uint64_t len, const std::string& path);

// Small control files (state json): tmp + fsync + rename + parent directory fsync.
Status WriteFileAtomic(const std::string& path, std::string_view contents);
Result<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes);
Status FsyncPath(const std::string& path);

}  // namespace refit::internal
