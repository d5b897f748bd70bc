#include "layout/hf_names.h"

#include <array>
#include <utility>

namespace refit::layouts {

namespace {

constexpr const char* kLayerPrefix = "model.layers.";
constexpr const char* kExpertPrefix = "mlp.experts.";

// Per-layer kinds and the name after "model.layers.{l}." (experts: after "mlp.experts.{e}.").
constexpr std::array<std::pair<HfKind, const char*>, 18> kLayerSuffixes = {{
    {HfKind::kInputNorm, "input_layernorm.weight"},
    {HfKind::kPostAttnNorm, "post_attention_layernorm.weight"},
    {HfKind::kQ, "self_attn.q_proj.weight"},
    {HfKind::kK, "self_attn.k_proj.weight"},
    {HfKind::kV, "self_attn.v_proj.weight"},
    {HfKind::kO, "self_attn.o_proj.weight"},
    {HfKind::kQBias, "self_attn.q_proj.bias"},
    {HfKind::kKBias, "self_attn.k_proj.bias"},
    {HfKind::kVBias, "self_attn.v_proj.bias"},
    {HfKind::kQNorm, "self_attn.q_norm.weight"},
    {HfKind::kKNorm, "self_attn.k_norm.weight"},
    {HfKind::kGate, "mlp.gate_proj.weight"},
    {HfKind::kUp, "mlp.up_proj.weight"},
    {HfKind::kDown, "mlp.down_proj.weight"},
    {HfKind::kRouter, "mlp.gate.weight"},
    {HfKind::kExpertGate, "gate_proj.weight"},
    {HfKind::kExpertUp, "up_proj.weight"},
    {HfKind::kExpertDown, "down_proj.weight"},
}};

const char* SuffixOf(HfKind kind) {
  for (const auto& [k, suffix] : kLayerSuffixes) {
    if (k == kind) return suffix;
  }
  return "";
}

}  // namespace

bool IsExpert(HfKind kind) {
  return kind == HfKind::kExpertGate || kind == HfKind::kExpertUp || kind == HfKind::kExpertDown;
}

bool IsPerLayer(HfKind kind) {
  return kind != HfKind::kEmbed && kind != HfKind::kLmHead && kind != HfKind::kFinalNorm;
}

bool ParseIndexed(const std::string& name, const std::string& prefix, uint64_t* index,
                  std::string* rest) {
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  size_t pos = prefix.size();
  size_t digits_end = pos;
  while (digits_end < name.size() && name[digits_end] >= '0' && name[digits_end] <= '9') {
    ++digits_end;
  }
  size_t n_digits = digits_end - pos;
  // Bounded so the number cannot overflow; "01" is not the name of layer 1.
  if (n_digits == 0 || n_digits > 9 || (n_digits > 1 && name[pos] == '0')) return false;
  if (digits_end >= name.size() || name[digits_end] != '.') return false;
  *index = std::stoull(name.substr(pos, n_digits));
  *rest = name.substr(digits_end + 1);
  return true;
}

std::optional<HfName> ParseHfName(const std::string& name) {
  if (name == "model.embed_tokens.weight") return HfName{HfKind::kEmbed};
  if (name == "lm_head.weight") return HfName{HfKind::kLmHead};
  if (name == "model.norm.weight") return HfName{HfKind::kFinalNorm};
  HfName out;
  std::string rest;
  if (!ParseIndexed(name, kLayerPrefix, &out.layer, &rest)) return std::nullopt;
  std::string expert_rest;
  if (ParseIndexed(rest, kExpertPrefix, &out.expert, &expert_rest)) {
    for (HfKind kind : {HfKind::kExpertGate, HfKind::kExpertUp, HfKind::kExpertDown}) {
      if (expert_rest == SuffixOf(kind)) {
        out.kind = kind;
        return out;
      }
    }
    return std::nullopt;
  }
  for (const auto& [kind, suffix] : kLayerSuffixes) {
    if (!IsExpert(kind) && rest == suffix) {
      out.kind = kind;
      return out;
    }
  }
  return std::nullopt;
}

std::string HfTensorName(HfKind kind, uint64_t layer, uint64_t expert) {
  switch (kind) {
    case HfKind::kEmbed:
      return "model.embed_tokens.weight";
    case HfKind::kLmHead:
      return "lm_head.weight";
    case HfKind::kFinalNorm:
      return "model.norm.weight";
    default:
      break;
  }
  std::string name = kLayerPrefix + std::to_string(layer) + ".";
  if (IsExpert(kind)) name += kExpertPrefix + std::to_string(expert) + ".";
  return name + SuffixOf(kind);
}

}  // namespace refit::layouts
