// Plugin loader and registry, and the C++ handles the pipelines use for plugin instances.
//
// Every instance holds a reference to the library that created it and to its ComponentInfo, so a
// .so stays mapped as long as any object it made is alive (dropping the Registry first is fine).
//
// Threading: a Registry is filled once (one thread), then may be read concurrently. Encoding and
// Transport instances may be called from several threads at once (the ABI requires it: encodings
// are stateless per call, transports take concurrent calls on distinct keys, which the transport
// conformance suite checks); callers serialize calls on one Layout instance.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "refit/config.h"
#include "refit/export.h"
#include "refit/plugin_abi.h"
#include "refit/status.h"
#include "refit/tensor.h"

namespace refit {

// A loaded plugin library or the builtin pseudo-library. Internal to the loader.
class PluginLibrary;

// The host API table handed to every plugin entry point.
REFIT_API const refit_host_api_t* HostApi();

REFIT_API const char* KindName(refit_component_kind_t kind);  // "encoding", "transport", "layout"

struct ComponentInfo {
  refit_component_kind_t kind;
  std::string name;
  std::string description;
  std::string plugin_name;
  std::string plugin_version;
  std::string origin;  // "builtin" or the .so path
  uint64_t capabilities = 0;
  // The plugin table's abi_minor: which form of a versioned function (max_encoded_size) it has.
  uint16_t abi_minor = REFIT_ABI_MINOR;
  // Encodings: relative apply cost declared by the plugin (0: not declared); `auto` orders by it.
  uint32_t apply_cost = 0;
  std::vector<ConfigKeySpec> config_keys;  // names relative to the component's section
  const void* vtable = nullptr;
  std::shared_ptr<PluginLibrary> library;
};

// Converts a C error filled by a plugin into a Status prefixed with context.
REFIT_API Status StatusFromPlugin(int rc, const refit_error_t& err, const std::string& context);

class REFIT_API Encoding {
 public:
  ~Encoding();
  Encoding(const Encoding&) = delete;
  Encoding& operator=(const Encoding&) = delete;

  const std::string& name() const { return info_->name; }
  refit_op_t op() const { return static_cast<refit_op_t>(vtable_->op); }
  uint64_t capabilities() const { return info_->capabilities; }
  // Upper bound of Encode's output for in; an error (or, from a plugin built before ABI 1.3, 0)
  // when the encoding cannot encode it.
  Result<uint64_t> MaxEncodedSize(const refit_encode_input_t& in) const;
  // Returns the number of bytes written to out.
  Result<uint64_t> Encode(const refit_encode_input_t& in, uint8_t* out, uint64_t cap) const;
  Status Decode(const uint8_t* payload, uint64_t len, const refit_decode_target_t& target) const;
  // Whether the encoding lists a record's changes without writing (ABI 1.4 decode_changes).
  bool can_decode_changes() const;
  // The changes decoding the record onto `old` would make, listed into `changes` (see
  // plugin_abi.h); Unsupported: this payload is decoded in place only. Checks what the plugin
  // reports: count <= capacity.
  Status DecodeChanges(const uint8_t* payload, uint64_t len, const refit_decode_target_t& old,
                       refit_decoded_changes_t* changes) const;

 private:
  friend class Registry;
  Encoding() = default;
  std::shared_ptr<const ComponentInfo> info_;
  std::shared_ptr<PluginLibrary> library_;
  const refit_encoding_vtable_t* vtable_ = nullptr;
  void* instance_ = nullptr;
};

class REFIT_API Transport {
 public:
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Wraps an instance made outside any registry with vtable's functions (a decorator such as the
  // fault injector); vtable->destroy(instance) runs when the Transport is destroyed.
  static std::unique_ptr<Transport> Adopt(std::string name, const refit_transport_vtable_t* vtable,
                                          void* instance);

  const std::string& name() const { return info_->name; }
  // REFIT_TRANSPORT_CAP_* flags the plugin declared (0 for an adopted decorator).
  uint64_t capabilities() const { return info_->capabilities; }
  Status Put(const std::string& key, const uint8_t* data, uint64_t len);
  // nullopt when the key does not exist.
  Result<std::optional<uint64_t>> Size(const std::string& key);
  Status Get(const std::string& key, uint64_t offset, uint8_t* buf, uint64_t len);
  // Whole object (bounded by max_bytes: larger is an error naming the key).
  Result<std::vector<uint8_t>> GetAll(const std::string& key, uint64_t max_bytes);
  // Sorted by key.
  Result<std::vector<std::pair<std::string, uint64_t>>> List(const std::string& prefix);
  Status Remove(const std::string& key);
  // Whether the plugin can wake a waiting receiver when an object arrives (ABI 1.6 wait).
  bool can_wait() const;
  // Blocks until an object may have arrived since the previous Wait, or timeout_ms elapse: true
  // when woken by one (possibly with nothing new), false at the timeout. A transport that cannot
  // wait sleeps for timeout_ms and says false.
  Result<bool> Wait(uint32_t timeout_ms);

 private:
  friend class Registry;
  Transport() = default;
  std::shared_ptr<const ComponentInfo> info_;
  std::shared_ptr<PluginLibrary> library_;
  const refit_transport_vtable_t* vtable_ = nullptr;
  void* instance_ = nullptr;
};

struct SliceMap {
  std::string canonical_name;
  refit_slice_map_t map{};  // map.canonical_name is not valid here: use canonical_name
};

class REFIT_API Layout {
 public:
  ~Layout();
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;

  const std::string& name() const { return info_->name; }
  Result<std::vector<SliceMap>> MapTensor(const refit_local_tensor_t& local) const;
  // Whether the plugin implements list_local (ABI 1.1; optional).
  bool CanListLocal() const;
  // The local tensors (name, dtype, shape) this rank holds when the canonical checkpoint has
  // `canonical`, in shard-file order. Unsupported when the plugin has no list_local.
  Result<std::vector<TensorSpec>> ListLocal(const std::vector<TensorSpec>& canonical) const;

 private:
  friend class Registry;
  Layout() = default;
  std::shared_ptr<const ComponentInfo> info_;
  std::shared_ptr<PluginLibrary> library_;
  const refit_layout_vtable_t* vtable_ = nullptr;
  void* instance_ = nullptr;
};

class REFIT_API Registry {
 public:
  // A registry holding the builtin plugins (the one CMake list REFIT_BUILTIN_PLUGINS).
  static Result<std::unique_ptr<Registry>> WithBuiltins();
  // An empty registry (tests of the loader).
  Registry();
  ~Registry();

  // Open a plugin .so (RTLD_NOW | RTLD_LOCAL) and register its components. Errors name the path and
  // the cause: missing file, dlopen error, missing refit_plugin_entry_v1, null table, struct_size
  // too small, abi_major mismatch, a component with an unknown kind or null vtable, a duplicate
  // component name ("encoding 'x' from /p/b.so is already registered by builtin").
  Status LoadLibrary(const std::string& path);
  // Loads every *.so directly inside dir (sorted by name). A missing dir is not an error.
  Status LoadDirectory(const std::string& dir);
  // Registers a plugin table obtained from an entry point (builtins and tests).
  Status RegisterPlugin(const refit_plugin_t* plugin, std::shared_ptr<PluginLibrary> library,
                        const std::string& origin);

  const ComponentInfo* Find(refit_component_kind_t kind, const std::string& name) const;
  std::vector<const ComponentInfo*> List() const;  // sorted by kind, then name

  // Instance creation. config/section may be null/empty: the component gets no keys. The section
  // is validated against the component's declared keys first (unknown key -> file:line error).
  Result<std::unique_ptr<Encoding>> CreateEncoding(const std::string& name,
                                                   const Config* config = nullptr,
                                                   const std::string& section = "") const;
  Result<std::unique_ptr<Transport>> CreateTransport(const std::string& name,
                                                     refit_transport_role_t role,
                                                     const std::string& peer_id,
                                                     const Config* config = nullptr,
                                                     const std::string& section = "") const;
  Result<std::unique_ptr<Layout>> CreateLayout(const std::string& name, int rank, int world,
                                               const Config* config = nullptr,
                                               const std::string& section = "") const;

 private:
  // The one creation path behind CreateEncoding/CreateTransport/CreateLayout: finds the
  // component of Handle's kind, validates its section and calls its create with args.
  template <class Handle, class... CreateArgs>
  Result<std::unique_ptr<Handle>> Create(const std::string& name, const Config* config,
                                         const std::string& section, CreateArgs... args) const;

  // Shared with the instances created from them (see the file comment).
  std::vector<std::shared_ptr<const ComponentInfo>> components_;
};

// The [plugins] config section: `paths` (directories whose *.so are all loaded) and `load` (.so
// files). Relative entries are resolved against the config file's directory.
REFIT_API std::vector<ConfigKeySpec> PluginConfigSpecs();
REFIT_API Status LoadPluginsFromConfig(Registry& registry, const Config& config);
// Loads every directory listed in the environment variable REFIT_PLUGIN_PATH (colon-separated).
REFIT_API Status LoadPluginsFromEnv(Registry& registry);
// Where the .so plugins shipped with this librefit live: <libdir>/refit/plugins next to the
// librefit actually loaded (so an installed tree can be moved), or the build tree's plugin dir.
REFIT_API std::string DefaultPluginDir();
// The registry a program uses: the builtins, then DefaultPluginDir(), REFIT_PLUGIN_PATH and the
// config's [plugins] section (config may be null). Any load error is returned, never skipped.
REFIT_API Result<std::shared_ptr<Registry>> LoadRegistry(const Config* config);

// The framework's own config keys (docs/config.md), for validation and `refit plugins`.
REFIT_API std::vector<ConfigKeySpec> FrameworkConfigSpecs();
// Validates the whole file: framework keys, then each [encoding.X]/[transport.X]/[layout.X]
// section against the keys its plugin declares (unknown plugin -> error naming file:line:key).
REFIT_API Status ValidateConfig(const Config& config, const Registry& registry);

}  // namespace refit
