// The Megatron-Core layout: the shards of a GPT model (Transformer-Engine layer spec) under tensor,
// pipeline and expert parallelism, mapped onto HuggingFace tensors. docs/layouts.md has the rules
// and a worked example; every rule lives in Plan(), which map_tensor and list_local share.
//
// Ranks: rank = pp_rank * tp * ep + ep_rank * tp + tp_rank (Megatron's default order, tp fastest,
// then ep, pipeline stages outermost).
#include <memory>
#include <optional>
#include <set>
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

constexpr const char* kLayerPrefix = "decoder.layers.";
constexpr const char* kExpertPrefix = "mlp.experts.local_experts.";
constexpr const char* kEmbedding = "embedding.word_embeddings.weight";
constexpr const char* kFinalNorm = "decoder.final_layernorm.weight";
constexpr const char* kOutput = "output_layer.weight";

const refit_config_key_t kKeys[] = {
    REFIT_LAYOUT_MODEL_KEYS,
    {"tp", REFIT_CFG_INT, "1", "tensor-parallel size"},
    {"pp", REFIT_CFG_INT, "1", "pipeline-parallel size (layers are split evenly over stages)"},
    {"ep", REFIT_CFG_INT, "1", "expert-parallel size (experts are split evenly over ep ranks)"},
    {"vocab_divisible_by", REFIT_CFG_INT, "128",
     "the vocab is padded up to a multiple of this times tp (Megatron's "
     "make_vocab_size_divisible_by)"},
};

// Who holds a piece besides this rank, and who sends it.
struct Sharing {
  bool replicated = false;
  int owner = 0;
};

class MegatronLayout {
 public:
  static Result<std::unique_ptr<MegatronLayout>> Create(const refit::sdk::ConfigView& cfg, int rank,
                                                        int world) {
    auto layout = std::make_unique<MegatronLayout>();
    MegatronLayout& l = *layout;
    REFIT_ASSIGN_OR_RAISE(l.m_, refit::layouts::ReadModelConfig(cfg));
    REFIT_ASSIGN_OR_RAISE(l.tp_, refit::layouts::ReadCount(cfg, "tp", 1));
    REFIT_ASSIGN_OR_RAISE(l.pp_, refit::layouts::ReadCount(cfg, "pp", 1));
    REFIT_ASSIGN_OR_RAISE(l.ep_, refit::layouts::ReadCount(cfg, "ep", 1));
    REFIT_ASSIGN_OR_RAISE(uint64_t divisible_by,
                          refit::layouts::ReadCount(cfg, "vocab_divisible_by", 128));
    if (static_cast<uint64_t>(world) != l.tp_ * l.pp_ * l.ep_) {
      return Status::Invalid("world size " + std::to_string(world) +
                             " is not tp * pp * ep = " + std::to_string(l.tp_ * l.pp_ * l.ep_));
    }
    if (rank < 0 || rank >= world) {
      return Status::Invalid("rank " + std::to_string(rank) + " is outside world size " +
                             std::to_string(world));
    }
    const ModelConfig& m = l.m_;
    REFIT_RETURN_NOT_OK(refit::layouts::CheckDivides(m.num_layers, "num_layers", l.pp_, "pp"));
    // Megatron keeps whole query groups on a rank: it requires num_query_groups % tp == 0.
    REFIT_RETURN_NOT_OK(refit::layouts::CheckDivides(m.num_kv_heads, "num_kv_heads", l.tp_, "tp"));
    REFIT_RETURN_NOT_OK(refit::layouts::CheckDivides(m.ffn, "ffn", l.tp_, "tp"));
    if (l.ep_ > 1 && m.num_experts == 0) {
      return Status::Invalid("ep " + std::to_string(l.ep_) + " needs num_experts > 0");
    }
    if (m.num_experts > 0) {
      REFIT_RETURN_NOT_OK(refit::layouts::CheckDivides(m.num_experts, "num_experts", l.ep_, "ep"));
      REFIT_RETURN_NOT_OK(refit::layouts::CheckDivides(m.moe_ffn, "moe_ffn", l.tp_, "tp"));
    }
    l.rank_ = rank;
    l.tp_rank_ = static_cast<uint64_t>(rank) % l.tp_;
    l.ep_rank_ = static_cast<uint64_t>(rank) / l.tp_ % l.ep_;
    l.pp_rank_ = static_cast<uint64_t>(rank) / (l.tp_ * l.ep_);
    l.layers_per_stage_ = m.num_layers / l.pp_;
    l.vocab_per_rank_ = refit::layouts::RoundUp(m.vocab, divisible_by * l.tp_) / l.tp_;
    return layout;
  }

  Result<std::vector<refit::sdk::Slice>> MapTensor(const refit_local_tensor_t& local) const {
    if (local.name == nullptr) return Status::Invalid("local tensor has no name");
    REFIT_ASSIGN_OR_RAISE(LocalPlan plan, Plan(local.name));
    return refit::layouts::SlicesFor(plan, local);
  }

  Result<std::vector<TensorSpec>> ListLocal(const std::vector<TensorSpec>& canonical) const {
    std::set<std::string> names;
    for (const TensorSpec& t : canonical) names.insert(t.name);
    for (const TensorSpec& t : canonical) REFIT_RETURN_NOT_OK(CheckCanonical(t.name, names));
    std::vector<std::string> candidates;
    if (first_stage()) candidates.push_back(kEmbedding);
    for (uint64_t l = 0; l < layers_per_stage_; ++l) {
      const std::string layer = kLayerPrefix + std::to_string(l) + ".";
      for (const char* rest :
           {"self_attention.linear_qkv.layer_norm_weight", "self_attention.q_layernorm.weight",
            "self_attention.k_layernorm.weight", "self_attention.linear_qkv.weight",
            "self_attention.linear_qkv.bias", "self_attention.linear_proj.weight"}) {
        candidates.push_back(layer + rest);
      }
      if (IsMoeLayer(GlobalLayer(l), names)) {
        candidates.push_back(layer + "pre_mlp_layernorm.weight");
        candidates.push_back(layer + "mlp.router.weight");
        for (uint64_t j = 0; j < experts_per_rank(); ++j) {
          const std::string expert = layer + kExpertPrefix + std::to_string(j) + ".";
          candidates.push_back(expert + "linear_fc1.weight");
          candidates.push_back(expert + "linear_fc2.weight");
        }
      } else {
        for (const char* rest : {"mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc1.weight",
                                 "mlp.linear_fc2.weight"}) {
          candidates.push_back(layer + rest);
        }
      }
    }
    if (last_stage()) {
      candidates.push_back(kFinalNorm);
      if (!m_.tie_word_embeddings || pp_ > 1) candidates.push_back(kOutput);
    }
    std::vector<LocalPlan> plans;
    for (const std::string& name : candidates) {
      REFIT_ASSIGN_OR_RAISE(LocalPlan plan, Plan(name));
      plans.push_back(std::move(plan));
    }
    return refit::layouts::SelectLocal(plans, canonical);
  }

 private:
  bool first_stage() const { return pp_rank_ == 0; }
  bool last_stage() const { return pp_rank_ + 1 == pp_; }
  uint64_t experts_per_rank() const { return m_.num_experts / ep_; }
  uint64_t GlobalLayer(uint64_t local_layer) const {
    return pp_rank_ * layers_per_stage_ + local_layer;
  }
  int RankOf(uint64_t tp_rank, uint64_t ep_rank, uint64_t pp_rank) const {
    return static_cast<int>(pp_rank * tp_ * ep_ + ep_rank * tp_ + tp_rank);
  }
  // Split over TP, the same on every EP rank (attention, dense MLP, embedding, output layer).
  Sharing TpSplit() const { return {ep_ > 1, RankOf(tp_rank_, 0, pp_rank_)}; }
  // Whole on every rank of the stage (norms, router).
  Sharing StageWide() const { return {tp_ * ep_ > 1, RankOf(0, 0, pp_rank_)}; }
  // Only this rank holds it (experts).
  Sharing Own() const { return {false, rank_}; }

  static LocalPlan Make(std::string name, Shape shape, std::vector<Piece> pieces, Sharing sharing) {
    return LocalPlan{std::move(name), std::move(shape),
                     refit::layouts::Shared(std::move(pieces), sharing.replicated, sharing.owner)};
  }

  LocalPlan Norm(std::string name, HfKind kind, uint64_t layer, uint64_t size) const {
    return Make(std::move(name), {size},
                {refit::layouts::Whole(HfTensorName(kind, layer), {size}, false, 0)}, StageWide());
  }

  LocalPlan VocabParallel(std::string name, HfKind kind, Sharing sharing) const {
    return Make(std::move(name), {vocab_per_rank_, m_.hidden},
                {refit::layouts::VocabRows(HfTensorName(kind), m_.vocab, m_.hidden, vocab_per_rank_,
                                           tp_rank_)},
                sharing);
  }

  // Per query group g of this rank: g's q heads, then its k head, then its v head.
  LocalPlan Qkv(std::string name, uint64_t layer, bool bias) const {
    const uint64_t hd = m_.head_dim, qpg = m_.heads_per_group();
    const uint64_t groups = m_.num_kv_heads / tp_, group_rows = (qpg + 2) * hd;
    auto shape_of = [&](uint64_t rows) { return bias ? Shape{rows} : Shape{rows, m_.hidden}; };
    const HfKind q = bias ? HfKind::kQBias : HfKind::kQ;
    const HfKind k = bias ? HfKind::kKBias : HfKind::kK;
    const HfKind v = bias ? HfKind::kVBias : HfKind::kV;
    std::vector<Piece> pieces;
    for (uint64_t i = 0; i < groups; ++i) {
      const uint64_t g = tp_rank_ * groups + i, base = i * group_rows;
      pieces.push_back(refit::layouts::Rows(HfTensorName(q, layer), shape_of(m_.q_rows()),
                                            g * qpg * hd, base, qpg * hd));
      pieces.push_back(refit::layouts::Rows(HfTensorName(k, layer), shape_of(m_.kv_rows()), g * hd,
                                            base + qpg * hd, hd));
      pieces.push_back(refit::layouts::Rows(HfTensorName(v, layer), shape_of(m_.kv_rows()), g * hd,
                                            base + (qpg + 1) * hd, hd));
    }
    return Make(std::move(name), shape_of(groups * group_rows), std::move(pieces), TpSplit());
  }

  LocalPlan Fc1(std::string name, HfKind gate, HfKind up, uint64_t layer, uint64_t expert,
                uint64_t ffn, Sharing sharing) const {
    return Make(
        std::move(name), {2 * (ffn / tp_), m_.hidden},
        refit::layouts::GateUpRows(HfTensorName(gate, layer, expert),
                                   HfTensorName(up, layer, expert), ffn, m_.hidden, tp_, tp_rank_),
        sharing);
  }

  LocalPlan RowParallel(std::string name, std::string canonical, uint64_t in_features,
                        Sharing sharing) const {
    return Make(
        std::move(name), {m_.hidden, in_features / tp_},
        {refit::layouts::InputCols(std::move(canonical), m_.hidden, in_features, tp_, tp_rank_)},
        sharing);
  }

  Result<LocalPlan> Plan(const std::string& name) const {
    if (name == kEmbedding) {
      if (!first_stage()) return NotHere(name, "the first");
      // A tied embedding is also held by the last stage (as output_layer): the first stage sends
      // it.
      Sharing sharing = TpSplit();
      sharing.replicated = sharing.replicated || (m_.tie_word_embeddings && pp_ > 1);
      return VocabParallel(name, HfKind::kEmbed, sharing);
    }
    if (name == kFinalNorm) {
      if (!last_stage()) return NotHere(name, "the last");
      return Norm(name, HfKind::kFinalNorm, 0, m_.hidden);
    }
    if (name == kOutput) {
      if (!last_stage()) return NotHere(name, "the last");
      if (!m_.tie_word_embeddings) return VocabParallel(name, HfKind::kLmHead, TpSplit());
      if (pp_ == 1) {
        return Status::Invalid(
            "tie_word_embeddings = true: with pp = 1 the output layer is the "
            "embedding, there is no output_layer.weight");
      }
      // The last stage's copy of the tied embedding: the first stage sends those rows.
      return VocabParallel(name, HfKind::kEmbed, {true, RankOf(tp_rank_, 0, 0)});
    }
    uint64_t l = 0;
    std::string rest;
    if (!refit::layouts::ParseIndexed(name, kLayerPrefix, &l, &rest)) return Unknown(name);
    if (l >= layers_per_stage_) {
      return Status::Invalid("local layer " + std::to_string(l) + " is past the " +
                             std::to_string(layers_per_stage_) + " layers of a pipeline stage");
    }
    const uint64_t g = GlobalLayer(l);
    if (rest == "self_attention.linear_qkv.layer_norm_weight") {
      return Norm(name, HfKind::kInputNorm, g, m_.hidden);
    }
    if (rest == "self_attention.q_layernorm.weight") {
      return Norm(name, HfKind::kQNorm, g, m_.head_dim);
    }
    if (rest == "self_attention.k_layernorm.weight") {
      return Norm(name, HfKind::kKNorm, g, m_.head_dim);
    }
    if (rest == "self_attention.linear_qkv.weight") return Qkv(name, g, /*bias=*/false);
    if (rest == "self_attention.linear_qkv.bias") return Qkv(name, g, /*bias=*/true);
    if (rest == "self_attention.linear_proj.weight") {
      return RowParallel(name, HfTensorName(HfKind::kO, g), m_.q_rows(), TpSplit());
    }
    if (rest == "mlp.linear_fc1.layer_norm_weight" || rest == "pre_mlp_layernorm.weight") {
      return Norm(name, HfKind::kPostAttnNorm, g, m_.hidden);
    }
    if (rest == "mlp.linear_fc1.weight") {
      return Fc1(name, HfKind::kGate, HfKind::kUp, g, 0, m_.ffn, TpSplit());
    }
    if (rest == "mlp.linear_fc2.weight") {
      return RowParallel(name, HfTensorName(HfKind::kDown, g), m_.ffn, TpSplit());
    }
    if (m_.num_experts == 0) return Unknown(name);
    if (rest == "mlp.router.weight") {
      return Make(name, {m_.num_experts, m_.hidden},
                  {refit::layouts::Whole(HfTensorName(HfKind::kRouter, g),
                                         {m_.num_experts, m_.hidden}, false, 0)},
                  StageWide());
    }
    uint64_t j = 0;
    std::string expert_rest;
    if (!refit::layouts::ParseIndexed(rest, kExpertPrefix, &j, &expert_rest)) return Unknown(name);
    if (j >= experts_per_rank()) {
      return Status::Invalid("local expert " + std::to_string(j) + " is past the " +
                             std::to_string(experts_per_rank()) + " experts of an ep rank");
    }
    const uint64_t e = ep_rank_ * experts_per_rank() + j;
    if (expert_rest == "linear_fc1.weight") {
      return Fc1(name, HfKind::kExpertGate, HfKind::kExpertUp, g, e, m_.moe_ffn, Own());
    }
    if (expert_rest == "linear_fc2.weight") {
      return RowParallel(name, HfTensorName(HfKind::kExpertDown, g, e), m_.moe_ffn, Own());
    }
    return Unknown(name);
  }

  // With experts configured every layer is MoE, except one whose dense MLP tensors are given.
  // (Decided from the config, not from the router: a sender rank's subset may lack the router.)
  bool IsMoeLayer(uint64_t layer, const std::set<std::string>& names) const {
    if (m_.num_experts == 0) return false;
    for (HfKind dense : {HfKind::kGate, HfKind::kUp, HfKind::kDown}) {
      if (names.count(HfTensorName(dense, layer)) != 0) return false;
    }
    return true;
  }

  // A canonical tensor no rank of this layout would hold is an error, not a silent drop.
  Status CheckCanonical(const std::string& name, const std::set<std::string>& names) const {
    std::optional<refit::layouts::HfName> hf = refit::layouts::ParseHfName(name);
    if (!hf) {
      return Status::Invalid("unknown tensor '" + name +
                             "' (the megatron layout maps HuggingFace Llama/Qwen-style names)");
    }
    if (hf->kind == HfKind::kLmHead && m_.tie_word_embeddings) {
      return Status::Invalid(
          "'lm_head.weight' is in the checkpoint but tie_word_embeddings = true");
    }
    if (!refit::layouts::IsPerLayer(hf->kind)) return Status::OK();
    if (hf->layer >= m_.num_layers) {
      return Status::Invalid("tensor '" + name + "' is in layer " + std::to_string(hf->layer) +
                             ", the config has num_layers = " + std::to_string(m_.num_layers));
    }
    const bool moe_tensor = hf->kind == HfKind::kRouter || refit::layouts::IsExpert(hf->kind);
    if (moe_tensor && m_.num_experts == 0) {
      return Status::Invalid("tensor '" + name +
                             "' is an MoE tensor, the config has num_experts = 0");
    }
    if (refit::layouts::IsExpert(hf->kind) && hf->expert >= m_.num_experts) {
      return Status::Invalid("tensor '" + name + "' is expert " + std::to_string(hf->expert) +
                             ", the config has num_experts = " + std::to_string(m_.num_experts));
    }
    const bool dense_tensor =
        hf->kind == HfKind::kGate || hf->kind == HfKind::kUp || hf->kind == HfKind::kDown;
    if (dense_tensor && m_.num_experts > 0 &&
        names.count(HfTensorName(HfKind::kRouter, hf->layer)) != 0) {
      return Status::Invalid("layer " + std::to_string(hf->layer) + " has both a router and '" +
                             name + "' (shared experts are not mapped)");
    }
    return Status::OK();
  }

  Status NotHere(const std::string& name, const char* stage) const {
    return Status::Invalid("'" + name + "' lives on " + stage + " pipeline stage, rank " +
                           std::to_string(rank_) + " is stage " + std::to_string(pp_rank_));
  }
  static Status Unknown(const std::string& name) {
    return Status::Invalid("'" + name +
                           "' is not a Megatron-Core GPT tensor name this layout maps");
  }

  ModelConfig m_;
  uint64_t tp_ = 1, pp_ = 1, ep_ = 1;
  int rank_ = 0;
  uint64_t tp_rank_ = 0, ep_rank_ = 0, pp_rank_ = 0;
  uint64_t layers_per_stage_ = 0;
  uint64_t vocab_per_rank_ = 0;
};

}  // namespace

REFIT_PLUGIN("megatron", "0.1.0",
             refit::sdk::MakeLayout<MegatronLayout>(
                 "megatron",
                 "Megatron-Core GPT shards (TP/PP/EP, fused QKV and gate/up, vocab-parallel "
                 "embedding/output) <-> HuggingFace tensors",
                 &kKeys))
