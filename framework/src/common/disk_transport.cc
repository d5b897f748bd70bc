#include "common/disk_transport.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>

#include "common/file_util.h"
#include "common/transport_key.h"

namespace refit::disk {
namespace {

using internal::ScopedFd;

// One pread() moves at most this much: Linux caps a single transfer near 2 GiB anyway.
constexpr uint64_t kMaxIoChunk = uint64_t{1} << 30;

std::string ErrnoText(int err) { return std::error_code(err, std::generic_category()).message(); }

Status IoFailure(const std::string& what, const std::string& path, int err) {
  return Status::IoError("disk transport: " + what + " '" + path + "': " + ErrnoText(err));
}

struct WalkState {
  const std::string* root;
  const std::string* prefix;
  std::vector<std::pair<std::string, uint64_t>>* out;
};

// Lists regular files in the directory open as dir_fd (whose key prefix is rel_dir, "" or ending
// in '/'), then its subdirectories, each opened beneath it without following a link: a symlink
// planted in the shared directory is neither listed nor walked into. Entries that vanish mid-walk
// (a concurrent Remove) are skipped, not errors. In the first directory only names starting with
// name_filter are visited: the prefix's partial component.
Status Walk(int dir_fd, const std::string& rel_dir, const std::string& name_filter,
            const WalkState& state) {
  const std::string where = *state.root + "/" + rel_dir;
  // closedir closes it; dir_fd stays ours for openat. A fresh open, not dup(): a dup would share
  // (and move) dir_fd's offset.
  const int listing_fd = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR* d = listing_fd < 0 ? nullptr : ::fdopendir(listing_fd);
  if (d == nullptr) {
    const int err = errno;
    if (listing_fd >= 0) ::close(listing_fd);
    return IoFailure("list: cannot open directory", where, err);
  }
  std::vector<std::string> subdirs;
  Status st;
  while (true) {
    errno = 0;
    struct dirent* entry = ::readdir(d);
    if (entry == nullptr) {
      if (errno != 0) st = IoFailure("list: cannot read directory", where, errno);
      break;
    }
    std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    if (name.compare(0, name_filter.size(), name_filter) != 0) continue;
    // Foreign files whose names are not keys (editor backups, "a b") are not ours to list.
    if (!std::all_of(name.begin(), name.end(), IsTransportKeyChar)) continue;
    struct stat sb;
    if (::fstatat(dirfd(d), entry->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;
      st = IoFailure("list: cannot stat", where + name, errno);
      break;
    }
    std::string key = rel_dir + name;
    if (S_ISDIR(sb.st_mode)) {
      subdirs.push_back(name);
    } else if (S_ISREG(sb.st_mode) && !IsReservedTmpName(name) &&
               key.compare(0, state.prefix->size(), *state.prefix) == 0) {
      state.out->emplace_back(std::move(key), static_cast<uint64_t>(sb.st_size));
    }
  }
  ::closedir(d);  // before recursing: depth is bounded by the key length, fds are not
  REFIT_RETURN_NOT_OK(st);
  for (const std::string& sub : subdirs) {
    ScopedFd sub_fd(::openat(dir_fd, sub.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (sub_fd.get() < 0) {
      // Removed, or swapped for a link or a file, since it was listed: not ours to walk.
      if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP) continue;
      return IoFailure("list: cannot open directory", where + sub, errno);
    }
    REFIT_RETURN_NOT_OK(Walk(sub_fd.get(), rel_dir + sub + "/", "", state));
  }
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<DiskTransport>> DiskTransport::Create(const sdk::ConfigView& cfg,
                                                             refit_transport_role_t /*role*/,
                                                             const std::string& /*peer_id*/) {
  DiskOptions options;
  REFIT_ASSIGN_OR_RAISE(options.dir, cfg.GetString("dir", ""));
  if (options.dir.empty()) {
    return Status::Invalid(
        "config key 'dir' is required (the shared directory of the disk transport) and must not "
        "be empty");
  }
  REFIT_ASSIGN_OR_RAISE(options.fsync, cfg.GetBool("fsync", true));
  return Open(std::move(options));
}

Result<std::unique_ptr<DiskTransport>> DiskTransport::Open(DiskOptions options) {
  if (options.dir.empty()) return Status::Invalid("disk transport: empty directory path");
  std::error_code ec;
  // Absolute, so a later chdir() of the host process cannot move the channel.
  std::filesystem::path dir = std::filesystem::absolute(options.dir, ec).lexically_normal();
  if (ec) return IoFailure("cannot resolve directory", options.dir, ec.value());
  std::string normalized = dir.string();
  while (normalized.size() > 1 && normalized.back() == '/') normalized.pop_back();
  // The directory itself is the operator's choice (a symlink naming it is followed, once); what
  // lies beneath it is resolved through root without following anything.
  Result<std::unique_ptr<internal::ConfinedDir>> root =
      internal::ConfinedDir::Open(normalized, /*create=*/true);
  if (!root.ok()) return root.status().WithContext("disk transport");
  options.dir = std::move(normalized);
  return std::unique_ptr<DiskTransport>(
      new DiskTransport(std::move(options), std::move(root).value()));
}

Status DiskTransport::Put(const std::string& key, const uint8_t* data, uint64_t len) {
  REFIT_RETURN_NOT_OK(ValidateTransportKey(key));
  if (data == nullptr && len != 0) return Status::Invalid("put '" + key + "': null data");
  // The first put under a directory creates it, and so does one racing a Remove that prunes it.
  return root_->WriteAtomic(key, data, len, options_.fsync, /*make_parents=*/true)
      .WithContext("disk transport: put '" + key + "'");
}

// A read-only fd on the regular file holding key. NotFound when it is missing; Invalid, with a
// message naming only the key, for anything else (a planted link, FIFO, device or directory).
Result<int> DiskTransport::OpenObject(const std::string& key) const {
  Result<int> fd = root_->OpenFile(key);
  if (fd.ok()) return fd;
  if (fd.status().code() == StatusCode::kNotFound) {
    return Status::NotFound("disk transport: key '" + key + "' does not exist (" + PathOf(key) +
                            ")");
  }
  return fd.status().WithContext("disk transport: key '" + key + "'");
}

Result<std::optional<uint64_t>> DiskTransport::Size(const std::string& key) {
  REFIT_RETURN_NOT_OK(ValidateTransportKey(key));
  Result<int> fd = OpenObject(key);
  // Only a regular file of its own is an object: anything else counts as missing, and its size
  // (a link's target's above all) is never looked at.
  if (!fd.ok()) {
    if (fd.status().code() == StatusCode::kNotFound ||
        fd.status().code() == StatusCode::kInvalidArgument) {
      return std::optional<uint64_t>();
    }
    return fd.status();
  }
  ScopedFd file(fd.value());
  struct stat sb;
  if (::fstat(file.get(), &sb) != 0) {
    return IoFailure("size '" + key + "': cannot stat", PathOf(key), errno);
  }
  return std::optional<uint64_t>(static_cast<uint64_t>(sb.st_size));
}

Status DiskTransport::Get(const std::string& key, uint64_t offset, uint8_t* buf, uint64_t len) {
  REFIT_RETURN_NOT_OK(ValidateTransportKey(key));
  if (len > UINT64_MAX - offset) {
    return Status::Invalid("get '" + key + "': range offset " + std::to_string(offset) + " + " +
                           std::to_string(len) + " overflows");
  }
  if (buf == nullptr && len != 0) return Status::Invalid("get '" + key + "': null buffer");
  const std::string path = PathOf(key);
  REFIT_ASSIGN_OR_RAISE(int raw_fd, OpenObject(key));
  ScopedFd file(raw_fd);
  const int fd = file.get();
  struct stat sb;
  if (::fstat(fd, &sb) != 0) return IoFailure("get '" + key + "': cannot stat", path, errno);
  auto too_short = [&](uint64_t available) {
    return Status::Corrupt("key '" + key + "': wanted bytes [" + std::to_string(offset) + ", " +
                           std::to_string(offset + len) + ") but the object has " +
                           std::to_string(available));
  };
  const uint64_t size = static_cast<uint64_t>(sb.st_size);
  if (offset + len > size) return too_short(size);
  uint64_t done = 0;
  while (done < len) {
    size_t chunk = static_cast<size_t>(std::min(len - done, kMaxIoChunk));
    ssize_t n = ::pread(fd, buf + done, chunk, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoFailure(
          "get '" + key + "': read failed at byte " + std::to_string(offset + done) + " of", path,
          errno);
    }
    if (n == 0) return too_short(offset + done);  // truncated behind our back
    done += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

Result<std::vector<std::pair<std::string, uint64_t>>> DiskTransport::List(
    const std::string& prefix) {
  REFIT_RETURN_NOT_OK(ValidateTransportPrefix(prefix));
  // Only the subtree named by the prefix's directory part is walked.
  size_t last_slash = prefix.rfind('/');
  std::string rel_dir = last_slash == std::string::npos ? "" : prefix.substr(0, last_slash + 1);
  std::string partial = last_slash == std::string::npos ? prefix : prefix.substr(last_slash + 1);
  std::vector<std::pair<std::string, uint64_t>> out;
  Result<int> dir_fd =
      root_->OpenDir(rel_dir.empty() ? std::string() : rel_dir.substr(0, last_slash));
  if (!dir_fd.ok()) {
    // No directory of its own (missing, a file, a planted link): nothing under that prefix.
    if (dir_fd.status().code() == StatusCode::kNotFound ||
        dir_fd.status().code() == StatusCode::kInvalidArgument) {
      return out;
    }
    return dir_fd.status().WithContext("disk transport: list '" + prefix + "'");
  }
  ScopedFd dir(dir_fd.value());
  REFIT_RETURN_NOT_OK(Walk(dir.get(), rel_dir, partial, WalkState{&options_.dir, &prefix, &out}));
  std::sort(out.begin(), out.end());
  return out;
}

void DiskTransport::PruneEmptyParents(const std::string& key) const {
  size_t slash = key.rfind('/');
  while (slash != std::string::npos && slash > 0) {
    // rmdir fails on a non-empty directory: that is where pruning stops.
    if (!root_->Remove(key.substr(0, slash), /*directory=*/true).ok()) return;
    slash = key.rfind('/', slash - 1);
  }
}

Status DiskTransport::Remove(const std::string& key) {
  REFIT_RETURN_NOT_OK(ValidateTransportKey(key));
  const size_t slash = key.rfind('/');
  Result<int> parent_fd =
      root_->OpenDir(slash == std::string::npos ? std::string() : key.substr(0, slash));
  if (!parent_fd.ok()) {
    if (parent_fd.status().code() == StatusCode::kNotFound) return Status::OK();
    return parent_fd.status().WithContext("disk transport: remove '" + key + "'");
  }
  ScopedFd parent(parent_fd.value());
  const std::string name = slash == std::string::npos ? key : key.substr(slash + 1);
  // unlinkat removes the entry itself: a planted link goes, its target never.
  if (::unlinkat(parent.get(), name.c_str(), 0) != 0) {
    // A directory is "missing" as a key (see Size), so removing it is a no-op like ENOENT.
    if (errno == ENOENT || errno == EISDIR) return Status::OK();
    return IoFailure("remove '" + key + "': cannot unlink", PathOf(key), errno);
  }
  PruneEmptyParents(key);
  return Status::OK();
}

}  // namespace refit::disk
