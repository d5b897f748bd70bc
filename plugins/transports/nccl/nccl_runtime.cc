#include "nccl_runtime.h"

#include <dlfcn.h>

#include <string>

namespace refit::nccl {
namespace {

// Resolves one symbol into *fn; the first failure is the one reported.
template <typename Fn>
void Bind(void* lib, const char* lib_name, const char* name, Fn* fn, std::string* error) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*fn == nullptr && error->empty()) *error = std::string(lib_name) + " has no " + name;
}

// The soname first (the loader's search path), then the toolkit this plugin was built against:
// /usr/local/cuda/lib64 is not always in the search path.
void* Open(const char* soname, std::string* error) {
  void* lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (lib != nullptr) return lib;
  const char* why = dlerror();
  std::string first = why != nullptr ? why : "?";
  lib = dlopen((std::string(REFIT_CUDA_LIBRARY_DIR) + "/" + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr && error->empty())
    *error = "cannot load " + std::string(soname) + ": " + first;
  return lib;
}

void BindCuda(void* lib, CudaApi* a, std::string* e) {
  const char* n = "libcudart.so." REFIT_CUDART_SOVERSION;
  Bind(lib, n, "cudaGetDeviceCount", &a->GetDeviceCount, e);
  Bind(lib, n, "cudaSetDevice", &a->SetDevice, e);
  Bind(lib, n, "cudaGetErrorString", &a->GetErrorString, e);
  Bind(lib, n, "cudaMalloc", &a->Malloc, e);
  Bind(lib, n, "cudaFree", &a->Free, e);
  Bind(lib, n, "cudaMallocHost", &a->MallocHost, e);
  Bind(lib, n, "cudaFreeHost", &a->FreeHost, e);
  Bind(lib, n, "cudaMemcpyAsync", &a->MemcpyAsync, e);
  Bind(lib, n, "cudaStreamCreateWithFlags", &a->StreamCreateWithFlags, e);
  Bind(lib, n, "cudaStreamDestroy", &a->StreamDestroy, e);
  Bind(lib, n, "cudaStreamSynchronize", &a->StreamSynchronize, e);
  Bind(lib, n, "cudaStreamWaitEvent", &a->StreamWaitEvent, e);
  Bind(lib, n, "cudaEventCreateWithFlags", &a->EventCreateWithFlags, e);
  Bind(lib, n, "cudaEventDestroy", &a->EventDestroy, e);
  Bind(lib, n, "cudaEventRecord", &a->EventRecord, e);
  Bind(lib, n, "cudaEventQuery", &a->EventQuery, e);
}

void BindNccl(void* lib, NcclApi* a, std::string* e) {
  const char* n = "libnccl.so.2";
  Bind(lib, n, "ncclGetVersion", &a->GetVersion, e);
  Bind(lib, n, "ncclGetUniqueId", &a->GetUniqueId, e);
  Bind(lib, n, "ncclCommInitRank", &a->CommInitRank, e);
  Bind(lib, n, "ncclCommDestroy", &a->CommDestroy, e);
  Bind(lib, n, "ncclCommAbort", &a->CommAbort, e);
  Bind(lib, n, "ncclCommGetAsyncError", &a->CommGetAsyncError, e);
  Bind(lib, n, "ncclBroadcast", &a->Broadcast, e);
  Bind(lib, n, "ncclReduce", &a->Reduce, e);
  Bind(lib, n, "ncclGetErrorString", &a->GetErrorString, e);
}

}  // namespace

// Never dlclosed: NCCL keeps threads of its own, and a process that used it once may use it again.
const Runtime& LoadRuntime() {
  static const Runtime runtime = [] {
    Runtime r;
    void* cudart = Open("libcudart.so." REFIT_CUDART_SOVERSION, &r.error);
    if (cudart != nullptr) BindCuda(cudart, &r.cuda, &r.error);
    void* nccl = r.error.empty() ? Open("libnccl.so.2", &r.error) : nullptr;
    if (nccl != nullptr) BindNccl(nccl, &r.nccl, &r.error);
    return r;
  }();
  return runtime;
}

Result<const Runtime*> RequireDevice() {
  const Runtime& rt = LoadRuntime();
  if (!rt.error.empty()) return Status::Unsupported("nccl transport: no CUDA device: " + rt.error);
  int count = 0;
  cudaError_t rc = rt.cuda.GetDeviceCount(&count);
  if (rc != cudaSuccess) {
    return Status::Unsupported(std::string("nccl transport: no CUDA device: cudaGetDeviceCount: ") +
                               rt.cuda.GetErrorString(rc));
  }
  if (count < 1) {
    return Status::Unsupported("nccl transport: no CUDA device: cudaGetDeviceCount found 0");
  }
  return &rt;
}

Status CudaCheck(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return Status::OK();
  return Status::IoError(std::string("nccl transport: ") + what + ": " +
                         LoadRuntime().cuda.GetErrorString(rc));
}

Status NcclCheck(ncclResult_t rc, const char* what) {
  if (rc == ncclSuccess) return Status::OK();
  return Status::IoError(std::string("nccl transport: ") + what + ": " +
                         LoadRuntime().nccl.GetErrorString(rc));
}

}  // namespace refit::nccl
