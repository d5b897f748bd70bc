#include "tensors.h"

#include <cstdint>
#include <string>
#include <utility>

#include "errors.h"
#include "refit/dtype.h"

namespace refit::python {

namespace {

TensorView FromCapsule(const py::capsule& capsule, std::string name) {
  const char* capsule_name = capsule.name();
  if (capsule_name == nullptr || std::string(capsule_name) != "dltensor") {
    Check(Status::Invalid("tensor '" + name + "': DLPack capsule already consumed ('" +
                          (capsule_name ? capsule_name : "") + "'), export the tensor again"));
  }
  const auto* managed = static_cast<const DLManagedTensor*>(capsule.get_pointer());
  return Unwrap(ViewFromDLPack(managed, std::move(name)));
}

// Row-major check of a buffer's strides (in bytes); dims of extent 1 may carry any stride.
bool RowMajor(const py::buffer_info& info) {
  int64_t expected = info.itemsize;
  for (py::ssize_t i = info.ndim - 1; i >= 0; --i) {
    if (info.shape[i] != 1 && info.strides[i] != expected) return false;
    expected *= info.shape[i];
  }
  return true;
}

TensorView FromBuffer(const py::buffer_info& info, std::string name, DType dtype, bool writable) {
  const std::string what = "tensor '" + name + "'";
  if (info.itemsize != static_cast<py::ssize_t>(SizeOf(dtype))) {
    Check(Status::Invalid(what + ": " + std::to_string(info.itemsize) + "-byte elements are not " +
                          std::string(NameOf(dtype))));
  }
  if (info.size > 0 && !RowMajor(info)) {
    Check(Status::Unsupported(what + ": not contiguous (refit reads and writes the tensor's own " +
                              "row-major memory; pass a contiguous copy to publish)"));
  }
  if (writable && info.readonly) {
    Check(Status::Invalid(what + ": read-only memory cannot be attached to a receiver"));
  }
  TensorView view;
  view.name = std::move(name);
  view.dtype = dtype;
  for (py::ssize_t dim : info.shape) view.shape.push_back(static_cast<uint64_t>(dim));
  view.data = info.ptr;
  return view;
}

DType DTypeOf(const py::handle& name, const std::string& tensor) {
  const std::string text = name.cast<std::string>();
  Result<DType> dtype = DTypeFromName(text);
  if (!dtype.ok()) {
    Check(Status::Unsupported("tensor '" + tensor + "': dtype '" + text + "' is not refit's"));
  }
  return *dtype;
}

}  // namespace

TensorSet TensorSet::FromEntries(const py::list& entries, bool writable) {
  TensorSet set;
  set.views_.reserve(entries.size());
  for (const py::handle& entry : entries) {
    auto tuple = entry.cast<py::tuple>();
    std::string name = tuple[0].cast<std::string>();
    py::object exporter = tuple[1];
    py::object dtype_name = tuple[2];
    TensorView view;
    if (py::isinstance<py::capsule>(exporter)) {
      view = FromCapsule(exporter.cast<py::capsule>(), name);
      if (!dtype_name.is_none()) {
        DType dtype = DTypeOf(dtype_name, name);
        if (SizeOf(dtype) != SizeOf(view.dtype)) {
          Check(Status::Invalid("tensor '" + name + "': " + std::string(NameOf(view.dtype)) +
                                " memory cannot be read as " + std::string(NameOf(dtype))));
        }
        view.dtype = dtype;
      }
    } else {
      auto info = std::make_unique<py::buffer_info>(exporter.cast<py::buffer>().request());
      view = FromBuffer(*info, name, DTypeOf(dtype_name, name), writable);
      set.buffers_.push_back(std::move(info));
    }
    set.views_.push_back(std::move(view));
    set.owners_.push_back(std::move(exporter));
  }
  return set;
}

}  // namespace refit::python
