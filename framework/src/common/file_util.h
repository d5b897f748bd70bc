// Low-level file I/O, one implementation for the core, the CLI and the disk transport (which
// links it as the small static library refit_file_util, never the core):
//   - atomic replacement: a temporary file next to the target, fsync, rename, fsync of the parent
//     directory (AtomicFile, WriteFileAtomic, and ReplaceFile for a temporary built another way);
//   - complete writes (WriteAll), directory creation with parents (MakeDirs);
//   - whole-file mappings, read-only or read-write (MappedFile);
//   - confined access beneath a root directory that never follows a symlink (ConfinedDir), for
//     directories other jobs can write into.
// "durable" everywhere means: survive a host crash, not just a process crash. Without it the
// operations stay atomic (rename) but skip every fsync.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "refit/status.h"

namespace refit::internal {

// Closes an fd on scope exit unless released.
class ScopedFd {
 public:
  explicit ScopedFd(int fd = -1) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

// "what path: strerror(errno)".
std::string Errno(const std::string& what, const std::string& path);
// The directory holding `path` ("." for a bare name).
std::string ParentDir(const std::string& path);

// Writes all of `data`, retrying short writes and EINTR.
Status WriteAll(int fd, const uint8_t* data, uint64_t len, const std::string& path);
// The same at a file offset (pwrite), the file position untouched.
Status WriteAllAt(int fd, const uint8_t* data, uint64_t len, uint64_t offset,
                  const std::string& path);
// Reads exactly `len` bytes at `offset` (pread, retried on EINTR and short reads); an IoError
// naming `path` when the file ends first or the read fails.
Status ReadAllAt(int fd, uint8_t* out, uint64_t len, uint64_t offset, const std::string& path);

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
// Invalid for anything but a regular file (a FIFO is refused, never waited on; a directory is
// "<path>: is a directory").
Result<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes);

// Reads and writes of a MappedFile's bytes through its file, not its mapping. Touching a page of
// a file mapping costs a fault the first time a process does it (and a write fault again after
// writeback cleans it); a copy from the page cache into a buffer the process reuses costs none.
// Measured on one 2-core VM (docs/benchmarks.md, "Reading and writing through the file"):
// reading 1 GB through a fresh mapping 0.5 s, writing it 1.5 s, pread 0.12 s, pread + pwrite
// 0.15-0.17 s; on another, reading through the mapping took 0.03 s, so a receiver probes its
// model file (MappedFile::ReadInPlaceIfCheaper). A receiver or sender process that applies one
// version and exits touches every page of the model once.
//
// The file and offset behind [begin, begin + bytes) when the range lies inside one live
// MappedFile's mapping; false for any other memory (attached tensors, heap buffers).
struct FileRange {
  int fd = -1;
  uint64_t offset = 0;     // of begin in the file
  uint64_t file_size = 0;  // the mapped size
  bool writable = false;
  // Read in place: the process populated the mapping for reading (MappedFile::PopulateForReading),
  // so its pages are read where they are, with no fault and no copy, or it found a fault of the
  // mapping cheaper than a copy through the kernel (MappedFile::ReadInPlaceIfCheaper).
  bool warm = false;
  const std::string* path = nullptr;  // valid while the MappedFile lives
};
bool FindMappedFile(const void* begin, uint64_t bytes, FileRange* out);

// Copies `bytes` of `file` from its offset into `out` (pread).
Status PreadMapped(const FileRange& file, uint8_t* out, uint64_t bytes);
// Writes `bytes` of `data` to `file` at its offset (pwrite); the file must be writable.
Status PwriteMapped(const FileRange& file, const uint8_t* data, uint64_t bytes);

// Spans of a patched write through a file: at most kOverwriteSpanBytes long (patched and written
// while in cache), and a change more than kOverwriteGapBytes past the span's last one starts a
// new span instead of reading and writing the bytes between.
inline constexpr uint64_t kOverwriteGapBytes = 16 << 10;
inline constexpr uint64_t kOverwriteSpanBytes = 256 << 10;

// When base's elements lie in a writable MappedFile: overwrites `count` elements of `elem` bytes
// at `positions` (element indices from `base`) with the packed `values` through the file and
// answers true. The bytes from one change to the next are read, patched and written back in
// spans (above), never past the first and last change: callers on other threads may be writing
// the rest of a shared page. False, writing nothing, for any other memory: the caller stores
// into it.
Result<bool> OverwriteInMappedFile(uint8_t* base, uint32_t elem, const uint64_t* positions,
                                   uint64_t count, const uint8_t* values);

// A whole regular file mapped into memory. Read-only mappings are private; writable ones are
// shared, so stores reach the file (Sync() makes them durable). An empty file maps to nullptr.
// One of at least 16 MiB keeps its file open and is registered for FindMappedFile while it
// lives (smaller ones gain nothing from it, and a process may map many: an open file each would
// bring it nearer its descriptor limit).
class MappedFile {
 public:
  // NotFound when the file does not exist, Invalid when it is not a regular file (a FIFO is
  // refused, never waited on; a directory is "<path>: is a directory"). A writable mapping is never
  // opened through a symlink: it writes state files, and a link planted in their place must not
  // carry those writes elsewhere.
  static Result<std::unique_ptr<MappedFile>> Open(const std::string& path, bool writable = false);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint8_t* mutable_data() const { return writable_ ? data_ : nullptr; }
  uint64_t size() const { return size_; }
  // msync of a writable mapping (whole file); a no-op for a read-only one.
  Status Sync();
  // Maps every page of the file for reading (MADV_POPULATE_READ, one pass), after which
  // FindMappedFile reports it warm and readers read it in place instead of copying it out with
  // pread: for a process that reads the file version after version (a long-lived sender's
  // baseline, `refit recv --follow`'s model); a process that reads it once keeps pread. Writes
  // through the file leave the pages mapped. A kernel without MADV_POPULATE_READ (before 5.14)
  // leaves the file as it was. Only the first call does anything.
  Status PopulateForReading();

  // How this machine reads the file: the seconds per GB of faulting in a fresh part of the
  // mapping (one touch per 4 KiB page) and of copying a part out with pread, each timed once
  // on 4 MiB of the file (zeros for a file too small or not registered).
  struct ReadCosts {
    double fault_s_per_gb = 0;
    double pread_s_per_gb = 0;
  };
  // Marks the file read in place (FindMappedFile: warm) when a fault of its mapping costs less
  // than a copy with pread, so that a process that reads it once stops copying it: the ratio
  // depends on the machine (0.02 against 0.12 s/GB on one VM, 0.5-1.2 against 0.12 on another,
  // where every page-table change traps to the hypervisor). REFIT_FILE_READS=pread or mapping
  // decides instead of the probe. Sets *in_place; what was measured in *costs (may be null).
  Status ReadInPlaceIfCheaper(bool* in_place, ReadCosts* costs = nullptr);

 private:
  void MarkReadInPlace();
  MappedFile() = default;
  std::string path_;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  bool writable_ = false;
  int fd_ = -1;
  bool populate_tried_ = false;  // PopulateForReading was called
};

// A directory held open, under which every path is resolved without following any symlink and
// without leaving it: "a/b/c" walks a, b and c beneath the root, and a symlink anywhere on the way
// (or a "..") fails the call. Used for directories any other job can write into (the disk
// transport's shared directory, state directories): whatever is planted there, nothing outside is
// created, written, removed, read or sized through it, and no call blocks on a FIFO.
// Resolution uses openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) where the kernel has it, else a
// walk opening one component at a time with O_NOFOLLOW.
// Paths given to the methods are relative: non-empty components, no ".", "..", or leading '/'.
class ConfinedDir {
 public:
  // Opens `dir` itself (the operator chose it: a symlink naming it is followed here, once).
  // create: makes it and its missing parents first.
  static Result<std::unique_ptr<ConfinedDir>> Open(const std::string& dir, bool create = false);
  ~ConfinedDir();
  ConfinedDir(const ConfinedDir&) = delete;
  ConfinedDir& operator=(const ConfinedDir&) = delete;

  const std::string& path() const { return path_; }
  int fd() const { return fd_; }

  // A new fd on the directory `rel` beneath the root ("" is the root itself); the caller closes
  // it. NotFound when a component is missing; Invalid (one message for symlinks, files and every
  // other non-directory) otherwise. create: missing components are made (0755).
  Result<int> OpenDir(const std::string& rel, bool create = false, bool durable = false) const;
  // A read-only fd on the regular file `rel`; NotFound when missing; Invalid, with one message
  // that says nothing about the object (no size, no link target), for anything else: symlink,
  // FIFO, device, socket, directory. Never blocks.
  Result<int> OpenFile(const std::string& rel) const;
  // Writes `rel` atomically (temporary beside it, fsync when durable, rename within the parent,
  // fsync of the parent). A symlink at `rel` is replaced, never written through.
  // make_parents: missing directories on the way are created.
  Status WriteAtomic(const std::string& rel, const uint8_t* data, uint64_t len, bool durable,
                     bool make_parents = false) const;
  Status WriteAtomic(const std::string& rel, std::string_view contents, bool durable,
                     bool make_parents = false) const;
  // Reads a small regular file (see OpenFile for what is refused).
  Result<std::string> ReadSmallFile(const std::string& rel, uint64_t max_bytes) const;
  // Removes the entry `rel` (a symlink is removed as itself); NotFound when missing.
  // directory: removes an empty directory instead of a file.
  Status Remove(const std::string& rel, bool directory = false) const;
  // Checks the path grammar above.
  static Status ValidateRelative(const std::string& rel);

 private:
  ConfinedDir() = default;
  std::string Describe(const std::string& rel) const;
  std::string path_;
  int fd_ = -1;
};

// Tests only: false makes ConfinedDir resolve by its O_NOFOLLOW walk, as on kernels without
// openat2; true tries openat2 again.
void SetOpenat2ForTesting(bool enabled);
// The size from which a MappedFile is registered (FindMappedFile); tests use small files.
void SetMappedFileRegistrationBytesForTesting(uint64_t bytes);

}  // namespace refit::internal
