#include "layout/model_config.h"

namespace refit::layouts {

Result<uint64_t> ReadCount(const sdk::ConfigView& cfg, const char* key, int64_t fallback,
                           int64_t min_value) {
  REFIT_ASSIGN_OR_RAISE(int64_t value, cfg.GetInt(key, fallback));
  if (value < min_value) {
    if (value == -1 && fallback == -1) {
      return Status::Invalid(std::string("config key '") + key +
                             "' is required (part of the model description)");
    }
    return Status::Invalid(std::string("config key '") + key + "' is " + std::to_string(value) +
                           ", it must be at least " + std::to_string(min_value));
  }
  return static_cast<uint64_t>(value);
}

Status CheckDivides(uint64_t value, const char* what, uint64_t by, const char* by_what) {
  if (by == 0 || value % by != 0) {
    return Status::Invalid(std::string(what) + " " + std::to_string(value) +
                           " is not divisible by " + by_what + " " + std::to_string(by));
  }
  return Status::OK();
}

Result<ModelConfig> ReadModelConfig(const sdk::ConfigView& cfg) {
  ModelConfig m;
  REFIT_ASSIGN_OR_RAISE(m.num_layers, ReadCount(cfg, "num_layers", -1));
  REFIT_ASSIGN_OR_RAISE(m.num_heads, ReadCount(cfg, "num_heads", -1));
  REFIT_ASSIGN_OR_RAISE(m.hidden, ReadCount(cfg, "hidden", -1));
  REFIT_ASSIGN_OR_RAISE(m.ffn, ReadCount(cfg, "ffn", -1));
  REFIT_ASSIGN_OR_RAISE(m.vocab, ReadCount(cfg, "vocab", -1));
  REFIT_ASSIGN_OR_RAISE(m.num_kv_heads,
                        ReadCount(cfg, "num_kv_heads", static_cast<int64_t>(m.num_heads)));
  REFIT_RETURN_NOT_OK(CheckDivides(m.num_heads, "num_heads", m.num_kv_heads, "num_kv_heads"));
  int64_t head_dim_default =
      m.hidden % m.num_heads == 0 ? static_cast<int64_t>(m.hidden / m.num_heads) : -1;
  REFIT_ASSIGN_OR_RAISE(m.head_dim, ReadCount(cfg, "head_dim", head_dim_default));
  REFIT_ASSIGN_OR_RAISE(m.num_experts, ReadCount(cfg, "num_experts", 0, 0));
  REFIT_ASSIGN_OR_RAISE(m.moe_ffn, ReadCount(cfg, "moe_ffn", static_cast<int64_t>(m.ffn)));
  REFIT_ASSIGN_OR_RAISE(m.tie_word_embeddings, cfg.GetBool("tie_word_embeddings", false));
  return m;
}

}  // namespace refit::layouts
