// The identity layout: every local tensor already is a whole canonical (HuggingFace) tensor.
#include <memory>
#include <string>
#include <vector>

#include "refit/sdk/plugin.hpp"

namespace {

class HfLayout {
 public:
  static refit::Result<std::unique_ptr<HfLayout>> Create(const refit::sdk::ConfigView& /*cfg*/,
                                                         int rank, int world) {
    if (world < 1 || rank < 0 || rank >= world) {
      return refit::Status::Invalid("rank " + std::to_string(rank) + " is outside world size " +
                                    std::to_string(world));
    }
    return std::make_unique<HfLayout>(rank);
  }

  explicit HfLayout(int rank) : rank_(rank) {}

  refit::Result<std::vector<refit::sdk::Slice>> MapTensor(const refit_local_tensor_t& local) const {
    if (local.name == nullptr) return refit::Status::Invalid("local tensor has no name");
    if (local.ndim > REFIT_MAX_DIMS) {
      return refit::Status::Invalid("tensor '" + std::string(local.name) + "' has " +
                                    std::to_string(local.ndim) + " dims (max " +
                                    std::to_string(REFIT_MAX_DIMS) + ")");
    }
    refit::sdk::Slice slice;
    slice.canonical_name = local.name;
    slice.map.ndim = local.ndim;
    for (uint32_t d = 0; d < local.ndim; ++d) {
      slice.map.canonical_shape[d] = local.shape[d];
      slice.map.extent[d] = local.shape[d];
      // canonical_offset and local_offset stay 0: the whole tensor maps onto itself.
    }
    slice.map.replicated = 0;
    slice.map.owner_rank = rank_;
    std::vector<refit::sdk::Slice> slices;
    slices.push_back(std::move(slice));
    return slices;
  }

  // Every rank holds every canonical tensor whole.
  refit::Result<std::vector<refit::sdk::TensorSpec>> ListLocal(
      const std::vector<refit::sdk::TensorSpec>& canonical) const {
    return canonical;
  }

 private:
  int rank_;
};

}  // namespace

REFIT_PLUGIN("hf", "0.1.0",
             refit::sdk::MakeLayout<HfLayout>("hf",
                                              "identity: each local tensor is one whole "
                                              "canonical tensor of the same name and shape"))
