// Diff -> encode -> pack: the sender's records, built on worker threads, appended in order.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/box.h"
#include "common/worker_pool.h"
#include "format/wire.h"
#include "plugins/encoding_cache.h"
#include "refit/delta_counters.h"
#include "send/auto_policy.h"

namespace refit::internal {

class RedoOverlay;

// One slice to diff and encode: a box of a local tensor that maps onto a box (same extent) of a
// canonical tensor.
struct SliceSource {
  std::string tensor;        // canonical name
  std::string local_tensor;  // the local tensor's name
  DType dtype = DType::kU8;
  Shape canonical_shape;
  Shape canonical_offset;
  Shape local_shape;
  Box local_box;
  const uint8_t* new_bits = nullptr;  // local tensor base
  const uint8_t* old_bits = nullptr;  // local baseline base; null for a full sync
};

// Diffs, encodes and packs records into size-capped payloads, handing each full payload to
// `flush`. Chunks are diffed and encoded on `threads` threads (0: hardware concurrency, 1: inline
// on the caller's thread; otherwise the caller and threads - 1 workers) but appended in their
// original order and flushed on sizes alone, so the payload bytes do not depend on timing or the
// thread count. A window of up to 4 chunks per thread (and 2 chunk_bytes per thread of tensor
// data) is in flight, each chunk with its positions and encoded scratch: a large chunk does not
// hold the other threads idle behind it. While it waits for the oldest chunk the caller computes
// queued ones itself; chunks under 64 KiB are computed by the caller right away.
//
// The bits an added slice points to must stay valid and unchanged until Finish() returns.
class DeltaWriter {
  struct Slot;

 public:
  // What a writer keeps between uses: its worker threads and its chunks' scratch (and with the
  // threads, their read buffers). A sender that publishes every step lends one to each
  // version's writer, so that scratch is faulted in once rather than per version (a fresh page
  // costs ~10 us on the 2-core VM: a 286 MB model's delta faulted in ~0.1 s of it per version).
  // Used by one writer at a time; must outlive the writers it is lent to.
  class Workspace {
   public:
    Workspace();
    ~Workspace();
    Workspace(const Workspace&) = delete;
    Workspace& operator=(const Workspace&) = delete;

   private:
    friend class DeltaWriter;
    std::vector<std::unique_ptr<Slot>> slots;
    std::unique_ptr<WorkerPool> pool;  // declared after slots: destroyed (joined) first
    unsigned pool_threads = 0;
  };

  using FlushFn = std::function<Status(std::vector<uint8_t>&& payload, uint64_t records)>;
  // workspace: lent (kept by the caller between writers), or null for one of the writer's own.
  DeltaWriter(EncodingCache& encodings, std::string encoding, uint64_t chunk_bytes,
              uint64_t bucket_bytes, Metadata payload_metadata, FlushFn flush, unsigned threads = 0,
              Workspace* workspace = nullptr);
  ~DeltaWriter();  // waits for chunks still in flight (after an error)

  // Called in record order, on the caller's thread, with the changes of each delta record (not
  // of a full sync's): its local tensor and box, box-relative positions and the new bits.
  using ChangesFn =
      std::function<Status(const SliceSource& slice, const Box& local_box,
                           const uint64_t* positions, uint64_t count, const uint8_t* new_values)>;
  void SetChangesSink(ChangesFn fn) { changes_ = std::move(fn); }

  // The old bits are a file with changes still to be written into it (a sender's baseline, one
  // acknowledged version behind): each chunk's are written as the chunk is read, and the chunk
  // is diffed against the bits with them. Before the first Add; must outlive the writer.
  void SetOldBitsOverlay(RedoOverlay* overlay) { old_overlay_ = overlay; }

  // About how many bytes of tensor data will be added (before the first Add): below 1 MiB per
  // thread, fewer threads are used (their start-up and hand-offs would cost more than they save);
  // from 8 chunks per thread on, bits in files are read through them (ReadThroughFiles).
  void ExpectBytes(uint64_t bytes);
  Status Add(const SliceSource& slice);
  Status Finish();  // waits for every chunk, flushes the last partial payload
  // Sizes the payload being built for about `bytes` up front (before the first Add): one
  // allocation instead of a chain of reallocations, each copying and faulting in fresh pages.
  void ReserveOutput(uint64_t bytes) {
    if (builder_.empty()) builder_.Reserve(bytes);
  }
  // Also flush a payload once its records cover this many bytes of tensor data (0: on size
  // alone). Depends on the chunks added, not on timing: payloads stay deterministic.
  void SetStreamBytes(uint64_t bytes) { stream_bytes_ = bytes; }
  // Where a payload's buffer comes from: a payload already put (AsyncPutter::TakeSpare), so that
  // a version of many payloads reuses its memory instead of faulting in a fresh bucket each.
  using SpareFn = std::function<std::vector<uint8_t>()>;
  void SetSpareBuffers(SpareFn spare) { spare_ = std::move(spare); }

  DeltaCounters counters;     // of every slice added
  double diff_seconds = 0;    // summed over worker threads
  double encode_seconds = 0;  // summed over worker threads

 private:
  Status Prepare();
  void Compute(Slot& slot);  // diff + digest + encode (any thread)
  // Slot hand-off: Claim takes a queued slot for this thread (false: another has it or it is
  // done); RunClaimed computes it and marks it done.
  static bool Claim(Slot& slot);
  void RunClaimed(Slot& slot);
  void Submit(Slot& slot);  // queue a filled slot (or compute it now: no pool, small chunk)
  void Await(Slot& slot);   // until done, computing it or later queued slots meanwhile
  Status CommitOldest();    // await and commit the oldest pending slot
  void TrimScratch(Slot& slot);
  // Compute's steps. The slice's bits for the slot's box: in place when contiguous, else
  // gathered into the slot's scratch (old_bits stays null for a create record).
  void ReadBits(Slot& slot, const uint8_t** new_bits, const uint8_t** old_bits);
  // Bits lying in a MappedFile are copied into this thread's buffers with pread (the pointers
  // then name the copies; valid until this thread's next call).
  // With an overlay, the old bits' copy has its changes patched in and written to the file.
  static Status ReadThroughFiles(uint64_t bytes, const uint8_t** new_bits, const uint8_t** old_bits,
                                 RedoOverlay* old_overlay);
  // Writes the overlay's changes in the chunk's old bits read in place (in the file).
  Status AdvanceOldBits(Slot& slot, const uint8_t* old_in_place, const uint8_t* old_bits,
                        uint64_t bytes);
  // Changed positions (and their packed values when `encodes`) and the digest of the new bits;
  // the number of changed elements.
  uint64_t DiffAndDigest(Slot& slot, const uint8_t* new_bits, const uint8_t* old_bits, bool encodes,
                         uint64_t* digest);
  void FillEncodeInput(Slot& slot, const uint8_t* new_bits, const uint8_t* old_bits, bool encodes);
  // Encode into slot.best with the configured encoding / every auto candidate / the one auto
  // candidate mode link predicts cheapest; slot.chosen stays null (dense) unless the result is
  // smaller than `dense_bytes`.
  void EncodeSingle(Slot& slot, uint64_t dense_bytes);
  void EncodeAuto(Slot& slot, uint64_t dense_bytes);
  void EncodeLink(Slot& slot, uint64_t dense_bytes);
  Status Commit(Slot& slot);        // append in order (caller's thread), flush when due
  Status CommitRecord(Slot& slot);  // append in order (caller's thread)
  // The slot's new bits are where the caller's slice has them (valid until Finish), not a
  // gathered copy in the slot's scratch: a dense record can borrow them until its payload is made.
  static bool BitsAreTheCallers(const Slot& slot);
  Status DrainSlots();
  Status Flush();

  EncodingCache& encodings_;
  std::string encoding_;
  uint64_t chunk_bytes_;
  uint64_t bucket_bytes_;
  uint64_t stream_bytes_ = 0;
  uint64_t streamed_bytes_ = 0;  // tensor bytes committed since the last flush
  PayloadBuilder builder_;
  FlushFn flush_;
  SpareFn spare_;
  ChangesFn changes_;
  RedoOverlay* old_overlay_ = nullptr;
  unsigned threads_;
  bool read_through_files_ = false;
  uint64_t max_in_flight_bytes_ = 0;
  bool prepared_ = false;
  const Encoding* dense_ = nullptr;
  const Encoding* single_ = nullptr;  // the configured encoding unless auto/dense
  const AutoPolicy* auto_ = nullptr;
  Workspace own_workspace_;
  Workspace* ws_;  // its slots are a ring: pending_ slots from head_ on, in order
  size_t head_ = 0;
  size_t pending_ = 0;
  uint64_t in_flight_bytes_ = 0;  // tensor bytes of the pending slots
  std::mutex slot_mu_;
  std::condition_variable slot_cv_;
};

}  // namespace refit::internal
