// The megatron layout: exact cover, single owners and bit-exact round trips for TP x PP, GQA and
// expert parallelism, and every local tensor compared with the test's own statement of
// Megatron-Core's placement rules.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "layout_test_util.h"

namespace refit::testing {
namespace {

struct Parallel {
  uint64_t tp = 1, pp = 1, ep = 1;
};

Config MegatronConfig(const ModelDesc& m, const Parallel& par) {
  std::string toml = "[layout.megatron]\n" + m.Toml() + "tp = " + std::to_string(par.tp) +
                     "\npp = " + std::to_string(par.pp) + "\nep = " + std::to_string(par.ep) + "\n";
  Result<Config> c = Config::FromString(toml, "megatron-test.toml");
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? c.value() : Config();
}

// What rank (t, e, p) holds, written out directly from the Megatron-Core rules (docs/layouts.md):
// name -> bits.
std::map<std::string, std::vector<uint8_t>> ExpectedMegatronRank(
    const ModelDesc& m, const Parallel& par, int rank, const std::vector<CanonicalTensor>& c) {
  auto T = [&](const std::string& name) -> const CanonicalTensor& {
    const CanonicalTensor* t = FindCanonical(c, name);
    EXPECT_NE(t, nullptr) << name;
    return *t;
  };
  const uint64_t t = rank % par.tp, e = rank / par.tp % par.ep, p = rank / (par.tp * par.ep);
  const uint64_t layers_per_stage = m.layers / par.pp, hd = m.head_dim;
  const uint64_t qpg = m.heads / m.kv_heads, groups = m.kv_heads / par.tp;
  const uint64_t padded = (m.vocab + 128 * par.tp - 1) / (128 * par.tp) * (128 * par.tp);
  const uint64_t vpr = padded / par.tp;
  std::map<std::string, std::vector<uint8_t>> out;
  auto vocab_rows = [&](const CanonicalTensor& src) {
    const uint64_t start = t * vpr;
    const uint64_t n = start < m.vocab ? std::min(vpr, m.vocab - start) : 0;
    std::vector<uint8_t> bits = Rows(src, start, n);
    bits.resize(vpr * m.hidden * 4, 0);  // padding rows
    return bits;
  };
  if (p == 0) out["embedding.word_embeddings.weight"] = vocab_rows(T("model.embed_tokens.weight"));
  for (uint64_t l = 0; l < layers_per_stage; ++l) {
    const uint64_t g = p * layers_per_stage + l;
    const std::string hf = "model.layers." + std::to_string(g) + ".";
    const std::string mg = "decoder.layers." + std::to_string(l) + ".";
    out[mg + "self_attention.linear_qkv.layer_norm_weight"] =
        T(hf + "input_layernorm.weight").bytes;
    if (m.qk_norm) {
      out[mg + "self_attention.q_layernorm.weight"] = T(hf + "self_attn.q_norm.weight").bytes;
      out[mg + "self_attention.k_layernorm.weight"] = T(hf + "self_attn.k_norm.weight").bytes;
    }
    for (const std::string kind : {"weight", "bias"}) {
      if (kind == "bias" && !m.qkv_bias) continue;
      std::vector<uint8_t> qkv;
      for (uint64_t i = 0; i < groups; ++i) {
        const uint64_t group = t * groups + i;
        Append(&qkv, Rows(T(hf + "self_attn.q_proj." + kind), group * qpg * hd, qpg * hd));
        Append(&qkv, Rows(T(hf + "self_attn.k_proj." + kind), group * hd, hd));
        Append(&qkv, Rows(T(hf + "self_attn.v_proj." + kind), group * hd, hd));
      }
      out[mg + "self_attention.linear_qkv." + kind] = qkv;
    }
    const uint64_t q_cols = m.heads * hd / par.tp;
    out[mg + "self_attention.linear_proj.weight"] =
        Cols(T(hf + "self_attn.o_proj.weight"), t * q_cols, q_cols);
    if (m.experts == 0) {
      const uint64_t f = m.ffn / par.tp;
      out[mg + "mlp.linear_fc1.layer_norm_weight"] =
          T(hf + "post_attention_layernorm.weight").bytes;
      std::vector<uint8_t> fc1 = Rows(T(hf + "mlp.gate_proj.weight"), t * f, f);
      Append(&fc1, Rows(T(hf + "mlp.up_proj.weight"), t * f, f));
      out[mg + "mlp.linear_fc1.weight"] = fc1;
      out[mg + "mlp.linear_fc2.weight"] = Cols(T(hf + "mlp.down_proj.weight"), t * f, f);
    } else {
      const uint64_t f = m.moe_ffn / par.tp, per_rank = m.experts / par.ep;
      out[mg + "pre_mlp_layernorm.weight"] = T(hf + "post_attention_layernorm.weight").bytes;
      out[mg + "mlp.router.weight"] = T(hf + "mlp.gate.weight").bytes;
      for (uint64_t j = 0; j < per_rank; ++j) {
        const std::string x = hf + "mlp.experts." + std::to_string(e * per_rank + j) + ".";
        const std::string lx = mg + "mlp.experts.local_experts." + std::to_string(j) + ".";
        std::vector<uint8_t> fc1 = Rows(T(x + "gate_proj.weight"), t * f, f);
        Append(&fc1, Rows(T(x + "up_proj.weight"), t * f, f));
        out[lx + "linear_fc1.weight"] = fc1;
        out[lx + "linear_fc2.weight"] = Cols(T(x + "down_proj.weight"), t * f, f);
      }
    }
  }
  if (p + 1 == par.pp) {
    out["decoder.final_layernorm.weight"] = T("model.norm.weight").bytes;
    if (!m.tie) {
      out["output_layer.weight"] = vocab_rows(T("lm_head.weight"));
    } else if (par.pp > 1) {
      out["output_layer.weight"] = vocab_rows(T("model.embed_tokens.weight"));
    }
  }
  return out;
}

void CheckMegatron(const ModelDesc& m, const Parallel& par) {
  std::shared_ptr<Registry> registry = TestRegistry();
  ASSERT_NE(registry, nullptr);
  std::vector<CanonicalTensor> canonical = MakeCheckpoint(m);
  const int world = static_cast<int>(par.tp * par.pp * par.ep);
  std::vector<RankShards> ranks =
      ShardAll(*registry, "megatron", world, MegatronConfig(m, par), canonical);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(world));
  ExpectExactCover(canonical, ranks);
  ExpectRoundTrip(canonical, ranks);
  for (const RankShards& rank : ranks) {
    std::map<std::string, std::vector<uint8_t>> expected =
        ExpectedMegatronRank(m, par, rank.rank, canonical);
    std::map<std::string, std::vector<uint8_t>> actual;
    for (const LocalTensor& t : rank.tensors) actual[t.spec.name] = t.bytes;
    std::vector<std::string> expected_names, actual_names;
    for (const auto& [name, bits] : expected) expected_names.push_back(name);
    for (const auto& [name, bits] : actual) actual_names.push_back(name);
    ASSERT_EQ(actual_names, expected_names) << "rank " << rank.rank;
    for (const auto& [name, bits] : expected) {
      EXPECT_TRUE(actual[name] == bits) << "rank " << rank.rank << ": " << name;
    }
  }
}

TEST(MegatronLayout, Tp2Pp2) {
  ModelDesc m;
  m.layers = 4;
  m.heads = 8;
  m.kv_heads = 2;
  CheckMegatron(m, {2, 2, 1});
}

TEST(MegatronLayout, Tp2Pp2WithBiasQkNormAndTiedEmbeddings) {
  ModelDesc m;
  m.layers = 2;
  m.heads = 4;
  m.kv_heads = 2;
  m.qkv_bias = true;
  m.qk_norm = true;
  m.tie = true;  // the last stage holds a copy of the embedding as output_layer
  CheckMegatron(m, {2, 2, 1});
}

TEST(MegatronLayout, Tp4GroupedQueryAttention) {
  ModelDesc m;
  m.heads = 8;
  m.kv_heads = 4;  // one query group of 2 q heads per rank
  m.head_dim = 2;
  m.vocab = 300;  // 512 padded rows: rank 2 holds 44 real rows, rank 3 only padding
  CheckMegatron(m, {4, 1, 1});
}

TEST(MegatronLayout, Ep2WithExperts) {
  ModelDesc m;
  m.experts = 4;
  m.kv_heads = 2;
  CheckMegatron(m, {2, 1, 2});
}

TEST(MegatronLayout, Ep2Pp2WithExperts) {
  ModelDesc m;
  m.experts = 4;
  m.layers = 2;
  CheckMegatron(m, {1, 2, 2});
}

TEST(MegatronLayout, RejectsWhatMegatronCannotShard) {
  std::shared_ptr<Registry> registry = TestRegistry();
  ASSERT_NE(registry, nullptr);
  ModelDesc m;
  m.heads = 8;
  m.kv_heads = 2;
  auto layout = registry->CreateLayout("megatron", 0, 4, nullptr, "");
  EXPECT_EQ(layout.status().message(),
            "layout 'megatron': create: config key 'num_layers' is required (part of the model "
            "description)");
  Config tp4 = MegatronConfig(m, {4, 1, 1});
  layout = registry->CreateLayout("megatron", 0, 4, &tp4, "layout.megatron");
  EXPECT_EQ(layout.status().message(),
            "layout 'megatron': create: num_kv_heads 2 is not divisible by tp 4");
  Config tp2 = MegatronConfig(m, {2, 1, 1});
  layout = registry->CreateLayout("megatron", 0, 4, &tp2, "layout.megatron");
  EXPECT_EQ(layout.status().message(),
            "layout 'megatron': create: world size 4 is not tp * pp * ep = 2");
}

TEST(MegatronLayout, ListLocalNamesTheTensorAtFault) {
  std::shared_ptr<Registry> registry = TestRegistry();
  ASSERT_NE(registry, nullptr);
  ModelDesc m;
  Config config = MegatronConfig(m, {1, 1, 1});
  auto layout = registry->CreateLayout("megatron", 0, 1, &config, "layout.megatron");
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  std::vector<TensorSpec> specs = Specs(MakeCheckpoint(m));
  specs.push_back({"model.layers.0.mlp.shared_expert.weight", DType::kF32, {4}});
  auto listed = layout.value()->ListLocal(specs);
  EXPECT_EQ(listed.status().message(),
            "layout 'megatron': list local tensors: unknown tensor "
            "'model.layers.0.mlp.shared_expert.weight' (the megatron layout maps HuggingFace "
            "Llama/Qwen-style names)");
  specs = Specs(MakeCheckpoint(m));
  specs[1].shape = {17};  // input_layernorm of layer 0
  listed = layout.value()->ListLocal(specs);
  EXPECT_EQ(listed.status().message(),
            "layout 'megatron': list local tensors: tensor 'model.layers.0.input_layernorm.weight' "
            "has shape [17], the layout's config expects [16]");
  specs = Specs(MakeCheckpoint(m));
  specs.erase(specs.begin() + 3);  // k_proj of layer 0
  listed = layout.value()->ListLocal(specs);
  EXPECT_EQ(listed.status().message(),
            "layout 'megatron': list local tensors: 'decoder.layers.0.self_attention.linear_qkv."
            "weight' needs tensor 'model.layers.0.self_attn.k_proj.weight', which the checkpoint "
            "lacks (it has 'model.layers.0.self_attn.q_proj.weight')");
}

// A caller may describe a subset of the checkpoint (a sender rank's tensors): local tensors none
// of whose sources are given are left out; a fused tensor given only in part is an error.
TEST(MegatronLayout, ListLocalOfASubsetOfTheCheckpoint) {
  std::shared_ptr<Registry> registry = TestRegistry();
  ASSERT_NE(registry, nullptr);
  ModelDesc m;
  m.layers = 4;
  Config config = MegatronConfig(m, {1, 2, 1});
  auto layout = registry->CreateLayout("megatron", 1, 2, &config, "layout.megatron");
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  std::vector<TensorSpec> layer3;
  for (const TensorSpec& t : Specs(MakeCheckpoint(m))) {
    const bool norm = t.name.find("layernorm") != std::string::npos;
    if (t.name.rfind("model.layers.3.", 0) == 0 && !norm) layer3.push_back(t);
  }
  auto listed = layout.value()->ListLocal(layer3);
  ASSERT_TRUE(listed.ok()) << listed.status().message();
  std::vector<std::string> names;
  for (const TensorSpec& t : listed.value()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"decoder.layers.1.self_attention.linear_qkv.weight",
                                             "decoder.layers.1.self_attention.linear_proj.weight",
                                             "decoder.layers.1.mlp.linear_fc1.weight",
                                             "decoder.layers.1.mlp.linear_fc2.weight"}));
  layer3.erase(layer3.begin() + 1);  // k_proj
  listed = layout.value()->ListLocal(layer3);
  EXPECT_EQ(listed.status().message(),
            "layout 'megatron': list local tensors: 'decoder.layers.1.self_attention.linear_qkv."
            "weight' needs tensor 'model.layers.3.self_attn.k_proj.weight', which the checkpoint "
            "lacks (it has 'model.layers.3.self_attn.q_proj.weight')");
}

// An expert-parallel rank that is not the owner of the norms and the router describes only its
// experts and TP slices: its MoE layers are still MoE layers.
TEST(MegatronLayout, ListLocalOfAnMoeSubsetWithoutTheRouter) {
  std::shared_ptr<Registry> registry = TestRegistry();
  ASSERT_NE(registry, nullptr);
  ModelDesc m;
  m.layers = 1;
  m.experts = 4;
  Config config = MegatronConfig(m, {1, 1, 2});
  auto layout = registry->CreateLayout("megatron", 1, 2, &config, "layout.megatron");
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  std::vector<TensorSpec> experts;
  for (const TensorSpec& t : Specs(MakeCheckpoint(m))) {
    if (t.name.find(".mlp.experts.") != std::string::npos) experts.push_back(t);
  }
  auto listed = layout.value()->ListLocal(experts);
  ASSERT_TRUE(listed.ok()) << listed.status().message();
  std::vector<std::string> names;
  for (const TensorSpec& t : listed.value()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight",
                       "decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.weight",
                       "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight",
                       "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight"}));
}

TEST(MegatronLayout, MapTensorChecksTheLocalShapeAndStage) {
  std::shared_ptr<Registry> registry = TestRegistry();
  ASSERT_NE(registry, nullptr);
  ModelDesc m;
  m.layers = 4;
  Config config = MegatronConfig(m, {1, 2, 1});
  auto layout = registry->CreateLayout("megatron", 1, 2, &config, "layout.megatron");
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  refit_local_tensor_t local{};
  local.struct_size = sizeof(local);
  local.dtype = REFIT_DTYPE_F32;
  local.name = "embedding.word_embeddings.weight";
  local.ndim = 2;
  local.shape[0] = 256;
  local.shape[1] = 16;
  auto slices = layout.value()->MapTensor(local);
  EXPECT_EQ(slices.status().message(),
            "layout 'megatron': map 'embedding.word_embeddings.weight': "
            "'embedding.word_embeddings.weight' lives on the first pipeline stage, rank 1 is "
            "stage 1");
  local.name = "decoder.layers.1.mlp.linear_fc2.weight";
  local.shape[0] = 16;
  local.shape[1] = 25;
  slices = layout.value()->MapTensor(local);
  EXPECT_EQ(slices.status().message(),
            "layout 'megatron': map 'decoder.layers.1.mlp.linear_fc2.weight': local tensor "
            "'decoder.layers.1.mlp.linear_fc2.weight' has shape [16, 25], the layout's config "
            "gives [16, 24]");
  local.shape[1] = 24;
  slices = layout.value()->MapTensor(local);
  ASSERT_TRUE(slices.ok()) << slices.status().message();
  ASSERT_EQ(slices.value().size(), 1u);
  EXPECT_EQ(slices.value()[0].canonical_name, "model.layers.3.mlp.down_proj.weight");
}

}  // namespace
}  // namespace refit::testing
