// refit's Status -> Python exceptions (refit.Error and its subclasses, python/refit/_errors.py).
//
// Binding code throws StatusError; the translator registered by RegisterErrors turns it into the
// Python exception of its status code, carrying the C++ message unchanged.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <utility>

#include "refit/status.h"

namespace refit::python {

namespace py = pybind11;

// Where an error came from: an invalid or missing config (while making a Config, a Sender or a
// Receiver) raises refit.ConfigError; the same codes elsewhere raise their own classes.
enum class Stage { kConfig, kRun };

class StatusError : public std::exception {
 public:
  StatusError(Status status, Stage stage) : status_(std::move(status)), stage_(stage) {}
  const char* what() const noexcept override { return status_.message().c_str(); }
  const Status& status() const { return status_; }
  Stage stage() const { return stage_; }

 private:
  Status status_;
  Stage stage_;
};

// Throws StatusError when the status is not OK.
void Check(const Status& status, Stage stage = Stage::kRun);

template <typename T>
T Unwrap(Result<T> result, Stage stage = Stage::kRun) {
  Check(result.status(), stage);
  return std::move(result).value();
}

void RegisterErrors(py::module_& m);

}  // namespace refit::python
