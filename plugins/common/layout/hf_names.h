// The canonical (HuggingFace Llama/Qwen/Mistral-style) tensor names the layouts map.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace refit::layouts {

enum class HfKind {
  kEmbed,         // model.embed_tokens.weight
  kLmHead,        // lm_head.weight
  kFinalNorm,     // model.norm.weight
  kInputNorm,     // model.layers.{l}.input_layernorm.weight
  kPostAttnNorm,  // model.layers.{l}.post_attention_layernorm.weight
  kQ,             // model.layers.{l}.self_attn.q_proj.weight (and k, v, o)
  kK,
  kV,
  kO,
  kQBias,  // model.layers.{l}.self_attn.q_proj.bias (and k, v)
  kKBias,
  kVBias,
  kQNorm,  // model.layers.{l}.self_attn.q_norm.weight (and k)
  kKNorm,
  kGate,  // model.layers.{l}.mlp.gate_proj.weight (and up, down)
  kUp,
  kDown,
  kRouter,      // model.layers.{l}.mlp.gate.weight
  kExpertGate,  // model.layers.{l}.mlp.experts.{e}.gate_proj.weight (and up, down)
  kExpertUp,
  kExpertDown,
};

struct HfName {
  HfKind kind = HfKind::kEmbed;
  uint64_t layer = 0;   // per-layer kinds
  uint64_t expert = 0;  // expert kinds
};

// nullopt for a name none of the kinds has.
std::optional<HfName> ParseHfName(const std::string& name);
std::string HfTensorName(HfKind kind, uint64_t layer = 0, uint64_t expert = 0);
bool IsPerLayer(HfKind kind);
bool IsExpert(HfKind kind);

// "<prefix><N>.<rest>" with N a decimal number without leading zeros: sets *index and *rest.
bool ParseIndexed(const std::string& name, const std::string& prefix, uint64_t* index,
                  std::string* rest);

}  // namespace refit::layouts
