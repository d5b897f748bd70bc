#include "nccl_pipe.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

namespace refit::nccl {
namespace {

using Clock = std::chrono::steady_clock;

// Busy polling costs a core; sleeping costs latency. A bucket takes milliseconds to move, so a
// few yields and then short sleeps lose little of either.
constexpr int kYieldPolls = 64;
constexpr auto kPollSleep = std::chrono::microseconds(20);
constexpr auto kAbandonEvery = std::chrono::milliseconds(200);

}  // namespace

Result<std::unique_ptr<NcclPipe>> NcclPipe::Open(const Runtime& rt, const PipeOptions& options) {
  if (options.nranks < 1 || options.rank < 0 || options.rank >= options.nranks ||
      options.bucket_bytes == 0) {
    return Status::Invalid("nccl transport: bad communicator shape (rank " +
                           std::to_string(options.rank) + " of " + std::to_string(options.nranks) +
                           ")");
  }
  std::unique_ptr<NcclPipe> pipe(new NcclPipe(rt, options));
  REFIT_RETURN_NOT_OK(CudaCheck(rt.cuda.SetDevice(options.device),
                                ("cudaSetDevice(" + std::to_string(options.device) + ")").c_str()));
  // Local resources first: a rank that cannot allocate fails before the others wait on it.
  REFIT_RETURN_NOT_OK(pipe->Allocate());
  REFIT_RETURN_NOT_OK(
      NcclCheck(rt.nccl.CommInitRank(&pipe->comm_, options.nranks, options.id, options.rank),
                "ncclCommInitRank"));
  return pipe;
}

Status NcclPipe::Allocate() {
  const CudaApi& c = rt_.cuda;
  REFIT_RETURN_NOT_OK(CudaCheck(c.StreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking),
                                "cudaStreamCreateWithFlags"));
  REFIT_RETURN_NOT_OK(CudaCheck(c.StreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking),
                                "cudaStreamCreateWithFlags"));
  for (Slot& s : slots_) {
    REFIT_RETURN_NOT_OK(CudaCheck(c.Malloc(&s.device, options_.bucket_bytes), "cudaMalloc"));
    void* host = nullptr;
    REFIT_RETURN_NOT_OK(CudaCheck(c.MallocHost(&host, options_.bucket_bytes), "cudaMallocHost"));
    s.host = static_cast<uint8_t*>(host);
    REFIT_RETURN_NOT_OK(CudaCheck(c.EventCreateWithFlags(&s.copied, cudaEventDisableTiming),
                                  "cudaEventCreateWithFlags"));
    REFIT_RETURN_NOT_OK(CudaCheck(c.EventCreateWithFlags(&s.sent, cudaEventDisableTiming),
                                  "cudaEventCreateWithFlags"));
  }
  void* word = nullptr;
  REFIT_RETURN_NOT_OK(CudaCheck(c.MallocHost(&word, sizeof(int32_t)), "cudaMallocHost"));
  word_host_ = static_cast<int32_t*>(word);
  REFIT_RETURN_NOT_OK(CudaCheck(c.Malloc(&word_device_, sizeof(int32_t)), "cudaMalloc"));
  return CudaCheck(c.EventCreateWithFlags(&word_event_, cudaEventDisableTiming),
                   "cudaEventCreateWithFlags");
}

NcclPipe::~NcclPipe() {
  const CudaApi& c = rt_.cuda;
  (void)c.SetDevice(options_.device);
  if (comm_ != nullptr) {
    if (broken_) {
      (void)rt_.nccl.CommAbort(comm_);  // a collective may be stuck: do not wait for it
    } else {
      (void)c.StreamSynchronize(comm_stream_);
      (void)rt_.nccl.CommDestroy(comm_);
    }
  }
  if (!broken_ && copy_stream_ != nullptr) (void)c.StreamSynchronize(copy_stream_);
  for (Slot& s : slots_) {
    if (s.copied != nullptr) (void)c.EventDestroy(s.copied);
    if (s.sent != nullptr) (void)c.EventDestroy(s.sent);
    if (s.device != nullptr) (void)c.Free(s.device);
    if (s.host != nullptr) (void)c.FreeHost(s.host);
  }
  if (word_event_ != nullptr) (void)c.EventDestroy(word_event_);
  if (word_device_ != nullptr) (void)c.Free(word_device_);
  if (word_host_ != nullptr) (void)c.FreeHost(word_host_);
  if (copy_stream_ != nullptr) (void)c.StreamDestroy(copy_stream_);
  if (comm_stream_ != nullptr) (void)c.StreamDestroy(comm_stream_);
}

// Polls instead of cudaEventSynchronize: a peer that died leaves the event pending forever, and
// only polling can notice NCCL's asynchronous error, the deadline or the owner giving up.
Status NcclPipe::Wait(cudaEvent_t event, const WaitPolicy& wait, const char* what) {
  const Clock::time_point start = Clock::now();
  Clock::time_point last_abandon_check = start;
  for (int polls = 0;; ++polls) {
    cudaError_t rc = rt_.cuda.EventQuery(event);
    if (rc == cudaSuccess) return Status::OK();
    if (rc != cudaErrorNotReady) return CudaCheck(rc, what);
    ncclResult_t async = ncclSuccess;
    REFIT_RETURN_NOT_OK(NcclCheck(rt_.nccl.CommGetAsyncError(comm_, &async), what));
    if (async != ncclSuccess && async != ncclInProgress) return NcclCheck(async, what);
    if (wait.stop != nullptr && wait.stop->load()) {
      return Status::Timeout(std::string("nccl transport: ") + what + ": stopped");
    }
    const Clock::time_point now = Clock::now();
    if (wait.timeout_s > 0 && std::chrono::duration<double>(now - start).count() > wait.timeout_s) {
      return Status::Timeout(std::string("nccl transport: ") + what + ": no progress in " +
                             std::to_string(static_cast<int64_t>(wait.timeout_s)) +
                             " s (op_timeout_s); is every rank alive?");
    }
    if (wait.abandon != nullptr && now - last_abandon_check > kAbandonEvery) {
      last_abandon_check = now;
      if (wait.abandon(wait.ctx)) {
        return Status::Timeout(std::string("nccl transport: ") + what + ": abandoned");
      }
    }
    if (polls < kYieldPolls) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kPollSleep);
    }
  }
}

Status NcclPipe::Drain(Slot& slot, const WaitPolicy& wait) {
  if (!slot.busy) return Status::OK();
  // The root's slot is free once its broadcast is done (which waited for its upload); a
  // receiver's once the download that followed the broadcast is done.
  const bool root = options_.rank == 0;
  REFIT_RETURN_NOT_OK(
      Wait(root ? slot.sent : slot.copied, wait, root ? "ncclBroadcast (send)" : "ncclBroadcast"));
  if (slot.dst != nullptr) std::memcpy(slot.dst, slot.host, slot.len);
  slot.busy = false;
  return Status::OK();
}

Status NcclPipe::SendChunk(Slot& slot, const uint8_t* src, uint64_t n, const WaitPolicy& wait) {
  const CudaApi& c = rt_.cuda;
  REFIT_RETURN_NOT_OK(Drain(slot, wait));
  // Pinned staging: an upload from pageable memory would not be asynchronous.
  std::memcpy(slot.host, src, n);
  REFIT_RETURN_NOT_OK(
      CudaCheck(c.MemcpyAsync(slot.device, slot.host, n, cudaMemcpyHostToDevice, copy_stream_),
                "cudaMemcpyAsync (upload)"));
  REFIT_RETURN_NOT_OK(CudaCheck(c.EventRecord(slot.copied, copy_stream_), "cudaEventRecord"));
  REFIT_RETURN_NOT_OK(
      CudaCheck(c.StreamWaitEvent(comm_stream_, slot.copied, 0), "cudaStreamWaitEvent"));
  REFIT_RETURN_NOT_OK(
      NcclCheck(rt_.nccl.Broadcast(slot.device, slot.device, n, ncclUint8, 0, comm_, comm_stream_),
                "ncclBroadcast"));
  REFIT_RETURN_NOT_OK(CudaCheck(c.EventRecord(slot.sent, comm_stream_), "cudaEventRecord"));
  slot.busy = true;
  slot.dst = nullptr;
  slot.len = n;
  return Status::OK();
}

Status NcclPipe::PostRecv(Slot& slot, uint8_t* dst, uint64_t n, const WaitPolicy& wait) {
  const CudaApi& c = rt_.cuda;
  REFIT_RETURN_NOT_OK(Drain(slot, wait));
  // sendbuff is ignored on a non-root rank; NCCL reads only recvbuff there.
  REFIT_RETURN_NOT_OK(
      NcclCheck(rt_.nccl.Broadcast(slot.device, slot.device, n, ncclUint8, 0, comm_, comm_stream_),
                "ncclBroadcast"));
  REFIT_RETURN_NOT_OK(CudaCheck(c.EventRecord(slot.sent, comm_stream_), "cudaEventRecord"));
  REFIT_RETURN_NOT_OK(
      CudaCheck(c.StreamWaitEvent(copy_stream_, slot.sent, 0), "cudaStreamWaitEvent"));
  REFIT_RETURN_NOT_OK(
      CudaCheck(c.MemcpyAsync(slot.host, slot.device, n, cudaMemcpyDeviceToHost, copy_stream_),
                "cudaMemcpyAsync (download)"));
  REFIT_RETURN_NOT_OK(CudaCheck(c.EventRecord(slot.copied, copy_stream_), "cudaEventRecord"));
  slot.busy = true;
  slot.dst = dst;
  slot.len = n;
  return Status::OK();
}

Status NcclPipe::Send(const uint8_t* src, uint64_t len, const WaitPolicy& wait) {
  if (options_.rank != 0) return Status::Internal("nccl transport: only rank 0 sends");
  Status st = CudaCheck(rt_.cuda.SetDevice(options_.device), "cudaSetDevice");
  uint64_t k = 0;
  for (uint64_t off = 0; st.ok() && off < len; ++k) {
    const uint64_t n = std::min(options_.bucket_bytes, len - off);
    st = SendChunk(slots_[k % 2], src + off, n, wait);
    off += n;
  }
  for (Slot& s : slots_) {
    if (st.ok()) st = Drain(s, wait);
  }
  if (!st.ok()) broken_ = true;
  return st;
}

Status NcclPipe::Recv(uint8_t* dst, uint64_t len, const WaitPolicy& wait) {
  if (options_.rank == 0) return Status::Internal("nccl transport: rank 0 does not receive");
  Status st = CudaCheck(rt_.cuda.SetDevice(options_.device), "cudaSetDevice");
  uint64_t k = 0;
  for (uint64_t off = 0; st.ok() && off < len; ++k) {
    const uint64_t n = std::min(options_.bucket_bytes, len - off);
    st = PostRecv(slots_[k % 2], dst == nullptr ? nullptr : dst + off, n, wait);
    off += n;
  }
  // The older bucket first; the order only matters for the memcpy's cache behaviour.
  for (uint64_t i = 0; i < 2 && st.ok(); ++i) st = Drain(slots_[(k + i) % 2], wait);
  if (!st.ok()) broken_ = true;
  return st;
}

// All on the communicator's stream, after every broadcast this rank posted: upload the word,
// reduce it to the root, download the result.
Result<int32_t> NcclPipe::Confirm(int32_t mine, const WaitPolicy& wait) {
  const CudaApi& c = rt_.cuda;
  Status st = CudaCheck(c.SetDevice(options_.device), "cudaSetDevice");
  *word_host_ = mine;
  if (st.ok()) {
    st = CudaCheck(c.MemcpyAsync(word_device_, word_host_, sizeof(int32_t), cudaMemcpyHostToDevice,
                                 comm_stream_),
                   "cudaMemcpyAsync (confirm)");
  }
  if (st.ok()) {
    st = NcclCheck(
        rt_.nccl.Reduce(word_device_, word_device_, 1, ncclInt32, ncclMax, 0, comm_, comm_stream_),
        "ncclReduce");
  }
  if (st.ok()) {
    st = CudaCheck(c.MemcpyAsync(word_host_, word_device_, sizeof(int32_t), cudaMemcpyDeviceToHost,
                                 comm_stream_),
                   "cudaMemcpyAsync (confirm)");
  }
  if (st.ok()) st = CudaCheck(c.EventRecord(word_event_, comm_stream_), "cudaEventRecord");
  if (st.ok()) st = Wait(word_event_, wait, "ncclReduce (confirm)");
  if (!st.ok()) {
    broken_ = true;
    return st;
  }
  return *word_host_;
}

}  // namespace refit::nccl
