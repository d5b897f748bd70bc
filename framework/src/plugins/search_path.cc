// Where plugins are found: the directory shipped next to the core, REFIT_PLUGIN_PATH and the
// config's [plugins] section.
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <type_traits>

#include "refit/registry.h"

namespace refit {

namespace fs = std::filesystem;

namespace {

// Relative config paths are relative to the config file, not to the working directory.
fs::path ConfigBaseDir(const Config& config) {
  std::error_code ec;
  fs::path label(config.label());
  if (!config.label().empty() && fs::is_regular_file(label, ec)) {
    return fs::absolute(label, ec).parent_path();
  }
  return fs::current_path(ec);
}

fs::path Resolve(const fs::path& base, const std::string& entry) {
  fs::path p(entry);
  return p.is_absolute() ? p : (base / p).lexically_normal();
}

}  // namespace

std::vector<ConfigKeySpec> PluginConfigSpecs() {
  return {
      {"plugins.paths", REFIT_CFG_STRING_LIST, "[]",
       "directories whose *.so plugins are all loaded (relative to this file)"},
      {"plugins.load", REFIT_CFG_STRING_LIST, "[]",
       "plugin .so files to load (relative to this file)"},
  };
}

Status LoadPluginsFromConfig(Registry& registry, const Config& config) {
  REFIT_RETURN_NOT_OK(config.Validate(PluginConfigSpecs(), "plugins"));
  const fs::path base = ConfigBaseDir(config);
  REFIT_ASSIGN_OR_RAISE(std::vector<std::string> dirs, config.GetStringList("plugins.paths", {}));
  for (const std::string& dir : dirs) {
    const std::string where = config.Where("plugins.paths");
    std::error_code ec;
    fs::path resolved = Resolve(base, dir);
    // A directory named in a config is meant to exist: a typo must not pass silently.
    if (!fs::is_directory(resolved, ec)) {
      return Status::NotFound(where + ": plugins.paths: " + resolved.string() +
                              " is not a directory");
    }
    REFIT_RETURN_NOT_OK(registry.LoadDirectory(resolved.string()).WithContext(where));
  }
  REFIT_ASSIGN_OR_RAISE(std::vector<std::string> libraries,
                        config.GetStringList("plugins.load", {}));
  for (const std::string& library : libraries) {
    const std::string where = config.Where("plugins.load");
    if (library.empty()) return Status::Invalid(where + ": plugins.load: empty path");
    REFIT_RETURN_NOT_OK(registry.LoadLibrary(Resolve(base, library).string()).WithContext(where));
  }
  return Status::OK();
}

Status LoadPluginsFromEnv(Registry& registry) {
  const char* value = std::getenv("REFIT_PLUGIN_PATH");
  if (value == nullptr) return Status::OK();
  std::string paths(value);
  size_t start = 0;
  while (start <= paths.size()) {
    size_t end = paths.find(':', start);
    if (end == std::string::npos) end = paths.size();
    std::string dir = paths.substr(start, end - start);
    // Like PATH: empty entries and missing directories are skipped.
    if (!dir.empty()) {
      REFIT_RETURN_NOT_OK(registry.LoadDirectory(dir).WithContext("REFIT_PLUGIN_PATH"));
    }
    start = end + 1;
  }
  return Status::OK();
}

std::string DefaultPluginDir() {
  Dl_info where{};
  // Any object of the core tells which file it was loaded from: librefit.so, or a program that
  // links the core statically (the CLI, tests, tools).
  if (dladdr(static_cast<const void*>(HostApi()), &where) != 0 && where.dli_fname != nullptr) {
    std::error_code ec;
    // For the main program dladdr reports argv[0] ("refit" when run from PATH, or whatever a
    // parent passed to exec), not a path: the kernel's /proc/self/exe is the real file.
    const bool shared_library = std::strstr(where.dli_fname, ".so") != nullptr;
    fs::path file =
        shared_library ? fs::absolute(where.dli_fname, ec) : fs::read_symlink("/proc/self/exe", ec);
    if (!ec) file = fs::weakly_canonical(file, ec);
    if (!ec) {
#if defined(REFIT_BUILD_ROOT) && defined(REFIT_BUILD_PLUGIN_DIR)
      // Anything running from the build tree uses the plugins built with it.
      fs::path build_root = fs::weakly_canonical(REFIT_BUILD_ROOT, ec);
      if (!ec) {
        auto [root_end, file_it] =
            std::mismatch(build_root.begin(), build_root.end(), file.begin(), file.end());
        if (root_end == build_root.end()) return REFIT_BUILD_PLUGIN_DIR;
      }
#endif
#ifdef REFIT_INSTALL_LIBDIR
      // An installed program: <prefix>/bin/refit -> <prefix>/<libdir>/refit/plugins.
      if (!shared_library) {
        return (file.parent_path().parent_path() / REFIT_INSTALL_LIBDIR / "refit" / "plugins")
            .string();
      }
#endif
      if (shared_library) return (file.parent_path() / "refit" / "plugins").string();
    }
  }
#ifdef REFIT_PLUGIN_INSTALL_DIR
  return REFIT_PLUGIN_INSTALL_DIR;
#else
  return "";
#endif
}

Result<std::shared_ptr<Registry>> LoadRegistry(const Config* config) {
  REFIT_ASSIGN_OR_RAISE(std::shared_ptr<Registry> registry, Registry::WithBuiltins());
  std::string dir = DefaultPluginDir();
  if (!dir.empty()) REFIT_RETURN_NOT_OK(registry->LoadDirectory(dir));
  REFIT_RETURN_NOT_OK(LoadPluginsFromEnv(*registry));
  if (config != nullptr) REFIT_RETURN_NOT_OK(LoadPluginsFromConfig(*registry, *config));
  return registry;
}

}  // namespace refit
