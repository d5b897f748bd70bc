#include "errors.h"

#include <string>

namespace refit::python {

void Check(const Status& status, Stage stage) {
  if (!status.ok()) throw StatusError(status, stage);
}

namespace {

// The class table lives in Python (refit._errors.from_status), so the mapping is read in one
// place; the translator only hands it the code and the message.
void SetPythonError(const StatusError& error) {
  try {
    py::object make = py::module_::import("refit._errors").attr("from_status");
    py::object exc = make(static_cast<int>(error.status().code()), error.status().message(),
                          error.stage() == Stage::kConfig);
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  } catch (py::error_already_set& e) {
    // refit._errors itself failed: keep refit's message, chained to the import error.
    e.restore();
    py::raise_from(PyExc_RuntimeError, error.status().message().c_str());
  }
}

}  // namespace

void RegisterErrors(py::module_& /*m*/) {
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& error) {
      SetPythonError(error);
    }
  });
}

}  // namespace refit::python
