// The CUDA runtime and NCCL, loaded with dlopen when the first nccl transport is created.
//
// The plugin is compiled against the headers only and links neither library: `refit plugins`
// loads every plugin it finds, and must start on a machine without a GPU driver (libcudart loads
// there, but a binary linked to it would pull it into every refit process). The function
// pointers carry the headers' own signatures (decltype), so a call through them is checked by
// the compiler exactly like a direct call.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "refit/status.h"

namespace refit::nccl {

struct CudaApi {
  decltype(&::cudaGetDeviceCount) GetDeviceCount = nullptr;
  decltype(&::cudaSetDevice) SetDevice = nullptr;
  decltype(&::cudaGetErrorString) GetErrorString = nullptr;
  // cuda_runtime.h (which nccl.h includes) overloads these two with templates: the C ones.
  cudaError_t (*Malloc)(void**, size_t) = nullptr;
  decltype(&::cudaFree) Free = nullptr;
  cudaError_t (*MallocHost)(void**, size_t) = nullptr;
  decltype(&::cudaFreeHost) FreeHost = nullptr;
  decltype(&::cudaMemcpyAsync) MemcpyAsync = nullptr;
  decltype(&::cudaStreamCreateWithFlags) StreamCreateWithFlags = nullptr;
  decltype(&::cudaStreamDestroy) StreamDestroy = nullptr;
  decltype(&::cudaStreamSynchronize) StreamSynchronize = nullptr;
  decltype(&::cudaStreamWaitEvent) StreamWaitEvent = nullptr;
  decltype(&::cudaEventCreateWithFlags) EventCreateWithFlags = nullptr;
  decltype(&::cudaEventDestroy) EventDestroy = nullptr;
  decltype(&::cudaEventRecord) EventRecord = nullptr;
  decltype(&::cudaEventQuery) EventQuery = nullptr;
};

struct NcclApi {
  decltype(&::ncclGetVersion) GetVersion = nullptr;
  decltype(&::ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&::ncclCommInitRank) CommInitRank = nullptr;
  decltype(&::ncclCommDestroy) CommDestroy = nullptr;
  decltype(&::ncclCommAbort) CommAbort = nullptr;
  decltype(&::ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&::ncclBroadcast) Broadcast = nullptr;
  decltype(&::ncclReduce) Reduce = nullptr;
  decltype(&::ncclGetErrorString) GetErrorString = nullptr;
};

// Both libraries, loaded once per process (thread-safe); `error` says why they are not usable
// (a library or symbol missing), empty when they are.
struct Runtime {
  CudaApi cuda;
  NcclApi nccl;
  std::string error;
};
const Runtime& LoadRuntime();

// The runtime, with at least one CUDA device visible. Otherwise Unsupported:
// "nccl transport: no CUDA device: <reason>" (the one line a GPU-less machine gets).
Result<const Runtime*> RequireDevice();

// "<what>: <cudaGetErrorString>" as an IoError; OK for cudaSuccess.
Status CudaCheck(cudaError_t rc, const char* what);
// "<what>: <ncclGetErrorString>" as an IoError; OK for ncclSuccess.
Status NcclCheck(ncclResult_t rc, const char* what);

}  // namespace refit::nccl
