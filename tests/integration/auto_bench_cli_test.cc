// The default `auto` encoding through the real CLI, and a quick `refit bench codec` run.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_harness.h"

namespace refit::testing {
namespace {

TEST(AutoCli, DefaultDiffIsAutoAndAppliesByteForByte) {
  TempDir dir;
  for (double density : {0.0, 1e-3, 0.05, 1.0}) {
    Checkpoint a = Checkpoint::Make(4);
    Checkpoint b = a;
    b.Mutate(density, 9);
    ASSERT_TRUE(a.Write(dir / "a.safetensors"));
    ASSERT_TRUE(b.Write(dir / "b.safetensors"));
    auto diff = RunRefit(
        {"diff", dir / "a.safetensors", dir / "b.safetensors", "-o", dir / "d.refit"}, dir.path());
    ASSERT_EQ(diff.exit_code, 0) << diff.err;
    auto inspect = RunRefit({"inspect", dir / "d.refit", "--records"}, dir.path());
    ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
    EXPECT_EQ(inspect.out.find("auto"), std::string::npos) << "records name the real encoding";
    auto apply = RunRefit(
        {"apply", dir / "a.safetensors", dir / "d.refit", "-o", dir / "c.safetensors"}, dir.path());
    ASSERT_EQ(apply.exit_code, 0) << apply.err;
    EXPECT_TRUE(SameTensors(dir / "b.safetensors", dir / "c.safetensors")) << density;
  }
}

TEST(AutoCli, PluginsListsAutoAndItsKeys) {
  TempDir dir;
  auto r = RunRefit({"plugins"}, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("auto"), std::string::npos);
  EXPECT_NE(r.out.find("[encoding.auto] candidates"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[encoding.auto] link_bandwidth"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[encoding.auto] calibration"), std::string::npos) << r.out;
}

TEST(AutoCli, UnknownCandidateInConfigFailsCleanly) {
  TempDir dir;
  WriteAll(dir / "c.toml", "[encoding.auto]\ncandidates = [\"nope\"]\n");
  Checkpoint a = Checkpoint::Make(5);
  ASSERT_TRUE(a.Write(dir / "a.safetensors"));
  auto r = RunRefit({"diff", dir / "a.safetensors", dir / "a.safetensors", "-o", dir / "d.refit",
                     "--config", dir / "c.toml"},
                    dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("encoding.auto.candidates"), std::string::npos) << r.err;
  EXPECT_EQ(LineCount(r.err), 1) << r.err;
}

// a.safetensors and b.safetensors in dir: a small checkpoint and the same with 2% changed.
bool WritePair(const TempDir& dir) {
  Checkpoint a = Checkpoint::Make(6);
  Checkpoint b = a;
  b.Mutate(0.02, 3);
  return a.Write(dir / "a.safetensors") && b.Write(dir / "b.safetensors");
}

TEST(BenchCli, CodecQuickRunPrintsEveryEncodingAndJson) {
  TempDir dir;
  ASSERT_TRUE(WritePair(dir));
  auto r = RunRefit(
      {"bench", "codec", "--density", "0.01", "--bytes", "256KiB", "--pair", dir / "a.safetensors",
       dir / "b.safetensors", "--threads", "1", "--threads", "2", "--json", dir / "r.json"},
      dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* word : {"ref nemo xor", "ref slime xor", "ref slime deltas_zstd", "indices",
                           "dense", "auto", "compare-scan", "order-0 bound"}) {
    EXPECT_NE(r.out.find(word), std::string::npos) << word << "\n" << r.out;
  }
  std::string json = ReadAll(dir / "r.json");
  EXPECT_NE(json.find("\"payload_over_bound\""), std::string::npos);
  EXPECT_NE(json.find("\"encoding\": \"auto\""), std::string::npos);
  EXPECT_NE(json.find("a.safetensors -> b.safetensors"), std::string::npos);

  // Its link_model is a calibration file for auto's mode link.
  EXPECT_NE(json.find("\"link_model\""), std::string::npos);
  WriteAll(dir / "c.toml",
           "[encoding.auto]\nmode = \"link\"\nlink_bandwidth = \"200MB\"\n"
           "calibration = \"" +
               (dir / "r.json") + "\"\n");
  auto diff = RunRefit({"diff", dir / "a.safetensors", dir / "b.safetensors", "-o", dir / "d.refit",
                        "--config", dir / "c.toml"},
                       dir.path());
  ASSERT_EQ(diff.exit_code, 0) << diff.err;
  auto apply = RunRefit(
      {"apply", dir / "a.safetensors", dir / "d.refit", "-o", dir / "c.safetensors"}, dir.path());
  ASSERT_EQ(apply.exit_code, 0) << apply.err;
  EXPECT_TRUE(SameTensors(dir / "b.safetensors", dir / "c.safetensors"));

  auto bad =
      RunRefit({"bench", "codec", "--pair", dir / "a.safetensors", dir / "missing"}, dir.path());
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_EQ(LineCount(bad.err), 1) << bad.err;
}

// The codec bench cuts records as the configured sender would (sender.chunk_bytes), so that
// its times compare with that sender's.
TEST(BenchCli, CodecCutsRecordsAtTheConfiguredChunkBytes) {
  TempDir dir;
  ASSERT_TRUE(WritePair(dir));
  const auto records = [&](const std::vector<std::string>& extra) -> int64_t {
    std::vector<std::string> args = {"bench",
                                     "codec",
                                     "--pair",
                                     dir / "a.safetensors",
                                     dir / "b.safetensors",
                                     "--encoding",
                                     "indices",
                                     "--threads",
                                     "1",
                                     "--json",
                                     dir / "r.json"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = RunRefit(args, dir.path());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json report =
        nlohmann::json::parse(ReadAll(dir / "r.json"), nullptr, /*allow_exceptions=*/false);
    int64_t found = -1;
    const std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& node) {
      if (node.is_object() && node.contains("records_by_encoding")) {
        found = 0;
        for (const auto& count : node["records_by_encoding"]) found += count.get<int64_t>();
      }
      if (node.is_structured()) {
        for (const auto& child : node) walk(child);
      }
    };
    walk(report);
    return found;
  };
  const int64_t by_default = records({});
  WriteAll(dir / "c.toml", "[sender]\nchunk_bytes = \"1KiB\"\n");
  const int64_t at_1kib = records({"--config", dir / "c.toml"});
  ASSERT_GT(by_default, 0);
  EXPECT_GT(at_1kib, 4 * by_default)
      << "records at 1 KiB chunks: " << at_1kib << " against " << by_default << " by default";
  // As a sender's, an unset chunk_bytes shrinks to a smaller bucket_bytes.
  WriteAll(dir / "b.toml", "[sender]\nbucket_bytes = \"4KiB\"\n");
  const int64_t in_4kib_buckets = records({"--config", dir / "b.toml"});
  EXPECT_GT(in_4kib_buckets, by_default)
      << "records in 4 KiB buckets: " << in_4kib_buckets << " against " << by_default;
}

}  // namespace
}  // namespace refit::testing
