// libtorch adapter: refit tensor views over at::Tensors and whole torch::nn::Modules, so a C++
// trainer publishes its module and an inference engine attaches its own module to a receiver.
//
// This header declares libtorch's types and includes none of its headers (they cost seconds per
// translation unit): the caller already includes torch for its module, and only the adapter's
// one source file (torch_adapter.cc) compiles against them. Link refit::torch.
//
// Tensors are borrowed, never copied: a view is valid while its tensor's storage lives and is
// not reallocated. Only CPU, strided, contiguous tensors of refit's dtypes are accepted; anything
// else is an error naming the tensor.
#pragma once

#include <string>

#include "refit/export.h"
#include "refit/receiver.h"
#include "refit/sender.h"
#include "refit/status.h"
#include "refit/tensor.h"

namespace at {
class Tensor;  // torch::Tensor is the same class
}  // namespace at
namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace refit::torch_adapter {

// A view of `tensor`'s memory named `name`: bool, uint8, int8/16/32/64, float16, bfloat16,
// float32, float64 map to refit's dtypes; other dtypes, non-CPU, sparse or non-contiguous
// tensors are refused with a message naming `name`.
REFIT_API Result<TensorView> ViewOf(const at::Tensor& tensor, std::string name);

// Publishes the module's named parameters (recursively, dotted names as named_parameters()
// gives them: "fc1.weight") as the sender's next version.
REFIT_API Result<SyncStats> PublishModule(Sender& sender, const torch::nn::Module& module);

// Attaches the module's named parameters to the receiver: from now on every applied version is
// written straight into the parameters' memory (Receiver::Attach). The module must outlive the
// attachment and keep its parameters' storage (no .to() that reallocates them).
REFIT_API Status AttachModule(Receiver& receiver, torch::nn::Module& module);

}  // namespace refit::torch_adapter
