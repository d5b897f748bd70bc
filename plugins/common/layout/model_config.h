// The model description every tensor-parallel layout reads from its config section.
#pragma once

#include <cstdint>
#include <string>

#include "refit/sdk/plugin.hpp"
#include "refit/status.h"

namespace refit::layouts {

// Config rows of the model description, for a layout's key table:
//   static const refit_config_key_t kKeys[] = {REFIT_LAYOUT_MODEL_KEYS, {"tp", ...}};
// clang-format off
#define REFIT_LAYOUT_MODEL_KEYS                                                                   \
  {"num_layers", REFIT_CFG_INT, nullptr, "number of transformer layers"},                         \
  {"num_heads", REFIT_CFG_INT, nullptr, "attention (query) heads"},                               \
  {"num_kv_heads", REFIT_CFG_INT, "num_heads",                                                    \
   "key/value heads (grouped-query attention: fewer than num_heads)"},                            \
  {"head_dim", REFIT_CFG_INT, "hidden / num_heads", "rows per attention head"},                   \
  {"hidden", REFIT_CFG_INT, nullptr, "hidden size (columns of q_proj)"},                          \
  {"ffn", REFIT_CFG_INT, nullptr, "intermediate size of the dense MLP (rows of gate_proj)"},      \
  {"vocab", REFIT_CFG_INT, nullptr, "vocabulary size (rows of embed_tokens, unpadded)"},          \
  {"num_experts", REFIT_CFG_INT, "0", "routed experts per MoE layer (0: dense model)"},           \
  {"moe_ffn", REFIT_CFG_INT, "ffn", "intermediate size of one expert"},                           \
  {"tie_word_embeddings", REFIT_CFG_BOOL, "false",                                                \
   "the output layer shares embed_tokens (no lm_head.weight)"}
// clang-format on

struct ModelConfig {
  uint64_t num_layers = 0;
  uint64_t num_heads = 0;
  uint64_t num_kv_heads = 0;
  uint64_t head_dim = 0;
  uint64_t hidden = 0;
  uint64_t ffn = 0;
  uint64_t vocab = 0;
  uint64_t num_experts = 0;
  uint64_t moe_ffn = 0;
  bool tie_word_embeddings = false;

  uint64_t q_rows() const { return num_heads * head_dim; }
  uint64_t kv_rows() const { return num_kv_heads * head_dim; }
  uint64_t heads_per_group() const { return num_heads / num_kv_heads; }
};

// Reads and checks the REFIT_LAYOUT_MODEL_KEYS (required keys present, counts positive, heads a
// multiple of kv heads).
Result<ModelConfig> ReadModelConfig(const sdk::ConfigView& cfg);

// An integer key >= min_value (fallback when absent).
Result<uint64_t> ReadCount(const sdk::ConfigView& cfg, const char* key, int64_t fallback,
                           int64_t min_value = 1);

// "x N is not divisible by tp M"-style check.
Status CheckDivides(uint64_t value, const char* what, uint64_t by, const char* by_what);

}  // namespace refit::layouts
