// The header-only plugin SDK: write a normal C++ class, get the C ABI table.
//
// A plugin links nothing of refit's core: only this header, plugin_abi.h and status.h (both
// header-only). Every call into the plugin is wrapped so that exceptions never cross the C
// boundary; they become REFIT_ERR_INTERNAL with the exception's text.
//
// Minimal encoding plugin:
//
//   #include <refit/sdk/plugin.hpp>
//   class MyEncoding {
//    public:
//     static constexpr refit_op_t kOp = REFIT_OP_OVERWRITE;
//     static constexpr uint32_t kApplyCost = 25;  // optional: see refit_component_t.apply_cost
//     static refit::Result<std::unique_ptr<MyEncoding>> Create(const refit::sdk::ConfigView& cfg);
//     refit::Result<uint64_t> MaxEncodedSize(const refit_encode_input_t& in) const;  // or uint64_t
//     refit::Result<uint64_t> Encode(const refit_encode_input_t& in, uint8_t* out, uint64_t cap)
//     const; refit::Status Decode(const uint8_t* payload, uint64_t len, const
//     refit_decode_target_t& t) const;
//     // Optional (ABI 1.4 decode_changes): the changes Decode would make, listed without
//     // writing t; returns their count (<= capacity, or an error).
//     refit::Result<uint64_t> DecodeChanges(const uint8_t* payload, uint64_t len,
//                                           const refit_decode_target_t& old, uint64_t* positions,
//                                           uint8_t* values, uint64_t capacity) const;
//     // ...or the same with a last `const refit::sdk::ListProgress& progress` (ABI 1.7), called
//     // as the listing goes on so that the host verifies in cache.
//   };
//   REFIT_PLUGIN("my-plugin", "0.1.0",
//                refit::sdk::MakeEncoding<MyEncoding>("myenc", "what it does"))
//
// Transports implement Create(cfg, role, peer_id), Put, Size, Get, List, Remove, and optionally
// (ABI 1.6 wait) `refit::Result<bool> Wait(uint32_t timeout_ms)`: block until an object may have
// arrived since the previous Wait, true when woken by one, false at the timeout. Layouts implement
// Create(cfg, rank, world), MapTensor and optionally ListLocal. The concepts EncodingImpl,
// TransportImpl and LayoutImpl below state each requirement; Make* names the unmet one in a
// static_assert. The plugin table is emitted for REFIT_ABI_MINOR of the header it is built with.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "refit/plugin_abi.h"
#include "refit/sdk/encoding_util.hpp"
#include "refit/status.h"

#if defined(_WIN32)
#define REFIT_PLUGIN_EXPORT __declspec(dllexport)
#else
#define REFIT_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

// Builtin plugins are compiled with REFIT_BUILTIN_ENTRY=<unique symbol> so that several can be
// linked into one library; a shared-library plugin exports the standard entry symbol.
#ifdef REFIT_BUILTIN_ENTRY
#define REFIT_PLUGIN_ENTRY_NAME REFIT_BUILTIN_ENTRY
#define REFIT_PLUGIN_ENTRY_VISIBILITY
#else
#define REFIT_PLUGIN_ENTRY_NAME refit_plugin_entry_v1
#define REFIT_PLUGIN_ENTRY_VISIBILITY REFIT_PLUGIN_EXPORT
#endif

namespace refit::sdk {

namespace detail {
inline const refit_host_api_t*& HostSlot() {
  static const refit_host_api_t* host = nullptr;
  return host;
}

inline int Fail(refit_error_t* err, StatusCode code, const std::string& message) {
  if (err != nullptr) {
    err->code = static_cast<int32_t>(code);
    std::snprintf(err->message, sizeof(err->message), "%s", message.c_str());
  }
  return static_cast<int>(code);
}

inline int Report(refit_error_t* err, const Status& st) {
  if (st.ok()) return REFIT_OK;
  return Fail(err, st.code(), st.message());
}

// Runs fn, turning any exception into REFIT_ERR_INTERNAL.
template <typename Fn>
int Guard(refit_error_t* err, Fn&& fn) noexcept {
  try {
    return fn();
  } catch (const std::exception& e) {
    return Fail(err, StatusCode::kInternal, std::string("plugin threw: ") + e.what());
  } catch (...) {
    return Fail(err, StatusCode::kInternal, "plugin threw a non-standard exception");
  }
}
}  // namespace detail

// The host that loaded this plugin (null before the entry point ran).
inline const refit_host_api_t* Host() { return detail::HostSlot(); }

inline void Log(refit_log_level_t level, const char* component, const std::string& message) {
  const refit_host_api_t* host = Host();
  if (host != nullptr && host->log != nullptr) host->log(level, component, message.c_str());
}

// Typed access to a component's config section through the host API.
class ConfigView {
 public:
  ConfigView(const refit_host_api_t* host, const refit_config_t* cfg) : host_(host), cfg_(cfg) {}

  Result<std::string> GetString(const char* key, std::string fallback) const {
    if (cfg_ == nullptr) return fallback;
    std::string buf(256, '\0');
    size_t len = 0;
    int rc = host_->config_get_string(cfg_, key, buf.data(), buf.size(), &len);
    if (rc == 0) return fallback;
    if (rc < 0) return TypeError(key, "a string");
    if (len + 1 > buf.size()) {
      buf.assign(len + 1, '\0');
      host_->config_get_string(cfg_, key, buf.data(), buf.size(), &len);
    }
    buf.resize(len);
    return buf;
  }
  Result<int64_t> GetInt(const char* key, int64_t fallback) const {
    if (cfg_ == nullptr) return fallback;
    int64_t v = 0;
    int rc = host_->config_get_int(cfg_, key, &v);
    if (rc < 0) return TypeError(key, "an integer");
    return rc == 0 ? fallback : v;
  }
  Result<bool> GetBool(const char* key, bool fallback) const {
    if (cfg_ == nullptr) return fallback;
    int v = 0;
    int rc = host_->config_get_bool(cfg_, key, &v);
    if (rc < 0) return TypeError(key, "a boolean");
    return rc == 0 ? fallback : v != 0;
  }
  Result<double> GetDouble(const char* key, double fallback) const {
    if (cfg_ == nullptr) return fallback;
    double v = 0;
    int rc = host_->config_get_double(cfg_, key, &v);
    if (rc < 0) return TypeError(key, "a number");
    return rc == 0 ? fallback : v;
  }
  Result<uint64_t> GetSize(const char* key, uint64_t fallback) const {
    if (cfg_ == nullptr) return fallback;
    uint64_t v = 0;
    int rc = host_->config_get_size(cfg_, key, &v);
    if (rc < 0) return TypeError(key, "a size (bytes or \"64MiB\")");
    return rc == 0 ? fallback : v;
  }
  // A list of strings (TOML array). The host API has no "is it set" for lists: an absent key and
  // an empty list both give fallback.
  Result<std::vector<std::string>> GetStringList(const char* key,
                                                 std::vector<std::string> fallback) const {
    if (cfg_ == nullptr) return fallback;
    std::vector<std::string> items;
    std::string buf(256, '\0');
    for (size_t i = 0;; ++i) {
      size_t len = 0;
      int rc = host_->config_get_list_item(cfg_, key, i, buf.data(), buf.size(), &len);
      if (rc < 0) return TypeError(key, "a list of strings");
      if (rc == 0) break;
      if (len + 1 > buf.size()) {
        buf.assign(len + 1, '\0');
        host_->config_get_list_item(cfg_, key, i, buf.data(), buf.size(), &len);
      }
      items.emplace_back(buf.data(), len);
    }
    if (items.empty()) return fallback;
    return items;
  }

 private:
  static Status TypeError(const char* key, const char* want) {
    return Status::Invalid(std::string("config key '") + key + "' must be " + want);
  }
  const refit_host_api_t* host_;
  const refit_config_t* cfg_;
};

// ------------------------------------------------------------------ requirements

// An encoding class: the op its records carry, a factory taking its config section, a bound of
// its output (a Result, or a plain uint64_t where 0 means "cannot encode"), encode and decode.
// Optional: static constexpr uint32_t kApplyCost (refit_component_t.apply_cost).
template <class Impl>
concept EncodingImpl = requires(const Impl& impl, const ConfigView& cfg,
                                const refit_encode_input_t& in, uint8_t* out, uint64_t cap,
                                const uint8_t* payload, const refit_decode_target_t& target) {
  { Impl::kOp } -> std::convertible_to<refit_op_t>;
  { Impl::Create(cfg) } -> std::same_as<Result<std::unique_ptr<Impl>>>;
  requires std::same_as<decltype(impl.MaxEncodedSize(in)), Result<uint64_t>> ||
      std::same_as<decltype(impl.MaxEncodedSize(in)), uint64_t>;
  { impl.Encode(in, out, cap) } -> std::same_as<Result<uint64_t>>;
  { impl.Decode(payload, cap, target) } -> std::same_as<Status>;
};

// A transport class (the ABI's keyed blob channel; Size gives nullopt for a missing key).
template <class Impl>
concept TransportImpl = requires(Impl& impl, const ConfigView& cfg, refit_transport_role_t role,
                                 const std::string& key, const uint8_t* data, uint8_t* buf,
                                 uint64_t n) {
  { Impl::Create(cfg, role, key) } -> std::same_as<Result<std::unique_ptr<Impl>>>;
  { impl.Put(key, data, n) } -> std::same_as<Status>;
  { impl.Size(key) } -> std::same_as<Result<std::optional<uint64_t>>>;
  { impl.Get(key, n, buf, n) } -> std::same_as<Status>;
  { impl.List(key) } -> std::same_as<Result<std::vector<std::pair<std::string, uint64_t>>>>;
  { impl.Remove(key) } -> std::same_as<Status>;
};

namespace detail {
template <class Impl>
concept HasApplyCost = requires {
  { Impl::kApplyCost } -> std::convertible_to<uint32_t>;
};

template <class Impl>
concept HasDecodeChanges = requires(const Impl& impl, const uint8_t* payload, uint64_t n,
                                    const refit_decode_target_t& old, uint64_t* positions,
                                    uint8_t* values) {
  { impl.DecodeChanges(payload, n, old, positions, values, n) } -> std::same_as<Result<uint64_t>>;
};

// The ABI 1.7 variant: DecodeChanges also takes the host's progress hook (ListProgress).
template <class Impl>
concept HasDecodeChangesWithProgress = requires(const Impl& impl, const uint8_t* payload,
                                                uint64_t n, const refit_decode_target_t& old,
                                                uint64_t* positions, uint8_t* values,
                                                const ListProgress& progress) {
  {
    impl.DecodeChanges(payload, n, old, positions, values, n, progress)
    } -> std::same_as<Result<uint64_t>>;
};

template <class Impl>
concept HasWait = requires(Impl& impl, uint32_t timeout_ms) {
  { impl.Wait(timeout_ms) } -> std::same_as<Result<bool>>;
};

template <class Impl>
constexpr uint32_t ApplyCost() {
  if constexpr (HasApplyCost<Impl>) {
    return static_cast<uint32_t>(Impl::kApplyCost);
  } else {
    return 0;
  }
}
}  // namespace detail

// ------------------------------------------------------------------ encodings

template <class Impl>
struct EncodingAdapter {
  static int Create(const refit_host_api_t* host, const refit_config_t* cfg, void** instance_p,
                    refit_error_t* err) {
    return detail::Guard(err, [&] {
      Result<std::unique_ptr<Impl>> made = Impl::Create(ConfigView(host, cfg));
      if (!made.ok()) return detail::Report(err, made.status());
      *instance_p = made.value().release();
      return static_cast<int>(REFIT_OK);
    });
  }
  static void Destroy(void* instance) { delete static_cast<Impl*>(instance); }
  static int MaxEncodedSize(void* instance, const refit_encode_input_t* in, uint64_t* size_p,
                            refit_error_t* err) {
    return detail::Guard(err, [&] {
      // A plain uint64_t bound passes through; the host treats 0 as "cannot encode".
      Result<uint64_t> n = static_cast<const Impl*>(instance)->MaxEncodedSize(*in);
      if (!n.ok()) return detail::Report(err, n.status());
      *size_p = n.value();
      return static_cast<int>(REFIT_OK);
    });
  }
  static int Encode(void* instance, const refit_encode_input_t* in, uint8_t* out, uint64_t cap,
                    uint64_t* size_p, refit_error_t* err) {
    return detail::Guard(err, [&] {
      Result<uint64_t> n = static_cast<const Impl*>(instance)->Encode(*in, out, cap);
      if (!n.ok()) return detail::Report(err, n.status());
      *size_p = n.value();
      return static_cast<int>(REFIT_OK);
    });
  }
  static int Decode(void* instance, const uint8_t* payload, uint64_t len,
                    const refit_decode_target_t* target, refit_error_t* err) {
    return detail::Guard(err, [&] {
      return detail::Report(err, static_cast<const Impl*>(instance)->Decode(payload, len, *target));
    });
  }
  static int DecodeChanges(void* instance, const uint8_t* payload, uint64_t len,
                           const refit_decode_target_t* old, refit_decoded_changes_t* changes,
                           refit_error_t* err) {
    return detail::Guard(err, [&] {
      if constexpr (detail::HasDecodeChanges<Impl> || detail::HasDecodeChangesWithProgress<Impl>) {
        const Impl& impl = *static_cast<const Impl*>(instance);
        auto* values = static_cast<uint8_t*>(changes->values);
        Result<uint64_t> n = [&] {
          if constexpr (detail::HasDecodeChangesWithProgress<Impl>) {
            return impl.DecodeChanges(payload, len, *old, changes->positions, values,
                                      changes->capacity, ListProgress::Of(*changes));
          } else {
            return impl.DecodeChanges(payload, len, *old, changes->positions, values,
                                      changes->capacity);
          }
        }();
        if (!n.ok()) return detail::Report(err, n.status());
        changes->count = n.value();
        return static_cast<int>(REFIT_OK);
      } else {
        (void)instance, (void)payload, (void)len, (void)old, (void)changes;
        return static_cast<int>(REFIT_ERR_UNSUPPORTED);
      }
    });
  }
  static const refit_encoding_vtable_t* Vtable() {
    static const refit_encoding_vtable_t vt = {
        sizeof(refit_encoding_vtable_t),
        static_cast<int32_t>(Impl::kOp),
        &Create,
        &Destroy,
        &MaxEncodedSize,
        &Encode,
        &Decode,
        detail::HasDecodeChanges<Impl> || detail::HasDecodeChangesWithProgress<Impl>
            ? &DecodeChanges
            : nullptr};
    return &vt;
  }
};

// ------------------------------------------------------------------ transports

template <class Impl>
struct TransportAdapter {
  static int Create(const refit_host_api_t* host, const refit_config_t* cfg, int32_t role,
                    const char* peer_id, void** instance_p, refit_error_t* err) {
    return detail::Guard(err, [&] {
      Result<std::unique_ptr<Impl>> made =
          Impl::Create(ConfigView(host, cfg), static_cast<refit_transport_role_t>(role),
                       std::string(peer_id != nullptr ? peer_id : ""));
      if (!made.ok()) return detail::Report(err, made.status());
      *instance_p = made.value().release();
      return static_cast<int>(REFIT_OK);
    });
  }
  static void Destroy(void* instance) { delete static_cast<Impl*>(instance); }
  static int Put(void* instance, const char* key, const uint8_t* data, uint64_t len,
                 refit_error_t* err) {
    return detail::Guard(err, [&] {
      return detail::Report(err, static_cast<Impl*>(instance)->Put(key, data, len));
    });
  }
  static int Size(void* instance, const char* key, uint64_t* size_p, int* found_p,
                  refit_error_t* err) {
    return detail::Guard(err, [&] {
      Result<std::optional<uint64_t>> r = static_cast<Impl*>(instance)->Size(key);
      if (!r.ok()) return detail::Report(err, r.status());
      *found_p = r.value().has_value() ? 1 : 0;
      *size_p = r.value().value_or(0);
      return static_cast<int>(REFIT_OK);
    });
  }
  static int Get(void* instance, const char* key, uint64_t offset, uint8_t* buf, uint64_t len,
                 refit_error_t* err) {
    return detail::Guard(err, [&] {
      return detail::Report(err, static_cast<Impl*>(instance)->Get(key, offset, buf, len));
    });
  }
  static int List(void* instance, const char* prefix, refit_list_cb cb, void* ctx,
                  refit_error_t* err) {
    return detail::Guard(err, [&] {
      Result<std::vector<std::pair<std::string, uint64_t>>> r =
          static_cast<Impl*>(instance)->List(prefix);
      if (!r.ok()) return detail::Report(err, r.status());
      for (const auto& [key, size] : r.value()) cb(ctx, key.c_str(), size);
      return static_cast<int>(REFIT_OK);
    });
  }
  static int Remove(void* instance, const char* key, refit_error_t* err) {
    return detail::Guard(
        err, [&] { return detail::Report(err, static_cast<Impl*>(instance)->Remove(key)); });
  }
  static int Wait(void* instance, uint32_t timeout_ms, int* changed_p, refit_error_t* err) {
    return detail::Guard(err, [&] {
      if constexpr (detail::HasWait<Impl>) {
        Result<bool> r = static_cast<Impl*>(instance)->Wait(timeout_ms);
        if (!r.ok()) return detail::Report(err, r.status());
        *changed_p = r.value() ? 1 : 0;
        return static_cast<int>(REFIT_OK);
      } else {
        (void)instance, (void)timeout_ms, (void)changed_p;
        return static_cast<int>(REFIT_ERR_UNSUPPORTED);
      }
    });
  }
  static const refit_transport_vtable_t* Vtable() {
    static const refit_transport_vtable_t vt = {sizeof(refit_transport_vtable_t),
                                                0,
                                                &Create,
                                                &Destroy,
                                                &Put,
                                                &Size,
                                                &Get,
                                                &List,
                                                &Remove,
                                                detail::HasWait<Impl> ? &Wait : nullptr};
    return &vt;
  }
};

// ------------------------------------------------------------------ layouts

// One canonical slice produced by a layout (owns its name).
struct Slice {
  std::string canonical_name;
  refit_slice_map_t map{};
};

// A tensor by name, dtype and shape (no data): what ListLocal takes and returns.
struct TensorSpec {
  std::string name;
  int32_t dtype = 0;  // refit_dtype_t
  std::vector<uint64_t> shape;
};

// A layout class. Optional (ABI 1.1; without it the layout cannot be used by `refit shard`):
//   Result<std::vector<TensorSpec>> ListLocal(const std::vector<TensorSpec>& canonical) const;
template <class Impl>
concept LayoutImpl = requires(const Impl& impl, const ConfigView& cfg, int rank,
                              const refit_local_tensor_t& local) {
  { Impl::Create(cfg, rank, rank) } -> std::same_as<Result<std::unique_ptr<Impl>>>;
  { impl.MapTensor(local) } -> std::same_as<Result<std::vector<Slice>>>;
};

template <class Impl>
struct LayoutAdapter {
  static constexpr bool kHasListLocal =
      requires(const Impl& impl, const std::vector<TensorSpec>& canonical) {
    { impl.ListLocal(canonical) } -> std::same_as<Result<std::vector<TensorSpec>>>;
  };
  static int Create(const refit_host_api_t* host, const refit_config_t* cfg, int32_t rank,
                    int32_t world, void** instance_p, refit_error_t* err) {
    return detail::Guard(err, [&] {
      Result<std::unique_ptr<Impl>> made = Impl::Create(ConfigView(host, cfg), rank, world);
      if (!made.ok()) return detail::Report(err, made.status());
      *instance_p = made.value().release();
      return static_cast<int>(REFIT_OK);
    });
  }
  static void Destroy(void* instance) { delete static_cast<Impl*>(instance); }
  static int MapTensor(void* instance, const refit_local_tensor_t* local, refit_slice_cb cb,
                       void* ctx, refit_error_t* err) {
    return detail::Guard(err, [&] {
      Result<std::vector<Slice>> r = static_cast<const Impl*>(instance)->MapTensor(*local);
      if (!r.ok()) return detail::Report(err, r.status());
      for (Slice& s : r.value()) {
        s.map.struct_size = sizeof(refit_slice_map_t);
        s.map.canonical_name = s.canonical_name.c_str();
        cb(ctx, &s.map);
      }
      return static_cast<int>(REFIT_OK);
    });
  }
  static int ListLocal(void* instance, const refit_local_tensor_t* canonical, size_t n_canonical,
                       refit_local_cb cb, void* ctx, refit_error_t* err) {
    return detail::Guard(err, [&] {
      std::vector<TensorSpec> specs(n_canonical);
      for (size_t i = 0; i < n_canonical; ++i) {
        const refit_local_tensor_t& c = canonical[i];
        if (c.name == nullptr || c.ndim > REFIT_MAX_DIMS) {
          return detail::Fail(
              err, StatusCode::kInvalidArgument,
              "canonical tensor " + std::to_string(i) + " has no name or more than 8 dims");
        }
        specs[i].name = c.name;
        specs[i].dtype = c.dtype;
        specs[i].shape.assign(c.shape, c.shape + c.ndim);
      }
      Result<std::vector<TensorSpec>> r = static_cast<const Impl*>(instance)->ListLocal(specs);
      if (!r.ok()) return detail::Report(err, r.status());
      for (const TensorSpec& t : r.value()) {
        if (t.shape.size() > REFIT_MAX_DIMS) {
          return detail::Fail(err, StatusCode::kInternal,
                              "local tensor '" + t.name + "' has more than 8 dims");
        }
        refit_local_tensor_t local{};
        local.struct_size = sizeof(local);
        local.dtype = t.dtype;
        local.name = t.name.c_str();
        local.ndim = static_cast<uint32_t>(t.shape.size());
        for (size_t d = 0; d < t.shape.size(); ++d) local.shape[d] = t.shape[d];
        cb(ctx, &local);
      }
      return static_cast<int>(REFIT_OK);
    });
  }
  static const refit_layout_vtable_t* Vtable() {
    if constexpr (kHasListLocal) {
      static const refit_layout_vtable_t vt = {
          sizeof(refit_layout_vtable_t), 0, &Create, &Destroy, &MapTensor, &ListLocal};
      return &vt;
    } else {
      static const refit_layout_vtable_t vt = {
          sizeof(refit_layout_vtable_t), 0, &Create, &Destroy, &MapTensor, nullptr};
      return &vt;
    }
  }
};

// ------------------------------------------------------------------ component rows

namespace detail {
template <class Impl>
constexpr void CheckEncoding() {
  static_assert(EncodingImpl<Impl>,
                "an encoding class needs: static constexpr refit_op_t kOp; static "
                "Result<std::unique_ptr<Impl>> Create(const ConfigView&); Result<uint64_t> (or "
                "uint64_t) MaxEncodedSize(const refit_encode_input_t&) const; Result<uint64_t> "
                "Encode(const refit_encode_input_t&, uint8_t*, uint64_t) const; Status "
                "Decode(const uint8_t*, uint64_t, const refit_decode_target_t&) const");
}
template <class Impl>
constexpr void CheckTransport() {
  static_assert(TransportImpl<Impl>,
                "a transport class needs: static Result<std::unique_ptr<Impl>> Create(const "
                "ConfigView&, refit_transport_role_t, const std::string& peer_id); Status "
                "Put(key, const uint8_t*, uint64_t); Result<std::optional<uint64_t>> Size(key); "
                "Status Get(key, uint64_t offset, uint8_t*, uint64_t len); "
                "Result<std::vector<std::pair<std::string, uint64_t>>> List(prefix); Status "
                "Remove(key)");
}
template <class Impl>
constexpr void CheckLayout() {
  static_assert(LayoutImpl<Impl>,
                "a layout class needs: static Result<std::unique_ptr<Impl>> Create(const "
                "ConfigView&, int rank, int world); Result<std::vector<Slice>> MapTensor(const "
                "refit_local_tensor_t&) const");
}

constexpr refit_component_t Row(refit_component_kind_t kind, const char* name,
                                const char* description, uint64_t capabilities,
                                const refit_config_key_t* keys, size_t n_keys, const void* vtable,
                                uint32_t apply_cost) {
  return refit_component_t{
      sizeof(refit_component_t),  kind,      name, description, capabilities, keys, n_keys, vtable,
      sizeof(refit_config_key_t), apply_cost};
}
}  // namespace detail

// Each Make* has a form without config keys (a zero-length array type is ill-formed, so the keyed
// form cannot default N to 0) and one taking &kKeys. Encodings without keys but with
// capabilities pass nullptr for the keys.
template <class Impl>
constexpr refit_component_t MakeEncoding(const char* name, const char* description,
                                         std::nullptr_t /*no keys*/ = nullptr,
                                         uint64_t capabilities = 0) {
  detail::CheckEncoding<Impl>();
  if constexpr (EncodingImpl<Impl>) {
    return detail::Row(REFIT_KIND_ENCODING, name, description, capabilities, nullptr, 0,
                       EncodingAdapter<Impl>::Vtable(), detail::ApplyCost<Impl>());
  } else {
    return refit_component_t{};
  }
}

template <class Impl, size_t N>
constexpr refit_component_t MakeEncoding(const char* name, const char* description,
                                         const refit_config_key_t (*keys)[N],
                                         uint64_t capabilities = 0) {
  detail::CheckEncoding<Impl>();
  if constexpr (EncodingImpl<Impl>) {
    return detail::Row(REFIT_KIND_ENCODING, name, description, capabilities, *keys, N,
                       EncodingAdapter<Impl>::Vtable(), detail::ApplyCost<Impl>());
  } else {
    return refit_component_t{};
  }
}

template <class Impl>
constexpr refit_component_t MakeTransport(const char* name, const char* description) {
  detail::CheckTransport<Impl>();
  if constexpr (TransportImpl<Impl>) {
    return detail::Row(REFIT_KIND_TRANSPORT, name, description, 0, nullptr, 0,
                       TransportAdapter<Impl>::Vtable(), 0);
  } else {
    return refit_component_t{};
  }
}

template <class Impl, size_t N>
constexpr refit_component_t MakeTransport(const char* name, const char* description,
                                          const refit_config_key_t (*keys)[N]) {
  detail::CheckTransport<Impl>();
  if constexpr (TransportImpl<Impl>) {
    return detail::Row(REFIT_KIND_TRANSPORT, name, description, 0, *keys, N,
                       TransportAdapter<Impl>::Vtable(), 0);
  } else {
    return refit_component_t{};
  }
}

template <class Impl>
constexpr refit_component_t MakeLayout(const char* name, const char* description) {
  detail::CheckLayout<Impl>();
  if constexpr (LayoutImpl<Impl>) {
    return detail::Row(REFIT_KIND_LAYOUT, name, description, 0, nullptr, 0,
                       LayoutAdapter<Impl>::Vtable(), 0);
  } else {
    return refit_component_t{};
  }
}

template <class Impl, size_t N>
constexpr refit_component_t MakeLayout(const char* name, const char* description,
                                       const refit_config_key_t (*keys)[N]) {
  detail::CheckLayout<Impl>();
  if constexpr (LayoutImpl<Impl>) {
    return detail::Row(REFIT_KIND_LAYOUT, name, description, 0, *keys, N,
                       LayoutAdapter<Impl>::Vtable(), 0);
  } else {
    return refit_component_t{};
  }
}

}  // namespace refit::sdk

// Defines the plugin's one exported entry point. Components are refit::sdk::Make*<...>(...) rows;
// pass config keys as &kMyKeys (a static const refit_config_key_t array).
#define REFIT_PLUGIN(plugin_name, plugin_version, ...) \
  REFIT_PLUGIN_WITH_FINI(plugin_name, plugin_version, nullptr, __VA_ARGS__)

// The same with a plugin-level fini (a void() function, or nullptr): the host calls it once, when
// the last object made from this plugin is gone and before the library is unloaded.
#define REFIT_PLUGIN_WITH_FINI(plugin_name, plugin_version, plugin_fini, ...)             \
  extern "C" REFIT_PLUGIN_ENTRY_VISIBILITY const refit_plugin_t* REFIT_PLUGIN_ENTRY_NAME( \
      const refit_host_api_t* host) {                                                     \
    static const refit_component_t kComponents[] = {__VA_ARGS__};                         \
    static const refit_plugin_t kPlugin = {sizeof(refit_plugin_t),                        \
                                           REFIT_ABI_MAJOR,                               \
                                           REFIT_ABI_MINOR,                               \
                                           plugin_name,                                   \
                                           plugin_version,                                \
                                           kComponents,                                   \
                                           sizeof(kComponents) / sizeof(kComponents[0]),  \
                                           plugin_fini};                                  \
    ::refit::sdk::detail::HostSlot() = host;                                              \
    return &kPlugin;                                                                      \
  }
