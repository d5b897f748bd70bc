// The pieces of the _refit extension module, each bound by its own file.
#pragma once

#include <pybind11/pybind11.h>

namespace refit::python {

namespace py = pybind11;

void BindConfig(py::module_& m);     // config.cc: refit.Config
void BindStats(py::module_& m);      // stats.cc: SyncStats, ApplyStats, DiffStats, Ack
void BindEndpoints(py::module_& m);  // endpoints.cc: the Sender and Receiver cores
void BindOffline(py::module_& m);    // offline.cc: diff, apply, model_digest

}  // namespace refit::python
