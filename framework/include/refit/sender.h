// The sender: one per trainer rank. It diffs the rank's weights against its baseline, encodes the
// changed elements, puts payloads through a transport and commits a version.
//
// Objects are made by static Make(), report through Status/Result, never throw, and own no model
// memory they did not allocate (weights come in as TensorViews). A Sender is used from one thread
// at a time; internally it writes payloads on a background thread while it encodes the next one
// (two buckets in flight at most).
#pragma once

#include <cstdint>
#include <functional>
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

// A receiver's acknowledgement of a committed version.
struct Ack {
  std::string receiver;
  uint64_t version = 0;
  double apply_seconds = 0;
  uint64_t applied_records = 0;
  // SHA-256 (hex) of the COMMIT object the receiver applied; a sender takes the ack only for the
  // commit it published (an ack left by another history at the same version number is no
  // answer). Empty from a receiver older than this field: taken.
  std::string commit_sha256;
};

struct SyncStats {
  uint64_t version = 0;
  std::optional<uint64_t> base_version;
  bool full = false;
  uint64_t tensors = 0;
  DeltaCounters counters;      // of this rank's slices
  uint64_t payload_bytes = 0;  // what crossed the transport
  uint64_t payloads = 0;
  // Seconds per stage. diff and encode run on the writer's threads (summed over them); send is
  // the time the pipeline waited on payload puts, commit the manifest, commit and state writes.
  double read_seconds = 0;     // opening and mapping the weights (set by `refit send`)
  double wait_seconds = 0;     // waiting for the previous version's acks
  double advance_seconds = 0;  // advancing the baseline to the acknowledged version
  double diff_seconds = 0;
  double encode_seconds = 0;
  double send_seconds = 0;
  double commit_seconds = 0;
  double total_seconds = 0;
  // Recovery of an earlier attempt that died (docs/reliability.md): its commit was stored, so
  // this publish adopted that version first; or it died before its commit, and this publish
  // removed its leftovers and reuses the version number; or the baseline advance it was in
  // resumed through the advance journal (entries replayed).
  bool adopted_commit = false;
  bool republished = false;
  uint64_t advance_resumed_entries = 0;
  // The baseline's advance to the acknowledged version was written by this version's diff as it
  // read the baseline (one read of it per version), not replayed before it; its time is then
  // part of diff_seconds.
  bool advanced_in_diff = false;
};
// Progress of long work: bytes done of the total so far. Called on the caller's thread, from inside
// the call that does the work; it must not call back into the object reporting.
using ProgressFn = std::function<void(uint64_t done_bytes, uint64_t total_bytes)>;

class REFIT_API Sender {
 public:
  // Reads [sender], [transport], [encoding.*], [layout]; state lives in sender.state_dir.
  // `registry`: the plugins to use (e.g. one the caller loaded extra plugins into, shared by
  // several senders); null loads LoadRegistry(&config).
  static Result<std::unique_ptr<Sender>> Make(const Config& config, int rank = 0, int world = 1,
                                              std::shared_ptr<Registry> registry = nullptr);
  ~Sender();

  // Publishes version published_version()+1 from the rank's local weights: waits for every
  // configured receiver to acknowledge the previous version (then advances the baseline), diffs,
  // encodes, sends, writes the manifest and the commit marker. The first version, a version after
  // a receiver asked for one, or every full_every-th is a full (dense) sync.
  Result<SyncStats> Publish(const std::vector<TensorView>& weights);

  // Called by Publish as the rank's slices are handed to the diff/encode pass (bytes of the local
  // weights; total: all of this rank's slices). Empty: no reports.
  void SetProgress(ProgressFn fn);

  // Blocks until every receiver acknowledged the published version (or answered "need full"),
  // then advances the baseline to it. No-op when the baseline is already current.
  Status WaitAndAdvance(double timeout_seconds);

  // The configured receivers that have neither acknowledged the published version nor answered
  // it with a need-full request (what WaitAndAdvance waits for); empty once all answered. One
  // look through the sender's own transport instance, no wait: a caller may watch the acks
  // while it does other work (over a push transport a second instance would be a second sender).
  std::vector<std::string> Unanswered();

  uint64_t baseline_version() const;
  uint64_t published_version() const;
  // Acks seen for the published version (after WaitAndAdvance).
  const std::vector<Ack>& acks() const;

 private:
  Sender();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
}  // namespace refit
