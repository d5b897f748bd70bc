// The sender and receiver pipelines, and offline deltas between checkpoint files.
//
// Shape of the API (kept so a C API and a Python module can wrap it): objects are made by static
// Make() from a Config, hold their plugins, report through Status/Result, never throw, and own no
// model memory they did not allocate (weights come in as TensorViews).
//
// Threading: a Sender or Receiver is used from one thread at a time; internally the sender writes
// payloads on a background thread while it encodes the next one (two buckets in flight at most).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "refit/api.h"
#include "refit/config.h"
#include "refit/registry.h"
#include "refit/status.h"
#include "refit/tensor.h"
#include "refit/wire.h"

namespace refit {

// The framework's own config keys (docs/config.md), for validation and `refit plugins`.
REFIT_API std::vector<ConfigKeySpec> FrameworkConfigSpecs();
// Validates the whole file: framework keys, then each [encoding.X]/[transport.X]/[layout.X]
// section against the keys its plugin declares (unknown plugin -> error naming file:line:key).
REFIT_API Status ValidateConfig(const Config& config, const Registry& registry);

// Creates the registry for a config: builtins, REFIT_PLUGIN_PATH, then [plugins] paths/load.
REFIT_API Result<std::shared_ptr<Registry>> MakeRegistry(const Config* config);

struct SyncStats {
  uint64_t version = 0;
  std::optional<uint64_t> base_version;
  bool full = false;
  uint64_t tensors = 0;
  uint64_t total_elements = 0;
  uint64_t changed_elements = 0;
  uint64_t model_bytes = 0;    // one copy of the model, dense
  uint64_t changed_bytes = 0;  // changed elements * their size
  uint64_t payload_bytes = 0;  // what crossed the transport
  uint64_t records = 0;
  uint64_t payloads = 0;
  double wait_seconds = 0;  // waiting for the previous version's acks + baseline advance
  double diff_seconds = 0;
  double encode_seconds = 0;
  double send_seconds = 0;  // time the pipeline waited on the transport
  double total_seconds = 0;
  // Recovery of an earlier attempt that died (docs/reliability.md): its commit was stored, so
  // this publish adopted that version first; or it died before its commit, and this publish
  // removed its leftovers and reuses the version number; or the baseline advance it was in
  // resumed through the advance journal (entries replayed).
  bool adopted_commit = false;
  bool republished = false;
  uint64_t advance_resumed_entries = 0;
  double density() const {
    return total_elements ? static_cast<double>(changed_elements) / total_elements : 0.0;
  }
};

struct ApplyStats {
  uint64_t version = 0;
  bool full = false;
  uint64_t records = 0;
  uint64_t payloads = 0;
  uint64_t payload_bytes = 0;
  uint64_t changed_elements = 0;
  // Exactly-once apply of xor/step records (framework/src/journal.h): records journaled before
  // they touched the model, and, when resuming an interrupted apply, entries replayed and
  // records skipped because an earlier attempt had journaled them.
  uint64_t journaled_records = 0;
  uint64_t resumed_entries = 0;
  uint64_t resumed_skipped_records = 0;
  // The model was `applying` this version when the receiver started it: an interrupted in-place
  // apply resumed (journal entries replayed, overwrite records applied again).
  bool resumed = false;
  double fetch_seconds = 0;
  double apply_seconds = 0;  // decode + apply + digest verification
  double total_seconds = 0;
};

class REFIT_API Sender {
 public:
  // Reads [sender], [transport], [encoding.*], [layout]; state lives in sender.state_dir.
  static Result<std::unique_ptr<Sender>> Make(const Config& config, int rank = 0, int world = 1);
  ~Sender();

  // Publishes version published_version()+1 from the rank's local weights: waits for every
  // configured receiver to acknowledge the previous version (then advances the baseline), diffs,
  // encodes, sends, writes the manifest and the commit marker. The first version, a version after
  // a receiver asked for one, or every full_every-th is a full (dense) sync.
  Result<SyncStats> Publish(const std::vector<TensorView>& weights);

  // Blocks until every receiver acknowledged the published version (or answered "need full"),
  // then advances the baseline to it. No-op when the baseline is already current.
  Status WaitAndAdvance(double timeout_seconds);

  uint64_t baseline_version() const;
  uint64_t published_version() const;
  // Acks seen for the published version (after WaitAndAdvance).
  const std::vector<Ack>& acks() const;

 private:
  Sender();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class REFIT_API Receiver {
 public:
  // Reads [receiver], [transport], [encoding.*]; the model lives in receiver.state_dir.
  static Result<std::unique_ptr<Receiver>> Make(const Config& config);
  ~Receiver();

  // Applies the next committed version if there is one (nullopt if none yet). A delta whose base
  // is not the receiver's version is answered with a "need full" request to the sender and a
  // kVersionMismatch status; a later full sync is then applied normally.
  Result<std::optional<ApplyStats>> PollOnce();

  uint64_t version() const;  // 0: no committed state
  std::string model_path() const;

 private:
  Receiver();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- offline deltas (`refit diff` / `refit apply`) ----

struct DiffStats {
  uint64_t tensors = 0;
  uint64_t total_elements = 0;
  uint64_t changed_elements = 0;
  uint64_t model_bytes = 0;
  uint64_t delta_bytes = 0;
  uint64_t records = 0;
};

// Writes a delta taking base_path to new_path. encoding applies to changed tensors; tensors that
// are new or changed dtype/shape are sent dense. The delta names its base by a digest of the
// base's tensors.
REFIT_API Result<DiffStats> DiffFiles(const std::string& base_path, const std::string& new_path,
                                      const std::string& out_path, const std::string& encoding,
                                      const Registry& registry, const Config* config);

// Applies a delta onto base_path and writes out_path atomically (tmp + fsync + rename): out has
// exactly the new file's tensors, dtypes, shapes and bytes. Wrong base -> kVersionMismatch.
REFIT_API Result<ApplyStats> ApplyFile(const std::string& base_path, const std::string& delta_path,
                                       const std::string& out_path, const Registry& registry,
                                       const Config* config);

// Digest of a set of tensors (names, dtypes, shapes and bits), order-independent.
REFIT_API uint64_t ModelDigest(const std::vector<TensorView>& tensors);

}  // namespace refit
