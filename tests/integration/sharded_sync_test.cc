// Multi-rank syncs as separate processes: an HF checkpoint is cut into trainer shards with
// `refit shard`, one `refit send` process per rank publishes each version (every rank diffs
// only its own shard), and receivers - one canonical, two holding vLLM TP=2 shards - follow.
// After every version the canonical receiver equals the HF checkpoint bit for bit and each
// sharded receiver equals `refit shard --layout vllm` of it.
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "cli_harness.h"
#include "llama_checkpoint.h"

namespace refit::testing {
namespace {

struct Parallel {
  std::string layout;  // megatron | fsdp
  int tp = 1;
  int pp = 1;
  int ep = 1;
  bool pp_mode = false;
  bool vllm_receivers =
      true;  // besides the canonical receiver, two vLLM TP=2 receivers  // sender.mode = "pp": each
             // pipeline stage's TP group sends through rank 0 of it
  int world() const { return layout == "fsdp" ? tp : tp * pp * ep; }
};

std::string Transport(const TempDir& dir) {
  return "[transport]\nname = \"disk\"\n\n[transport.disk]\ndir = \"" + dir / "sync" +
         "\"\nfsync = false\n";
}

std::vector<std::string> ReceiverIds(const Parallel& p) {
  if (!p.vllm_receivers) return {"canon"};
  return {"canon", "v0", "v1"};
}

std::string SenderConfig(const TempDir& dir, const ModelShape& m, const Parallel& p) {
  std::string receivers;
  for (const std::string& id : ReceiverIds(p)) {
    receivers += (receivers.empty() ? "\"" : ", \"") + id + "\"";
  }
  const std::string sharded_receivers =
      p.vllm_receivers ? "receiver_layout = \"vllm\"\nreceiver_world = 2\n" : "";
  // FSDP shards do not tell their canonical shapes: the layout reads them off the checkpoint's
  // header (its first version: shapes do not change).
  std::string layout_keys = "shapes_from = \"" + dir / "hf1.safetensors" + "\"\n";
  if (p.layout == "megatron") {
    layout_keys = ModelKeys(m) + "tp = " + std::to_string(p.tp) + "\npp = " + std::to_string(p.pp) +
                  "\nep = " + std::to_string(p.ep) + "\n";
  }
  return "[sender]\nstate_dir = \"" + dir / "sender" + "\"\nreceivers = [" + receivers +
         "]\nack_timeout_s = 60\n"
         "chunk_bytes = \"2KiB\"\nbucket_bytes = \"16KiB\"\npoll_interval_ms = 10\n" +
         sharded_receivers +
         (p.pp_mode ? "mode = \"pp\"\nstage_ranks = " + std::to_string(p.tp) + "\nstage_dir = \"" +
                          dir / "stage" + "\"\n"
                    : std::string()) +
         "\n[layout]\nname = \"" + p.layout + "\"\n\n[layout." + p.layout + "]\n" + layout_keys +
         "\n[layout.vllm]\n" + ModelKeys(m) + "tp = 2\n\n" + Transport(dir);
}

std::string ReceiverConfig(const TempDir& dir, const ModelShape& m, const std::string& id,
                           int vllm_rank) {
  std::string text = "[receiver]\nid = \"" + id + "\"\nstate_dir = \"" + dir / ("recv-" + id) +
                     "\"\npoll_interval_ms = 10\n";
  if (vllm_rank >= 0) {
    text += "rank = " + std::to_string(vllm_rank) +
            "\nworld = 2\n\n[layout]\nname = \"vllm\"\n\n"
            "[layout.vllm]\n" +
            ModelKeys(m) + "tp = 2\n";
  }
  return text + "\n" + Transport(dir);
}

// `refit shard` of the HF file into dir/out; returns the shard files in rank order.
std::vector<std::string> Shard(const TempDir& dir, const std::string& hf, const std::string& config,
                               const std::string& layout, const Parallel& p,
                               const std::string& out) {
  std::vector<std::string> args = {"shard", hf, "--layout", layout, "--config", config, "-o", out};
  args.insert(args.end(), {layout == "fsdp" ? "--world" : "--tp", std::to_string(p.tp)});
  if (layout == "megatron") {
    args.insert(args.end(), {"--pp", std::to_string(p.pp), "--ep", std::to_string(p.ep)});
  }
  auto r = RunRefit(args, dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> files;
  if (layout == "megatron") {
    // Rank order of the megatron layout: tp fastest, then ep, then pp (docs/layouts.md).
    for (int pp = 0; pp < p.pp; ++pp) {
      for (int ep = 0; ep < p.ep; ++ep) {
        for (int tp = 0; tp < p.tp; ++tp) {
          std::string name = "tp" + std::to_string(tp) + "_pp" + std::to_string(pp);
          if (p.ep > 1) name += "_ep" + std::to_string(ep);
          files.push_back(out + "/" + name + ".safetensors");
        }
      }
    }
  } else {
    const int world = layout == "vllm" ? 2 : p.tp;
    for (int r = 0; r < world; ++r) {
      files.push_back(
          out + "/" +
          (layout == "vllm" ? "tp" + std::to_string(r) + "_pp0" : "rank" + std::to_string(r)) +
          ".safetensors");
    }
  }
  return files;
}

void RunShardedSyncs(const ModelShape& m, const Parallel& p) {
  TempDir dir;
  WriteAll(dir / "sender.toml", SenderConfig(dir, m, p));
  const std::vector<std::string> ids = ReceiverIds(p);
  for (size_t i = 0; i < ids.size(); ++i) {
    WriteAll(dir / (ids[i] + ".toml"), ReceiverConfig(dir, m, ids[i], static_cast<int>(i) - 1));
  }
  const int versions = 3;
  std::vector<std::unique_ptr<RefitProcess>> receivers;
  for (const std::string& id : ids) {
    receivers.push_back(std::make_unique<RefitProcess>(
        std::vector<std::string>{"recv", "--config", dir / (id + ".toml"), "--follow",
                                 "--until-version", std::to_string(versions), "--timeout", "240"},
        dir / ("recv-" + id)));
  }
  Checkpoint hf = MakeHf(m, 7);
  for (int v = 1; v <= versions; ++v) {
    if (v > 1) hf.Mutate(0.02, 40 + v);
    const std::string hf_path = dir / ("hf" + std::to_string(v) + ".safetensors");
    ASSERT_TRUE(hf.Write(hf_path));
    std::vector<std::string> shards =
        Shard(dir, hf_path, dir / "sender.toml", p.layout, p, dir / ("shards" + std::to_string(v)));
    ASSERT_EQ(static_cast<int>(shards.size()), p.world());
    std::vector<std::unique_ptr<RefitProcess>> senders;
    for (int r = 0; r < p.world(); ++r) {
      ASSERT_TRUE(std::filesystem::exists(shards[r])) << shards[r];
      senders.push_back(std::make_unique<RefitProcess>(
          std::vector<std::string>{"send", "--config", dir / "sender.toml", "--rank",
                                   std::to_string(r), "--world", std::to_string(p.world()),
                                   "--weights", shards[r]},
          dir / ("send-v" + std::to_string(v) + "-r" + std::to_string(r))));
    }
    std::vector<CommandResult> results;
    for (int r = 0; r < p.world(); ++r) results.push_back(senders[r]->Wait());
    for (int r = 0; r < p.world(); ++r) {
      EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].err;
    }
    if (::testing::Test::HasFailure()) return;
    for (int r = 0; r < p.world(); ++r) {
      const CommandResult& s = results[r];
      EXPECT_NE(
          s.out.find("published version " + std::to_string(v) + (v == 1 ? " (full)" : " (delta)")),
          std::string::npos)
          << s.out;
    }
  }
  for (size_t i = 0; i < receivers.size(); ++i) {
    auto r = receivers[i]->Wait();
    ASSERT_EQ(r.exit_code, 0) << ids[i] << ": " << r.err;
    EXPECT_NE(r.out.find("applied version 3 (delta)"), std::string::npos) << ids[i] << r.out;
  }
  if (p.pp_mode) {
    // Stage members (odd ranks here) staged their parts node-locally; leaders forwarded them.
    // A member drops its staged parts once they are in its baseline: only the last version's
    // remain.
    EXPECT_TRUE(std::filesystem::exists(dir / "stage/v00000003/manifest.r1.json"));
    EXPECT_FALSE(std::filesystem::exists(dir / "stage/v00000003/manifest.r0.json"));
    EXPECT_TRUE(std::filesystem::exists(dir / "sync/v00000003/manifest.r1.json"));
    for (const char* old_version : {"stage/v00000001", "stage/v00000002"}) {
      EXPECT_TRUE(!std::filesystem::exists(dir / old_version) ||
                  std::filesystem::is_empty(dir / old_version))
          << old_version;
    }
  }
  const std::string last = dir / ("hf" + std::to_string(versions) + ".safetensors");
  EXPECT_TRUE(SameTensors(last, dir / "recv-canon/model.safetensors"));
  if (!p.vllm_receivers) return;
  // The TP=2 receivers hold exactly their vLLM slices of the last version.
  std::vector<std::string> expected =
      Shard(dir, last, dir / "v0.toml", "vllm", Parallel{"vllm", 2}, dir / "vllm-expected");
  ASSERT_EQ(expected.size(), 2u);
  EXPECT_TRUE(SameTensors(expected[0], dir / "recv-v0/model.safetensors"));
  EXPECT_TRUE(SameTensors(expected[1], dir / "recv-v1/model.safetensors"));
}

TEST(ShardedSync, MegatronTp2Pp2) { RunShardedSyncs(ModelShape{}, Parallel{"megatron", 2, 2}); }

TEST(ShardedSync, MegatronTp2Pp2PipelineStagesGatherDeltasNodeLocally) {
  Parallel p{"megatron", 2, 2};
  p.pp_mode = true;
  RunShardedSyncs(ModelShape{}, p);
}

// The stage transport is named by sender.stage_transport ("disk" by default, as in the test
// above); an unknown name stops the sender before it does anything, naming the key.
TEST(ShardedSync, UnknownStageTransportIsAnErrorNamingTheKey) {
  TempDir dir;
  Parallel p{"megatron", 2, 2};
  p.pp_mode = true;
  std::string config = SenderConfig(dir, ModelShape{}, p);
  config.replace(0, std::string("[sender]\n").size(), "[sender]\nstage_transport = \"nope\"\n");
  WriteAll(dir / "sender.toml", config);
  CommandResult r = RunRefit({"send", "--config", dir / "sender.toml", "--rank", "1", "--world",
                              std::to_string(p.world()), "--weights", dir / "unused.safetensors"},
                             dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("sender.stage_transport"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("unknown transport 'nope'"), std::string::npos) << r.err;
}

TEST(ShardedSync, MegatronTp4GroupedQueryAttention) {
  ModelShape m;
  m.kv_heads = 4;  // 8 q heads over 4 kv groups: tp=4 holds one group per rank
  RunShardedSyncs(m, Parallel{"megatron", 4, 1});
}

TEST(ShardedSync, MegatronExpertParallel) {
  ModelShape m;
  m.layers = 2;
  m.experts = 4;
  Parallel p{"megatron", 2, 1, 2};
  p.vllm_receivers = false;  // the vllm layout maps dense models only
  RunShardedSyncs(m, p);
}

TEST(ShardedSync, Fsdp4Ranks) { RunShardedSyncs(ModelShape{}, Parallel{"fsdp", 4}); }

// The bytes `refit send` reports as its peak resident set.
uint64_t PeakResident(const std::string& out) {
  const std::string key = "peak resident memory: ";
  size_t at = out.find(key);
  if (at == std::string::npos) return 0;
  at = out.find('(', at);
  return at == std::string::npos ? 0 : std::strtoull(out.c_str() + at + 1, nullptr, 10);
}

// The bounded-memory rule (invariant 5, docs/architecture.md) on a model of > 1 GiB cut over two
// FSDP ranks: no rank's peak resident memory exceeds its shard + its baseline + two buckets + a
// constant (the chunks in flight, code and heap; chunks are small here so the constant does not
// hide the rest).
TEST(ShardedSync, RankPeakMemoryStaysWithinShardBaselineAndTwoBuckets) {
  TempDir dir;
  const uint64_t rows = 8192, cols = 4096, tensors = 17;  // 17 x 64 MiB of bf16 = 1.06 GiB
  const uint64_t bucket = 16ull << 20;
  std::vector<std::vector<uint8_t>> data(tensors);
  std::mt19937_64 rng(5);
  for (auto& t : data) {
    t.resize(rows * cols * 2);
    for (size_t i = 0; i + 8 <= t.size(); i += 8) {
      const uint64_t r = rng() & 0x3F7F3F7F3F7F3F7Full;  // finite bf16 of moderate magnitude
      std::memcpy(&t[i], &r, 8);
    }
  }
  auto write = [&](const std::string& path) {
    std::vector<TensorView> views;
    for (uint64_t i = 0; i < tensors; ++i) {
      TensorView v;
      v.name = "model.layers." + std::to_string(i) + ".mlp.up_proj.weight";
      v.dtype = DType::kBF16;
      v.shape = {rows, cols};
      v.data = data[i].data();
      views.push_back(v);
    }
    return WriteSafetensors(path, views).ok();
  };
  WriteAll(dir / "sender.toml",
           "[sender]\nstate_dir = \"" + dir / "sender" +
               "\"\nreceivers = [\"canon\"]\nack_timeout_s = 300\nthreads = 2\n"
               "chunk_bytes = \"4MiB\"\nbucket_bytes = \"16MiB\"\nencoding = \"indices\"\n\n"
               "[layout]\nname = \"fsdp\"\n\n[layout.fsdp]\nshapes_from = \"" +
               dir / "hf1.safetensors" + "\"\n\n" + Transport(dir));
  WriteAll(dir / "canon.toml", ReceiverConfig(dir, ModelShape{}, "canon", -1));
  RefitProcess receiver({"recv", "--config", dir / "canon.toml", "--follow", "--until-version", "3",
                         "--timeout", "600", "--quiet"},
                        dir / "recv");
  const Parallel p{"fsdp", 2};
  uint64_t worst_excess = 0;
  for (int v = 1; v <= 3; ++v) {
    if (v > 1) {
      for (auto& t : data) {
        for (size_t i = (v * 977) % 200; i + 1 < t.size(); i += 200) t[i] ^= 1;  // ~1% change
      }
    }
    const std::string hf = dir / ("hf" + std::to_string(v) + ".safetensors");
    ASSERT_TRUE(write(hf));
    std::vector<std::string> shards =
        Shard(dir, hf, dir / "sender.toml", "fsdp", p, dir / ("shards" + std::to_string(v)));
    if (v > 1) std::filesystem::remove(hf);  // hf1 stays: its header gives the shapes
    std::vector<std::unique_ptr<RefitProcess>> senders;
    for (int r = 0; r < 2; ++r) {
      senders.push_back(std::make_unique<RefitProcess>(
          std::vector<std::string>{"send", "--config", dir / "sender.toml", "--rank",
                                   std::to_string(r), "--world", "2", "--weights", shards[r]},
          dir / ("send-v" + std::to_string(v) + "-r" + std::to_string(r))));
    }
    for (int r = 0; r < 2; ++r) {
      auto s = senders[r]->Wait();
      ASSERT_EQ(s.exit_code, 0) << s.err;
      const uint64_t shard_bytes = std::filesystem::file_size(shards[r]);
      const uint64_t baseline_bytes = v == 1 ? 0 : shard_bytes;
      const uint64_t peak = PeakResident(s.out);
      ASSERT_GT(peak, 0u) << s.out;
      const uint64_t allowed = shard_bytes + baseline_bytes + 2 * bucket + (96ull << 20);
      EXPECT_LE(peak, allowed) << "version " << v << " rank " << r << ": " << s.out;
      std::printf(
          "version %d rank %d: peak resident %.1f MiB, shard %.1f MiB, baseline %.1f MiB, "
          "2 buckets %.1f MiB, rest %.1f MiB\n",
          v, r, peak / 1048576.0, shard_bytes / 1048576.0, baseline_bytes / 1048576.0,
          2.0 * bucket / 1048576.0,
          (static_cast<double>(peak) - shard_bytes - baseline_bytes - 2.0 * bucket) / 1048576.0);
      const uint64_t base = shard_bytes + baseline_bytes + 2 * bucket;
      if (peak > base) worst_excess = std::max(worst_excess, peak - base);
    }
    for (const std::string& s : shards) std::filesystem::remove(s);
  }
  std::printf("worst rank: %.1f MiB above shard + baseline + 2 buckets\n",
              worst_excess / 1048576.0);
  auto r = receiver.Wait();
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

}  // namespace
}  // namespace refit::testing
