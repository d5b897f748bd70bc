// Synthetic HuggingFace-style checkpoints and the checks every layout must pass: exact cover of the
// canonical elements by the slices ranks send (one owner per replicated slice), map_tensor agreeing
// with list_local, and a shard -> canonical round trip that is bit for bit. Public API only, so the
// layout suite can be installed; the refit tree's own layout tests use these helpers too.
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "refit/config.h"
#include "refit/dtype.h"
#include "refit/registry.h"
#include "refit/tensor.h"

namespace refit::conformance {

// A model description, in the units of the layouts' config keys.
struct ModelDesc {
  uint64_t layers = 2;
  uint64_t heads = 4;
  uint64_t kv_heads = 4;
  uint64_t head_dim = 4;
  uint64_t hidden = 16;
  uint64_t ffn = 24;
  uint64_t vocab = 200;
  uint64_t experts = 0;  // > 0: every layer is MoE
  uint64_t moe_ffn = 8;
  bool tie = false;
  bool qk_norm = false;
  bool qkv_bias = false;

  // The [layout.<name>] keys describing this model.
  std::string Toml() const {
    return "num_layers = " + std::to_string(layers) + "\nnum_heads = " + std::to_string(heads) +
           "\nnum_kv_heads = " + std::to_string(kv_heads) +
           "\nhead_dim = " + std::to_string(head_dim) + "\nhidden = " + std::to_string(hidden) +
           "\nffn = " + std::to_string(ffn) + "\nvocab = " + std::to_string(vocab) +
           "\nnum_experts = " + std::to_string(experts) + "\nmoe_ffn = " + std::to_string(moe_ffn) +
           "\ntie_word_embeddings = " + (tie ? "true" : "false") + "\n";
  }
};

struct CanonicalTensor {
  std::string name;
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;

  uint64_t elements() const {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    return n;
  }
};

// Every element's bits are distinct within its tensor (f32: a model-wide counter; bf16 norms: the
// element index), so a misplaced element cannot go unnoticed.
inline std::vector<CanonicalTensor> MakeCheckpoint(const ModelDesc& m) {
  std::vector<CanonicalTensor> out;
  uint32_t counter = 1;
  auto add = [&](std::string name, Shape shape, DType dtype = DType::kF32) {
    CanonicalTensor t{std::move(name), dtype, std::move(shape), {}};
    const uint64_t n = t.elements();
    t.bytes.resize(n * SizeOf(dtype));
    for (uint64_t i = 0; i < n; ++i) {
      if (dtype == DType::kBF16) {
        const uint16_t bits = static_cast<uint16_t>(i + 1);
        std::memcpy(&t.bytes[2 * i], &bits, 2);
      } else {
        const uint32_t bits = counter++;
        std::memcpy(&t.bytes[4 * i], &bits, 4);
      }
    }
    out.push_back(std::move(t));
  };
  const uint64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  add("model.embed_tokens.weight", {m.vocab, m.hidden});
  for (uint64_t l = 0; l < m.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {m.hidden}, DType::kBF16);
    add(p + "self_attn.q_proj.weight", {q, m.hidden});
    add(p + "self_attn.k_proj.weight", {kv, m.hidden});
    add(p + "self_attn.v_proj.weight", {kv, m.hidden});
    if (m.qkv_bias) {
      add(p + "self_attn.q_proj.bias", {q});
      add(p + "self_attn.k_proj.bias", {kv});
      add(p + "self_attn.v_proj.bias", {kv});
    }
    if (m.qk_norm) {
      add(p + "self_attn.q_norm.weight", {m.head_dim}, DType::kBF16);
      add(p + "self_attn.k_norm.weight", {m.head_dim}, DType::kBF16);
    }
    add(p + "self_attn.o_proj.weight", {m.hidden, q});
    add(p + "post_attention_layernorm.weight", {m.hidden}, DType::kBF16);
    if (m.experts == 0) {
      add(p + "mlp.gate_proj.weight", {m.ffn, m.hidden});
      add(p + "mlp.up_proj.weight", {m.ffn, m.hidden});
      add(p + "mlp.down_proj.weight", {m.hidden, m.ffn});
    } else {
      add(p + "mlp.gate.weight", {m.experts, m.hidden});
      for (uint64_t e = 0; e < m.experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        add(x + "gate_proj.weight", {m.moe_ffn, m.hidden});
        add(x + "up_proj.weight", {m.moe_ffn, m.hidden});
        add(x + "down_proj.weight", {m.hidden, m.moe_ffn});
      }
    }
  }
  add("model.norm.weight", {m.hidden}, DType::kBF16);
  if (!m.tie) add("lm_head.weight", {m.vocab, m.hidden});
  return out;
}

inline std::vector<TensorView> Views(std::vector<CanonicalTensor>& tensors) {
  std::vector<TensorView> views;
  for (CanonicalTensor& t : tensors) views.push_back({t.name, t.dtype, t.shape, t.bytes.data()});
  return views;
}

inline std::vector<TensorSpec> Specs(const std::vector<CanonicalTensor>& tensors) {
  std::vector<TensorSpec> specs;
  for (const CanonicalTensor& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  return specs;
}

inline const CanonicalTensor* FindCanonical(const std::vector<CanonicalTensor>& tensors,
                                            const std::string& name) {
  for (const CanonicalTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// Writes tensors as a safetensors file (for layouts that read the canonical shapes from one).
inline Status WriteCheckpointFile(const std::string& path,
                                  const std::vector<CanonicalTensor>& tensors) {
  std::string header = "{";
  uint64_t offset = 0;
  for (const CanonicalTensor& t : tensors) {
    if (header.size() > 1) header += ",";
    std::string dtype(NameOf(t.dtype));
    for (char& c : dtype) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    header += "\"" + t.name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d) {
      header += (d ? "," : "") + std::to_string(t.shape[d]);
    }
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + t.bytes.size()) + "]}";
    offset += t.bytes.size();
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return Status::IoError("cannot create '" + path + "'");
  uint8_t size[8];
  for (int b = 0; b < 8; ++b) size[b] = static_cast<uint8_t>(uint64_t{header.size()} >> (8 * b));
  bool ok = std::fwrite(size, 1, 8, f) == 8 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size();
  for (const CanonicalTensor& t : tensors) {
    ok = ok && std::fwrite(t.bytes.data(), 1, t.bytes.size(), f) == t.bytes.size();
  }
  ok = std::fclose(f) == 0 && ok;
  return ok ? Status::OK() : Status::IoError("cannot write '" + path + "'");
}

// An n-d box of a row-major tensor.
struct SliceBox {
  Shape offset;
  Shape extent;
};

inline SliceBox CanonicalBox(const refit_slice_map_t& m) {
  SliceBox b;
  for (uint32_t d = 0; d < m.ndim; ++d) {
    b.offset.push_back(m.canonical_offset[d]);
    b.extent.push_back(m.extent[d]);
  }
  return b;
}

inline SliceBox LocalBox(const refit_slice_map_t& m) {
  SliceBox b;
  for (uint32_t d = 0; d < m.ndim; ++d) {
    b.offset.push_back(m.local_offset[d]);
    b.extent.push_back(m.extent[d]);
  }
  return b;
}

inline uint64_t BoxElementCount(const SliceBox& box) {
  uint64_t n = 1;
  for (uint64_t e : box.extent) n *= e;
  return n;
}

// Whether box lies inside a tensor of shape (same rank, no overflow).
inline bool BoxInside(const Shape& shape, const SliceBox& box) {
  if (box.offset.size() != shape.size()) return false;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (box.offset[d] > shape[d] || box.extent[d] > shape[d] - box.offset[d]) return false;
  }
  return true;
}

// Calls fn(row-major element index in the tensor) for each element of box, in the box's row-major
// order. Element by element on purpose: the check must not share the framework's run logic.
inline void ForEachBoxElement(const Shape& shape, const SliceBox& box,
                              const std::function<void(uint64_t)>& fn) {
  const uint64_t n = BoxElementCount(box);
  const size_t rank = shape.size();
  std::vector<uint64_t> index(rank, 0);
  for (uint64_t k = 0; k < n; ++k) {
    uint64_t flat = 0;
    for (size_t d = 0; d < rank; ++d) flat = flat * shape[d] + box.offset[d] + index[d];
    fn(flat);
    for (size_t d = rank; d-- > 0;) {
      if (++index[d] < box.extent[d]) break;
      index[d] = 0;
    }
  }
}

inline std::vector<uint8_t> GatherElements(const std::vector<uint8_t>& tensor, const Shape& shape,
                                           const SliceBox& box, uint32_t elem) {
  std::vector<uint8_t> out;
  out.reserve(BoxElementCount(box) * elem);
  ForEachBoxElement(shape, box, [&](uint64_t i) {
    out.insert(out.end(), tensor.begin() + i * elem, tensor.begin() + (i + 1) * elem);
  });
  return out;
}

inline void ScatterElements(const std::vector<uint8_t>& in, const Shape& shape, const SliceBox& box,
                            uint32_t elem, std::vector<uint8_t>* tensor) {
  uint64_t k = 0;
  ForEachBoxElement(shape, box, [&](uint64_t i) {
    std::memcpy(tensor->data() + i * elem, in.data() + (k++) * elem, elem);
  });
}

// One rank's local tensors, their slices and their bits (cut from the canonical tensors).
struct LocalTensor {
  TensorSpec spec;
  std::vector<SliceMap> slices;
  std::vector<uint8_t> bytes;
};
struct RankShards {
  int rank = 0;
  std::vector<LocalTensor> tensors;

  const LocalTensor* Find(const std::string& name) const {
    for (const LocalTensor& t : tensors) {
      if (t.spec.name == name) return &t;
    }
    return nullptr;
  }
};

inline refit_local_tensor_t LocalTensorOf(const TensorSpec& spec) {
  refit_local_tensor_t local{};
  local.struct_size = sizeof(local);
  local.dtype = static_cast<int32_t>(spec.dtype);
  local.name = spec.name.c_str();
  local.ndim = static_cast<uint32_t>(spec.shape.size());
  for (size_t d = 0; d < spec.shape.size() && d < REFIT_MAX_DIMS; ++d) {
    local.shape[d] = spec.shape[d];
  }
  return local;
}

// Why a slice of local tensor `local` cannot be right, or "" when it is consistent: it names a
// known canonical tensor of the same dtype and rank, states that tensor's shape, and both of its
// boxes lie inside their tensors.
inline std::string SliceProblem(const TensorSpec& local, const SliceMap& s,
                                const std::vector<CanonicalTensor>& canonical) {
  const std::string what = "'" + local.name + "' -> '" + s.canonical_name + "': ";
  const CanonicalTensor* c = FindCanonical(canonical, s.canonical_name);
  if (c == nullptr) return what + "no such canonical tensor";
  if (c->dtype != local.dtype) return what + "dtypes differ";
  if (s.map.ndim != c->shape.size() || s.map.ndim != local.shape.size()) {
    return what + "slice has " + std::to_string(s.map.ndim) + " dims, canonical " +
           std::to_string(c->shape.size()) + ", local " + std::to_string(local.shape.size());
  }
  for (uint32_t d = 0; d < s.map.ndim; ++d) {
    if (s.map.canonical_shape[d] != c->shape[d]) return what + "wrong canonical_shape";
  }
  if (!BoxInside(c->shape, CanonicalBox(s.map))) return what + "canonical box outside the tensor";
  if (!BoxInside(local.shape, LocalBox(s.map))) return what + "local box outside the tensor";
  return "";
}

// Lists and maps every rank's local tensors, and fills them from the canonical ones through the
// slices (padding stays zero). Fails the test on any layout error or inconsistent slice.
inline std::vector<RankShards> ShardAll(const Registry& registry, const std::string& layout,
                                        int world, const Config& config,
                                        const std::vector<CanonicalTensor>& canonical) {
  std::vector<RankShards> ranks;
  for (int r = 0; r < world; ++r) {
    auto made = registry.CreateLayout(layout, r, world, &config, "layout." + layout);
    EXPECT_TRUE(made.ok()) << made.status().message();
    if (!made.ok()) return {};
    auto specs = made.value()->ListLocal(Specs(canonical));
    EXPECT_TRUE(specs.ok()) << specs.status().message();
    if (!specs.ok()) return {};
    RankShards rank;
    rank.rank = r;
    for (const TensorSpec& spec : specs.value()) {
      LocalTensor t;
      t.spec = spec;
      auto slices = made.value()->MapTensor(LocalTensorOf(t.spec));
      EXPECT_TRUE(slices.ok()) << "rank " << r << ": " << slices.status().message();
      if (!slices.ok()) return {};
      t.slices = slices.value();
      Result<uint64_t> n = NumElements(spec.shape);
      EXPECT_TRUE(n.ok()) << spec.name;
      if (!n.ok()) return {};
      const uint32_t elem = SizeOf(spec.dtype);
      t.bytes.assign(*n * elem, 0);
      for (const SliceMap& s : t.slices) {
        const std::string problem = SliceProblem(spec, s, canonical);
        EXPECT_EQ(problem, "") << "rank " << r;
        if (!problem.empty()) return {};
        const CanonicalTensor* c = FindCanonical(canonical, s.canonical_name);
        ScatterElements(GatherElements(c->bytes, c->shape, CanonicalBox(s.map), elem), spec.shape,
                        LocalBox(s.map), elem, &t.bytes);
      }
      rank.tensors.push_back(std::move(t));
    }
    ranks.push_back(std::move(rank));
  }
  return ranks;
}

// Every canonical element is covered exactly once by the slices the ranks send (non-replicated,
// or replicated with owner_rank == the rank); every replicated slice has one owner, which holds it;
// no local element is covered twice.
inline void ExpectExactCover(const std::vector<CanonicalTensor>& canonical,
                             const std::vector<RankShards>& ranks) {
  std::map<std::string, std::vector<uint8_t>> counts;
  for (const CanonicalTensor& t : canonical) counts[t.name].assign(t.elements(), 0);
  // (canonical name, box) -> owners named by the holders, and the holders.
  std::map<std::string, std::set<int>> owners, holders;
  for (const RankShards& rank : ranks) {
    for (const LocalTensor& t : rank.tensors) {
      std::vector<uint8_t> local_count(t.bytes.size() / SizeOf(t.spec.dtype), 0);
      for (const SliceMap& s : t.slices) {
        auto it = counts.find(s.canonical_name);
        ASSERT_NE(it, counts.end()) << t.spec.name << " -> unknown " << s.canonical_name;
        const CanonicalTensor* c = FindCanonical(canonical, s.canonical_name);
        ASSERT_EQ(SliceProblem(t.spec, s, canonical), "");
        ForEachBoxElement(t.spec.shape, LocalBox(s.map), [&](uint64_t i) { ++local_count[i]; });
        if (s.map.replicated) {
          std::string key = s.canonical_name + ShapeToString(CanonicalBox(s.map).offset) +
                            ShapeToString(CanonicalBox(s.map).extent);
          owners[key].insert(s.map.owner_rank);
          holders[key].insert(rank.rank);
          if (s.map.owner_rank != rank.rank) continue;
        } else {
          EXPECT_EQ(s.map.owner_rank, rank.rank) << t.spec.name << " -> " << s.canonical_name;
        }
        ForEachBoxElement(c->shape, CanonicalBox(s.map), [&](uint64_t i) { ++it->second[i]; });
      }
      for (uint64_t i = 0; i < local_count.size(); ++i) {
        ASSERT_LE(local_count[i], 1)
            << "rank " << rank.rank << " " << t.spec.name << " element " << i << " is mapped twice";
      }
    }
  }
  for (const auto& [name, count] : counts) {
    for (uint64_t i = 0; i < count.size(); ++i) {
      ASSERT_EQ(count[i], 1) << name << " element " << i << " is sent " << int(count[i])
                             << " times";
    }
  }
  for (const auto& [key, set] : owners) {
    EXPECT_EQ(set.size(), 1u) << key << " has several owners";
    EXPECT_EQ(holders[key].count(*set.begin()), 1u) << key << ": the owner does not hold it";
    EXPECT_GE(holders[key].size(), 2u) << key << " is marked replicated but only one rank holds it";
  }
}

// Rebuilds every canonical tensor from the local tensors (through the slices the ranks send) and
// compares the bits; also checks that every slice of every rank, sent or not, holds the right bits
// and that a local element no slice covers is zero (padding).
inline void ExpectRoundTrip(const std::vector<CanonicalTensor>& canonical,
                            const std::vector<RankShards>& ranks) {
  std::map<std::string, std::vector<uint8_t>> rebuilt;
  for (const CanonicalTensor& t : canonical) rebuilt[t.name].assign(t.bytes.size(), 0xA5);
  for (const RankShards& rank : ranks) {
    for (const LocalTensor& t : rank.tensors) {
      const uint32_t elem = SizeOf(t.spec.dtype);
      std::vector<uint8_t> covered(t.bytes.size() / elem, 0);
      for (const SliceMap& s : t.slices) {
        const CanonicalTensor* c = FindCanonical(canonical, s.canonical_name);
        ASSERT_NE(c, nullptr);
        ASSERT_EQ(SliceProblem(t.spec, s, canonical), "");
        const std::vector<uint8_t> local_box =
            GatherElements(t.bytes, t.spec.shape, LocalBox(s.map), elem);
        ASSERT_EQ(local_box, GatherElements(c->bytes, c->shape, CanonicalBox(s.map), elem))
            << t.spec.name << " <- " << s.canonical_name;
        ForEachBoxElement(t.spec.shape, LocalBox(s.map), [&](uint64_t i) { covered[i] = 1; });
        if (s.map.replicated && s.map.owner_rank != rank.rank) continue;
        ScatterElements(local_box, c->shape, CanonicalBox(s.map), elem, &rebuilt[s.canonical_name]);
      }
      for (uint64_t i = 0; i < covered.size(); ++i) {
        if (covered[i]) continue;
        for (uint32_t b = 0; b < elem; ++b) {
          ASSERT_EQ(t.bytes[i * elem + b], 0) << t.spec.name << " padding element " << i;
        }
      }
    }
  }
  for (const CanonicalTensor& t : canonical) {
    EXPECT_TRUE(rebuilt[t.name] == t.bytes) << t.name << " differs after shard -> canonical";
  }
}

// map_tensor agrees with list_local: a fresh instance of every rank maps each listed local tensor
// to the same slices as ranks (mapping depends only on the tensor, not on the call history), and
// every slice is consistent (SliceProblem); listed names are unique.
inline void ExpectMapAgreesWithList(const Registry& registry, const std::string& layout, int world,
                                    const Config& config,
                                    const std::vector<CanonicalTensor>& canonical,
                                    const std::vector<RankShards>& ranks) {
  ASSERT_EQ(ranks.size(), static_cast<size_t>(world));
  for (const RankShards& rank : ranks) {
    auto made = registry.CreateLayout(layout, rank.rank, world, &config, "layout." + layout);
    ASSERT_TRUE(made.ok()) << made.status().message();
    std::set<std::string> names;
    // In reverse order: a layout that leans on being asked in list order is caught.
    for (auto t = rank.tensors.rbegin(); t != rank.tensors.rend(); ++t) {
      EXPECT_TRUE(names.insert(t->spec.name).second)
          << "rank " << rank.rank << " lists '" << t->spec.name << "' twice";
      auto slices = made.value()->MapTensor(LocalTensorOf(t->spec));
      ASSERT_TRUE(slices.ok()) << "rank " << rank.rank << ": " << slices.status().message();
      ASSERT_EQ(slices.value().size(), t->slices.size())
          << "rank " << rank.rank << " " << t->spec.name;
      for (size_t i = 0; i < t->slices.size(); ++i) {
        const SliceMap& a = slices.value()[i];
        const SliceMap& b = t->slices[i];
        EXPECT_EQ(SliceProblem(t->spec, a, canonical), "") << "rank " << rank.rank;
        const bool same = a.canonical_name == b.canonical_name &&
                          CanonicalBox(a.map).offset == CanonicalBox(b.map).offset &&
                          LocalBox(a.map).offset == LocalBox(b.map).offset &&
                          LocalBox(a.map).extent == LocalBox(b.map).extent &&
                          a.map.replicated == b.map.replicated &&
                          a.map.owner_rank == b.map.owner_rank;
        EXPECT_TRUE(same) << "rank " << rank.rank << " " << t->spec.name << " slice " << i
                          << " differs between two mappings";
      }
    }
  }
}

}  // namespace refit::conformance
