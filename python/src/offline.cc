// Offline deltas between safetensors files (refit.diff / refit.apply) and the model digest.
#include "refit/offline.h"

#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "bindings.h"
#include "errors.h"
#include "refit/registry.h"
#include "tensors.h"

namespace refit::python {

namespace {

// The plugins of `config` (and the shipped ones); null config: the shipped ones only.
std::shared_ptr<Registry> Plugins(const Config* config) {
  return Unwrap(LoadRegistry(config), Stage::kConfig);
}

DiffStats Diff(const std::string& base, const std::string& next, const std::string& out,
               const std::string& encoding, const Config* config) {
  py::gil_scoped_release release;
  std::shared_ptr<Registry> plugins = Plugins(config);
  return Unwrap(DiffFiles(base, next, out, encoding, *plugins, config));
}

ApplyStats Apply(const std::string& base, const std::string& delta, const std::string& out,
                 const Config* config) {
  py::gil_scoped_release release;
  std::shared_ptr<Registry> plugins = Plugins(config);
  return Unwrap(ApplyFile(base, delta, out, *plugins, config));
}

uint64_t Digest(const py::list& entries) {
  TensorSet tensors = TensorSet::FromEntries(entries, /*writable=*/false);
  py::gil_scoped_release release;
  return ModelDigest(tensors.views());
}

}  // namespace

void BindOffline(py::module_& m) {
  m.def("diff", &Diff, py::arg("base"), py::arg("new"), py::arg("out"), py::arg("encoding"),
        py::arg("config"));
  m.def("apply", &Apply, py::arg("base"), py::arg("delta"), py::arg("out"), py::arg("config"));
  m.def("model_digest", &Digest, py::arg("entries"));
}

}  // namespace refit::python
