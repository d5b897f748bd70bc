// Plugin loader, registry and the C++ handles around plugin instances (see refit/registry.h).
#include "refit/registry.h"

#include <dlfcn.h>

// Boost.DLL on std::filesystem: the loader then needs no Boost library, only headers.
#define BOOST_DLL_USE_STD_FS
#include <algorithm>
#include <boost/dll/shared_library.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <type_traits>

#include "config/config_internal.h"
#include "plugins/plugin_library.h"
#include "refit/log.h"

namespace refit {

// Generated from REFIT_BUILTIN_PLUGINS (framework/src/plugins/builtin_plugins.cc.in).
extern const refit_plugin_entry_fn kBuiltinEntries[];
extern const size_t kNumBuiltinEntries;

namespace fs = std::filesystem;

// ------------------------------------------------------------------ PluginLibrary

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

// ------------------------------------------------------------------ host API

namespace {

// Called by plugins through a C function pointer: must never throw (Log never does).
void HostLog(int32_t level, const char* component, const char* message) noexcept {
  if (level < REFIT_LOG_DEBUG || level > REFIT_LOG_ERROR) level = REFIT_LOG_ERROR;
  Log(static_cast<LogLevel>(level), component != nullptr ? component : "plugin",
      message != nullptr ? message : "");
}

const refit_host_api_t kHostApi = {
    sizeof(refit_host_api_t),
    REFIT_ABI_MAJOR,
    REFIT_ABI_MINOR,
    &HostLog,
    &internal::ConfigGetString,
    &internal::ConfigGetInt,
    &internal::ConfigGetBool,
    &internal::ConfigGetDouble,
    &internal::ConfigGetSize,
    &internal::ConfigGetListItem,
};

}  // namespace

const refit_host_api_t* HostApi() { return &kHostApi; }

const char* KindName(refit_component_kind_t kind) {
  switch (kind) {
    case REFIT_KIND_ENCODING:
      return "encoding";
    case REFIT_KIND_TRANSPORT:
      return "transport";
    case REFIT_KIND_LAYOUT:
      return "layout";
  }
  return "unknown";
}

Status StatusFromPlugin(int rc, const refit_error_t& err, const std::string& context) {
  if (rc == REFIT_OK) return Status::OK();
  // The message buffer is plugin-filled: bound it, and keep the error on one line.
  std::string message(err.message, strnlen(err.message, sizeof(err.message)));
  for (char& c : message) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  if (message.empty()) message = "failed with status " + std::to_string(rc) + " and no message";
  StatusCode code = StatusCode::kInternal;
  if (rc > REFIT_OK && rc <= REFIT_ERR_INTERNAL) {
    code = static_cast<StatusCode>(rc);
  } else {
    message += " (unknown status code " + std::to_string(rc) + ")";
  }
  return Status(code, context + ": " + message);
}

// ------------------------------------------------------------------ table validation

namespace {

// The smallest tables this host accepts: the ABI 1.0 sizes. Later minors only append fields,
// which a newer host reads only when struct_size covers them.
constexpr uint32_t kMinPluginSize = offsetof(refit_plugin_t, fini);
constexpr uint32_t kMinComponentSize = offsetof(refit_component_t, config_key_size);
// The ABI 1.0 config key row; a component declares a larger one from ABI 1.3 on.
constexpr uint32_t kMinConfigKeySize = sizeof(refit_config_key_t);
constexpr uint32_t kMinEncodingVtableSize = sizeof(refit_encoding_vtable_t);
constexpr uint32_t kMinTransportVtableSize = sizeof(refit_transport_vtable_t);
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

std::string Describe(const ComponentInfo& info) {
  return std::string(KindName(info.kind)) + " '" + info.name + "'";
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

// ------------------------------------------------------------------ Encoding

Encoding::~Encoding() {
  if (vtable_ != nullptr) vtable_->destroy(instance_);
}

Result<uint64_t> Encoding::MaxEncodedSize(const refit_encode_input_t& in) const {
  if (info_->abi_minor < 3) {
    // Built for ABI 1.0 to 1.2: the slot holds the older function, which returns the bound (0
    // when it cannot encode; callers treat a 0 bound as that).
    // Through void(*)(), the generic function pointer type, since the two types differ.
    auto legacy = reinterpret_cast<refit_max_encoded_size_v1_fn>(
        reinterpret_cast<void (*)()>(vtable_->max_encoded_size));
    return legacy(instance_, &in);
  }
  refit_error_t err{};
  uint64_t size = 0;
  int rc = vtable_->max_encoded_size(instance_, &in, &size, &err);
  if (rc != REFIT_OK) return StatusFromPlugin(rc, err, Describe(*info_) + ": max_encoded_size");
  return size;
}

Result<uint64_t> Encoding::Encode(const refit_encode_input_t& in, uint8_t* out,
                                  uint64_t cap) const {
  refit_error_t err{};
  uint64_t size = 0;
  int rc = vtable_->encode(instance_, &in, out, cap, &size, &err);
  if (rc != REFIT_OK) return StatusFromPlugin(rc, err, Describe(*info_) + ": encode");
  if (size > cap) {
    return Status::Internal(Describe(*info_) + ": encode reported " + std::to_string(size) +
                            " bytes written into a buffer of " + std::to_string(cap));
  }
  return size;
}

Status Encoding::Decode(const uint8_t* payload, uint64_t len,
                        const refit_decode_target_t& target) const {
  refit_error_t err{};
  int rc = vtable_->decode(instance_, payload, len, &target, &err);
  return StatusFromPlugin(rc, err, Describe(*info_) + ": decode");
}

// ------------------------------------------------------------------ Transport

std::unique_ptr<Transport> Transport::Adopt(std::string name,
                                            const refit_transport_vtable_t* vtable,
                                            void* instance) {
  auto info = std::make_shared<ComponentInfo>();
  info->kind = REFIT_KIND_TRANSPORT;
  info->name = std::move(name);
  info->origin = "builtin";
  info->vtable = vtable;
  std::unique_ptr<Transport> transport(new Transport());
  transport->info_ = std::move(info);
  transport->vtable_ = vtable;
  transport->instance_ = instance;
  return transport;
}

Transport::~Transport() {
  if (vtable_ != nullptr) vtable_->destroy(instance_);
}

namespace {
// Keys cross the ABI as C strings: an embedded NUL would silently name another key.
Status CheckKeyText(const std::string& key) {
  if (key.find('\0') != std::string::npos) {
    return Status::Invalid("transport key contains a NUL byte");
  }
  return Status::OK();
}
}  // namespace

Status Transport::Put(const std::string& key, const uint8_t* data, uint64_t len) {
  REFIT_RETURN_NOT_OK(CheckKeyText(key));
  refit_error_t err{};
  int rc = vtable_->put(instance_, key.c_str(), data, len, &err);
  return StatusFromPlugin(rc, err, Describe(*info_) + ": put '" + key + "'");
}

Result<std::optional<uint64_t>> Transport::Size(const std::string& key) {
  REFIT_RETURN_NOT_OK(CheckKeyText(key));
  refit_error_t err{};
  uint64_t size = 0;
  int found = 0;
  int rc = vtable_->size(instance_, key.c_str(), &size, &found, &err);
  if (rc != REFIT_OK) return StatusFromPlugin(rc, err, Describe(*info_) + ": size '" + key + "'");
  if (found == 0) return std::optional<uint64_t>();
  return std::optional<uint64_t>(size);
}

Status Transport::Get(const std::string& key, uint64_t offset, uint8_t* buf, uint64_t len) {
  REFIT_RETURN_NOT_OK(CheckKeyText(key));
  refit_error_t err{};
  int rc = vtable_->get(instance_, key.c_str(), offset, buf, len, &err);
  return StatusFromPlugin(rc, err, Describe(*info_) + ": get '" + key + "'");
}

Result<std::vector<uint8_t>> Transport::GetAll(const std::string& key, uint64_t max_bytes) {
  REFIT_ASSIGN_OR_RAISE(std::optional<uint64_t> size, Size(key));
  if (!size.has_value()) {
    return Status::NotFound(Describe(*info_) + ": no key '" + key + "'");
  }
  if (*size > max_bytes) {
    return Status::Corrupt(Describe(*info_) + ": key '" + key + "' holds " + std::to_string(*size) +
                           " bytes, more than the limit of " + std::to_string(max_bytes));
  }
  std::vector<uint8_t> data(*size);
  REFIT_RETURN_NOT_OK(Get(key, 0, data.data(), data.size()));
  return data;
}

namespace {
struct ListContext {
  std::vector<std::pair<std::string, uint64_t>> entries;
  bool bad_key = false;
  bool out_of_memory = false;
};

// Called from plugin code through a C pointer: must never throw.
void CollectKey(void* ctx, const char* key, uint64_t size) noexcept {
  auto* list = static_cast<ListContext*>(ctx);
  if (key == nullptr) {
    list->bad_key = true;
    return;
  }
  try {
    list->entries.emplace_back(key, size);
  } catch (...) {
    list->out_of_memory = true;
  }
}
}  // namespace

Result<std::vector<std::pair<std::string, uint64_t>>> Transport::List(const std::string& prefix) {
  REFIT_RETURN_NOT_OK(CheckKeyText(prefix));
  refit_error_t err{};
  ListContext ctx;
  int rc = vtable_->list(instance_, prefix.c_str(), &CollectKey, &ctx, &err);
  const std::string context = Describe(*info_) + ": list '" + prefix + "'";
  if (rc != REFIT_OK) return StatusFromPlugin(rc, err, context);
  if (ctx.bad_key) return Status::Internal(context + ": the plugin listed a null key");
  if (ctx.out_of_memory) return Status::Internal(context + ": out of memory");
  std::sort(ctx.entries.begin(), ctx.entries.end());
  return std::move(ctx.entries);
}

Status Transport::Remove(const std::string& key) {
  REFIT_RETURN_NOT_OK(CheckKeyText(key));
  refit_error_t err{};
  int rc = vtable_->remove(instance_, key.c_str(), &err);
  return StatusFromPlugin(rc, err, Describe(*info_) + ": remove '" + key + "'");
}

// ------------------------------------------------------------------ Layout

Layout::~Layout() {
  if (vtable_ != nullptr) vtable_->destroy(instance_);
}

namespace {
struct SliceContext {
  std::vector<SliceMap> slices;
  std::string error;  // first contract violation of the plugin, if any
};

void CollectSlice(void* ctx, const refit_slice_map_t* slice) noexcept {
  auto* out = static_cast<SliceContext*>(ctx);
  if (!out->error.empty()) return;
  try {
    if (slice == nullptr) {
      out->error = "emitted a null slice";
    } else if (slice->struct_size < sizeof(refit_slice_map_t)) {
      out->error = "emitted a slice with struct_size " + std::to_string(slice->struct_size);
    } else if (slice->canonical_name == nullptr) {
      out->error = "emitted a slice without a canonical name";
    } else if (slice->ndim > REFIT_MAX_DIMS) {
      out->error = "emitted a slice of '" + std::string(slice->canonical_name) + "' with " +
                   std::to_string(slice->ndim) + " dims";
    } else {
      SliceMap map;
      map.canonical_name = slice->canonical_name;
      map.map = *slice;  // the v1 prefix; later fields of a newer plugin are not read
      map.map.struct_size = sizeof(refit_slice_map_t);
      map.map.canonical_name = nullptr;  // would dangle: the name lives in canonical_name
      out->slices.push_back(std::move(map));
    }
  } catch (...) {
    out->error = "out of memory";
  }
}
}  // namespace

Result<std::vector<SliceMap>> Layout::MapTensor(const refit_local_tensor_t& local) const {
  refit_error_t err{};
  SliceContext ctx;
  int rc = vtable_->map_tensor(instance_, &local, &CollectSlice, &ctx, &err);
  std::string context =
      Describe(*info_) + ": map '" + (local.name != nullptr ? local.name : "") + "'";
  if (rc != REFIT_OK) return StatusFromPlugin(rc, err, context);
  if (!ctx.error.empty()) return Status::Internal(context + ": " + ctx.error);
  return std::move(ctx.slices);
}

bool Layout::CanListLocal() const {
  // A 1.0 vtable ends before list_local: read the field only when struct_size covers it.
  return vtable_->struct_size >=
             offsetof(refit_layout_vtable_t, list_local) + sizeof(vtable_->list_local) &&
         vtable_->list_local != nullptr;
}

namespace {
struct LocalListContext {
  std::vector<TensorSpec> tensors;
  std::string error;  // first contract violation of the plugin, if any
};

void CollectLocal(void* ctx, const refit_local_tensor_t* local) noexcept {
  auto* out = static_cast<LocalListContext*>(ctx);
  if (!out->error.empty()) return;
  try {
    if (local == nullptr) {
      out->error = "emitted a null tensor";
    } else if (local->struct_size < sizeof(refit_local_tensor_t)) {
      out->error = "emitted a tensor with struct_size " + std::to_string(local->struct_size);
    } else if (local->name == nullptr) {
      out->error = "emitted a tensor without a name";
    } else if (local->ndim > REFIT_MAX_DIMS) {
      out->error = "emitted '" + std::string(local->name) + "' with " +
                   std::to_string(local->ndim) + " dims";
    } else if (FindDType(local->dtype) == nullptr) {
      out->error = "emitted '" + std::string(local->name) + "' with unknown dtype " +
                   std::to_string(local->dtype);
    } else {
      TensorSpec spec;
      spec.name = local->name;
      spec.dtype = static_cast<DType>(local->dtype);
      spec.shape.assign(local->shape, local->shape + local->ndim);
      if (!NumElements(spec.shape).ok()) {
        out->error = "emitted '" + spec.name + "' with an overflowing shape";
        return;
      }
      out->tensors.push_back(std::move(spec));
    }
  } catch (...) {
    out->error = "out of memory";
  }
}
}  // namespace

Result<std::vector<TensorSpec>> Layout::ListLocal(const std::vector<TensorSpec>& canonical) const {
  const std::string context = Describe(*info_) + ": list local tensors";
  if (!CanListLocal()) {
    return Status::Unsupported(context +
                               ": this layout cannot enumerate a rank's tensors (no "
                               "list_local: built for plugin ABI 1.0)");
  }
  std::vector<refit_local_tensor_t> views(canonical.size());
  for (size_t i = 0; i < canonical.size(); ++i) {
    const TensorSpec& t = canonical[i];
    if (t.shape.size() > REFIT_MAX_DIMS) {
      return Status::Unsupported(context + ": tensor '" + t.name + "' has more than " +
                                 std::to_string(REFIT_MAX_DIMS) + " dims");
    }
    refit_local_tensor_t& v = views[i];
    v.struct_size = sizeof(v);
    v.dtype = static_cast<int32_t>(t.dtype);
    v.name = t.name.c_str();
    v.ndim = static_cast<uint32_t>(t.shape.size());
    for (size_t d = 0; d < t.shape.size(); ++d) v.shape[d] = t.shape[d];
  }
  refit_error_t err{};
  LocalListContext ctx;
  int rc = vtable_->list_local(instance_, views.data(), views.size(), &CollectLocal, &ctx, &err);
  if (rc != REFIT_OK) return StatusFromPlugin(rc, err, context);
  if (!ctx.error.empty()) return Status::Internal(context + ": " + ctx.error);
  return std::move(ctx.tensors);
}

// ------------------------------------------------------------------ plugin search path

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
  if (dladdr(&kHostApi, &where) != 0 && where.dli_fname != nullptr) {
    std::error_code ec;
    // For the main program dladdr reports argv[0] ("refit" when run from PATH, or whatever a
    // parent passed to exec), not a path: the kernel's /proc/self/exe is the real file.
    const bool shared_library = std::strstr(where.dli_fname, ".so") != nullptr;
    fs::path file = shared_library ? fs::absolute(where.dli_fname, ec)
                                   : fs::read_symlink("/proc/self/exe", ec);
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
