// Decode, apply and verify the records of one payload.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/box.h"
#include "format/wire.h"
#include "plugins/encoding_cache.h"
#include "refit/kernels/buffer.h"
#include "refit/receiver.h"

namespace refit::internal {

// A thread's record buffer while applying: reused, never zero-filled (buffer.h).
using ApplyScratch = kernels::UninitVector<uint8_t>;

// Where a record lands: a box (same extent as the record's) of a writable local tensor. The
// receiver's layout decides; for canonical (hf) receivers it is the record's own box.
struct ApplyTarget {
  TensorView* tensor = nullptr;
  Box box;
};
using TensorResolver = std::function<Result<ApplyTarget>(const RecordHeader& record)>;

// The identity resolver over canonical tensors by name (checks name, dtype and full shape).
TensorResolver CanonicalResolver(std::map<std::string, TensorView*> tensors);

class RedoLog;     // journal.h
class WorkerPool;  // common/worker_pool.h

// The boxes a full sync's records wrote, per target tensor: a full sync must cover every element
// of every tensor exactly once (a version that lists a tensor and sends no record for it, or
// two records for one element, is refused before it replaces the model).
class CoverageTracker {
 public:
  void Add(const TensorView& target, const Box& box) { boxes_[target.name].push_back(box); }
  // Corrupt, naming the first tensor that is not covered exactly once. `mapped`: for sharded
  // receivers, the elements of each local tensor its layout maps to canonical ones (a shard's
  // padding rows get no record); null: every element.
  Status Check(const std::vector<TensorView>& tensors,
               const std::map<std::string, uint64_t>* mapped = nullptr) const;

 private:
  std::map<std::string, std::vector<Box>> boxes_;
};

// A payload's leading windows of records, decoded and verified against their targets' current
// bits before anything may be written: a receiver computes the next version's payloads while it
// waits for their commit (receiver.early_bytes), and ApplyPayload then writes them without
// decoding again. Opaque outside apply.cc.
struct EarlyWindows;
struct EarlyWindowsDeleter {
  void operator()(EarlyWindows* early) const;
};
using EarlyWindowsPtr = std::unique_ptr<EarlyWindows, EarlyWindowsDeleter>;

// A logged apply's last window, its log sync still running and its changes not yet written: the
// receiver lets it land while the next payload of the same version is computed (one log sync
// waited for per version, not one per payload). Opaque outside apply.cc.
struct LoggedTail;
struct LoggedTailDeleter {
  void operator()(LoggedTail* tail) const;
};
using LoggedTailPtr = std::unique_ptr<LoggedTail, LoggedTailDeleter>;

// Windows of change buffers kept between versions: lent to each version's applies through
// ApplySink::stash, their pages are faulted in once rather than per version (a fresh page costs
// ~10 us on the 2-core VM). Opaque outside apply.cc.
struct WindowStash;
struct WindowStashDeleter {
  void operator()(WindowStash* stash) const;
};
using WindowStashPtr = std::unique_ptr<WindowStash, WindowStashDeleter>;
WindowStashPtr MakeWindowStash();

// What the caller hooks into an apply.
struct ApplySink {
  // Called once, after every record of the payload is validated and before the first byte of a
  // target changes (the receiver marks its model `applying` and opens its journal there).
  std::function<Status()> before_write;
  bool began_writing = false;  // before_write was called (ApplyPayload calls it only once)
  // With a redo log (read after before_write), every record's changes are listed
  // (decode_changes) or decoded in scratch, and verified, then logged (one sync per window of
  // records) and only then written: applied exactly once and durable without syncing the file
  // (journal.h). Without one (attached memory,
  // a full sync's new file, an offline apply into a copy) records are decoded in place.
  RedoLog* journal = nullptr;
  CoverageTracker* coverage = nullptr;  // full syncs
  // After each record is applied and verified: its target, box and the digest of its new bits
  // (called under a lock: records may be applied on several threads).
  std::function<void(const TensorView& target, const Box& box, uint64_t digest)> applied;
  // Without a journal: the ids of records already applied in memory by an earlier attempt at
  // this version (skipped) and, after this call, those applied now. xor/step records are then
  // decoded straight into their target, like overwrite records: memory that outlives no crash
  // needs no redo log, only to never apply a record twice.
  std::set<std::string>* applied_ids = nullptr;
  // With a pool, a payload's records are applied by `threads` threads (the caller's included).
  WorkerPool* pool = nullptr;
  size_t threads = 1;
  // With a journal, or attached memory's applied_ids: this payload's windows computed before the
  // commit was read (ComputeEarly, against the same targets' bits, which nothing wrote since);
  // taken, not copied.
  EarlyWindows* early = nullptr;
  // With a journal: leave the payload's last window in `tail` (syncing, unwritten) instead of
  // waiting for it; the next ApplyPayload lands it after computing its own first window. The
  // caller must call FinishLoggedTail before anything reads the targets' bits but the next
  // payload of the same version (whose records are disjoint from this one's), and on every
  // exit.
  bool defer_last_sync = false;
  LoggedTailPtr tail;
  // With a journal: where windows are taken from and given back (null: made per apply).
  WindowStash* stash = nullptr;
};

// Waits for sink.tail's log sync and writes its changes (nothing to do without a tail). The tail
// is gone afterwards, landed or failed.
Status FinishLoggedTail(ApplySink& sink, ApplyStats* stats);

// Validates every record of a payload (target, dtype, box, cap, encoding), then decodes, applies
// and digest-verifies each: a payload refused for its structure changes nothing.
Status ApplyPayload(const Payload& payload, EncodingCache& encodings, const TensorResolver& resolve,
                    uint64_t max_record_bytes, ApplyScratch& scratch, ApplyStats* stats,
                    ApplySink* sink = nullptr);

// Validates the payload's records like ApplyPayload and computes (decodes and digest-verifies)
// its windows in order until the next would hold more than `max_held_bytes` of changes.
// *held_bytes: what the returned windows hold. A record that fails its digest (the payload is not
// a delta on these bits) fails the whole call. `scratch` as ApplyPayload's; windows are taken
// from `stash` (may be null) and go back there when the result is dropped.
// Nothing is written, unless `write_in_place` (attached memory, receiver.write_early): then each
// window's changes are swapped into their targets once verified (its buffers keep the old
// bits), ApplyPayload takes them as written, and a result dropped without ApplyPayload taking it
// swaps the old bits back, last window first. The targets' memory must outlive the result.
Result<EarlyWindowsPtr> ComputeEarly(const Payload& payload, EncodingCache& encodings,
                                     const TensorResolver& resolve, uint64_t max_record_bytes,
                                     WorkerPool* pool, size_t threads, uint64_t max_held_bytes,
                                     bool write_in_place, ApplyScratch& scratch,
                                     WindowStash* stash, uint64_t* held_bytes);
// The windows of `early` (0 for none).
size_t EarlyWindowCount(const EarlyWindows* early);

}  // namespace refit::internal
