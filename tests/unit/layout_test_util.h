// Synthetic HuggingFace-style checkpoints for the layout tests (unit and integration), and the
// checks every layout must pass: exact cover of the canonical elements by the slices ranks send,
// one owner per replicated slice, and a shard -> canonical round trip that is bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/box.h"
#include "format/safetensors.h"
#include "refit/config.h"
#include "refit/registry.h"
#include "refit/tensor.h"

namespace refit::testing {

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

inline Box CanonicalBox(const refit_slice_map_t& m) {
  Box b;
  for (uint32_t d = 0; d < m.ndim; ++d) {
    b.offset.push_back(m.canonical_offset[d]);
    b.extent.push_back(m.extent[d]);
  }
  return b;
}

inline Box LocalBox(const refit_slice_map_t& m) {
  Box b;
  for (uint32_t d = 0; d < m.ndim; ++d) {
    b.offset.push_back(m.local_offset[d]);
    b.extent.push_back(m.extent[d]);
  }
  return b;
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

// The registry the programs use: builtins plus the build tree's .so plugins.
inline std::shared_ptr<Registry> TestRegistry() {
  Result<std::shared_ptr<Registry>> r = LoadRegistry(nullptr);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(r).value() : nullptr;
}

// Lists and maps every rank's local tensors, and fills them from the canonical ones through the
// slices (padding stays zero). Fails the test on any layout error.
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
      refit_local_tensor_t local{};
      local.struct_size = sizeof(local);
      local.dtype = static_cast<int32_t>(spec.dtype);
      local.name = t.spec.name.c_str();
      local.ndim = static_cast<uint32_t>(spec.shape.size());
      for (size_t d = 0; d < spec.shape.size(); ++d) local.shape[d] = spec.shape[d];
      auto slices = made.value()->MapTensor(local);
      EXPECT_TRUE(slices.ok()) << slices.status().message();
      if (!slices.ok()) return {};
      t.slices = slices.value();
      uint64_t n = NumElements(spec.shape).value();
      const uint32_t elem = SizeOf(spec.dtype);
      t.bytes.assign(n * elem, 0);
      for (const SliceMap& s : t.slices) {
        const CanonicalTensor* c = FindCanonical(canonical, s.canonical_name);
        EXPECT_NE(c, nullptr) << s.canonical_name;
        if (c == nullptr) return {};
        std::vector<uint8_t> box(BoxElements(CanonicalBox(s.map)) * elem);
        GatherBox(c->bytes.data(), c->shape, CanonicalBox(s.map), elem, box.data());
        ScatterBox(box.data(), spec.shape, LocalBox(s.map), elem, t.bytes.data());
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
      std::vector<uint8_t> local_count(NumElements(t.spec.shape).value(), 0);
      for (const SliceMap& s : t.slices) {
        auto it = counts.find(s.canonical_name);
        ASSERT_NE(it, counts.end()) << t.spec.name << " -> unknown " << s.canonical_name;
        const CanonicalTensor* c = FindCanonical(canonical, s.canonical_name);
        ASSERT_EQ(s.map.ndim, c->shape.size()) << s.canonical_name;
        ForEachRun(t.spec.shape, LocalBox(s.map), [&](uint64_t start, uint64_t n) {
          for (uint64_t i = start; i < start + n; ++i) ++local_count[i];
        });
        if (s.map.replicated) {
          std::string key = s.canonical_name + ShapeToString(CanonicalBox(s.map).offset) +
                            ShapeToString(CanonicalBox(s.map).extent);
          owners[key].insert(s.map.owner_rank);
          holders[key].insert(rank.rank);
          if (s.map.owner_rank != rank.rank) continue;
        } else {
          EXPECT_EQ(s.map.owner_rank, rank.rank) << t.spec.name << " -> " << s.canonical_name;
        }
        ForEachRun(c->shape, CanonicalBox(s.map), [&](uint64_t start, uint64_t n) {
          for (uint64_t i = start; i < start + n; ++i) ++it->second[i];
        });
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
      std::vector<uint8_t> covered(NumElements(t.spec.shape).value(), 0);
      for (const SliceMap& s : t.slices) {
        const CanonicalTensor* c = FindCanonical(canonical, s.canonical_name);
        ASSERT_NE(c, nullptr);
        std::vector<uint8_t> local_box(BoxElements(LocalBox(s.map)) * elem);
        std::vector<uint8_t> canonical_box(local_box.size());
        GatherBox(t.bytes.data(), t.spec.shape, LocalBox(s.map), elem, local_box.data());
        GatherBox(c->bytes.data(), c->shape, CanonicalBox(s.map), elem, canonical_box.data());
        ASSERT_EQ(local_box, canonical_box) << t.spec.name << " <- " << s.canonical_name;
        ForEachRun(t.spec.shape, LocalBox(s.map), [&](uint64_t start, uint64_t n) {
          for (uint64_t i = start; i < start + n; ++i) covered[i] = 1;
        });
        if (s.map.replicated && s.map.owner_rank != rank.rank) continue;
        ScatterBox(local_box.data(), c->shape, CanonicalBox(s.map), elem,
                   rebuilt[s.canonical_name].data());
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
    EXPECT_TRUE(std::memcmp(rebuilt[t.name].data(), t.bytes.data(), t.bytes.size()) == 0)
        << t.name << " differs after shard -> canonical";
  }
}

// Rows [row0, row0 + n) and columns [col0, col0 + m) of a 2-d (or rows of a 1-d) canonical tensor,
// copied element by element: the tests' own statement of where a layout puts things.
inline std::vector<uint8_t> Rows(const CanonicalTensor& t, uint64_t row0, uint64_t n) {
  const uint64_t row_bytes = t.bytes.size() / t.shape[0];
  return std::vector<uint8_t>(t.bytes.begin() + row0 * row_bytes,
                              t.bytes.begin() + (row0 + n) * row_bytes);
}
inline std::vector<uint8_t> Cols(const CanonicalTensor& t, uint64_t col0, uint64_t m) {
  const uint64_t elem = SizeOf(t.dtype), cols = t.shape[1];
  std::vector<uint8_t> out;
  for (uint64_t r = 0; r < t.shape[0]; ++r) {
    auto begin = t.bytes.begin() + (r * cols + col0) * elem;
    out.insert(out.end(), begin, begin + m * elem);
  }
  return out;
}
inline void Append(std::vector<uint8_t>* out, const std::vector<uint8_t>& more) {
  out->insert(out->end(), more.begin(), more.end());
}

}  // namespace refit::testing
