// The only translation unit of refit that includes libtorch's headers (see torch_adapter.h).
#include "refit/torch_adapter.h"

#include <torch/torch.h>

#include <exception>
#include <optional>
#include <utility>
#include <vector>

namespace refit::torch_adapter {
namespace {

std::optional<DType> DTypeOf(at::ScalarType type) {
  switch (type) {
    case at::kBool:
      return DType::kBool;
    case at::kByte:
      return DType::kU8;
    case at::kChar:
      return DType::kI8;
    case at::kShort:
      return DType::kI16;
    case at::kInt:
      return DType::kI32;
    case at::kLong:
      return DType::kI64;
    case at::kHalf:
      return DType::kF16;
    case at::kBFloat16:
      return DType::kBF16;
    case at::kFloat:
      return DType::kF32;
    case at::kDouble:
      return DType::kF64;
    default:
      return std::nullopt;
  }
}

Result<TensorView> ViewOfUnguarded(const at::Tensor& tensor, std::string name) {
  const std::string where = "tensor '" + name + "'";
  if (!tensor.defined()) return Status::Invalid(where + ": undefined tensor");
  if (!tensor.device().is_cpu()) {
    return Status::Unsupported(where + ": on device " + tensor.device().str() +
                               ", only CPU tensors can be viewed (copy it to the CPU first)");
  }
  if (tensor.layout() != at::kStrided) return Status::Unsupported(where + ": not a strided tensor");
  if (!tensor.is_contiguous()) {
    return Status::Invalid(where + ": not contiguous (strides " + c10::str(tensor.strides()) +
                           "); pass .contiguous()");
  }
  std::optional<DType> dtype = DTypeOf(tensor.scalar_type());
  if (!dtype) {
    return Status::Unsupported(where + ": dtype " +
                               std::string(c10::toString(tensor.scalar_type())) +
                               " has no refit dtype");
  }
  TensorView view{std::move(name), *dtype, {}, tensor.data_ptr()};
  for (int64_t dim : tensor.sizes()) view.shape.push_back(static_cast<uint64_t>(dim));
  return view;
}

// libtorch reports through exceptions (c10::Error); refit's callers get a Status.
template <typename Body>
auto Guarded(const char* what, Body&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const std::exception& e) {
    return Status::Internal(std::string(what) + ": " + e.what());
  } catch (...) {
    return Status::Internal(std::string(what) + ": unknown exception");
  }
}

Result<std::vector<TensorView>> ParameterViews(const torch::nn::Module& module) {
  std::vector<TensorView> views;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    REFIT_ASSIGN_OR_RAISE(TensorView view, ViewOfUnguarded(item.value(), item.key()));
    views.push_back(std::move(view));
  }
  return views;
}

}  // namespace

Result<TensorView> ViewOf(const at::Tensor& tensor, std::string name) {
  return Guarded("view of a torch tensor",
                 [&] { return ViewOfUnguarded(tensor, std::move(name)); });
}

Result<SyncStats> PublishModule(Sender& sender, const torch::nn::Module& module) {
  return Guarded("publish a torch module", [&]() -> Result<SyncStats> {
    REFIT_ASSIGN_OR_RAISE(std::vector<TensorView> views, ParameterViews(module));
    return sender.Publish(views);
  });
}

Status AttachModule(Receiver& receiver, torch::nn::Module& module) {
  return Guarded("attach a torch module", [&]() -> Status {
    REFIT_ASSIGN_OR_RAISE(std::vector<TensorView> views, ParameterViews(module));
    return receiver.Attach(views);
  });
}

}  // namespace refit::torch_adapter
