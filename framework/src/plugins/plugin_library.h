// A loaded plugin library: the dlopen handle of a .so, or the builtin pseudo-library (no handle).
// Internal to the loader; never installed.
#pragma once

#include <memory>
#include <string>

#include "refit/status.h"

namespace refit {

class PluginLibrary {
 public:
  // The code linked into librefit itself: nothing to unload.
  static std::shared_ptr<PluginLibrary> Builtin();
  // dlopen(path, RTLD_NOW | RTLD_LOCAL). RTLD_NOW so a missing dependency fails here, with the
  // path in the message, instead of at the first call; RTLD_LOCAL so two plugins never resolve
  // each other's symbols. Errors are one line naming the path.
  static Result<std::shared_ptr<PluginLibrary>> Open(const std::string& path);

  ~PluginLibrary();
  PluginLibrary(const PluginLibrary&) = delete;
  PluginLibrary& operator=(const PluginLibrary&) = delete;

  bool builtin() const { return handle_ == nullptr; }
  void* handle() const { return handle_; }
  // "builtin" or the path it was opened from.
  const std::string& origin() const { return origin_; }
  // Null when the library does not define the symbol.
  void* FindSymbol(const char* name) const;

 private:
  PluginLibrary(void* handle, std::string origin) : handle_(handle), origin_(std::move(origin)) {}
  void* handle_;
  std::string origin_;
};

}  // namespace refit
