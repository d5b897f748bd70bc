// The `_refit` extension: refit's Sender, Receiver, Config and offline deltas for Python. The
// public face is the `refit` package (python/refit/__init__.py), which turns named tensors into
// the (name, exporter, dtype) entries these bindings take.
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "errors.h"

PYBIND11_MODULE(_refit, m) {
  m.doc() = "refit's C++ core (use the `refit` package, not this module)";
  refit::python::RegisterErrors(m);
  refit::python::BindConfig(m);
  refit::python::BindStats(m);
  refit::python::BindEndpoints(m);
  refit::python::BindOffline(m);
}
