// Tensor views over raw memory: the framework never owns model memory it did not allocate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "refit/dtype.h"
#include "refit/export.h"
#include "refit/status.h"

struct DLManagedTensor;  // dlpack.h; only tensor.cc needs the definition

namespace refit {

using Shape = std::vector<uint64_t>;

// Product of dims, or an error if it overflows uint64 (shapes come from untrusted files).
REFIT_API Result<uint64_t> NumElements(const Shape& shape);
REFIT_API std::string ShapeToString(const Shape& shape);

// A contiguous, row-major, non-owning view of one tensor's bits.
struct REFIT_API TensorView {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
  void* data = nullptr;  // may be read-only memory when viewed through ConstTensorView semantics

  uint64_t num_elements() const;  // shapes of views are validated when made: no overflow here
  uint64_t nbytes() const { return num_elements() * SizeOf(dtype); }
  uint8_t* bytes() const { return static_cast<uint8_t*>(data); }
};

// A tensor described without its data (manifests, Layout::ListLocal).
struct TensorSpec {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
};

// A DLPack tensor as a view. Only CPU, contiguous (strides null or row-major) tensors are accepted
// here; the view borrows the memory, the caller keeps the DLManagedTensor alive.
REFIT_API Result<TensorView> ViewFromDLPack(const DLManagedTensor* tensor, std::string name);

// A DLManagedTensor borrowing the view's memory; its deleter frees only the DLPack wrapper.
REFIT_API Result<DLManagedTensor*> ToDLPack(const TensorView& view);

}  // namespace refit
