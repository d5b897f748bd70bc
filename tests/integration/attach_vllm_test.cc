// The in-memory receiver with the vllm layout (issue 13): two inference engines
// (refit_attach_vllm_probe, one process each) hold the fused TP=2 shards `refit shard --layout
// vllm` makes (qkv_proj, gate_up_proj, vocab-parallel embeddings with padding rows) in their own
// heap memory, attached to their receivers. A canonical (hf) sender publishes a Llama-like
// checkpoint of ~100 MB and two ~1.5% deltas; after every version each engine's memory equals
// `refit shard --layout vllm` of that version bit for bit, and its peak resident set while a
// delta is applied stays below the attached shard + two payload buckets + 64 MiB.
#include <gtest/gtest.h>

#include <cinttypes>
#include <memory>

#include "cli_harness.h"
#include "llama_checkpoint.h"

namespace refit::testing {
namespace {

// GQA with one kv head per TP rank; vocab 32003 is padded to 32064 (vocab_pad 64): rank 1's
// last 61 rows are padding.
ModelShape LlamaShape() {
  ModelShape m;
  m.layers = 6;
  m.hidden = 512;
  m.heads = 8;
  m.kv_heads = 2;
  m.head_dim = 64;
  m.ffn = 1536;
  m.vocab = 32003;
  return m;
}

// Deltas of ~1.5% (~1.9 MB of payload here) span four payloads: the receiver prefetches the next
// while one is applied, so both payload buffers are in use during a delta.
constexpr uint64_t kBucketBytes = 512ull << 10;
constexpr uint64_t kSlackBytes = 64ull << 20;

std::string VllmSection(const ModelShape& m) {
  return "[layout.vllm]\n" + ModelKeys(m) + "tp = 2\n\n";
}

std::string Transport(const TempDir& dir) {
  return "[transport]\nname = \"disk\"\n\n[transport.disk]\ndir = \"" + dir / "sync" +
         "\"\nfsync = false\n";
}

// A canonical sender whose records are cut at the vLLM TP=2 shard boundaries.
std::string SenderConfig(const TempDir& dir, const ModelShape& m) {
  return "[sender]\nstate_dir = \"" + dir / "sender" +
         "\"\nreceivers = [\"v0\", \"v1\"]\nack_timeout_s = 120\nbucket_bytes = " +
         std::to_string(kBucketBytes) +
         "\n"
         "poll_interval_ms = 10\nreceiver_layout = \"vllm\"\nreceiver_world = 2\n\n"
         "[layout]\nname = \"hf\"\n\n" +
         VllmSection(m) + Transport(dir);
}

// Receiver threads are fixed: each apply thread holds one record's scratch, so the default (the
// host's core count) would make the memory bound depend on the machine.
std::string ReceiverConfig(const TempDir& dir, const ModelShape& m, int rank) {
  const std::string id = "v" + std::to_string(rank);
  return "[receiver]\nid = \"" + id + "\"\nstate_dir = \"" + dir / ("recv-" + id) +
         "\"\npoll_interval_ms = 10\nthreads = 2\nrank = " + std::to_string(rank) +
         "\nworld = 2\n\n[layout]\nname = \"vllm\"\n\n" + VllmSection(m) + Transport(dir);
}

// `refit shard --layout vllm --tp 2` of hf into out; the two shard files in rank order.
std::vector<std::string> ShardVllm(const TempDir& dir, const std::string& hf,
                                   const std::string& out) {
  CommandResult r = RunRefit(
      {"shard", hf, "--layout", "vllm", "--config", dir / "sender.toml", "-o", out, "--tp", "2"},
      dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return {out + "/tp0_pp0.safetensors", out + "/tp1_pp0.safetensors"};
}

// The number after `key` in a probe's output (0 when absent).
uint64_t NumberAfter(const std::string& out, const std::string& key) {
  const size_t at = out.find(key);
  return at == std::string::npos ? 0 : std::strtoull(out.c_str() + at + key.size(), nullptr, 10);
}

// Starts the engine of `rank`: its memory is its shard of `initial`, every version is compared.
std::unique_ptr<RefitProcess> StartEngine(const TempDir& dir, int rank, const std::string& initial,
                                          int versions) {
  const std::string shard = "/tp" + std::to_string(rank) + "_pp0.safetensors";
  std::vector<std::string> args = {"--config",        dir / ("v" + std::to_string(rank) + ".toml"),
                                   "--shard",         initial + shard,
                                   "--until-version", std::to_string(versions),
                                   "--timeout",       "240"};
  for (int v = 1; v <= versions; ++v) {
    args.insert(args.end(),
                {"--expect", std::to_string(v) + "=" + dir / "shards" + std::to_string(v) + shard});
  }
  return std::make_unique<RefitProcess>(args, dir / ("engine" + std::to_string(rank)),
                                        std::vector<std::string>{}, REFIT_ATTACH_VLLM_PROBE_PATH);
}

// Publishes version v of hf (its vLLM shards written first: the engines compare against them).
void Publish(const TempDir& dir, Checkpoint& hf, int v) {
  const std::string path = dir / ("hf" + std::to_string(v) + ".safetensors");
  ASSERT_TRUE(hf.Write(path));
  ShardVllm(dir, path, dir / ("shards" + std::to_string(v)));
  CommandResult s =
      RunRefit({"send", "--config", dir / "sender.toml", "--weights", path, "--wait"}, dir.path());
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_NE(
      s.out.find("published version " + std::to_string(v) + (v == 1 ? " (full)" : " (delta)")),
      std::string::npos)
      << s.out;
  std::printf("%s", s.out.substr(0, s.out.find('\n') + 1).c_str());
  std::filesystem::remove(path);
}

// The engine's report: every version bit-exact, its delta peak resident set within the bound.
void CheckEngine(int rank, const CommandResult& r, int versions) {
  ASSERT_EQ(r.exit_code, 0) << "engine " << rank << ": " << r.err << r.out;
  for (int v = 1; v <= versions; ++v) {
    EXPECT_NE(r.out.find("version " + std::to_string(v) + " bit-exact"), std::string::npos)
        << r.out;
  }
  const uint64_t attached = NumberAfter(r.out, "attached ");
  const uint64_t peak = NumberAfter(r.out, "peak resident during deltas: ");
  ASSERT_GT(attached, 0u) << r.out;
  ASSERT_GT(peak, 0u) << r.out;
  const uint64_t bound = attached + 2 * kBucketBytes + kSlackBytes;
  const size_t from = r.out.find('(', r.out.find("peak resident during deltas"));
  const std::string method = r.out.substr(from, r.out.find('\n', from) - from);
  std::printf(
      "engine %d: peak resident during deltas %.1f MiB %s\n"
      "  bound %.1f MiB = attached %.1f MiB + 2 x %.2f MiB buckets + %.0f MiB;"
      " %.1f MiB above attached + 2 buckets\n",
      rank, peak / 1048576.0, method.c_str(), bound / 1048576.0, attached / 1048576.0,
      kBucketBytes / 1048576.0, kSlackBytes / 1048576.0,
      (static_cast<double>(peak) - attached - 2.0 * kBucketBytes) / 1048576.0);
  EXPECT_LT(peak, bound) << r.out;
}

TEST(AttachVllm, FusedTp2ShardsTakeDeltasInPlaceBitExactWithinTheMemoryBound) {
  TempDir dir;
  const ModelShape m = LlamaShape();
  const int versions = 3;
  WriteAll(dir / "sender.toml", SenderConfig(dir, m));
  for (int r = 0; r < 2; ++r) {
    WriteAll(dir / ("v" + std::to_string(r) + ".toml"), ReceiverConfig(dir, m, r));
  }
  // What the engines loaded before any sync: other weights (their padding rows zero).
  Checkpoint initial = MakeHf(m, 3);
  ASSERT_TRUE(initial.Write(dir / "hf0.safetensors"));
  ShardVllm(dir, dir / "hf0.safetensors", dir / "shards0");
  std::filesystem::remove(dir / "hf0.safetensors");
  initial = Checkpoint();
  std::vector<std::unique_ptr<RefitProcess>> engines;
  for (int r = 0; r < 2; ++r) engines.push_back(StartEngine(dir, r, dir / "shards0", versions));

  Checkpoint hf = MakeHf(m, 7);
  for (int v = 1; v <= versions; ++v) {
    if (v > 1) hf.Mutate(0.015, 40 + v);  // NaN payloads, +-0, inf among the changes
    ASSERT_NO_FATAL_FAILURE(Publish(dir, hf, v));
  }
  for (int r = 0; r < 2; ++r) {
    CommandResult result;
    ASSERT_TRUE(engines[r]->WaitFor(120, &result)) << "engine " << r << " did not finish";
    std::printf("%s", result.out.c_str());
    CheckEngine(r, result, versions);
  }
}

}  // namespace
}  // namespace refit::testing
