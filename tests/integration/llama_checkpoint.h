// A Llama-style HuggingFace checkpoint for multi-rank and layout tests, and the [layout.<name>]
// keys that describe it.
#pragma once

#include <algorithm>
#include <cstring>
#include <random>
#include <string>

#include "cli_harness.h"

namespace refit::testing {

struct ModelShape {
  int layers = 4;
  int hidden = 64;
  int heads = 8;
  int kv_heads = 2;
  int head_dim = 8;
  int ffn = 96;
  int vocab = 250;  // not a multiple of 128 * tp: Megatron pads, padding is never sent
  int experts = 0;  // > 0: MoE MLPs
};

// A Llama-style HF checkpoint (bf16 bits, random with adversarial patterns mixed in).
inline Checkpoint MakeHf(const ModelShape& m, uint64_t seed) {
  Checkpoint c;
  std::mt19937_64 rng(seed);
  auto add = [&](const std::string& name, Shape shape) {
    Checkpoint::Tensor t{name, DType::kBF16, shape, {}};
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    t.bytes.resize(n * 2);
    for (size_t i = 0; i < t.bytes.size(); i += 8) {
      const uint64_t r = rng();
      std::memcpy(&t.bytes[i], &r, std::min<size_t>(8, t.bytes.size() - i));
    }
    const uint16_t patterns[] = {0x7FC1, 0xFFC3, 0x0000, 0x8000, 0x7F80, 0xFF80, 0x0001};
    for (size_t i = 0; i < 7 && 2 * i + 1 < t.bytes.size(); ++i) {
      std::memcpy(&t.bytes[2 * i], &patterns[i], 2);
    }
    c.tensors.push_back(std::move(t));
  };
  const uint64_t h = m.hidden, q = uint64_t(m.heads) * m.head_dim;
  const uint64_t kv = uint64_t(m.kv_heads) * m.head_dim, f = m.ffn;
  add("model.embed_tokens.weight", {uint64_t(m.vocab), h});
  for (int l = 0; l < m.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {h});
    add(p + "self_attn.q_proj.weight", {q, h});
    add(p + "self_attn.k_proj.weight", {kv, h});
    add(p + "self_attn.v_proj.weight", {kv, h});
    add(p + "self_attn.o_proj.weight", {h, q});
    add(p + "post_attention_layernorm.weight", {h});
    if (m.experts > 0) {
      add(p + "mlp.gate.weight", {uint64_t(m.experts), h});
      for (int e = 0; e < m.experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        add(x + "gate_proj.weight", {f, h});
        add(x + "up_proj.weight", {f, h});
        add(x + "down_proj.weight", {h, f});
      }
    } else {
      add(p + "mlp.gate_proj.weight", {f, h});
      add(p + "mlp.up_proj.weight", {f, h});
      add(p + "mlp.down_proj.weight", {h, f});
    }
  }
  add("model.norm.weight", {h});
  add("lm_head.weight", {uint64_t(m.vocab), h});
  return c;
}

// The [layout.<name>] keys describing the model (shared by the trainer and receiver layouts).
inline std::string ModelKeys(const ModelShape& m) {
  return "num_layers = " + std::to_string(m.layers) + "\nhidden = " + std::to_string(m.hidden) +
         "\nnum_heads = " + std::to_string(m.heads) +
         "\nnum_kv_heads = " + std::to_string(m.kv_heads) +
         "\nhead_dim = " + std::to_string(m.head_dim) + "\nffn = " + std::to_string(m.ffn) +
         "\nvocab = " + std::to_string(m.vocab) + "\nnum_experts = " + std::to_string(m.experts) +
         "\n";
}

}  // namespace refit::testing
