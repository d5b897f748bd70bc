// Helpers of the nccl transport's tests and benchmark: how many GPUs this machine has (asked
// through a dlopen'd libcudart, so the binaries start without one), the plugin loaded through the
// real loader, and configs.
#pragma once

#include <dlfcn.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>

#include "refit/config.h"
#include "refit/registry.h"

#ifdef REFIT_NCCL_FAKE
// The plugin's sources linked into this binary over tests/nccl/fake_runtime.cc.
extern "C" const refit_plugin_t* refit_nccl_fake_entry(const refit_host_api_t* host);
#elif !defined(REFIT_NCCL_PLUGIN)
#error "REFIT_NCCL_PLUGIN must name librefit-nccl.so"
#endif

namespace refit::nccl_test {

#ifdef REFIT_NCCL_FAKE
constexpr bool kFake = true;
constexpr const char* kPluginPath = "fake";

inline int GpuCount(std::string* why) {
  *why = "the CPU fake of libcudart and libnccl (tests/nccl/fake_runtime.cc)";
  return 2;
}

inline Result<std::shared_ptr<Registry>> LoadNcclRegistry() {
  auto registry = std::make_shared<Registry>();
  REFIT_RETURN_NOT_OK(registry->RegisterPlugin(refit_nccl_fake_entry(HostApi()), nullptr, "fake"));
  return registry;
}
#else
constexpr bool kFake = false;
constexpr const char* kPluginPath = REFIT_NCCL_PLUGIN;

// Visible CUDA devices, 0 when libcudart or the driver is missing; `why` says which.
inline int GpuCount(std::string* why) {
  void* lib = dlopen("libcudart.so." REFIT_CUDART_SOVERSION, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    *why = "libcudart cannot be loaded";
    return 0;
  }
  using CountFn = int (*)(int*);  // cudaError_t cudaGetDeviceCount(int*)
  auto count_fn = reinterpret_cast<CountFn>(dlsym(lib, "cudaGetDeviceCount"));
  int count = 0;
  if (count_fn == nullptr || count_fn(&count) != 0) {
    *why = "cudaGetDeviceCount failed (no driver or no GPU)";
    return 0;
  }
  *why = std::to_string(count) + " CUDA device(s)";
  return count;
}

// The builtins plus librefit-nccl.so, through the same loader `refit` uses.
inline Result<std::shared_ptr<Registry>> LoadNcclRegistry() {
  REFIT_ASSIGN_OR_RAISE(std::shared_ptr<Registry> registry, Registry::WithBuiltins());
  REFIT_RETURN_NOT_OK(registry->LoadLibrary(REFIT_NCCL_PLUGIN));
  return registry;
}
#endif

// A [transport.nccl] section over control directory `dir`; `extra` is appended verbatim.
inline Result<Config> NcclConfig(const std::string& dir, const std::string& extra) {
  return Config::FromString("[transport.nccl]\ncontrol_dir = \"" + dir +
                            "\"\nfsync = false\nconnect_timeout_s = 60\nop_timeout_s = 60\n" +
                            extra);
}

// An empty directory removed with the object.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "refit-nccl-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace refit::nccl_test
