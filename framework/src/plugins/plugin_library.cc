// Opening plugin libraries: Boost.DLL (header-only on std::filesystem) stays in this file.
#include "plugins/plugin_library.h"

#include <dlfcn.h>

// Boost.DLL on std::filesystem: the loader then needs no Boost library, only headers.
#define BOOST_DLL_USE_STD_FS
#include <boost/dll/shared_library.hpp>
#include <type_traits>

namespace refit {

struct PluginLibrary::Native {
  boost::dll::shared_library library;
};

PluginLibrary::PluginLibrary(std::unique_ptr<Native> native, std::string origin)
    : native_(std::move(native)), origin_(std::move(origin)) {}

std::shared_ptr<PluginLibrary> PluginLibrary::Builtin() {
  return std::shared_ptr<PluginLibrary>(new PluginLibrary(nullptr, "builtin"));
}

Result<std::shared_ptr<PluginLibrary>> PluginLibrary::Open(const std::string& path) {
  dlerror();  // clear any stale error so the one reported below is ours
  auto native = std::make_unique<Native>();
  boost::dll::fs::error_code ec;
  native->library.load(path, ec,
                       boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  if (ec || !native->library.is_loaded()) {
    // Boost.DLL reports a generic error code; the loader's own reason is still in dlerror().
    const char* why = dlerror();
    return Status::IoError("plugin " + path +
                           ": dlopen failed: " + (why != nullptr ? why : ec.message()));
  }
  return std::shared_ptr<PluginLibrary>(new PluginLibrary(std::move(native), path));
}

PluginLibrary::~PluginLibrary() {
  // Last registered first, like destructors; the library is unloaded only after them.
  for (auto it = finis_.rbegin(); it != finis_.rend(); ++it) (*it)();
}

void* PluginLibrary::handle() const {
  return native_ != nullptr ? native_->library.native() : nullptr;
}

refit_plugin_entry_fn PluginLibrary::FindEntry() const {
  if (native_ == nullptr || !native_->library.has(REFIT_ENTRY_SYMBOL)) return nullptr;
  return &native_->library.get<std::remove_pointer_t<refit_plugin_entry_fn>>(REFIT_ENTRY_SYMBOL);
}

}  // namespace refit
