// The vLLM tensor-parallel layout (receiver side): the weights one vLLM TP rank holds, mapped onto
// HuggingFace tensors. tp = world (key `tp`, optional); layer names stay global (no pipeline
// split).
//   qkv_proj     = [the rank's q rows; its k rows; its v rows] (QKVParallelLinear). With fewer kv
//                  heads than ranks each kv head is replicated on tp / num_kv_heads ranks, the
//                  lowest of which sends it.
//   gate_up_proj = [its gate rows; its up rows] (MergedColumnParallelLinear)
//   o_proj, down_proj: split on dim 1 (RowParallelLinear)
//   embed_tokens, lm_head: vocab-parallel over the vocab padded to a multiple of vocab_pad (64)
//   norms: whole on every rank, sent by rank 0
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "layout/hf_names.h"
#include "layout/layout_plan.h"
#include "layout/model_config.h"
#include "refit/sdk/plugin.hpp"

namespace {

using refit::Result;
using refit::Status;
using refit::layouts::HfKind;
using refit::layouts::HfTensorName;
using refit::layouts::LocalPlan;
using refit::layouts::ModelConfig;
using refit::layouts::Piece;
using refit::layouts::Shape;
using refit::sdk::TensorSpec;

constexpr const char* kLayerPrefix = "model.layers.";

const refit_config_key_t kKeys[] = {
    REFIT_LAYOUT_MODEL_KEYS,
    {"tp", REFIT_CFG_INT, "world", "tensor-parallel size (must equal the world size)"},
    {"vocab_pad", REFIT_CFG_INT, "64",
     "the vocab is padded up to a multiple of this before the TP split (vLLM's "
     "DEFAULT_VOCAB_PADDING_SIZE)"},
};

class VllmLayout {
 public:
  static Result<std::unique_ptr<VllmLayout>> Create(const refit::sdk::ConfigView& cfg, int rank,
                                                    int world) {
    if (world < 1 || rank < 0 || rank >= world) {
      return Status::Invalid("rank " + std::to_string(rank) + " is outside world size " +
                             std::to_string(world));
    }
    auto layout = std::make_unique<VllmLayout>();
    VllmLayout& l = *layout;
    REFIT_ASSIGN_OR_RAISE(l.m_, refit::layouts::ReadModelConfig(cfg));
    REFIT_ASSIGN_OR_RAISE(uint64_t vocab_pad, refit::layouts::ReadCount(cfg, "vocab_pad", 64));
    const ModelConfig& m = l.m_;
    REFIT_ASSIGN_OR_RAISE(l.tp_, refit::layouts::ReadCount(cfg, "tp", world));
    if (l.tp_ != static_cast<uint64_t>(world)) {
      return Status::Invalid("tp " + std::to_string(l.tp_) + " is not the world size " +
                             std::to_string(world) + " (the vllm layout has no pipeline split)");
    }
    l.rank_ = static_cast<uint64_t>(rank);
    if (m.num_experts > 0) {
      return Status::Unsupported("the vllm layout does not map MoE experts (num_experts > 0)");
    }
    REFIT_RETURN_NOT_OK(refit::layouts::CheckDivides(m.num_heads, "num_heads", l.tp_, "tp"));
    REFIT_RETURN_NOT_OK(refit::layouts::CheckDivides(m.ffn, "ffn", l.tp_, "tp"));
    if (m.num_kv_heads >= l.tp_) {
      REFIT_RETURN_NOT_OK(
          refit::layouts::CheckDivides(m.num_kv_heads, "num_kv_heads", l.tp_, "tp"));
    } else {
      REFIT_RETURN_NOT_OK(
          refit::layouts::CheckDivides(l.tp_, "tp", m.num_kv_heads, "num_kv_heads"));
    }
    const uint64_t padded = refit::layouts::RoundUp(m.vocab, vocab_pad);
    REFIT_RETURN_NOT_OK(refit::layouts::CheckDivides(padded, "padded vocab", l.tp_, "tp"));
    l.vocab_per_rank_ = padded / l.tp_;
    return layout;
  }

  Result<std::vector<refit::sdk::Slice>> MapTensor(const refit_local_tensor_t& local) const {
    if (local.name == nullptr) return Status::Invalid("local tensor has no name");
    REFIT_ASSIGN_OR_RAISE(LocalPlan plan, Plan(local.name));
    return refit::layouts::SlicesFor(plan, local);
  }

  Result<std::vector<TensorSpec>> ListLocal(const std::vector<TensorSpec>& canonical) const {
    for (const TensorSpec& t : canonical) REFIT_RETURN_NOT_OK(CheckCanonical(t.name));
    std::vector<std::string> candidates = {HfTensorName(HfKind::kEmbed)};
    for (uint64_t l = 0; l < m_.num_layers; ++l) {
      const std::string layer = kLayerPrefix + std::to_string(l) + ".";
      for (const char* rest :
           {"input_layernorm.weight", "self_attn.qkv_proj.weight", "self_attn.qkv_proj.bias",
            "self_attn.q_norm.weight", "self_attn.k_norm.weight", "self_attn.o_proj.weight",
            "post_attention_layernorm.weight", "mlp.gate_up_proj.weight", "mlp.down_proj.weight"}) {
        candidates.push_back(layer + rest);
      }
    }
    candidates.push_back(HfTensorName(HfKind::kFinalNorm));
    if (!m_.tie_word_embeddings) candidates.push_back(HfTensorName(HfKind::kLmHead));
    std::vector<LocalPlan> plans;
    for (const std::string& name : candidates) {
      REFIT_ASSIGN_OR_RAISE(LocalPlan plan, Plan(name));
      plans.push_back(std::move(plan));
    }
    return refit::layouts::SelectLocal(plans, canonical);
  }

 private:
  int Rank() const { return static_cast<int>(rank_); }

  // Whole on every rank; rank 0 sends it.
  LocalPlan Replicated(std::string name, HfKind kind, uint64_t layer, Shape shape) const {
    return LocalPlan{std::move(name),
                     shape,
                     {refit::layouts::Whole(HfTensorName(kind, layer), shape, tp_ > 1, 0)}};
  }

  LocalPlan VocabParallel(std::string name, HfKind kind) const {
    return LocalPlan{
        std::move(name),
        {vocab_per_rank_, m_.hidden},
        refit::layouts::Shared({refit::layouts::VocabRows(HfTensorName(kind), m_.vocab, m_.hidden,
                                                          vocab_per_rank_, rank_)},
                               false, Rank())};
  }

  LocalPlan Qkv(std::string name, uint64_t layer, bool bias) const {
    const uint64_t hd = m_.head_dim;
    const uint64_t q_rows = m_.q_rows() / tp_;
    // kv heads: a contiguous range per rank, or one head shared by tp / num_kv_heads ranks.
    uint64_t kv_heads = m_.num_kv_heads / tp_, first_kv = rank_ * kv_heads;
    bool kv_replicated = false;
    int kv_owner = Rank();
    if (m_.num_kv_heads < tp_) {
      const uint64_t replicas = tp_ / m_.num_kv_heads;
      kv_heads = 1;
      first_kv = rank_ / replicas;
      kv_replicated = true;
      kv_owner = static_cast<int>(first_kv * replicas);
    }
    const uint64_t kv_rows = kv_heads * hd;
    auto shape_of = [&](uint64_t rows) { return bias ? Shape{rows} : Shape{rows, m_.hidden}; };
    const HfKind q = bias ? HfKind::kQBias : HfKind::kQ;
    const HfKind k = bias ? HfKind::kKBias : HfKind::kK;
    const HfKind v = bias ? HfKind::kVBias : HfKind::kV;
    std::vector<Piece> pieces =
        refit::layouts::Shared({refit::layouts::Rows(HfTensorName(q, layer), shape_of(m_.q_rows()),
                                                     rank_ * q_rows, 0, q_rows)},
                               false, Rank());
    for (Piece& p : refit::layouts::Shared(
             {refit::layouts::Rows(HfTensorName(k, layer), shape_of(m_.kv_rows()), first_kv * hd,
                                   q_rows, kv_rows),
              refit::layouts::Rows(HfTensorName(v, layer), shape_of(m_.kv_rows()), first_kv * hd,
                                   q_rows + kv_rows, kv_rows)},
             kv_replicated, kv_owner)) {
      pieces.push_back(std::move(p));
    }
    return LocalPlan{std::move(name), shape_of(q_rows + 2 * kv_rows), std::move(pieces)};
  }

  Result<LocalPlan> Plan(const std::string& name) const {
    if (name == HfTensorName(HfKind::kEmbed)) return VocabParallel(name, HfKind::kEmbed);
    if (name == HfTensorName(HfKind::kFinalNorm)) {
      return Replicated(name, HfKind::kFinalNorm, 0, {m_.hidden});
    }
    if (name == HfTensorName(HfKind::kLmHead)) {
      if (m_.tie_word_embeddings) {
        return Status::Invalid("tie_word_embeddings = true: lm_head is embed_tokens");
      }
      return VocabParallel(name, HfKind::kLmHead);
    }
    uint64_t l = 0;
    std::string rest;
    if (!refit::layouts::ParseIndexed(name, kLayerPrefix, &l, &rest)) return Unknown(name);
    if (l >= m_.num_layers) {
      return Status::Invalid("layer " + std::to_string(l) +
                             " is past num_layers = " + std::to_string(m_.num_layers));
    }
    if (rest == "input_layernorm.weight") {
      return Replicated(name, HfKind::kInputNorm, l, {m_.hidden});
    }
    if (rest == "post_attention_layernorm.weight") {
      return Replicated(name, HfKind::kPostAttnNorm, l, {m_.hidden});
    }
    if (rest == "self_attn.q_norm.weight" || rest == "self_attn.k_norm.weight") {
      const HfKind kind = rest == "self_attn.q_norm.weight" ? HfKind::kQNorm : HfKind::kKNorm;
      return Replicated(name, kind, l, {m_.head_dim});  // only models with q/k norms (Qwen3)
    }
    if (rest == "self_attn.qkv_proj.weight") return Qkv(name, l, /*bias=*/false);
    if (rest == "self_attn.qkv_proj.bias") return Qkv(name, l, /*bias=*/true);
    if (rest == "self_attn.o_proj.weight") {
      return LocalPlan{
          name,
          {m_.hidden, m_.q_rows() / tp_},
          refit::layouts::Shared({refit::layouts::InputCols(HfTensorName(HfKind::kO, l), m_.hidden,
                                                            m_.q_rows(), tp_, rank_)},
                                 false, Rank())};
    }
    if (rest == "mlp.gate_up_proj.weight") {
      return LocalPlan{
          name,
          {2 * (m_.ffn / tp_), m_.hidden},
          refit::layouts::Shared(refit::layouts::GateUpRows(HfTensorName(HfKind::kGate, l),
                                                            HfTensorName(HfKind::kUp, l), m_.ffn,
                                                            m_.hidden, tp_, rank_),
                                 false, Rank())};
    }
    if (rest == "mlp.down_proj.weight") {
      return LocalPlan{
          name,
          {m_.hidden, m_.ffn / tp_},
          refit::layouts::Shared({refit::layouts::InputCols(HfTensorName(HfKind::kDown, l),
                                                            m_.hidden, m_.ffn, tp_, rank_)},
                                 false, Rank())};
    }
    return Unknown(name);
  }

  Status CheckCanonical(const std::string& name) const {
    std::optional<refit::layouts::HfName> hf = refit::layouts::ParseHfName(name);
    if (!hf) {
      return Status::Invalid("unknown tensor '" + name +
                             "' (the vllm layout maps HuggingFace Llama/Qwen-style names)");
    }
    if (hf->kind == HfKind::kRouter || refit::layouts::IsExpert(hf->kind)) {
      return Status::Unsupported("tensor '" + name + "': the vllm layout does not map MoE experts");
    }
    if (hf->kind == HfKind::kLmHead && m_.tie_word_embeddings) {
      return Status::Invalid(
          "'lm_head.weight' is in the checkpoint but tie_word_embeddings = true");
    }
    if (refit::layouts::IsPerLayer(hf->kind) && hf->layer >= m_.num_layers) {
      return Status::Invalid("tensor '" + name + "' is in layer " + std::to_string(hf->layer) +
                             ", the config has num_layers = " + std::to_string(m_.num_layers));
    }
    return Status::OK();
  }

  static Status Unknown(const std::string& name) {
    return Status::Invalid("'" + name + "' is not a vLLM tensor name this layout maps");
  }

  ModelConfig m_;
  uint64_t tp_ = 1;
  uint64_t rank_ = 0;
  uint64_t vocab_per_rank_ = 0;
};

}  // namespace

REFIT_PLUGIN("vllm", "0.1.0",
             refit::sdk::MakeLayout<VllmLayout>(
                 "vllm",
                 "vLLM tensor-parallel shards (qkv_proj, gate_up_proj, vocab-parallel "
                 "embed_tokens/lm_head) <-> HuggingFace tensors",
                 &kKeys))
