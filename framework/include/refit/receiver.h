// The receiver: applies committed versions in place, verifies every record's digest, commits
// the version and acknowledges it. Made by static Make(), used from one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "refit/config.h"
#include "refit/delta_counters.h"
#include "refit/export.h"
#include "refit/registry.h"
#include "refit/status.h"
#include "refit/tensor.h"

namespace refit {

struct ApplyStats {
  uint64_t version = 0;
  bool full = false;
  // Records applied and the elements they changed; the model-size counters stay 0 (the receiver
  // applies records, it does not walk the model).
  DeltaCounters counters;
  uint64_t payloads = 0;
  uint64_t payload_bytes = 0;
  // Payloads read and computed (decoded, verified) before the version's commit was there
  // (receiver.early_bytes): their fetch, decode and verify are not in this apply's stages.
  uint64_t early_payloads = 0;
  // Exactly-once apply of xor/step records (framework/src/receive/journal.h): records journaled
  // before they touched the model, and, when resuming an interrupted apply, entries replayed and
  // records skipped because an earlier attempt had journaled them.
  uint64_t journaled_records = 0;
  uint64_t resumed_entries = 0;
  uint64_t resumed_skipped_records = 0;
  // The model was `applying` this version when the receiver started it: an interrupted in-place
  // apply resumed (journal entries replayed, overwrite records applied again).
  bool resumed = false;
  // Seconds per stage (wall time of this receiver; a payload is fetched while the previous one
  // is applied, so fetch overlaps the others). apply = decode + verify + log_sync + write for a
  // delta applied through the redo log; for a full sync and attached memory, records are decoded
  // in place and apply is all there is.
  double fetch_seconds = 0;
  double apply_seconds = 0;
  double decode_seconds = 0;    // decoding records in scratch
  double verify_seconds = 0;    // diffing and digesting the decoded records
  double log_sync_seconds = 0;  // writing and syncing the redo log
  double write_seconds = 0;     // writing the changed elements into the model
  double commit_seconds = 0;    // state, checkpoint (when one is due) and ack
  double total_seconds = 0;     // the PollOnce that applied it, commit reads included
};
class REFIT_API Receiver {
 public:
  // Reads [receiver], [transport], [encoding.*]; the model lives in receiver.state_dir.
  // `registry`: the plugins to use; null loads LoadRegistry(&config).
  static Result<std::unique_ptr<Receiver>> Make(const Config& config,
                                                std::shared_ptr<Registry> registry = nullptr);
  ~Receiver();

  // Applies the next committed version if there is one (nullopt if none yet). A delta whose base
  // is not the receiver's version is answered with a "need full" request to the sender and a
  // kVersionMismatch status; a later full sync is then applied normally. A version that does not
  // extend the receiver's version chain (or, with [auth], is not signed) is refused. A version
  // that fails the same way receiver.max_apply_failures times is abandoned: a full sync is
  // requested (kVersionMismatch) and the version never tried again.
  Result<std::optional<ApplyStats>> PollOnce();
  // Between two PollOnce calls: returns once something may have arrived from the sender (a
  // transport that can wake a receiver, such as ucx: at once when the commit lands) or after
  // timeout_ms (any other transport: a plain sleep). True when woken by an arrival. Safe beside a
  // PollOnce on another thread (it only waits on the transport).
  Result<bool> WaitForArrival(uint32_t timeout_ms);

  // Binds the receiver's model to caller-owned memory (an inference engine's own parameters):
  // from now on a full sync is copied into these tensors and a delta is decoded and applied in
  // place, every record's digest verified; no model file is kept (the version, ack and journal
  // state stay in state_dir). Each tensor is matched by name against the receiver's tensors
  // (canonical names, or its layout's shards: e.g. vLLM's fused qkv_proj / gate_up_proj and
  // vocab-parallel embeddings), with the same dtype and shape, else one error naming it; memory
  // must be contiguous, writable and stay valid until the next Attach or the receiver's end
  // (with receiver.write_early, changes written before their commit are put back there when
  // the version does not commit them). `loaded_version`: the version the caller loaded into that memory (e.g. after a restart). It
  // is taken only if it is the receiver's committed version and the attached bits hash to what
  // the receiver recorded for it; otherwise the receiver asks for a full sync.
  Status Attach(const std::vector<TensorView>& tensors,
                std::optional<uint64_t> loaded_version = std::nullopt);
  // Syncs the model file and empties its redo log now (durable settings: the log already makes
  // every committed version survive a crash; this bounds the log and the replay after a reboot).
  // No-op for attached memory.
  Status Checkpoint();
  // The same, but only once the log is halfway to a due checkpoint (receiver.checkpoint_versions
  // or checkpoint_bytes): what `refit recv --follow` calls when idle, so that the sync a version
  // would come to need is done between versions. Not after every version: a sync cleans the
  // model's pages, and the next version's writes fault every page they touch writable again.
  Status IdleCheckpoint();
  uint64_t version() const;  // 0: no committed state
  // Nonzero while the model holds part of that version (an in-place apply interrupted, or one
  // abandoned until a full sync replaces the model): the model is then not `version()`.
  uint64_t applying() const;
  std::string model_path() const;

 private:
  Receiver();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
}  // namespace refit
