#include "layout/layout_plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

namespace refit::layouts {

namespace {
Piece Cut(std::string canonical, Shape canonical_shape, uint32_t dim, uint64_t canonical_start,
          uint64_t local_start, uint64_t count) {
  Piece p;
  p.canonical = std::move(canonical);
  p.canonical_shape = std::move(canonical_shape);
  p.dim = dim;
  p.canonical_start = canonical_start;
  p.local_start = local_start;
  p.count = count;
  return p;
}
}  // namespace

Piece Rows(std::string canonical, Shape canonical_shape, uint64_t canonical_start,
           uint64_t local_start, uint64_t count) {
  return Cut(std::move(canonical), std::move(canonical_shape), 0, canonical_start, local_start,
             count);
}

Piece Cols(std::string canonical, Shape canonical_shape, uint64_t canonical_start,
           uint64_t local_start, uint64_t count) {
  return Cut(std::move(canonical), std::move(canonical_shape), 1, canonical_start, local_start,
             count);
}

Piece Whole(std::string canonical, Shape canonical_shape, bool replicated, int owner) {
  uint64_t rows = canonical_shape.empty() ? 1 : canonical_shape[0];
  Piece p = Cut(std::move(canonical), std::move(canonical_shape), 0, 0, 0, rows);
  p.replicated = replicated;
  p.owner = owner;
  return p;
}

Piece VocabRows(std::string canonical, uint64_t vocab, uint64_t hidden, uint64_t per_rank,
                uint64_t t) {
  const uint64_t start = t * per_rank;
  const uint64_t count = start < vocab ? std::min(per_rank, vocab - start) : 0;
  return Rows(std::move(canonical), {vocab, hidden}, start, 0, count);
}

std::vector<Piece> GateUpRows(std::string gate, std::string up, uint64_t ffn, uint64_t hidden,
                              uint64_t tp, uint64_t t) {
  const uint64_t rows = ffn / tp;
  return {Rows(std::move(gate), {ffn, hidden}, t * rows, 0, rows),
          Rows(std::move(up), {ffn, hidden}, t * rows, rows, rows)};
}

Piece InputCols(std::string canonical, uint64_t out, uint64_t in, uint64_t tp, uint64_t t) {
  const uint64_t cols = in / tp;
  return Cols(std::move(canonical), {out, in}, t * cols, 0, cols);
}

std::vector<Piece> Shared(std::vector<Piece> pieces, bool replicated, int owner) {
  for (Piece& p : pieces) {
    p.replicated = replicated;
    p.owner = owner;
  }
  return pieces;
}

std::string ShapeString(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Result<std::vector<sdk::Slice>> SlicesFor(const LocalPlan& plan,
                                          const refit_local_tensor_t& local) {
  Shape shape(local.shape, local.shape + local.ndim);
  if (shape != plan.shape) {
    return Status::Invalid("local tensor '" + plan.name + "' has shape " + ShapeString(shape) +
                           ", the layout's config gives " + ShapeString(plan.shape));
  }
  std::vector<sdk::Slice> slices;
  for (const Piece& p : plan.pieces) {
    if (p.count == 0) continue;
    sdk::Slice s;
    s.canonical_name = p.canonical;
    s.map.ndim = static_cast<uint32_t>(p.canonical_shape.size());
    for (uint32_t d = 0; d < s.map.ndim; ++d) {
      s.map.canonical_shape[d] = p.canonical_shape[d];
      s.map.extent[d] = p.canonical_shape[d];
    }
    if (s.map.ndim > 0) {
      s.map.canonical_offset[p.dim] = p.canonical_start;
      s.map.local_offset[p.dim] = p.local_start;
      s.map.extent[p.dim] = p.count;
    }
    s.map.replicated = p.replicated ? 1 : 0;
    s.map.owner_rank = p.owner;
    slices.push_back(std::move(s));
  }
  return slices;
}

Result<std::vector<sdk::TensorSpec>> SelectLocal(const std::vector<LocalPlan>& candidates,
                                                 const std::vector<sdk::TensorSpec>& canonical) {
  std::map<std::string, const sdk::TensorSpec*> by_name;
  for (const sdk::TensorSpec& t : canonical) by_name[t.name] = &t;
  std::vector<sdk::TensorSpec> out;
  for (const LocalPlan& plan : candidates) {
    const sdk::TensorSpec* first = nullptr;
    const Piece* missing = nullptr;
    for (const Piece& p : plan.pieces) {
      auto it = by_name.find(p.canonical);
      if (it == by_name.end()) {
        if (missing == nullptr) missing = &p;
        continue;
      }
      const sdk::TensorSpec& t = *it->second;
      if (t.shape != p.canonical_shape) {
        return Status::Invalid("tensor '" + t.name + "' has shape " + ShapeString(t.shape) +
                               ", the layout's config expects " + ShapeString(p.canonical_shape));
      }
      if (first != nullptr && first->dtype != t.dtype) {
        return Status::Invalid("'" + plan.name + "' fuses '" + first->name + "' and '" + t.name +
                               "' of different dtypes");
      }
      if (first == nullptr) first = &t;
    }
    if (first == nullptr) continue;  // not given (another rank's, or a bias this model lacks)
    if (missing != nullptr) {
      if (first == nullptr) {
        return Status::Invalid("'" + plan.name + "' needs tensor '" + missing->canonical +
                               "', which the checkpoint lacks");
      }
      return Status::Invalid("'" + plan.name + "' needs tensor '" + missing->canonical +
                             "', which the checkpoint lacks (it has '" + first->name + "')");
    }
    out.push_back(sdk::TensorSpec{plan.name, first->dtype, plan.shape});
  }
  return out;
}

}  // namespace refit::layouts
