#include "plugins/layout_map.h"

#include <algorithm>
#include <set>

namespace refit::internal {

Result<std::vector<LocalSlice>> MapLocalTensors(const Layout& layout,
                                                const std::vector<TensorSpec>& tensors) {
  std::vector<LocalSlice> out;
  for (const TensorSpec& t : tensors) {
    if (t.shape.size() > REFIT_MAX_DIMS) {
      return Status::Unsupported("tensor '" + t.name + "' has more than " +
                                 std::to_string(REFIT_MAX_DIMS) + " dims");
    }
    refit_local_tensor_t local{};
    local.struct_size = sizeof(local);
    local.dtype = static_cast<int32_t>(t.dtype);
    local.name = t.name.c_str();
    local.ndim = static_cast<uint32_t>(t.shape.size());
    for (size_t d = 0; d < t.shape.size(); ++d) local.shape[d] = t.shape[d];
    REFIT_ASSIGN_OR_RAISE(std::vector<SliceMap> maps, layout.MapTensor(local));
    for (SliceMap& m : maps) {
      if (m.map.ndim != t.shape.size()) {
        return Status::Internal("layout '" + layout.name() + "' mapped '" + t.name +
                                "' with a different number of dims");
      }
      out.push_back({t.name, std::move(m)});
    }
  }
  return out;
}

namespace {

enum class Overlap { kNone, kInside, kPartial };

Overlap Classify(const refit_slice_map_t& sm, const RecordHeader& r) {
  bool inside = true;
  for (uint32_t d = 0; d < sm.ndim; ++d) {
    const uint64_t lo = sm.canonical_offset[d];
    const uint64_t hi = lo + sm.extent[d];
    const uint64_t rlo = r.box_offset[d];
    const uint64_t rhi = rlo + r.box_extent[d];
    if (rhi <= lo || rlo >= hi) return Overlap::kNone;
    if (rlo < lo || rhi > hi) inside = false;
  }
  return inside ? Overlap::kInside : Overlap::kPartial;
}

}  // namespace

TensorResolver SliceResolver(std::vector<LocalSlice> slices,
                             std::map<std::string, TensorView*> locals, bool skip_foreign) {
  std::multimap<std::string, LocalSlice> by_canonical;
  for (LocalSlice& s : slices) by_canonical.emplace(s.map.canonical_name, std::move(s));
  return [by_canonical = std::move(by_canonical), locals = std::move(locals),
          skip_foreign](const RecordHeader& r) -> Result<ApplyTarget> {
    auto range = by_canonical.equal_range(r.tensor);
    if (range.first == range.second) {
      return Status::NotFound("tensor '" + r.tensor + "' does not exist in the receiver's model");
    }
    bool partial = false;
    for (auto it = range.first; it != range.second; ++it) {
      const refit_slice_map_t& sm = it->second.map.map;
      if (sm.ndim != r.box_offset.size() || sm.ndim != r.shape.size()) {
        return Status::Corrupt("record has " + std::to_string(r.box_offset.size()) +
                               " dims, the receiver's '" + r.tensor + "' has " +
                               std::to_string(sm.ndim));
      }
      if (!std::equal(r.shape.begin(), r.shape.end(), sm.canonical_shape)) {
        Shape mine(sm.canonical_shape, sm.canonical_shape + sm.ndim);
        return Status::Corrupt("record shape " + ShapeToString(r.shape) +
                               " differs from the receiver's " + ShapeToString(mine));
      }
      const Overlap o = Classify(sm, r);
      if (o == Overlap::kPartial) partial = true;
      if (o != Overlap::kInside) continue;
      auto local = locals.find(it->second.local_name);
      if (local == locals.end()) {
        return Status::Internal("layout maps '" + r.tensor + "' to unknown local tensor '" +
                                it->second.local_name + "'");
      }
      Box box;
      box.extent = r.box_extent;
      for (uint32_t d = 0; d < sm.ndim; ++d) {
        box.offset.push_back(r.box_offset[d] - sm.canonical_offset[d] + sm.local_offset[d]);
      }
      return ApplyTarget{local->second, std::move(box)};
    }
    if (partial) {
      return Status::Invalid("record box of '" + r.tensor +
                             "' straddles this receiver's shard boundary (set "
                             "sender.receiver_layout so that the sender cuts records there)");
    }
    if (skip_foreign) return ApplyTarget{};
    return Status::NotFound("no local slice of '" + r.tensor + "' holds the record's box");
  };
}

Result<ShardCuts> ReceiverShardCuts(const Registry& registry, const Config* config,
                                    const std::string& layout_name, int world,
                                    const std::vector<TensorSpec>& canonical) {
  std::map<std::string, const TensorSpec*> wanted;
  for (const TensorSpec& t : canonical) wanted[t.name] = &t;
  std::map<std::string, std::vector<std::set<uint64_t>>> bounds;
  for (int rank = 0; rank < world; ++rank) {
    REFIT_ASSIGN_OR_RAISE(
        std::unique_ptr<Layout> layout,
        registry.CreateLayout(layout_name, rank, world, config, "layout." + layout_name));
    REFIT_ASSIGN_OR_RAISE(std::vector<TensorSpec> locals, layout->ListLocal(canonical));
    REFIT_ASSIGN_OR_RAISE(std::vector<LocalSlice> slices, MapLocalTensors(*layout, locals));
    for (const LocalSlice& s : slices) {
      auto it = wanted.find(s.map.canonical_name);
      if (it == wanted.end()) continue;
      const refit_slice_map_t& sm = s.map.map;
      auto& dims = bounds[s.map.canonical_name];
      dims.resize(sm.ndim);
      for (uint32_t d = 0; d < sm.ndim; ++d) {
        for (uint64_t b : {sm.canonical_offset[d], sm.canonical_offset[d] + sm.extent[d]}) {
          if (b > 0 && b < sm.canonical_shape[d]) dims[d].insert(b);
        }
      }
    }
  }
  ShardCuts cuts;
  for (auto& [name, dims] : bounds) {
    auto& out = cuts[name];
    for (const auto& d : dims) out.emplace_back(d.begin(), d.end());
  }
  return cuts;
}

std::vector<Box> CutBox(const Box& box, const std::vector<std::vector<uint64_t>>& cuts) {
  std::vector<Box> out = {box};
  for (size_t d = 0; d < cuts.size() && d < box.offset.size(); ++d) {
    std::vector<Box> next;
    for (const Box& b : out) {
      uint64_t lo = b.offset[d];
      const uint64_t end = b.offset[d] + b.extent[d];
      for (uint64_t c : cuts[d]) {
        if (c <= lo || c >= end) continue;
        Box piece = b;
        piece.offset[d] = lo;
        piece.extent[d] = c - lo;
        next.push_back(std::move(piece));
        lo = c;
      }
      Box last = b;
      last.offset[d] = lo;
      last.extent[d] = end - lo;
      next.push_back(std::move(last));
    }
    out = std::move(next);
  }
  return out;
}

}  // namespace refit::internal
