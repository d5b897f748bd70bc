// The C++ handles around plugin instances (Encoding, Transport, Layout): each call goes through
// the plugin's vtable, and its results are checked before the framework trusts them.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>

#include "plugins/describe.h"
#include "plugins/plugin_library.h"
#include "refit/kernels/buffer.h"
#include "refit/registry.h"

namespace refit {

using internal::Describe;

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

bool Encoding::can_decode_changes() const {
  return vtable_->struct_size >=
             offsetof(refit_encoding_vtable_t, decode_changes) + sizeof(vtable_->decode_changes) &&
         vtable_->decode_changes != nullptr;
}

Status Encoding::DecodeChanges(const uint8_t* payload, uint64_t len,
                               const refit_decode_target_t& old,
                               refit_decoded_changes_t* changes) const {
  if (!can_decode_changes()) {
    return Status::Unsupported(Describe(*info_) + ": no decode_changes");
  }
  refit_error_t err{};
  changes->count = 0;
  int rc = vtable_->decode_changes(instance_, payload, len, &old, changes, &err);
  if (rc != REFIT_OK) return StatusFromPlugin(rc, err, Describe(*info_) + ": decode_changes");
  if (changes->count > changes->capacity) {
    return Status::Internal(Describe(*info_) + ": decode_changes listed " +
                            std::to_string(changes->count) + " changes into room for " +
                            std::to_string(changes->capacity));
  }
  return Status::OK();
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
  // A payload read whole (a receiver's early read): its pages are huge where they can be, as a
  // fetched payload's are (GetVerified).
  std::vector<uint8_t> data;
  kernels::ReserveWithHugePages(data, static_cast<size_t>(*size));
  data.resize(static_cast<size_t>(*size));
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

bool Transport::can_wait() const {
  return vtable_->struct_size >= offsetof(refit_transport_vtable_t, wait) + sizeof(vtable_->wait) &&
         vtable_->wait != nullptr;
}

Result<bool> Transport::Wait(uint32_t timeout_ms) {
  if (!can_wait()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
    return false;
  }
  refit_error_t err{};
  int changed = 0;
  int rc = vtable_->wait(instance_, timeout_ms, &changed, &err);
  if (rc != REFIT_OK) return StatusFromPlugin(rc, err, Describe(*info_) + ": wait");
  return changed != 0;
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

}  // namespace refit
