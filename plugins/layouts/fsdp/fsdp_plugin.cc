// The FSDP2 / DTensor Shard(0) layout: every canonical tensor is split along dim 0 into `world`
// contiguous pieces with torch.chunk's rule (chunk = ceil(rows / world); the last ranks may hold
// fewer rows or none). Local names equal canonical names. A 0-d tensor cannot be split: every rank
// holds it and rank 0 sends it.
//
// A rank's row count does not determine the canonical one (rows 9 and 10 over 4 ranks both give
// rank 0 three rows), so map_tensor needs the canonical shapes: `shapes_from` names a safetensors
// file with them (the checkpoint the shards were cut from). list_local is given them.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "layout/layout_plan.h"
#include "layout/safetensors_shapes.h"
#include "refit/sdk/plugin.hpp"

namespace {

using refit::Result;
using refit::Status;
using refit::layouts::LocalPlan;
using refit::layouts::Shape;
using refit::sdk::TensorSpec;

const refit_config_key_t kKeys[] = {
    {"shapes_from", REFIT_CFG_STRING, nullptr,
     "safetensors file whose header gives the canonical shapes (the checkpoint the shards were "
     "cut from); needed to map local tensors"},
};

class FsdpLayout {
 public:
  static Result<std::unique_ptr<FsdpLayout>> Create(const refit::sdk::ConfigView& cfg, int rank,
                                                    int world) {
    if (world < 1 || rank < 0 || rank >= world) {
      return Status::Invalid("rank " + std::to_string(rank) + " is outside world size " +
                             std::to_string(world));
    }
    auto layout = std::make_unique<FsdpLayout>();
    layout->rank_ = static_cast<uint64_t>(rank);
    layout->world_ = static_cast<uint64_t>(world);
    REFIT_ASSIGN_OR_RAISE(layout->shapes_from_, cfg.GetString("shapes_from", ""));
    if (!layout->shapes_from_.empty()) {
      REFIT_ASSIGN_OR_RAISE(layout->shapes_,
                            refit::layouts::ReadSafetensorsShapes(layout->shapes_from_));
    }
    return layout;
  }

  Result<std::vector<refit::sdk::Slice>> MapTensor(const refit_local_tensor_t& local) const {
    if (local.name == nullptr) return Status::Invalid("local tensor has no name");
    if (shapes_from_.empty()) {
      return Status::Invalid(
          "the canonical shape is unknown: set shapes_from to the checkpoint "
          "the shards were cut from");
    }
    auto it = shapes_.find(local.name);
    if (it == shapes_.end()) {
      return Status::Invalid("no tensor of that name in " + shapes_from_ + " (shapes_from)");
    }
    return refit::layouts::SlicesFor(Plan(local.name, it->second), local);
  }

  Result<std::vector<TensorSpec>> ListLocal(const std::vector<TensorSpec>& canonical) const {
    std::vector<TensorSpec> out;
    for (const TensorSpec& t : canonical) {
      out.push_back(TensorSpec{t.name, t.dtype, Plan(t.name, t.shape).shape});
    }
    return out;
  }

 private:
  LocalPlan Plan(const std::string& name, const Shape& canonical_shape) const {
    if (canonical_shape.empty()) {
      return LocalPlan{name, {}, {refit::layouts::Whole(name, {}, world_ > 1, 0)}};
    }
    const uint64_t rows = canonical_shape[0];
    const uint64_t chunk = refit::layouts::CeilDiv(rows, world_);
    const uint64_t start = std::min(rank_ * chunk, rows);
    const uint64_t count = std::min(chunk, rows - start);
    Shape local_shape = canonical_shape;
    local_shape[0] = count;
    refit::layouts::Piece piece = refit::layouts::Rows(name, canonical_shape, start, 0, count);
    piece.owner = static_cast<int>(rank_);
    return LocalPlan{name, std::move(local_shape), {std::move(piece)}};
  }

  uint64_t rank_ = 0;
  uint64_t world_ = 1;
  std::string shapes_from_;
  std::map<std::string, Shape> shapes_;
};

}  // namespace

REFIT_PLUGIN("fsdp", "0.1.0",
             refit::sdk::MakeLayout<FsdpLayout>(
                 "fsdp",
                 "FSDP2 / DTensor Shard(0): each tensor split along dim 0 into world contiguous "
                 "chunks of ceil(rows / world) rows",
                 &kKeys))
