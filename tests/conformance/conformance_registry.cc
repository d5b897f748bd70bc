// The in-tree conformance binary tests every plugin this build has: the builtins, the .so files in
// the build's plugin dir, and out-of-tree ones named by REFIT_PLUGIN_PATH (dir[:dir...]).
#include <memory>

#include "refit/conformance/common.h"
#include "refit/registry.h"

#ifndef REFIT_BUILD_PLUGIN_DIR
#error "REFIT_BUILD_PLUGIN_DIR must name the build's plugin output directory"
#endif

namespace refit::conformance {

Result<std::shared_ptr<Registry>> LoadConformanceRegistry() {
  REFIT_ASSIGN_OR_RAISE(std::shared_ptr<Registry> registry, Registry::WithBuiltins());
  REFIT_RETURN_NOT_OK(registry->LoadDirectory(REFIT_BUILD_PLUGIN_DIR));
  // Loading a library twice is a no-op, so the build dir appearing here too is fine.
  REFIT_RETURN_NOT_OK(LoadPluginsFromEnv(*registry));
  return registry;
}

}  // namespace refit::conformance
