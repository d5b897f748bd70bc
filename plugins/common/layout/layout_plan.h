// A layout's description of one local tensor: which runs of which canonical tensors it holds and
// who sends them. map_tensor, list_local and `refit shard` all derive from the same plan, so the
// three can never disagree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "refit/plugin_abi.h"
#include "refit/sdk/plugin.hpp"
#include "refit/status.h"

namespace refit::layouts {

using Shape = std::vector<uint64_t>;

// local[..., local_start : local_start + count, ...] == canonical[..., canonical_start : ..., ...]
// along `dim`; every other dim is whole and the same size in both. A piece with count 0 holds no
// element (a rank whose vocab rows are all padding) but still names the canonical tensor the local
// one is cut from.
struct Piece {
  std::string canonical;
  Shape canonical_shape;
  uint32_t dim = 0;
  uint64_t canonical_start = 0;
  uint64_t local_start = 0;
  uint64_t count = 0;
  bool replicated = false;  // other ranks hold the same run
  int owner = 0;            // the one rank that sends it
};

struct LocalPlan {
  std::string name;
  Shape shape;
  std::vector<Piece> pieces;
};

// Pieces cut along dim 0 (rows) or dim 1 (columns) of a canonical tensor.
Piece Rows(std::string canonical, Shape canonical_shape, uint64_t canonical_start,
           uint64_t local_start, uint64_t count);
Piece Cols(std::string canonical, Shape canonical_shape, uint64_t canonical_start,
           uint64_t local_start, uint64_t count);
// The whole canonical tensor; `replicated` when other ranks hold it too, sent by `owner`.
Piece Whole(std::string canonical, Shape canonical_shape, bool replicated, int owner);

// Tensor-parallel building blocks shared by the megatron and vllm layouts, for TP rank t of tp.
// Vocab-parallel rows: rank t holds padded rows [t * per_rank, (t + 1) * per_rank) of a
// [vocab, hidden] tensor; rows past the vocab are padding, part of no canonical tensor.
Piece VocabRows(std::string canonical, uint64_t vocab, uint64_t hidden, uint64_t per_rank,
                uint64_t t);
// A fused column-parallel [gate; up]: rank t's ffn/tp rows of gate, then the same rows of up.
std::vector<Piece> GateUpRows(std::string gate, std::string up, uint64_t ffn, uint64_t hidden,
                              uint64_t tp, uint64_t t);
// A row-parallel linear [out, in]: rank t holds columns [t * in/tp, (t + 1) * in/tp).
Piece InputCols(std::string canonical, uint64_t out, uint64_t in, uint64_t tp, uint64_t t);
// Marks pieces as replicated (or not) and sent by owner.
std::vector<Piece> Shared(std::vector<Piece> pieces, bool replicated, int owner);

// The slices map_tensor emits for a plan (pieces without elements are left out); the local shape
// must equal the plan's. (Errors need not name the layout or tensor: the host prefixes both.)
Result<std::vector<sdk::Slice>> SlicesFor(const LocalPlan& plan, const refit_local_tensor_t& local);

// list_local's core: the candidates (in shard-file order) cut from the given canonical tensors.
// The caller may give any subset of the checkpoint (a sender rank describes only the tensors it
// sends), so a candidate none of whose canonical tensors are given is left out. A fused candidate
// with only some of its tensors given, a canonical shape that differs from the plan's and a fused
// tensor cut from tensors of different dtypes are errors.
Result<std::vector<sdk::TensorSpec>> SelectLocal(const std::vector<LocalPlan>& candidates,
                                                 const std::vector<sdk::TensorSpec>& canonical);

std::string ShapeString(const Shape& shape);

// (a + b - 1) / b for b > 0.
inline uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }
inline uint64_t RoundUp(uint64_t a, uint64_t b) { return CeilDiv(a, b) * b; }

}  // namespace refit::layouts
