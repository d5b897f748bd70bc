// The `disk` transport: a keyed blob channel over a shared directory.
//
// Key "v00000007/COMMIT" is the file <dir>/v00000007/COMMIT. A put is the framework's atomic file
// write (common/file_util.h, the refit_file_util library): it writes
// "<dir>/<key>.tmp.<pid>.<counter>", fsyncs it, renames it over the final path and fsyncs the
// parent directory, so a reader (in this or another process, on this or another host sharing the
// directory) sees either the whole old object, the whole new one, or no key; never a partial one.
//
// Thread safety: every method may be called concurrently from several threads; tmp names are
// unique per call within the process (pid + a process-wide atomic counter) and across processes
// (pid). Two hosts sharing one directory must not share a pid namespace view with equal pids
// writing the same key at once (the usual shared-filesystem caveat; the sync protocol never has
// two writers of one key).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/file_util.h"
#include "refit/plugin_abi.h"
#include "refit/sdk/plugin.hpp"
#include "refit/status.h"

namespace refit::disk {

struct DiskOptions {
  std::string dir;  // the shared directory (created if missing)
  bool fsync =
      true;  // fsync file + parent dir on put: survive a host crash, not just a process one
};

class DiskTransport {
 public:
  // The SDK concept: reads `dir` (required) and `fsync` from the component's config section.
  // Role and peer are unused: a shared directory needs no connection.
  static Result<std::unique_ptr<DiskTransport>> Create(const sdk::ConfigView& cfg,
                                                       refit_transport_role_t role,
                                                       const std::string& peer_id);
  // Creates options.dir (and its parents) if missing.
  static Result<std::unique_ptr<DiskTransport>> Open(DiskOptions options);

  Status Put(const std::string& key, const uint8_t* data, uint64_t len);
  // nullopt when no regular file holds the key (a directory counts as missing).
  Result<std::optional<uint64_t>> Size(const std::string& key);
  // Exactly len bytes at offset; an object too short for the range is Corrupt.
  Status Get(const std::string& key, uint64_t offset, uint8_t* buf, uint64_t len);
  // Every key starting with prefix (a plain string prefix), with its size, sorted by key.
  Result<std::vector<std::pair<std::string, uint64_t>>> List(const std::string& prefix);
  // Missing is fine (idempotent); empty parent directories are pruned up to dir (best effort).
  Status Remove(const std::string& key);

  const DiskOptions& options() const { return options_; }

 private:
  DiskTransport(DiskOptions options, std::unique_ptr<internal::ConfinedDir> root)
      : options_(std::move(options)), root_(std::move(root)) {}
  Result<int> OpenObject(const std::string& key) const;
  std::string PathOf(const std::string& key) const { return options_.dir + "/" + key; }
  void PruneEmptyParents(const std::string& key) const;

  DiskOptions options_;
  // options_.dir held open: every key is resolved beneath it, never through a symlink.
  std::unique_ptr<internal::ConfinedDir> root_;
};

}  // namespace refit::disk
