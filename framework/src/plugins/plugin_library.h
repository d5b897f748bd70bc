// A loaded plugin library: a shared library opened through Boost.DLL, or the builtin
// pseudo-library (nothing to open). Internal to the loader; never installed. Boost stays inside
// plugin_library.cc: this header only names an opaque holder.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "refit/plugin_abi.h"
#include "refit/status.h"

namespace refit {

class PluginLibrary {
 public:
  // The code linked into librefit itself: nothing to unload.
  static std::shared_ptr<PluginLibrary> Builtin();
  // Opens path with RTLD_NOW | RTLD_LOCAL. RTLD_NOW so a missing dependency fails here, with the
  // path in the message, instead of at the first call; RTLD_LOCAL so two plugins never resolve
  // each other's symbols. Errors are one line naming the path.
  static Result<std::shared_ptr<PluginLibrary>> Open(const std::string& path);

  // Runs the plugins' fini functions (last registered first), then unloads the library.
  ~PluginLibrary();
  PluginLibrary(const PluginLibrary&) = delete;
  PluginLibrary& operator=(const PluginLibrary&) = delete;

  bool builtin() const { return native_ == nullptr; }
  // The platform handle (equal for two opens of one file); null for the builtin library.
  void* handle() const;
  // "builtin" or the path it was opened from.
  const std::string& origin() const { return origin_; }
  // The exported REFIT_ENTRY_SYMBOL; null when the library does not define it.
  refit_plugin_entry_fn FindEntry() const;
  // A plugin table's fini, run when this object goes: every instance and ComponentInfo holds a
  // reference, so that is after the last object made from the library is gone. The builtin
  // library holds one per builtin plugin table.
  void AddFini(void (*fini)()) { finis_.push_back(fini); }

 private:
  struct Native;  // the Boost.DLL library, defined by the loader
  PluginLibrary(std::unique_ptr<Native> native, std::string origin);
  std::unique_ptr<Native> native_;
  std::string origin_;
  std::vector<void (*)()> finis_;
};

}  // namespace refit
