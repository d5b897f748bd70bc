// One rank's end of an NCCL broadcast channel: the communicator, two device staging buffers of
// bucket_bytes (with pinned host twins) and two streams, so that the copy of bucket k+1 overlaps
// the broadcast of bucket k. Rank 0 is the root (the sender); every other rank receives.
//
// Thread safety: none; the owner serializes calls (one collective at a time per communicator is
// what NCCL requires anyway). Every call sets the device on the calling thread first.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "nccl_runtime.h"
#include "refit/status.h"

namespace refit::nccl {

struct PipeOptions {
  ncclUniqueId id{};
  int nranks = 0;
  int rank = 0;
  int device = 0;
  uint64_t bucket_bytes = 0;
};

// How long a Send/Recv may wait for the GPU. timeout_s <= 0: no deadline. stop (may be null) is
// polled while waiting, and so is abandon(ctx) (may be null, at most every ~200 ms): either one
// ends the wait with Status::Timeout and leaves the communicator to be aborted.
struct WaitPolicy {
  double timeout_s = 0;
  const std::atomic<bool>* stop = nullptr;
  bool (*abandon)(void* ctx) = nullptr;
  void* ctx = nullptr;
};

class NcclPipe {
 public:
  // Blocks in ncclCommInitRank until every rank of the communicator has called it.
  static Result<std::unique_ptr<NcclPipe>> Open(const Runtime& rt, const PipeOptions& options);
  ~NcclPipe();
  NcclPipe(const NcclPipe&) = delete;
  NcclPipe& operator=(const NcclPipe&) = delete;

  // Root only: broadcasts len bytes of src, bucket_bytes at a time, and returns once every
  // broadcast has completed on this rank.
  Status Send(const uint8_t* src, uint64_t len, const WaitPolicy& wait);
  // Non-root: receives len bytes into dst (null: receive and drop them; the broadcast is
  // collective, so a receiver with no room still takes part).
  Status Recv(uint8_t* dst, uint64_t len, const WaitPolicy& wait);
  // Every rank contributes `mine`; the root gets the largest (a one-word ncclReduce). A receiver
  // calls it once an object is in its inbox, so the root's answer means "every receiver holds it"
  // (the root's broadcast alone can complete while small data still sits in NCCL's buffers).
  Result<int32_t> Confirm(int32_t mine, const WaitPolicy& wait);
  // After a failed or abandoned wait: the destructor aborts the communicator instead of
  // destroying it (ncclCommDestroy would wait for the stuck collective).
  void MarkBroken() { broken_ = true; }
  bool broken() const { return broken_; }

 private:
  struct Slot {
    void* device = nullptr;
    uint8_t* host = nullptr;  // pinned
    cudaEvent_t copied = nullptr;
    cudaEvent_t sent = nullptr;  // the broadcast into/out of `device` completed
    bool busy = false;
    uint8_t* dst = nullptr;  // Recv: where the host copy goes once `copied` completed
    uint64_t len = 0;
  };

  NcclPipe(const Runtime& rt, const PipeOptions& options) : rt_(rt), options_(options) {}
  Status Allocate();
  Status Wait(cudaEvent_t event, const WaitPolicy& wait, const char* what);
  Status SendChunk(Slot& slot, const uint8_t* src, uint64_t n, const WaitPolicy& wait);
  Status PostRecv(Slot& slot, uint8_t* dst, uint64_t n, const WaitPolicy& wait);
  Status Drain(Slot& slot, const WaitPolicy& wait);

  const Runtime& rt_;
  PipeOptions options_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;
  cudaStream_t comm_stream_ = nullptr;
  Slot slots_[2];
  int32_t* word_host_ = nullptr;  // pinned: Confirm's word
  void* word_device_ = nullptr;
  cudaEvent_t word_event_ = nullptr;
  bool broken_ = false;
};

}  // namespace refit::nccl
