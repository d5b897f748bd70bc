// A CPU stand-in for libcudart and libnccl, linked into refit_nccl_fake_tests in place of
// nccl_runtime.cc, so the transport's own logic (sessions, headers, bucket sequencing, the inbox,
// confirmations, session following) runs in CI. "Device" memory is host memory; each stream is a
// queue of actions run in order when an event on it is queried; a broadcast or reduce is matched
// across ranks by its sequence number in the communicator. Ranks live in one process (threads).
// It checks the call sequence NCCL requires: every rank posts the same collectives, same sizes.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "nccl_runtime.h"

struct CUevent_st;

// One rank's stream: actions run in order; an action returns false while it must wait.
struct CUstream_st {
  std::deque<std::function<bool()>> pending;
  uint64_t enqueued = 0;
  uint64_t done = 0;
  bool Progress() {
    while (!pending.empty() && pending.front()()) {
      pending.pop_front();
      ++done;
    }
    return pending.empty();
  }
};

struct CUevent_st {
  CUstream_st* stream = nullptr;
  uint64_t position = 0;  // complete once stream->done reaches it
  bool Complete() const {
    if (stream == nullptr) return true;
    stream->Progress();
    return stream->done >= position;
  }
};

namespace {

// A collective in flight: what the root broadcast, or the reduce contributions so far.
struct Op {
  size_t bytes = 0;
  bool posted_by_root = false;
  std::vector<uint8_t> data;
  int contributions = 0;
  int32_t max = 0;
  int consumed = 0;
};

struct Clique {
  int nranks = 0;
  int joined = 0;
  std::map<uint64_t, Op> ops;
};

std::mutex g_mutex;
std::condition_variable g_joined;
std::map<std::string, Clique> g_cliques;

}  // namespace

struct ncclComm {
  std::string key;
  int rank = 0;
  int nranks = 0;
  uint64_t next_op = 0;
};

namespace refit::nccl {
namespace {

cudaError_t GetDeviceCount(int* n) {
  *n = 2;
  return cudaSuccess;
}
cudaError_t SetDevice(int) { return cudaSuccess; }
const char* CudaError(cudaError_t) { return "fake cuda error"; }
cudaError_t Malloc(void** p, size_t n) {
  *p = std::malloc(n == 0 ? 1 : n);
  return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t Free(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t MemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t s) {
  ++s->enqueued;
  s->pending.push_back([=] {
    std::memcpy(dst, src, n);
    return true;
  });
  return cudaSuccess;
}
cudaError_t StreamCreate(cudaStream_t* s, unsigned) {
  *s = new CUstream_st;
  return cudaSuccess;
}
cudaError_t StreamDestroy(cudaStream_t s) {
  delete s;
  return cudaSuccess;
}
cudaError_t StreamSynchronize(cudaStream_t s) {
  for (int i = 0; i < 100000 && !s->Progress(); ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return cudaSuccess;
}
cudaError_t StreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  CUevent_st snapshot = *e;  // the event as recorded now (a later record must not move it)
  ++s->enqueued;
  s->pending.push_back([snapshot] { return snapshot.Complete(); });
  return cudaSuccess;
}
cudaError_t EventCreate(cudaEvent_t* e, unsigned) {
  *e = new CUevent_st;
  return cudaSuccess;
}
cudaError_t EventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t EventRecord(cudaEvent_t e, cudaStream_t s) {
  e->stream = s;
  e->position = s->enqueued;
  return cudaSuccess;
}
cudaError_t EventQuery(cudaEvent_t e) { return e->Complete() ? cudaSuccess : cudaErrorNotReady; }

ncclResult_t GetVersion(int* v) {
  *v = NCCL_VERSION_CODE;
  return ncclSuccess;
}
ncclResult_t GetUniqueId(ncclUniqueId* id) {
  std::random_device rd;
  for (char& c : id->internal) c = static_cast<char>(rd());
  return ncclSuccess;
}
ncclResult_t CommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  std::unique_lock<std::mutex> lock(g_mutex);
  const std::string key(id.internal, sizeof(id.internal));
  Clique& c = g_cliques[key];
  c.nranks = nranks;
  ++c.joined;
  g_joined.notify_all();
  // Like NCCL: returns once every rank joined (bounded here so a broken test cannot hang).
  if (!g_joined.wait_for(lock, std::chrono::seconds(60), [&] { return c.joined >= nranks; })) {
    return ncclInvalidUsage;
  }
  *comm = new ncclComm{key, rank, nranks, 0};
  return ncclSuccess;
}
ncclResult_t CommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}
ncclResult_t CommGetAsyncError(ncclComm_t, ncclResult_t* e) {
  *e = ncclSuccess;
  return ncclSuccess;
}

// Root: copies its bytes into the op when the stream reaches it. Others: wait for that op, then
// copy out. Sizes must agree: a mismatch is the bug this fake exists to catch.
ncclResult_t Broadcast(const void* send, void* recv, size_t n, ncclDataType_t type, int root,
                       ncclComm_t comm, cudaStream_t s) {
  if (type != ncclUint8 || root != 0) return ncclInvalidArgument;
  const uint64_t k = comm->next_op++;
  const std::string key = comm->key;
  const bool is_root = comm->rank == root;
  const int others = comm->nranks - 1;
  ++s->enqueued;
  s->pending.push_back([=] {
    std::lock_guard<std::mutex> lock(g_mutex);
    Op& op = g_cliques[key].ops[k];
    if (is_root) {
      if (op.posted_by_root) return true;
      op.posted_by_root = true;
      op.bytes = n;
      op.data.assign(static_cast<const uint8_t*>(send), static_cast<const uint8_t*>(send) + n);
    } else {
      if (!op.posted_by_root) return false;
      if (op.bytes != n) std::abort();  // ranks disagree on a collective's size
      std::memcpy(recv, op.data.data(), n);
      ++op.consumed;
    }
    if (op.consumed >= others) g_cliques[key].ops.erase(k);
    return true;
  });
  return ncclSuccess;
}

ncclResult_t Reduce(const void* send, void* recv, size_t n, ncclDataType_t type, ncclRedOp_t red,
                    int root, ncclComm_t comm, cudaStream_t s) {
  if (type != ncclInt32 || red != ncclMax || root != 0 || n != 1) return ncclInvalidArgument;
  const uint64_t k = comm->next_op++;
  const std::string key = comm->key;
  const bool is_root = comm->rank == root;
  const int nranks = comm->nranks;
  ++s->enqueued;
  bool contributed = false;
  s->pending.push_back([=]() mutable {
    std::lock_guard<std::mutex> lock(g_mutex);
    Op& op = g_cliques[key].ops[k];
    if (!contributed) {
      int32_t mine = 0;
      std::memcpy(&mine, send, sizeof(mine));
      op.max = op.contributions == 0 ? mine : std::max(op.max, mine);
      ++op.contributions;
      contributed = true;
    }
    if (!is_root) return true;
    if (op.contributions < nranks) return false;
    std::memcpy(recv, &op.max, sizeof(op.max));
    g_cliques[key].ops.erase(k);
    return true;
  });
  return ncclSuccess;
}

const char* NcclError(ncclResult_t) { return "fake nccl error"; }

}  // namespace

const Runtime& LoadRuntime() {
  static const Runtime runtime = [] {
    Runtime r;
    r.cuda.GetDeviceCount = &GetDeviceCount;
    r.cuda.SetDevice = &SetDevice;
    r.cuda.GetErrorString = &CudaError;
    r.cuda.Malloc = &Malloc;
    r.cuda.Free = &Free;
    r.cuda.MallocHost = &Malloc;
    r.cuda.FreeHost = &Free;
    r.cuda.MemcpyAsync = &MemcpyAsync;
    r.cuda.StreamCreateWithFlags = &StreamCreate;
    r.cuda.StreamDestroy = &StreamDestroy;
    r.cuda.StreamSynchronize = &StreamSynchronize;
    r.cuda.StreamWaitEvent = &StreamWaitEvent;
    r.cuda.EventCreateWithFlags = &EventCreate;
    r.cuda.EventDestroy = &EventDestroy;
    r.cuda.EventRecord = &EventRecord;
    r.cuda.EventQuery = &EventQuery;
    r.nccl.GetVersion = &GetVersion;
    r.nccl.GetUniqueId = &GetUniqueId;
    r.nccl.CommInitRank = &CommInitRank;
    r.nccl.CommDestroy = &CommDestroy;
    r.nccl.CommAbort = &CommDestroy;
    r.nccl.CommGetAsyncError = &CommGetAsyncError;
    r.nccl.Broadcast = &Broadcast;
    r.nccl.Reduce = &Reduce;
    r.nccl.GetErrorString = &NcclError;
    return r;
  }();
  return runtime;
}

Result<const Runtime*> RequireDevice() { return &LoadRuntime(); }

Status CudaCheck(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return Status::OK();
  return Status::IoError(std::string("nccl transport: ") + what + ": fake cuda error");
}

Status NcclCheck(ncclResult_t rc, const char* what) {
  if (rc == ncclSuccess) return Status::OK();
  return Status::IoError(std::string("nccl transport: ") + what + ": fake nccl error");
}

}  // namespace refit::nccl
