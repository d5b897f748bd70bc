// The C API (<refit.h>) over the C++ Sender and Receiver. Every entry point runs its body inside
// Guard(): whatever the C++ side reports (a Status, or an exception that should never happen)
// becomes a status code plus a message, so neither exceptions nor C++ types cross the ABI.
#include <refit.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "refit/config.h"
#include "refit/receiver.h"
#include "refit/sender.h"
#include "refit/status.h"
#include "refit/tensor.h"

struct refit_sender {
  std::unique_ptr<refit::Sender> impl;
  mutable std::string error;  // the handle's most recent call's message
};

struct refit_receiver {
  std::unique_ptr<refit::Receiver> impl;
  mutable std::string error;
};

namespace refit {
namespace {

static_assert(static_cast<int32_t>(StatusCode::kOk) == REFIT_OK);
static_assert(static_cast<int32_t>(StatusCode::kInvalidArgument) == REFIT_ERR_INVALID);
static_assert(static_cast<int32_t>(StatusCode::kNotFound) == REFIT_ERR_NOT_FOUND);
static_assert(static_cast<int32_t>(StatusCode::kTimeout) == REFIT_ERR_TIMEOUT);
static_assert(static_cast<int32_t>(StatusCode::kInternal) == REFIT_ERR_INTERNAL);

thread_local std::string t_last_error;

// Records the outcome of one call for refit_last_error() and the handle's getter.
refit_status_t Report(const Status& status, std::string* handle_error) noexcept {
  try {
    t_last_error = status.ok() ? std::string() : status.message();
    if (handle_error != nullptr) *handle_error = t_last_error;
  } catch (...) {  // out of memory for the message: the code still tells the class
    t_last_error.clear();
    if (handle_error != nullptr) handle_error->clear();
  }
  return static_cast<refit_status_t>(status.code());
}

// Runs `body` (returning Status) with every exception turned into kInternal.
template <typename Body>
refit_status_t Guard(std::string* handle_error, Body&& body) noexcept {
  Status status;
  try {
    status = body();
  } catch (const std::bad_alloc&) {
    status = Status::Internal("out of memory");
  } catch (const std::exception& e) {
    status = Status::Internal(std::string("unexpected exception: ") + e.what());
  } catch (...) {
    status = Status::Internal("unexpected exception");
  }
  return Report(status, handle_error);
}

Status CheckOut(const void* out, const char* what) {
  if (out == nullptr) return Status::Invalid(std::string(what) + " is NULL");
  return Status::OK();
}

// A stats struct the caller sized: at least its struct_size field.
template <typename T>
Status CheckStats(const T* stats, const char* type_name) {
  if (stats == nullptr || stats->struct_size >= sizeof(uint32_t)) return Status::OK();
  return Status::Invalid(std::string(type_name) + ".struct_size is " +
                         std::to_string(stats->struct_size) + ": set it to sizeof(" + type_name +
                         ")");
}

// Writes the fields of `full` that fit in the caller's struct_size, keeping that size.
template <typename T>
void FillStats(T full, T* out) {
  if (out == nullptr) return;
  full.struct_size = out->struct_size;
  std::memcpy(out, &full, std::min<size_t>(out->struct_size, sizeof(T)));
}

Result<Config> ConfigFrom(const char* text, bool is_path) {
  if (text == nullptr) return Status::Invalid(is_path ? "config path is NULL" : "TOML is NULL");
  if (is_path) return Config::FromFile(text);
  return Config::FromString(text, "<toml>");
}

Result<TensorView> ViewOf(const refit_tensor_t& t, size_t index) {
  if (t.name == nullptr) {
    return Status::Invalid("tensor " + std::to_string(index) + ": name is NULL");
  }
  const std::string where = "tensor '" + std::string(t.name) + "'";
  if (FindDType(t.dtype) == nullptr) {
    return Status::Invalid(where + ": unknown dtype code " + std::to_string(t.dtype));
  }
  if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr)) {
    return Status::Invalid(where + ": ndim " + std::to_string(t.ndim) + " without a shape");
  }
  TensorView view{t.name, static_cast<DType>(t.dtype), {}, t.data};
  for (int32_t d = 0; d < t.ndim; ++d) {
    if (t.shape[d] < 0) {
      return Status::Invalid(where + ": negative dim " + std::to_string(t.shape[d]));
    }
    view.shape.push_back(static_cast<uint64_t>(t.shape[d]));
  }
  REFIT_ASSIGN_OR_RAISE(uint64_t elements, NumElements(view.shape));
  if (elements != 0 && t.data == nullptr) return Status::Invalid(where + ": data is NULL");
  return view;
}

Result<std::vector<TensorView>> ViewsOf(const refit_tensor_t* tensors, size_t count) {
  if (tensors == nullptr && count != 0) return Status::Invalid("tensors is NULL");
  std::vector<TensorView> views;
  views.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    REFIT_ASSIGN_OR_RAISE(TensorView view, ViewOf(tensors[i], i));
    views.push_back(std::move(view));
  }
  return views;
}

Result<std::vector<TensorView>> ViewsOf(const DLManagedTensor* const* tensors,
                                        const char* const* names, size_t count) {
  if ((tensors == nullptr || names == nullptr) && count != 0) {
    return Status::Invalid("DLPack tensors or names is NULL");
  }
  std::vector<TensorView> views;
  views.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    if (names[i] == nullptr) {
      return Status::Invalid("DLPack tensor " + std::to_string(i) + ": name is NULL");
    }
    REFIT_ASSIGN_OR_RAISE(TensorView view, ViewFromDLPack(tensors[i], names[i]));
    views.push_back(std::move(view));
  }
  return views;
}

refit_sync_stats_t ToC(const SyncStats& s) {
  refit_sync_stats_t c{};
  c.full = s.full ? 1 : 0;
  c.version = s.version;
  c.base_version = s.base_version.value_or(0);
  c.tensors = s.tensors;
  c.total_elements = s.counters.total_elements;
  c.changed_elements = s.counters.changed_elements;
  c.records = s.counters.records;
  c.payloads = s.payloads;
  c.payload_bytes = s.payload_bytes;
  c.wait_seconds = s.wait_seconds;
  c.total_seconds = s.total_seconds;
  return c;
}

refit_apply_stats_t ToC(const ApplyStats& s) {
  refit_apply_stats_t c{};
  c.full = s.full ? 1 : 0;
  c.version = s.version;
  c.changed_elements = s.counters.changed_elements;
  c.records = s.counters.records;
  c.payloads = s.payloads;
  c.payload_bytes = s.payload_bytes;
  c.fetch_seconds = s.fetch_seconds;
  c.apply_seconds = s.apply_seconds;
  c.total_seconds = s.total_seconds;
  return c;
}

refit_status_t NewSender(const char* text, bool is_path, int32_t rank, int32_t world,
                         refit_sender_t** sender_p) {
  return Guard(nullptr, [&]() -> Status {
    REFIT_RETURN_NOT_OK(CheckOut(sender_p, "sender_p"));
    REFIT_ASSIGN_OR_RAISE(Config config, ConfigFrom(text, is_path));
    REFIT_ASSIGN_OR_RAISE(std::unique_ptr<Sender> sender, Sender::Make(config, rank, world));
    *sender_p = new refit_sender{std::move(sender), {}};
    return Status::OK();
  });
}

refit_status_t NewReceiver(const char* text, bool is_path, refit_receiver_t** receiver_p) {
  return Guard(nullptr, [&]() -> Status {
    REFIT_RETURN_NOT_OK(CheckOut(receiver_p, "receiver_p"));
    REFIT_ASSIGN_OR_RAISE(Config config, ConfigFrom(text, is_path));
    REFIT_ASSIGN_OR_RAISE(std::unique_ptr<Receiver> receiver, Receiver::Make(config));
    *receiver_p = new refit_receiver{std::move(receiver), {}};
    return Status::OK();
  });
}

// The body of both publish functions, once the views are made.
Status PublishViews(refit_sender_t* sender, const Result<std::vector<TensorView>>& views,
                    refit_sync_stats_t* stats_p) {
  REFIT_RETURN_NOT_OK(CheckStats(stats_p, "refit_sync_stats_t"));
  if (!views.ok()) return views.status();
  REFIT_ASSIGN_OR_RAISE(SyncStats stats, sender->impl->Publish(views.value()));
  FillStats(ToC(stats), stats_p);
  return Status::OK();
}

Status AttachViews(refit_receiver_t* receiver, const Result<std::vector<TensorView>>& views,
                   const uint64_t* loaded_version) {
  if (!views.ok()) return views.status();
  std::optional<uint64_t> loaded;
  if (loaded_version != nullptr) loaded = *loaded_version;
  return receiver->impl->Attach(views.value(), loaded);
}

}  // namespace
}  // namespace refit

using refit::Guard;
using refit::Status;

extern "C" {

const char* refit_status_name(refit_status_t status) {
  if (status < REFIT_OK || status > REFIT_ERR_INTERNAL) return "unknown";
  return refit::StatusCodeName(static_cast<refit::StatusCode>(status));
}

const char* refit_last_error(void) { return refit::t_last_error.c_str(); }

refit_status_t refit_sender_new_from_file(const char* path, int32_t rank, int32_t world,
                                          refit_sender_t** sender_p) {
  return refit::NewSender(path, true, rank, world, sender_p);
}

refit_status_t refit_sender_new_from_toml(const char* toml, int32_t rank, int32_t world,
                                          refit_sender_t** sender_p) {
  return refit::NewSender(toml, false, rank, world, sender_p);
}

refit_status_t refit_sender_publish(refit_sender_t* sender, const refit_tensor_t* tensors,
                                    size_t count, refit_sync_stats_t* stats_p) {
  if (sender == nullptr) return refit::Report(Status::Invalid("sender is NULL"), nullptr);
  return Guard(&sender->error, [&] {
    return refit::PublishViews(sender, refit::ViewsOf(tensors, count), stats_p);
  });
}

refit_status_t refit_sender_publish_dlpack(refit_sender_t* sender,
                                           const struct DLManagedTensor* const* tensors,
                                           const char* const* names, size_t count,
                                           refit_sync_stats_t* stats_p) {
  if (sender == nullptr) return refit::Report(Status::Invalid("sender is NULL"), nullptr);
  return Guard(&sender->error, [&] {
    return refit::PublishViews(sender, refit::ViewsOf(tensors, names, count), stats_p);
  });
}

refit_status_t refit_sender_wait(refit_sender_t* sender, double timeout_seconds) {
  if (sender == nullptr) return refit::Report(Status::Invalid("sender is NULL"), nullptr);
  return Guard(&sender->error, [&] { return sender->impl->WaitAndAdvance(timeout_seconds); });
}

refit_status_t refit_sender_version(const refit_sender_t* sender, uint64_t* version_p) {
  if (sender == nullptr) return refit::Report(Status::Invalid("sender is NULL"), nullptr);
  return Guard(&sender->error, [&]() -> Status {
    REFIT_RETURN_NOT_OK(refit::CheckOut(version_p, "version_p"));
    *version_p = sender->impl->published_version();
    return Status::OK();
  });
}

const char* refit_sender_last_error(const refit_sender_t* sender) {
  return sender == nullptr ? "sender is NULL" : sender->error.c_str();
}

void refit_sender_free(refit_sender_t* sender) { delete sender; }

refit_status_t refit_receiver_new_from_file(const char* path, refit_receiver_t** receiver_p) {
  return refit::NewReceiver(path, true, receiver_p);
}

refit_status_t refit_receiver_new_from_toml(const char* toml, refit_receiver_t** receiver_p) {
  return refit::NewReceiver(toml, false, receiver_p);
}

refit_status_t refit_receiver_attach(refit_receiver_t* receiver, const refit_tensor_t* tensors,
                                     size_t count, const uint64_t* loaded_version) {
  if (receiver == nullptr) return refit::Report(Status::Invalid("receiver is NULL"), nullptr);
  return Guard(&receiver->error, [&] {
    return refit::AttachViews(receiver, refit::ViewsOf(tensors, count), loaded_version);
  });
}

refit_status_t refit_receiver_attach_dlpack(refit_receiver_t* receiver,
                                            const struct DLManagedTensor* const* tensors,
                                            const char* const* names, size_t count,
                                            const uint64_t* loaded_version) {
  if (receiver == nullptr) return refit::Report(Status::Invalid("receiver is NULL"), nullptr);
  return Guard(&receiver->error, [&] {
    return refit::AttachViews(receiver, refit::ViewsOf(tensors, names, count), loaded_version);
  });
}

refit_status_t refit_receiver_poll(refit_receiver_t* receiver, int32_t* applied_p,
                                   refit_apply_stats_t* stats_p) {
  if (receiver == nullptr) return refit::Report(Status::Invalid("receiver is NULL"), nullptr);
  return Guard(&receiver->error, [&]() -> Status {
    REFIT_RETURN_NOT_OK(refit::CheckOut(applied_p, "applied_p"));
    REFIT_RETURN_NOT_OK(refit::CheckStats(stats_p, "refit_apply_stats_t"));
    REFIT_ASSIGN_OR_RAISE(std::optional<refit::ApplyStats> stats, receiver->impl->PollOnce());
    *applied_p = stats.has_value() ? 1 : 0;
    if (stats.has_value()) refit::FillStats(refit::ToC(*stats), stats_p);
    return Status::OK();
  });
}

refit_status_t refit_receiver_wait(refit_receiver_t* receiver, uint32_t timeout_ms,
                                   int32_t* woke_p) {
  if (receiver == nullptr) return refit::Report(Status::Invalid("receiver is NULL"), nullptr);
  return Guard(&receiver->error, [&]() -> Status {
    REFIT_RETURN_NOT_OK(refit::CheckOut(woke_p, "woke_p"));
    REFIT_ASSIGN_OR_RAISE(bool woke, receiver->impl->WaitForArrival(timeout_ms));
    *woke_p = woke ? 1 : 0;
    return Status::OK();
  });
}

refit_status_t refit_receiver_version(const refit_receiver_t* receiver, uint64_t* version_p) {
  if (receiver == nullptr) return refit::Report(Status::Invalid("receiver is NULL"), nullptr);
  return Guard(&receiver->error, [&]() -> Status {
    REFIT_RETURN_NOT_OK(refit::CheckOut(version_p, "version_p"));
    *version_p = receiver->impl->version();
    return Status::OK();
  });
}

const char* refit_receiver_last_error(const refit_receiver_t* receiver) {
  return receiver == nullptr ? "receiver is NULL" : receiver->error.c_str();
}

void refit_receiver_free(refit_receiver_t* receiver) { delete receiver; }

}  // extern "C"
