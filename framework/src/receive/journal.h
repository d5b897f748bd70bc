// The redo log of a model file (a receiver's model, a sender's baseline): what makes applying a
// version both exactly-once and durable without writing the file's pages back per version.
//
// Every record applied to the file is first decoded and verified in scratch, and the elements it
// changes (box-relative positions and their new bits) are staged here as an idempotent OVERWRITE
// entry. A batch of entries is written and synced (one fdatasync, when durable) before any of
// them touches the file; only then are the changed elements written into the file's page cache.
// The file itself is synced only at a checkpoint (every N versions or M bytes of log, when idle),
// after which the log is emptied. So:
// - a process killed mid-version finds the entries of its interrupted attempt past the size the
//   log had at the last commit (`clean_bytes`): it replays them and skips their records, so an
//   xor is never applied twice, and applies the rest afresh;
// - after a reboot (the header names the boot that wrote the entries), pages written since the
//   last checkpoint may never have reached the disk: every entry is replayed;
// - a torn last entry fails its checksum and is cut off (it never reached the file).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/box.h"
#include "refit/export.h"
#include "refit/status.h"
#include "refit/tensor.h"

namespace refit::internal {

// Unmaps a RedoLog's staging buffer (kernels::MapGrowableBuffer) of `bytes`.
struct UnmapLogBuffer {
  uint64_t bytes = 0;
  void operator()(uint8_t* p) const;
};

class RedoLog {
 public:
  // Opens (creating) the log at `path`. `clean_bytes`: its size when the owner last committed
  // (0 or more than the file: nothing known): entries past it are an interrupted attempt and are
  // indexed (Has / interrupted_entries), a torn tail among them is cut.
  static Result<std::unique_ptr<RedoLog>> Open(const std::string& path, bool durable,
                                               uint64_t clean_bytes);
  ~RedoLog();

  // The version the file held, synced, when the log was last emptied (0: never).
  uint64_t checkpoint_version() const { return checkpoint_version_; }
  // The entries were written in another boot: the file's pages since the checkpoint may be lost.
  bool written_in_another_boot() const { return other_boot_; }
  // Size of the log file (entries written, staged ones excluded).
  uint64_t bytes() const { return size_; }
  bool empty() const { return size_ <= HeaderBytes(); }
  // Entries of an interrupted attempt (past clean_bytes) found at Open.
  size_t interrupted_entries() const { return interrupted_; }
  // Safe while a Flush runs on another thread (the receiver asks about the next payload's ids
  // while the previous payload's last window is being synced).
  bool Has(const std::string& record_id) const {
    std::lock_guard<std::mutex> lock(ids_mu_);
    return ids_.count(record_id) != 0;
  }
  bool HasIdWithPrefix(const std::string& prefix) const {
    std::lock_guard<std::mutex> lock(ids_mu_);
    auto it = ids_.lower_bound(prefix);
    return it != ids_.end() && it->compare(0, prefix.size(), prefix) == 0;
  }
  // The owner committed what the log holds (and recorded bytes() as its clean size): the ids
  // written so far no longer name an interrupted attempt.
  void MarkCommitted() {
    std::lock_guard<std::mutex> lock(ids_mu_);
    ids_.clear();
    interrupted_ = 0;
  }

  // Stages one overwrite entry; written by the next Flush. positions are box-relative row-major
  // element indices; values holds count elements. Not thread-safe (callers serialize).
  Status Stage(const std::string& record_id, const std::string& tensor, const Box& box,
               uint32_t elem_size, const uint64_t* positions, uint64_t count,
               const uint8_t* values);
  uint64_t staged_bytes() const { return buffer_size_ - tail_bytes_; }
  // Durable logs only: entries are written with O_DIRECT (from this process's buffer straight
  // to the device, no page-cache copy of the log) where the filesystem allows it. For logs that
  // are not read back in the normal course (the receiver's: only a recovery replays it); the
  // sender replays its own entries at the next advance and keeps them cached.
  void UseDirectWrites();
  // Writes the staged entries and syncs them (when durable): from here they survive a crash.
  // `sync` false: written (they survive the process, not a power cut) but not synced; a later
  // Flush syncs them with its own.
  Status Flush(bool sync = true);
  // Syncs what was written (when durable), whether or not this process wrote it.
  Status Sync();
  // Starts the kernel writing back what was written (asynchronous), so that a later sync finds
  // little left to wait for.
  void StartWriteback();
  // Drops the entries at offsets >= `size` and every staged one (an interrupted attempt that is
  // redone whole).
  Status TruncateTo(uint64_t size);
  // Where the first entry named `record_id` at or past offset `from` ends (NotFound: none).
  Result<uint64_t> EndOfEntry(const std::string& record_id, uint64_t from) const;

  // Writes the entries at offsets in [from, to) (default: every entry) into `tensors`;
  // idempotent. Entries without changes (markers) name no tensor and are skipped.
  // `disjoint_threads` > 1: the entries change disjoint elements (one version's records), so
  // they are replayed on that many threads in any order.
  Status Replay(const std::map<std::string, TensorView*>& tensors, uint64_t from = 0,
                uint64_t to = UINT64_MAX, unsigned disjoint_threads = 1) const;
  // After a replay of every entry: the header names this boot (entries are replayed again only
  // after another reboot).
  Status MarkCurrentBoot();
  // The file holds `version` and is synced: every entry is dropped.
  Status Checkpoint(uint64_t version);

  static uint64_t HeaderBytes();

 private:
  friend class RedoOverlay;
  RedoLog() = default;
  Status Index(uint64_t from);
  Status WriteHeader(uint64_t version);

  std::string path_;
  int fd_ = -1;
  bool durable_ = false;
  bool other_boot_ = false;
  uint64_t checkpoint_version_ = 0;
  uint64_t size_ = 0;
  size_t interrupted_ = 0;
  Status WriteStaged();
  Result<bool> WriteDirect();
  Status LoadTail();
  void KeepTail();
  void Reserve(uint64_t bytes);  // buffer_ holds at least `bytes`, block-padded
  uint8_t* Grow(uint64_t n);     // appends n bytes to buffer_: where they go

  mutable std::mutex ids_mu_;  // guards ids_
  std::set<std::string> ids_;
  // buffer_: a copy of the file's bytes from the block boundary at or below size_ (tail_bytes_
  // of them), then the staged entries; an O_DIRECT write starts on that boundary.
  // Grown by moving its pages (kernels::GrowMappedBuffer): a version's entries are staged at an
  // unknown pace, and copying them on every doubling faulted in twice their size. Its deleter
  // holds the mapping's size, which is the buffer's capacity.
  std::unique_ptr<uint8_t, UnmapLogBuffer> buffer_;
  uint64_t buffer_size_ = 0;
  uint64_t tail_bytes_ = 0;
  int direct_fd_ = -1;     // the O_DIRECT writer, or -1
  bool unsynced_ = false;  // entries written by Flush(false) and not synced since
  std::vector<std::string> staged_ids_;
};

// The same with the file's tensors as views (by name).
Status ReplayInto(const RedoLog& log, std::vector<TensorView> tensors, uint64_t from = 0,
                  uint64_t to = UINT64_MAX, unsigned disjoint_threads = 1);

// The entries of a log between two offsets (one version's changes to a file: disjoint elements),
// held in memory and found by where their elements lie, so that a reader of the file writes them
// as it reads: the sender's diff advances its baseline by the acknowledged version's changes while
// reading it for the next version, instead of replaying them over the whole file in a pass of its
// own first. Thread-safe for callers working on disjoint ranges.
class RedoOverlay {
 public:
  // Null (no error) when the entries do not suit an overlay: a box not contiguous in its tensor,
  // positions not strictly increasing, boxes that overlap, or more than `max_bytes` of entries.
  static Result<std::unique_ptr<RedoOverlay>> Load(const RedoLog& log, uint64_t from, uint64_t to,
                                                   const std::vector<TensorView>& tensors,
                                                   uint64_t max_bytes);
  ~RedoOverlay();

  // Reads the file's bytes at [begin, begin + bytes) of a registered writable mapping into
  // `copy` with the changes there patched in, and writes those changes to the file; piece by
  // piece, each written from its copy while in cache, from a change to the next (a gap over 16
  // KiB starts a new write), never past the first and last change (other threads may be writing
  // the rest of a shared page).
  Status ReadPatched(const uint8_t* begin, uint64_t bytes, uint8_t* copy);
  // Writes the changes at [begin, begin + bytes) into the file (for a reader in place).
  Status ApplyInPlace(const uint8_t* begin, uint64_t bytes);
  // Writes every change neither of the two above has written (idempotent).
  Status ApplyRest();
  uint64_t changes() const { return changes_; }

 private:
  struct Item;
  RedoOverlay() = default;
  template <typename Fn>
  Status ForChangesIn(const uint8_t* begin, uint64_t bytes, Fn&& fn);

  std::string path_;
  std::vector<std::unique_ptr<Item>> items_;  // by address, disjoint
  uint64_t changes_ = 0;
  std::atomic<bool> wrote_ = false;  // a kill point after the first write
};

// Opens a file's redo log; entries written in another boot (the file's pages since the last
// checkpoint may never have reached the disk) are first replayed into `tensors`, the file's, up
// to `clean_bytes` (what the owner committed; entries past it are an interrupted attempt, maybe
// never synced, that the owner resumes or drops itself).
Result<std::unique_ptr<RedoLog>> OpenRedoLog(const std::string& path, bool durable,
                                             uint64_t clean_bytes,
                                             const std::vector<TensorView>& tensors);

// When a file is synced and its log emptied: every `versions` versions since the last
// checkpoint, or once the log holds `bytes` (0: the file's size).
struct CheckpointPolicy {
  uint64_t versions = 8;
  uint64_t bytes = 0;
};
// When CheckpointIfDue syncs: once the policy says so; once the log is halfway there (a follower
// gone idle gets ahead of a due checkpoint without syncing after every version: a sync cleans
// the file's pages, and the next version's writes fault every page it touches writable again);
// or now.
enum class CheckpointWhen { kDue, kHalfway, kNow };
// Checkpoints the file holding `version` as `when` says: sync_file, then the log emptied (kill
// points redo.checkpoint and redo.checkpoint_synced around the sync). Whether it did.
Result<bool> CheckpointIfDue(RedoLog& log, uint64_t version, uint64_t file_bytes,
                             const CheckpointPolicy& policy, CheckpointWhen when,
                             const std::function<Status()>& sync_file);
// Whether CheckpointIfDue(kDue) would checkpoint the file holding `version` now.
bool CheckpointDue(const RedoLog& log, uint64_t version, uint64_t file_bytes,
                   const CheckpointPolicy& policy);

// Element index in a row-major tensor of the box's i-th element (row-major within the box).
uint64_t BoxElementIndex(const Shape& shape, const Box& box, uint64_t i);

// Overwrites `count` elements of the box at `positions` (row-major within the box) with the
// packed `values`: through the file where the tensor lies in a writable MappedFile
// (OverwriteInMappedFile: only the changed spans touched), else stored into its memory.
Status OverwriteBox(const TensorView& tensor, const Box& box, uint32_t elem,
                    const uint64_t* positions, uint64_t count, const uint8_t* values);

// This boot's id (/proc/sys/kernel/random/boot_id), empty where the kernel has none.
const std::string& CurrentBootId();

}  // namespace refit::internal
