// `refit shard`: the real binary cuts a synthetic HuggingFace checkpoint into per-rank files whose
// names, tensors, shapes and bits are checked against the layouts' slices of the canonical tensors.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "../unit/layout_test_util.h"
#include "cli_harness.h"

namespace refit::testing {
namespace {

std::set<std::string> FilesIn(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

// Every file holds exactly the tensors (names in order, dtypes, shapes, bits) the layout lists for
// its rank, filled from the canonical tensors through the layout's slices.
void ExpectShardFiles(const std::string& dir, const std::vector<std::string>& files,
                      const std::vector<RankShards>& ranks) {
  ASSERT_EQ(files.size(), ranks.size());
  EXPECT_EQ(FilesIn(dir), std::set<std::string>(files.begin(), files.end()));
  for (size_t r = 0; r < files.size(); ++r) {
    auto file = SafetensorsFile::Open(dir + "/" + files[r]);
    ASSERT_TRUE(file.ok()) << file.status().message();
    const auto& tensors = file.value()->tensors();
    ASSERT_EQ(tensors.size(), ranks[r].tensors.size()) << files[r];
    for (size_t i = 0; i < tensors.size(); ++i) {
      const LocalTensor& want = ranks[r].tensors[i];
      EXPECT_EQ(tensors[i].name, want.spec.name) << files[r];
      EXPECT_EQ(tensors[i].dtype, want.spec.dtype) << want.spec.name;
      EXPECT_EQ(tensors[i].shape, want.spec.shape) << want.spec.name;
      ASSERT_EQ(tensors[i].nbytes(), want.bytes.size()) << want.spec.name;
      EXPECT_EQ(std::memcmp(tensors[i].data, want.bytes.data(), want.bytes.size()), 0)
          << files[r] << ": " << want.spec.name;
    }
    EXPECT_EQ(file.value()->metadata().at("refit.rank"), std::to_string(r));
  }
}

Config LayoutConfig(const std::string& layout, const std::string& keys) {
  Result<Config> c = Config::FromString("[layout." + layout + "]\n" + keys);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? c.value() : Config();
}

TEST(ShardCli, MegatronTp2Pp2) {
  TempDir dir;
  ModelDesc m;
  m.layers = 4;
  m.heads = 8;
  m.kv_heads = 2;
  std::vector<CanonicalTensor> canonical = MakeCheckpoint(m);
  ASSERT_TRUE(WriteSafetensors(dir / "hf.safetensors", Views(canonical)).ok());
  auto r = RunRefit({"shard", dir / "hf.safetensors", "--layout", "megatron", "--tp", "2", "--pp",
                     "2", "--num-heads", "8", "-o", dir / "out"},
                    dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(LineCount(r.out), 5) << r.out;  // one line per file and a summary
  std::shared_ptr<Registry> registry = TestRegistry();
  ASSERT_NE(registry, nullptr);
  std::vector<RankShards> ranks = ShardAll(
      *registry, "megatron", 4, LayoutConfig("megatron", m.Toml() + "tp = 2\npp = 2\n"), canonical);
  ExpectShardFiles(
      dir / "out",
      {"tp0_pp0.safetensors", "tp1_pp0.safetensors", "tp0_pp1.safetensors", "tp1_pp1.safetensors"},
      ranks);

  // Spelled out: tp rank 1 holds query group 1 (q heads 4..7, then k and v head 1) of layer 2 as
  // its local layer 0 on stage 1, and the vocab rows 128..199 followed by 56 zero rows.
  auto stage1 = SafetensorsFile::Open(dir / "out/tp1_pp1.safetensors");
  ASSERT_TRUE(stage1.ok());
  const TensorView* qkv = stage1.value()->Find("decoder.layers.0.self_attention.linear_qkv.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->shape, (Shape{24, 16}));
  std::vector<uint8_t> want =
      Rows(*FindCanonical(canonical, "model.layers.2.self_attn.q_proj.weight"), 16, 16);
  Append(&want, Rows(*FindCanonical(canonical, "model.layers.2.self_attn.k_proj.weight"), 4, 4));
  Append(&want, Rows(*FindCanonical(canonical, "model.layers.2.self_attn.v_proj.weight"), 4, 4));
  EXPECT_EQ(std::memcmp(qkv->data, want.data(), want.size()), 0);
  const TensorView* out = stage1.value()->Find("output_layer.weight");
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(out->shape, (Shape{128, 16}));
  want = Rows(*FindCanonical(canonical, "lm_head.weight"), 128, 72);
  EXPECT_EQ(std::memcmp(out->data, want.data(), want.size()), 0);
  for (uint64_t b = want.size(); b < out->nbytes(); ++b) ASSERT_EQ(out->bytes()[b], 0) << b;
  EXPECT_EQ(stage1.value()->Find("embedding.word_embeddings.weight"), nullptr);
}

TEST(ShardCli, MegatronExpertParallelNamesEpFiles) {
  TempDir dir;
  ModelDesc m;
  m.experts = 4;
  m.kv_heads = 2;
  m.qk_norm = true;  // head_dim, and so num_heads, is inferred from q_norm
  std::vector<CanonicalTensor> canonical = MakeCheckpoint(m);
  ASSERT_TRUE(WriteSafetensors(dir / "hf.safetensors", Views(canonical)).ok());
  auto r = RunRefit({"shard", dir / "hf.safetensors", "--layout", "megatron", "--tp", "2", "--ep",
                     "2", "-o", dir / "out"},
                    dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::shared_ptr<Registry> registry = TestRegistry();
  ASSERT_NE(registry, nullptr);
  std::vector<RankShards> ranks = ShardAll(
      *registry, "megatron", 4, LayoutConfig("megatron", m.Toml() + "tp = 2\nep = 2\n"), canonical);
  ExpectShardFiles(dir / "out",
                   {"tp0_pp0_ep0.safetensors", "tp1_pp0_ep0.safetensors", "tp0_pp0_ep1.safetensors",
                    "tp1_pp0_ep1.safetensors"},
                   ranks);
}

TEST(ShardCli, FsdpAndVllm) {
  TempDir dir;
  ModelDesc m;
  m.kv_heads = 2;
  m.vocab = 130;
  std::vector<CanonicalTensor> canonical = MakeCheckpoint(m);
  ASSERT_TRUE(WriteSafetensors(dir / "hf.safetensors", Views(canonical)).ok());
  std::shared_ptr<Registry> registry = TestRegistry();
  ASSERT_NE(registry, nullptr);

  auto r = RunRefit(
      {"shard", dir / "hf.safetensors", "--layout", "fsdp", "--world", "4", "-o", dir / "fsdp"},
      dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ExpectShardFiles(
      dir / "fsdp",
      {"rank0.safetensors", "rank1.safetensors", "rank2.safetensors", "rank3.safetensors"},
      ShardAll(*registry, "fsdp", 4,
               LayoutConfig("fsdp", "shapes_from = \"" + dir / "hf.safetensors" + "\"\n"),
               canonical));

  r = RunRefit({"shard", dir / "hf.safetensors", "--layout", "vllm", "--tp", "2", "--num-heads",
                "4", "-o", dir / "vllm"},
               dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ExpectShardFiles(dir / "vllm", {"tp0_pp0.safetensors", "tp1_pp0.safetensors"},
                   ShardAll(*registry, "vllm", 2, LayoutConfig("vllm", m.Toml()), canonical));
}

TEST(ShardCli, ModelDescriptionFromAConfigFile) {
  TempDir dir;
  ModelDesc m;
  m.heads = 8;
  m.kv_heads = 4;
  m.head_dim = 2;
  std::vector<CanonicalTensor> canonical = MakeCheckpoint(m);
  ASSERT_TRUE(WriteSafetensors(dir / "hf.safetensors", Views(canonical)).ok());
  WriteAll(dir / "model.toml", "[layout.megatron]\nnum_heads = 8\nnum_kv_heads = 4\ntp = 4\n");
  auto r = RunRefit({"shard", dir / "hf.safetensors", "--layout", "megatron", "--config",
                     dir / "model.toml", "-o", dir / "out"},
                    dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::shared_ptr<Registry> registry = TestRegistry();
  ASSERT_NE(registry, nullptr);
  ExpectShardFiles(
      dir / "out",
      {"tp0_pp0.safetensors", "tp1_pp0.safetensors", "tp2_pp0.safetensors", "tp3_pp0.safetensors"},
      ShardAll(*registry, "megatron", 4, LayoutConfig("megatron", m.Toml() + "tp = 4\n"),
               canonical));
  r = RunRefit({"shard", dir / "hf.safetensors", "--layout", "megatron", "--config",
                dir / "model.toml", "--tp", "2", "-o", dir / "out2"},
               dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(LineCount(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("--tp 2 contradicts layout.megatron.tp = 4"), std::string::npos) << r.err;
}

// A grouped-query model: its shapes alone give neither the heads nor the kv heads (q_proj rows are
// num_heads * head_dim), so without flags the HuggingFace config.json beside it says.
TEST(ShardCli, HeadsFromTheHuggingFaceConfigJson) {
  TempDir dir;
  ModelDesc m;
  m.heads = 8;
  m.kv_heads = 2;
  std::vector<CanonicalTensor> canonical = MakeCheckpoint(m);
  ASSERT_TRUE(WriteSafetensors(dir / "hf.safetensors", Views(canonical)).ok());
  std::shared_ptr<Registry> registry = TestRegistry();
  ASSERT_NE(registry, nullptr);
  const std::vector<RankShards> want = ShardAll(
      *registry, "megatron", 2, LayoutConfig("megatron", m.Toml() + "tp = 2\n"), canonical);
  const std::vector<std::string> files = {"tp0_pp0.safetensors", "tp1_pp0.safetensors"};
  auto shard = [&](const std::string& out, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {
        "shard", dir / "hf.safetensors", "--layout", "megatron", "--tp", "2", "-o", dir / out};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunRefit(args, dir.path());
  };
  WriteAll(dir / "config.json",
           R"({"model_type": "llama", "num_attention_heads": 8, "num_key_value_heads": 2,
               "hidden_size": 16, "head_dim": null})");
  auto r = shard("out");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ExpectShardFiles(dir / "out", files, want);

  // A flag beats config.json (num_heads here); config.json's head_dim then gives the kv heads.
  WriteAll(dir / "config.json", R"({"head_dim": 4, "num_attention_heads": 4})");
  r = shard("out2", {"--num-heads", "8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ExpectShardFiles(dir / "out2", files, want);
  // So does the TOML config.
  WriteAll(dir / "model.toml", "[layout.megatron]\nnum_heads = 8\nnum_kv_heads = 2\n");
  WriteAll(dir / "config.json", R"({"num_attention_heads": 16, "num_key_value_heads": 16})");
  r = shard("out3", {"--config", dir / "model.toml"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ExpectShardFiles(dir / "out3", files, want);
  // A flag and the TOML config must agree (as for tp/pp/ep).
  r = shard("out4", {"--config", dir / "model.toml", "--num-heads", "4"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(LineCount(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("--num-heads 4 contradicts layout.megatron.num_heads = 8"),
            std::string::npos)
      << r.err;

  // A config.json that cannot be read: one line naming the file (and the key).
  const std::string path = dir / "config.json";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"num_attention_heads": "8"})",
       path + ": num_attention_heads must be a positive integer"},
      {R"({"num_key_value_heads": 2.5})",
       path + ": num_key_value_heads must be a positive integer"},
      {R"({"head_dim": -4})", path + ": head_dim must be a positive integer"},
      {R"({"num_attention_heads": 8,)", path + ": not valid JSON"},
      {"[8, 2]", path + ": not a JSON object"},
  };
  for (const auto& [text, message] : bad) {
    WriteAll(path, text);
    r = shard("bad");
    EXPECT_NE(r.exit_code, 0) << text;
    EXPECT_EQ(LineCount(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir / "bad")) << text;
  }
  std::filesystem::remove(path);
  std::filesystem::create_directory(path);
  r = shard("bad");
  EXPECT_EQ(LineCount(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(path + ": is a directory"), std::string::npos) << r.err;
}

TEST(ShardCli, ErrorsAreOneLineNamingTheCause) {
  TempDir dir;
  ModelDesc m;
  std::vector<CanonicalTensor> canonical = MakeCheckpoint(m);
  canonical.push_back({"model.layers.0.mlp.shared_expert_gate.weight",
                       DType::kF32,
                       {1, 16},
                       std::vector<uint8_t>(64, 1)});
  ASSERT_TRUE(WriteSafetensors(dir / "extra.safetensors", Views(canonical)).ok());
  canonical.pop_back();
  ASSERT_TRUE(WriteSafetensors(dir / "hf.safetensors", Views(canonical)).ok());
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"shard", dir / "extra.safetensors", "--layout", "megatron", "--num-heads", "4"},
       "unknown tensor 'model.layers.0.mlp.shared_expert_gate.weight'"},
      {{"shard", dir / "hf.safetensors", "--layout", "megatron", "--num-heads", "4", "--tp", "5"},
       "num_kv_heads 4 is not divisible by tp 5"},
      {{"shard", dir / "hf.safetensors", "--layout", "megatron", "--num-heads", "4", "--pp", "3"},
       "num_layers 2 is not divisible by pp 3"},
      {{"shard", dir / "hf.safetensors", "--layout", "megatron"}, "cannot infer num_heads"},
      {{"shard", dir / "hf.safetensors", "--layout", "nope"}, "unknown layout 'nope'"},
      {{"shard", dir / "hf.safetensors", "--layout", "fsdp"}, "needs --world N"},
      {{"shard", dir / "hf.safetensors", "--layout", "vllm", "--pp", "2", "--num-heads", "4"},
       "layout 'vllm' has no pp split"},
      {{"shard", dir / "missing.safetensors", "--layout", "megatron"}, "missing.safetensors"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    args.push_back("-o");
    args.push_back(dir / "out");
    auto r = RunRefit(args, dir.path());
    EXPECT_NE(r.exit_code, 0) << c.message;
    EXPECT_EQ(LineCount(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    // A failed run leaves no output directory behind (not even an empty one).
    EXPECT_FALSE(std::filesystem::exists(dir / "out")) << c.message;
  }
  auto help = RunRefit({"shard", "--help"}, dir.path());
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("tp{t}_pp{p}[_ep{e}].safetensors"), std::string::npos) << help.out;
}

// A parallel size of 0 (or less) is a usage error, never read as "not given" and replaced by 1.
TEST(ShardCli, SizesBelowOneAreRefused) {
  TempDir dir;
  ModelDesc m;
  std::vector<CanonicalTensor> canonical = MakeCheckpoint(m);
  ASSERT_TRUE(WriteSafetensors(dir / "hf.safetensors", Views(canonical)).ok());
  for (const char* flag : {"--tp", "--pp", "--ep", "--world"}) {
    for (const char* value : {"0", "-1"}) {
      auto r = RunRefit({"shard", dir / "hf.safetensors", "--layout", "megatron", "--num-heads",
                         "4", flag, value, "-o", dir / "out"},
                        dir.path());
      EXPECT_EQ(r.exit_code, 2) << flag << " " << value << ": " << r.err;
      EXPECT_EQ(LineCount(r.err), 1) << r.err;
      EXPECT_NE(r.err.find(flag), std::string::npos) << r.err;
      EXPECT_FALSE(std::filesystem::exists(dir / "out")) << flag;
    }
  }
}

// A failure after the output directory was made removes the directories the run created, and
// leaves a directory that existed before in place.
TEST(ShardCli, FailedRunRemovesTheDirectoriesItCreated) {
  TempDir dir;
  ModelDesc m;
  std::vector<CanonicalTensor> canonical = MakeCheckpoint(m);
  canonical.push_back({"model.layers.0.mlp.shared_expert_gate.weight",
                       DType::kF32,
                       {1, 16},
                       std::vector<uint8_t>(64, 1)});
  ASSERT_TRUE(WriteSafetensors(dir / "extra.safetensors", Views(canonical)).ok());
  auto r = RunRefit({"shard", dir / "extra.safetensors", "--layout", "megatron", "--num-heads", "4",
                     "-o", dir / "a/b/out"},
                    dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_FALSE(std::filesystem::exists(dir / "a")) << r.err;

  std::filesystem::create_directory(dir / "kept");
  r = RunRefit({"shard", dir / "extra.safetensors", "--layout", "megatron", "--num-heads", "4",
                "-o", dir / "kept/out"},
               dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(std::filesystem::exists(dir / "kept"));
  EXPECT_FALSE(std::filesystem::exists(dir / "kept/out"));
}

}  // namespace
}  // namespace refit::testing
