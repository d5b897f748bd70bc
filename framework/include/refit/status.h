// Status / Result<T>: the one error style of refit (no exceptions inside the library).
//
// Header-only on purpose: the plugin SDK uses it too, and plugins never link the core library.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

namespace refit {

// Error classes. Values are part of the plugin C ABI (refit_error_t::code), never renumber.
enum class StatusCode : int32_t {
  kOk = 0,
  kInvalidArgument = 1,  // caller passed something malformed (bad flag, bad config value)
  kNotFound = 2,         // a file, key, tensor, plugin or symbol does not exist
  kIoError = 3,          // the OS refused a read/write/fsync/rename
  kCorrupt = 4,          // bytes failed validation: truncated, bad checksum, out-of-range offsets
  kUnsupported = 5,      // valid but not implemented here (dtype, ABI version, encoding feature)
  kVersionMismatch = 6,  // a delta's base is not what the receiver holds: need a full sync
  kAlreadyExists = 7,    // duplicate plugin/component name, version already published
  kTimeout = 8,          // waited for acks/commits longer than configured
  kInternal = 9,         // a bug or a plugin that broke its contract
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status OK() { return Status(); }
  static Status Invalid(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
  static Status Corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
  static Status Unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
  static Status VersionMismatch(std::string m) {
    return {StatusCode::kVersionMismatch, std::move(m)};
  }
  static Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
  static Status Timeout(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "context: message" so errors read outermost-first, e.g. "apply delta.st: record 3: ...".
  Status WithContext(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + ": " + message_);
  }
  std::string ToString() const { return ok() ? "OK" : message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : storage_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : storage_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(storage_).ok()) {
      storage_ = Status::Internal("Result constructed from an OK status without a value");
    }
  }

  bool ok() const { return std::holds_alternative<T>(storage_); }
  Status status() const { return ok() ? Status::OK() : std::get<Status>(storage_); }
  T& value() & { return std::get<T>(storage_); }
  const T& value() const& { return std::get<T>(storage_); }
  T&& value() && { return std::get<T>(std::move(storage_)); }
  T& operator*() & { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T ValueOr(T fallback) const { return ok() ? value() : std::move(fallback); }

 private:
  std::variant<T, Status> storage_;
};

inline const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kIoError:
      return "io error";
    case StatusCode::kCorrupt:
      return "corrupt";
    case StatusCode::kUnsupported:
      return "unsupported";
    case StatusCode::kVersionMismatch:
      return "version mismatch";
    case StatusCode::kAlreadyExists:
      return "already exists";
    case StatusCode::kTimeout:
      return "timeout";
    case StatusCode::kInternal:
      return "internal";
  }
  return "unknown";
}

}  // namespace refit

#define REFIT_CONCAT_INNER(a, b) a##b
#define REFIT_CONCAT(a, b) REFIT_CONCAT_INNER(a, b)

// Return the status from the enclosing function if it is not OK.
#define REFIT_RETURN_NOT_OK(expr)          \
  do {                                     \
    ::refit::Status _refit_st = (expr);    \
    if (!_refit_st.ok()) return _refit_st; \
  } while (0)

#define REFIT_ASSIGN_OR_RAISE_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                               \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

// REFIT_ASSIGN_OR_RAISE(auto x, MakeX()); declares/assigns x or returns the error.
#define REFIT_ASSIGN_OR_RAISE(lhs, rexpr) \
  REFIT_ASSIGN_OR_RAISE_IMPL(REFIT_CONCAT(_refit_res_, __LINE__), lhs, rexpr)
