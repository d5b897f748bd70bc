// The vllm layout (receiver side): qkv_proj = [q rows; k rows; v rows] of the rank, gate_up_proj =
// [gate rows; up rows], o_proj/down_proj split on dim 1, vocab-parallel embed_tokens/lm_head;
// with fewer kv heads than ranks each kv head is replicated and sent once.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "layout_test_util.h"

namespace refit::testing {
namespace {

Config VllmConfig(const ModelDesc& m) {
  Result<Config> c = Config::FromString("[layout.vllm]\n" + m.Toml(), "vllm-test.toml");
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? c.value() : Config();
}

// vLLM's placement for TP rank t, written out directly: name -> bits.
std::map<std::string, std::vector<uint8_t>> ExpectedVllmRank(
    const ModelDesc& m, uint64_t tp, uint64_t t, const std::vector<CanonicalTensor>& c) {
  auto T = [&](const std::string& name) -> const CanonicalTensor& {
    const CanonicalTensor* x = FindCanonical(c, name);
    EXPECT_NE(x, nullptr) << name;
    return *x;
  };
  const uint64_t hd = m.head_dim, q_rows = m.heads * hd / tp;
  const uint64_t kv_heads = m.kv_heads >= tp ? m.kv_heads / tp : 1;
  const uint64_t first_kv = m.kv_heads >= tp ? t * kv_heads : t / (tp / m.kv_heads);
  const uint64_t vpr = (m.vocab + 63) / 64 * 64 / tp;
  auto vocab_rows = [&](const CanonicalTensor& src) {
    const uint64_t start = t * vpr;
    std::vector<uint8_t> bits =
        Rows(src, start, start < m.vocab ? std::min(vpr, m.vocab - start) : 0);
    bits.resize(vpr * m.hidden * 4, 0);
    return bits;
  };
  std::map<std::string, std::vector<uint8_t>> out;
  out["model.embed_tokens.weight"] = vocab_rows(T("model.embed_tokens.weight"));
  for (uint64_t l = 0; l < m.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out[p + "input_layernorm.weight"] = T(p + "input_layernorm.weight").bytes;
    out[p + "post_attention_layernorm.weight"] = T(p + "post_attention_layernorm.weight").bytes;
    std::vector<uint8_t> qkv = Rows(T(p + "self_attn.q_proj.weight"), t * q_rows, q_rows);
    Append(&qkv, Rows(T(p + "self_attn.k_proj.weight"), first_kv * hd, kv_heads * hd));
    Append(&qkv, Rows(T(p + "self_attn.v_proj.weight"), first_kv * hd, kv_heads * hd));
    out[p + "self_attn.qkv_proj.weight"] = qkv;
    out[p + "self_attn.o_proj.weight"] = Cols(T(p + "self_attn.o_proj.weight"), t * q_rows, q_rows);
    const uint64_t f = m.ffn / tp;
    std::vector<uint8_t> gate_up = Rows(T(p + "mlp.gate_proj.weight"), t * f, f);
    Append(&gate_up, Rows(T(p + "mlp.up_proj.weight"), t * f, f));
    out[p + "mlp.gate_up_proj.weight"] = gate_up;
    out[p + "mlp.down_proj.weight"] = Cols(T(p + "mlp.down_proj.weight"), t * f, f);
  }
  out["model.norm.weight"] = T("model.norm.weight").bytes;
  if (!m.tie) out["lm_head.weight"] = vocab_rows(T("lm_head.weight"));
  return out;
}

void CheckVllm(const ModelDesc& m, uint64_t tp) {
  std::shared_ptr<Registry> registry = TestRegistry();
  ASSERT_NE(registry, nullptr);
  std::vector<CanonicalTensor> canonical = MakeCheckpoint(m);
  std::vector<RankShards> ranks =
      ShardAll(*registry, "vllm", static_cast<int>(tp), VllmConfig(m), canonical);
  ASSERT_EQ(ranks.size(), tp);
  ExpectExactCover(canonical, ranks);
  ExpectRoundTrip(canonical, ranks);
  for (const RankShards& rank : ranks) {
    auto expected = ExpectedVllmRank(m, tp, static_cast<uint64_t>(rank.rank), canonical);
    std::map<std::string, std::vector<uint8_t>> actual;
    for (const LocalTensor& t : rank.tensors) actual[t.spec.name] = t.bytes;
    ASSERT_EQ(actual.size(), expected.size()) << "rank " << rank.rank;
    for (const auto& [name, bits] : expected) {
      ASSERT_EQ(actual.count(name), 1u) << "rank " << rank.rank << " lacks " << name;
      EXPECT_TRUE(actual[name] == bits) << "rank " << rank.rank << ": " << name;
    }
  }
}

TEST(VllmLayout, Tp2) {
  ModelDesc m;
  m.heads = 4;
  m.kv_heads = 2;
  m.vocab = 100;  // padded to 128: rank 1 holds 36 real rows and 28 padding rows
  CheckVllm(m, 2);
}

TEST(VllmLayout, Tp4WithFewerKvHeadsThanRanks) {
  ModelDesc m;
  m.heads = 8;
  m.kv_heads = 2;  // each kv head lives on 2 ranks and is sent by the lower one
  m.head_dim = 2;
  m.tie = true;
  CheckVllm(m, 4);
}

TEST(VllmLayout, RejectsExperts) {
  std::shared_ptr<Registry> registry = TestRegistry();
  ASSERT_NE(registry, nullptr);
  ModelDesc m;
  m.experts = 2;
  Config config = VllmConfig(m);
  auto layout = registry->CreateLayout("vllm", 0, 2, &config, "layout.vllm");
  EXPECT_EQ(layout.status().message(),
            "layout 'vllm': create: the vllm layout does not map MoE experts (num_experts > 0)");
}

}  // namespace
}  // namespace refit::testing
