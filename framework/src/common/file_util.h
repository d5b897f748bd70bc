// Low-level file I/O, one implementation for the core, the CLI and the disk transport (which
// links it as the small static library refit_file_util, never the core):
//   - atomic replacement: a temporary file next to the target, fsync, rename, fsync of the parent
//     directory (AtomicFile, WriteFileAtomic, and ReplaceFile for a temporary built another way);
//   - complete writes (WriteAll), directory creation with parents (MakeDirs);
//   - whole-file mappings, read-only or read-write (MappedFile).
// "durable" everywhere means: survive a host crash, not just a process crash. Without it the
// operations stay atomic (rename) but skip every fsync.
#pragma once

#include <cstdint>
#include <memory>
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

// fsync of an open file.
Status FsyncFd(int fd, const std::string& path);
// fsync of a file or directory by path (a directory: what makes renames and new entries in it
// durable). Filesystems that cannot sync a directory are not an error (see file_util.cc).
Status FsyncPath(const std::string& path);

// mkdir -p: creates `dir` and every missing parent. durable: each directory created is made
// durable by syncing its parent.
Status MakeDirs(const std::string& dir, bool durable = false);

// A fresh temporary name next to `path`: "<path>.tmp.<pid>.<n>", unique within this process and
// across processes sharing the directory.
std::string TempPathFor(const std::string& path);

// Renames the complete file `from` over `to`, then (durable) syncs the directory holding `to` so
// the new name survives a host crash. The data of `from` must already be synced by the caller.
// NotFound when `from` does not exist; on any failure `to` is untouched.
Status ReplaceFile(const std::string& from, const std::string& to, bool durable = true);

struct AtomicFileOptions {
  bool durable = true;
  // Create missing parent directories of the target (and again if a concurrent remover prunes
  // them between our mkdir and our create).
  bool make_parents = false;
};

// A file written under TempPathFor(path) and renamed over `path` by Commit(): readers see the old
// file or the complete new one, never a partial one. Dropped uncommitted (or after a failed
// Commit) the temporary file is removed and `path` is untouched.
class AtomicFile {
 public:
  static Result<std::unique_ptr<AtomicFile>> Create(const std::string& path,
                                                    AtomicFileOptions options = {});
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  const std::string& path() const { return path_; }
  const std::string& tmp_path() const { return tmp_path_; }
  Status Write(const uint8_t* data, uint64_t len);
  // fsync (durable), close (NFS reports write errors there), ReplaceFile over path.
  Status Commit();

 private:
  AtomicFile() = default;
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  bool durable_ = true;
  bool committed_ = false;
};

// Small whole files (state json, deltas in memory): one AtomicFile holding `contents`.
Status WriteFileAtomic(const std::string& path, std::string_view contents, bool durable = true);
Result<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes);

// A whole regular file mapped into memory. Read-only mappings are private; writable ones are
// shared, so stores reach the file (Sync() makes them durable). An empty file maps to nullptr.
class MappedFile {
 public:
  // NotFound when the file does not exist, Invalid when it is not a regular file.
  static Result<std::unique_ptr<MappedFile>> Open(const std::string& path, bool writable = false);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint8_t* mutable_data() const { return writable_ ? data_ : nullptr; }
  uint64_t size() const { return size_; }
  // msync of a writable mapping (whole file); a no-op for a read-only one.
  Status Sync();

 private:
  MappedFile() = default;
  std::string path_;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  bool writable_ = false;
};

}  // namespace refit::internal
