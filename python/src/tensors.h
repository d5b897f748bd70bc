// Tensors handed over from Python: views of their memory, plus the Python objects that own that
// memory, held for as long as the views are used.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <vector>

#include "refit/tensor.h"

namespace refit::python {

namespace py = pybind11;

// What refit._tensors.entries() makes of a named tensor: (name, exporter, dtype) where exporter
// is a DLPack capsule ("dltensor", not consumed: the capsule keeps its producer's memory alive)
// or an object with the buffer protocol (a numpy array), and dtype is refit's dtype name (None:
// the capsule's own dtype).
//
// Built and destroyed with the GIL held; views() may be used without it. Zero copy: every view
// points into its producer's own memory.
class TensorSet {
 public:
  // `writable`: the memory will be written (a receiver's attach): read-only buffers are refused.
  // Errors (StatusError) name the tensor.
  static TensorSet FromEntries(const py::list& entries, bool writable);

  const std::vector<TensorView>& views() const { return views_; }

 private:
  std::vector<TensorView> views_;
  std::vector<py::object> owners_;
  std::vector<std::unique_ptr<py::buffer_info>> buffers_;  // released with the GIL held
};

}  // namespace refit::python
