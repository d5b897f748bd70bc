// The registry: checks a plugin's tables (sizes, ABI version, names, vtables) and registers its
// components; creates instances wrapped in the handles of handles.cc.
#include "refit/registry.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <type_traits>

#include "config/config_internal.h"
#include "plugins/describe.h"
#include "plugins/plugin_library.h"

namespace refit {

// Generated from REFIT_BUILTIN_PLUGINS (framework/src/plugins/builtin_plugins.cc.in).
extern const refit_plugin_entry_fn kBuiltinEntries[];
extern const size_t kNumBuiltinEntries;

namespace fs = std::filesystem;
using internal::Describe;

namespace {

// The smallest tables this host accepts: the ABI 1.0 sizes. Later minors only append fields,
// which a newer host reads only when struct_size covers them.
constexpr uint32_t kMinPluginSize = offsetof(refit_plugin_t, fini);
constexpr uint32_t kMinComponentSize = offsetof(refit_component_t, config_key_size);
// The ABI 1.0 config key row; a component declares a larger one from ABI 1.3 on.
constexpr uint32_t kMinConfigKeySize = sizeof(refit_config_key_t);
// decode_changes (ABI 1.4) is optional: an older encoding table ends before it.
constexpr uint32_t kMinEncodingVtableSize = offsetof(refit_encoding_vtable_t, decode_changes);
// wait (ABI 1.6) is optional: an older transport table ends before it.
constexpr uint32_t kMinTransportVtableSize = offsetof(refit_transport_vtable_t, wait);
// list_local (ABI 1.1) is optional: a 1.0 layout table ends before it.
constexpr uint32_t kMinLayoutVtableSize = offsetof(refit_layout_vtable_t, list_local);
// Enough to read struct_size, abi_major and abi_minor.
constexpr uint32_t kPluginHeaderSize = offsetof(refit_plugin_t, abi_minor) + sizeof(uint16_t);
// A sanity bound: a garbage count would otherwise walk off into unmapped memory.
constexpr size_t kMaxComponents = 4096;
constexpr size_t kMaxConfigKeys = 4096;

bool IsKnownKind(int32_t kind) {
  return kind == REFIT_KIND_ENCODING || kind == REFIT_KIND_TRANSPORT || kind == REFIT_KIND_LAYOUT;
}

// Component names become config sections ("encoding.<name>") and CLI words.
bool IsValidComponentName(const char* name) {
  if (name == nullptr || *name == '\0') return false;
  for (const char* p = name; *p != '\0'; ++p) {
    char c = *p;
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

uint32_t MinVtableSize(int32_t kind) {
  switch (kind) {
    case REFIT_KIND_ENCODING:
      return kMinEncodingVtableSize;
    case REFIT_KIND_TRANSPORT:
      return kMinTransportVtableSize;
    default:
      return kMinLayoutVtableSize;
  }
}

// Every function the host calls must be there; returns the name of the first missing one.
const char* MissingFunction(int32_t kind, const void* vtable) {
  switch (kind) {
    case REFIT_KIND_ENCODING: {
      auto* vt = static_cast<const refit_encoding_vtable_t*>(vtable);
      if (vt->create == nullptr) return "create";
      if (vt->destroy == nullptr) return "destroy";
      if (vt->max_encoded_size == nullptr) return "max_encoded_size";
      if (vt->encode == nullptr) return "encode";
      if (vt->decode == nullptr) return "decode";
      return nullptr;
    }
    case REFIT_KIND_TRANSPORT: {
      auto* vt = static_cast<const refit_transport_vtable_t*>(vtable);
      if (vt->create == nullptr) return "create";
      if (vt->destroy == nullptr) return "destroy";
      if (vt->put == nullptr) return "put";
      if (vt->size == nullptr) return "size";
      if (vt->get == nullptr) return "get";
      if (vt->list == nullptr) return "list";
      if (vt->remove == nullptr) return "remove";
      return nullptr;
    }
    default: {
      auto* vt = static_cast<const refit_layout_vtable_t*>(vtable);
      if (vt->create == nullptr) return "create";
      if (vt->destroy == nullptr) return "destroy";
      if (vt->map_tensor == nullptr) return "map_tensor";
      return nullptr;
    }
  }
}

// Checks one component row and copies what the host keeps. `where` is "plugin <origin>".
// Whether a table of struct_size bytes holds the field that ends at `end` (an offsetof plus the
// field's size): fields of later minors are read only then.
constexpr bool Covers(uint32_t struct_size, size_t end) { return struct_size >= end; }

Result<std::shared_ptr<ComponentInfo>> ReadComponent(const refit_component_t& row, size_t index,
                                                     uint32_t row_size, const std::string& where) {
  const std::string at = where + ": component " + std::to_string(index);
  if (row.struct_size != row_size) {
    return Status::Internal(at + " has struct_size " + std::to_string(row.struct_size) +
                            ", the first component has " + std::to_string(row_size));
  }
  if (!IsKnownKind(row.kind)) {
    return Status::Internal(at + " has unknown kind " + std::to_string(row.kind));
  }
  const char* kind = KindName(static_cast<refit_component_kind_t>(row.kind));
  if (row.name == nullptr) return Status::Internal(at + " (" + kind + ") has a null name");
  if (!IsValidComponentName(row.name)) {
    return Status::Internal(at + ": " + kind + " name '" + row.name +
                            "' must be non-empty [A-Za-z0-9_-]");
  }
  const std::string named = where + ": " + kind + " '" + row.name + "'";
  if (row.vtable == nullptr) return Status::Internal(named + " has a null vtable");
  // Every vtable starts with its struct_size.
  uint32_t vtable_size = *static_cast<const uint32_t*>(row.vtable);
  if (vtable_size < MinVtableSize(row.kind)) {
    return Status::Unsupported(named + ": vtable struct_size " + std::to_string(vtable_size) +
                               " is smaller than the ABI 1 size " +
                               std::to_string(MinVtableSize(row.kind)));
  }
  if (const char* missing = MissingFunction(row.kind, row.vtable)) {
    return Status::Internal(named + ": vtable has no " + missing + " function");
  }
  if (row.kind == REFIT_KIND_ENCODING) {
    int32_t op = static_cast<const refit_encoding_vtable_t*>(row.vtable)->op;
    if (op != REFIT_OP_OVERWRITE && op != REFIT_OP_XOR && op != REFIT_OP_STEP) {
      return Status::Internal(named + ": unknown op " + std::to_string(op));
    }
  }
  if (row.n_config_keys > kMaxConfigKeys || (row.n_config_keys > 0 && row.config_keys == nullptr)) {
    return Status::Internal(named + ": bad config key table (" + std::to_string(row.n_config_keys) +
                            " keys)");
  }
  // Before ABI 1.3 the key rows were exactly refit_config_key_t; 0 keeps that meaning.
  uint32_t key_size = kMinConfigKeySize;
  if (Covers(row_size, offsetof(refit_component_t, config_key_size) + sizeof(uint32_t)) &&
      row.config_key_size != 0) {
    key_size = row.config_key_size;
  }
  if (key_size < kMinConfigKeySize) {
    return Status::Unsupported(named + ": config key struct_size " + std::to_string(key_size) +
                               " is smaller than the ABI 1 size " +
                               std::to_string(kMinConfigKeySize));
  }

  auto info = std::make_shared<ComponentInfo>();
  info->kind = static_cast<refit_component_kind_t>(row.kind);
  info->name = row.name;
  info->description = row.description != nullptr ? row.description : "";
  info->capabilities = row.capabilities;
  info->vtable = row.vtable;
  if (Covers(row_size, offsetof(refit_component_t, apply_cost) + sizeof(uint32_t))) {
    info->apply_cost = row.apply_cost;
  }
  const auto* key_rows = reinterpret_cast<const uint8_t*>(row.config_keys);
  for (size_t k = 0; k < row.n_config_keys; ++k) {
    const auto& key = *reinterpret_cast<const refit_config_key_t*>(key_rows + k * key_size);
    if (key.name == nullptr || *key.name == '\0') {
      return Status::Internal(named + ": config key " + std::to_string(k) + " has no name");
    }
    if (key.type < REFIT_CFG_STRING || key.type > REFIT_CFG_STRING_LIST) {
      return Status::Internal(named + ": config key '" + key.name + "' has unknown type " +
                              std::to_string(key.type));
    }
    info->config_keys.push_back(ConfigKeySpec{key.name, static_cast<refit_config_type_t>(key.type),
                                              key.default_value != nullptr ? key.default_value : "",
                                              key.description != nullptr ? key.description : ""});
  }
  return info;
}

std::shared_ptr<const ComponentInfo> FindShared(
    const std::vector<std::shared_ptr<const ComponentInfo>>& components,
    refit_component_kind_t kind, const std::string& name) {
  for (const auto& info : components) {
    if (info->kind == kind && info->name == name) return info;
  }
  return nullptr;
}

// The component to instantiate, or "unknown encoding 'foo' (known: dense, indices)".
Result<std::shared_ptr<const ComponentInfo>> FindForCreate(
    const std::vector<std::shared_ptr<const ComponentInfo>>& components,
    refit_component_kind_t kind, const std::string& name) {
  if (auto info = FindShared(components, kind, name)) return info;
  std::vector<std::string> known;
  for (const auto& info : components) {
    if (info->kind == kind) known.push_back(info->name);
  }
  std::sort(known.begin(), known.end());
  std::string list;
  for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
  return Status::NotFound(std::string("unknown ") + KindName(kind) + " '" + name +
                          "' (known: " + (list.empty() ? "none" : list) + ")");
}

// Validates [section] against the component's declared keys and returns its C handle (null when
// there is no config).
Result<const refit_config_t*> SectionFor(const ComponentInfo& info, const Config* config,
                                         const std::string& section) {
  if (config == nullptr || section.empty()) return static_cast<const refit_config_t*>(nullptr);
  std::vector<ConfigKeySpec> specs = info.config_keys;
  for (ConfigKeySpec& spec : specs) spec.name = section + "." + spec.name;
  REFIT_RETURN_NOT_OK(config->Validate(specs, section).WithContext(Describe(info)));
  return config->SectionHandle(section);
}

}  // namespace

// ------------------------------------------------------------------ Registry

Registry::Registry() = default;
Registry::~Registry() = default;

Result<std::unique_ptr<Registry>> Registry::WithBuiltins() {
  auto registry = std::make_unique<Registry>();
  std::shared_ptr<PluginLibrary> builtin = PluginLibrary::Builtin();
  for (size_t i = 0; i < kNumBuiltinEntries; ++i) {
    REFIT_RETURN_NOT_OK(
        registry->RegisterPlugin(kBuiltinEntries[i](HostApi()), builtin, "builtin"));
  }
  return registry;
}

Status Registry::RegisterPlugin(const refit_plugin_t* plugin,
                                std::shared_ptr<PluginLibrary> library, const std::string& origin) {
  const std::string where = "plugin " + origin;
  if (plugin == nullptr) return Status::Internal(where + ": " REFIT_ENTRY_SYMBOL " returned null");
  if (plugin->struct_size < kPluginHeaderSize) {
    return Status::Unsupported(where + ": plugin table struct_size " +
                               std::to_string(plugin->struct_size) +
                               " is too small to hold a version");
  }
  // The major version decides how the rest is laid out: check it before trusting any size.
  if (plugin->abi_major != REFIT_ABI_MAJOR) {
    return Status::Unsupported(where + ": built for plugin ABI " +
                               std::to_string(plugin->abi_major) + ", this refit speaks ABI " +
                               std::to_string(REFIT_ABI_MAJOR));
  }
  if (plugin->struct_size < kMinPluginSize) {
    return Status::Unsupported(where + ": plugin table struct_size " +
                               std::to_string(plugin->struct_size) +
                               " is smaller than the ABI 1 size " + std::to_string(kMinPluginSize));
  }
  if (plugin->name == nullptr) return Status::Internal(where + ": plugin table has a null name");
  if (plugin->n_components > kMaxComponents ||
      (plugin->n_components > 0 && plugin->components == nullptr)) {
    return Status::Internal(where + ": bad component table (" +
                            std::to_string(plugin->n_components) + " components)");
  }

  // Rows may be larger than this host's refit_component_t (a newer minor): step by their size.
  const auto* rows = reinterpret_cast<const uint8_t*>(plugin->components);
  uint32_t row_size = plugin->n_components > 0 ? plugin->components[0].struct_size : 0;
  if (plugin->n_components > 0 && row_size < kMinComponentSize) {
    return Status::Unsupported(where + ": component struct_size " + std::to_string(row_size) +
                               " is smaller than the ABI 1 size " +
                               std::to_string(kMinComponentSize));
  }

  // Validate everything first: a library is registered completely or not at all.
  std::vector<std::shared_ptr<const ComponentInfo>> added;
  for (size_t i = 0; i < plugin->n_components; ++i) {
    const auto& row = *reinterpret_cast<const refit_component_t*>(rows + i * row_size);
    REFIT_ASSIGN_OR_RAISE(std::shared_ptr<ComponentInfo> info,
                          ReadComponent(row, i, row_size, where));
    info->abi_minor = plugin->abi_minor;
    info->plugin_name = plugin->name;
    info->plugin_version = plugin->version != nullptr ? plugin->version : "";
    info->origin = origin;
    info->library = library;
    std::shared_ptr<const ComponentInfo> clash = FindShared(components_, info->kind, info->name);
    if (clash == nullptr) clash = FindShared(added, info->kind, info->name);
    if (clash != nullptr) {
      return Status::AlreadyExists(Describe(*info) + " from " + origin +
                                   " is already registered by " + clash->origin);
    }
    added.push_back(std::move(info));
  }
  // Only a table that registered is finished by its fini: a rejected one may be garbage.
  if (Covers(plugin->struct_size, offsetof(refit_plugin_t, fini) + sizeof(plugin->fini)) &&
      plugin->fini != nullptr && library != nullptr) {
    library->AddFini(plugin->fini);
  }
  components_.insert(components_.end(), added.begin(), added.end());
  return Status::OK();
}

Status Registry::LoadLibrary(const std::string& path) {
  std::error_code ec;
  // Absolute, so dlopen never searches LD_LIBRARY_PATH for a bare file name.
  fs::path absolute = fs::absolute(path, ec);
  if (ec) return Status::IoError("plugin " + path + ": " + ec.message());
  const std::string shown = absolute.lexically_normal().string();
  fs::file_status st = fs::status(absolute, ec);
  if (!fs::exists(st)) {
    if (ec && ec != std::errc::no_such_file_or_directory) {
      return Status::IoError("plugin " + shown + ": " + ec.message());
    }
    return Status::NotFound("plugin " + shown + ": no such file");
  }
  if (fs::is_directory(st)) {
    return Status::Invalid("plugin " + shown + ": is a directory (use plugins.paths for those)");
  }

  REFIT_ASSIGN_OR_RAISE(std::shared_ptr<PluginLibrary> library, PluginLibrary::Open(shown));
  // The same file reached twice (a directory listed in both the config and REFIT_PLUGIN_PATH,
  // or a symlink): dlopen returns the same handle; it is registered already.
  for (const auto& info : components_) {
    if (info->library != nullptr && info->library->handle() == library->handle()) {
      return Status::OK();
    }
  }
  refit_plugin_entry_fn entry = library->FindEntry();
  if (entry == nullptr) {
    return Status::NotFound("plugin " + shown +
                            ": no symbol " REFIT_ENTRY_SYMBOL
                            " (not a refit plugin, or the entry is not exported)");
  }
  // On error `library` is the last reference: returning dlcloses it.
  return RegisterPlugin(entry(HostApi()), library, shown);
}

Status Registry::LoadDirectory(const std::string& dir) {
  std::error_code ec;
  fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) {
    if (ec && ec != std::errc::no_such_file_or_directory) {
      return Status::IoError("plugin directory " + dir + ": " + ec.message());
    }
    return Status::OK();
  }
  if (!fs::is_directory(st)) {
    return Status::Invalid("plugin directory " + dir + ": not a directory");
  }
  std::vector<std::string> libraries;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    if (p.extension() == ".so" && it->is_regular_file(ec)) libraries.push_back(p.string());
  }
  if (ec) return Status::IoError("plugin directory " + dir + ": " + ec.message());
  // Sorted so the load order (and so which duplicate is reported) does not depend on the
  // filesystem.
  std::sort(libraries.begin(), libraries.end());
  for (const std::string& library : libraries) REFIT_RETURN_NOT_OK(LoadLibrary(library));
  return Status::OK();
}

const ComponentInfo* Registry::Find(refit_component_kind_t kind, const std::string& name) const {
  return FindShared(components_, kind, name).get();
}

std::vector<const ComponentInfo*> Registry::List() const {
  std::vector<const ComponentInfo*> out;
  for (const auto& info : components_) out.push_back(info.get());
  std::sort(out.begin(), out.end(), [](const ComponentInfo* a, const ComponentInfo* b) {
    return a->kind != b->kind ? a->kind < b->kind : a->name < b->name;
  });
  return out;
}

namespace {

// What Create needs to know about each handle class.
template <class Handle>
struct HandleTraits;
template <>
struct HandleTraits<Encoding> {
  static constexpr refit_component_kind_t kKind = REFIT_KIND_ENCODING;
  using Vtable = refit_encoding_vtable_t;
};
template <>
struct HandleTraits<Transport> {
  static constexpr refit_component_kind_t kKind = REFIT_KIND_TRANSPORT;
  using Vtable = refit_transport_vtable_t;
};
template <>
struct HandleTraits<Layout> {
  static constexpr refit_component_kind_t kKind = REFIT_KIND_LAYOUT;
  using Vtable = refit_layout_vtable_t;
};

}  // namespace

template <class Handle, class... CreateArgs>
Result<std::unique_ptr<Handle>> Registry::Create(const std::string& name, const Config* config,
                                                 const std::string& section,
                                                 CreateArgs... args) const {
  using Traits = HandleTraits<Handle>;
  REFIT_ASSIGN_OR_RAISE(std::shared_ptr<const ComponentInfo> info,
                        FindForCreate(components_, Traits::kKind, name));
  REFIT_ASSIGN_OR_RAISE(const refit_config_t* cfg, SectionFor(*info, config, section));
  auto* vtable = static_cast<const typename Traits::Vtable*>(info->vtable);
  refit_error_t err{};
  void* instance = nullptr;
  int rc = vtable->create(HostApi(), cfg, args..., &instance, &err);
  if (rc != REFIT_OK) return StatusFromPlugin(rc, err, Describe(*info) + ": create");
  std::unique_ptr<Handle> handle(new Handle());
  handle->info_ = info;
  handle->library_ = info->library;
  handle->vtable_ = vtable;
  handle->instance_ = instance;
  return handle;
}

Result<std::unique_ptr<Encoding>> Registry::CreateEncoding(const std::string& name,
                                                           const Config* config,
                                                           const std::string& section) const {
  return Create<Encoding>(name, config, section);
}

Result<std::unique_ptr<Transport>> Registry::CreateTransport(const std::string& name,
                                                             refit_transport_role_t role,
                                                             const std::string& peer_id,
                                                             const Config* config,
                                                             const std::string& section) const {
  return Create<Transport>(name, config, section, static_cast<int32_t>(role), peer_id.c_str());
}

Result<std::unique_ptr<Layout>> Registry::CreateLayout(const std::string& name, int rank, int world,
                                                       const Config* config,
                                                       const std::string& section) const {
  return Create<Layout>(name, config, section, static_cast<int32_t>(rank),
                        static_cast<int32_t>(world));
}

}  // namespace refit
