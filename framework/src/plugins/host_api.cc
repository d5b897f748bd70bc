// The host API plugins call back through (logging, config lookup), and the translation of a
// plugin's C error into a Status.
#include <cstring>
#include <string>

#include "config/config_internal.h"
#include "refit/log.h"
#include "refit/registry.h"

namespace refit {

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

}  // namespace refit
