// Tensor views and DLPack interop.
#include "refit/tensor.h"

#include <dlpack/dlpack.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace refit {

Result<uint64_t> NumElements(const Shape& shape) {
  // Any zero dim means no elements, however large the other dims are.
  for (uint64_t dim : shape) {
    if (dim == 0) return uint64_t{0};
  }
  uint64_t count = 1;
  for (uint64_t dim : shape) {
    if (__builtin_mul_overflow(count, dim, &count)) {
      return Status::Invalid("shape " + ShapeToString(shape) + " has more than 2^64 elements");
    }
  }
  return count;
}

std::string ShapeToString(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  out += "]";
  return out;
}

uint64_t TensorView::num_elements() const {
  uint64_t count = 1;
  for (uint64_t dim : shape) count *= dim;
  return count;
}

Result<TensorView> ViewFromDLPack(const DLManagedTensor* tensor, std::string name) {
  const std::string what = "DLPack tensor '" + name + "'";
  if (tensor == nullptr) return Status::Invalid(what + ": null DLManagedTensor");
  const DLTensor& t = tensor->dl_tensor;
  if (t.device.device_type != kDLCPU) {
    return Status::Unsupported(what + ": only CPU tensors are supported (device type " +
                               std::to_string(static_cast<int>(t.device.device_type)) + ")");
  }
  if (t.dtype.lanes != 1) {
    return Status::Unsupported(what + ": vector dtypes (lanes=" + std::to_string(t.dtype.lanes) +
                               ") are not supported");
  }
  Result<DType> dtype = DTypeFromDLPack(t.dtype.code, t.dtype.bits);
  if (!dtype.ok()) return dtype.status().WithContext(what);
  if (t.ndim < 0 || t.ndim > REFIT_MAX_DIMS) {
    return Status::Unsupported(what + ": " + std::to_string(t.ndim) + " dims (at most " +
                               std::to_string(REFIT_MAX_DIMS) + " supported)");
  }
  if (t.ndim > 0 && t.shape == nullptr) return Status::Invalid(what + ": null shape");

  TensorView view;
  view.name = std::move(name);
  view.dtype = *dtype;
  view.shape.reserve(static_cast<size_t>(t.ndim));
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0) {
      return Status::Invalid(what + ": negative dim " + std::to_string(t.shape[i]));
    }
    view.shape.push_back(static_cast<uint64_t>(t.shape[i]));
  }
  Result<uint64_t> elements = NumElements(view.shape);
  if (!elements.ok()) return elements.status().WithContext(what);
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(*elements, static_cast<uint64_t>(SizeOf(view.dtype)), &nbytes)) {
    return Status::Invalid(what + ": shape " + ShapeToString(view.shape) + " overflows bytes");
  }

  // Row-major check. Dims of extent 1 may carry any stride (frameworks differ there), and an
  // empty tensor has no layout to speak of.
  if (t.strides != nullptr && *elements > 0) {
    int64_t expected = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (t.shape[i] != 1 && t.strides[i] != expected) {
        return Status::Unsupported(what + ": not contiguous (dim " + std::to_string(i) +
                                   " has stride " + std::to_string(t.strides[i]) + ", expected " +
                                   std::to_string(expected) + ")");
      }
      expected *= t.shape[i];  // cannot overflow: the element count fitted above
    }
  }
  if (t.data == nullptr && *elements > 0) return Status::Invalid(what + ": null data pointer");
  view.data = t.data == nullptr ? nullptr : static_cast<uint8_t*>(t.data) + t.byte_offset;
  return view;
}

namespace {

// The DLManagedTensor and the shape it points to, freed together by the deleter.
struct DLPackHolder {
  DLManagedTensor managed{};
  std::vector<int64_t> shape;
};

void DeleteDLPackHolder(DLManagedTensor* self) {
  if (self != nullptr) delete static_cast<DLPackHolder*>(self->manager_ctx);
}

}  // namespace

Result<DLManagedTensor*> ToDLPack(const TensorView& view) {
  const DTypeInfo* info = FindDType(static_cast<int32_t>(view.dtype));
  if (info == nullptr) return Status::Invalid("tensor '" + view.name + "': invalid dtype");
  if (!DTypeFromDLPack(info->dlpack_code, info->dlpack_bits).ok()) {
    return Status::Unsupported("tensor '" + view.name + "': dtype " + std::string(info->name) +
                               " has no DLPack type code in this dlpack version");
  }
  if (view.shape.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return Status::Invalid("tensor '" + view.name + "': too many dims");
  }
  auto holder = std::make_unique<DLPackHolder>();
  holder->shape.reserve(view.shape.size());
  for (uint64_t dim : view.shape) {
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Status::Invalid("tensor '" + view.name + "': dim " + std::to_string(dim) +
                             " does not fit DLPack's int64");
    }
    holder->shape.push_back(static_cast<int64_t>(dim));
  }
  DLTensor& t = holder->managed.dl_tensor;
  t.data = view.data;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = static_cast<int>(view.shape.size());
  t.dtype = DLDataType{info->dlpack_code, info->dlpack_bits, 1};
  t.shape = holder->shape.data();
  t.strides = nullptr;  // compact row-major
  t.byte_offset = 0;
  holder->managed.manager_ctx = holder.get();
  holder->managed.deleter = &DeleteDLPackHolder;
  return &holder.release()->managed;
}

}  // namespace refit
