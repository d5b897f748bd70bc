// `refit bench e2e` through the real CLI: a sender and real `refit recv` child processes over the
// disk transport, a small synthetic model, its JSON report and its bit-exact check; the link's
// bandwidth in the computed stage; a receiver that dies fails the bench with one line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_harness.h"

namespace refit::testing {
namespace {

using json = nlohmann::json;

// Runs `refit args...` for at most 120 s (the bench takes seconds).
CommandResult RunBounded(const std::vector<std::string>& args, const TempDir& dir,
                         const std::vector<std::string>& env = {}) {
  static int counter = 0;
  RefitProcess p(args, dir / ("bench" + std::to_string(counter++)), env);
  CommandResult r;
  EXPECT_TRUE(p.WaitFor(120, &r)) << "refit bench e2e still running after 120 s";
  return r;
}

std::string NoFsyncConfig(const TempDir& dir) {
  // No directory: the bench puts the sync directory in its own work dir.
  WriteAll(dir / "bench.toml", "[transport.disk]\nfsync = false\n\n[receiver]\ndurable = false\n");
  return dir / "bench.toml";
}

TEST(BenchE2eCli, TwoReceiversJsonReportAndBitExact) {
  TempDir dir;
  auto r = RunBounded({"bench", "e2e", "--size", "8MiB", "--receivers", "2", "--syncs", "2",
                       "--json", "--dir", dir / "work", "--config", NoFsyncConfig(dir)},
                      dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json report = json::parse(r.out);  // stdout is exactly one JSON object
  EXPECT_EQ(report["transport"], "disk");
  EXPECT_EQ(report["receivers"], 2);
  EXPECT_EQ(report["bandwidth_bytes_per_s"], 0);
  EXPECT_GE(report["model"]["bytes"].get<uint64_t>(), 8u << 20);
  ASSERT_EQ(report["syncs"].size(), 2u);
  const json& full = report["syncs"][0];
  const json& delta = report["syncs"][1];
  EXPECT_EQ(full["kind"], "full");
  EXPECT_EQ(full["version"], 1);
  EXPECT_FALSE(full.contains("stages_alone")) << "stages are measured alone for deltas";
  EXPECT_EQ(delta["kind"], "delta");
  EXPECT_EQ(delta["version"], 2);
  for (const json& row : report["syncs"]) {
    EXPECT_GT(row["payload_bytes"].get<uint64_t>(), 0u);
    // The sender puts the payloads, then its manifest and the commit through the counted link;
    // with verify_puts it reads each one back.
    EXPECT_GT(row["sender_put_bytes"].get<uint64_t>(), row["payload_bytes"].get<uint64_t>());
    EXPECT_GE(row["sender_get_bytes"].get<uint64_t>(), row["payload_bytes"].get<uint64_t>());
    EXPECT_GT(row["time_to_last_ack_s"].get<double>(), 0);
    EXPECT_EQ(row["apply_s"].size(), 2u);
  }
  EXPECT_LT(delta["payload_bytes"].get<uint64_t>(), full["payload_bytes"].get<uint64_t>() / 10);
  for (const char* stage : {"encode_s", "link_s", "put_s", "get_s", "apply_s"}) {
    EXPECT_TRUE(delta["stages_alone"].contains(stage)) << stage;
  }
  EXPECT_EQ(delta["stages_alone"]["link_s"], 0.0) << "unlimited: no computed link time";
  EXPECT_TRUE(delta.contains("slowest_stage"));
  EXPECT_TRUE(delta.contains("ack_over_slowest_stage"));
  // The overlap target, judged per delta from the row's own numbers.
  const double target = 1.25 * delta["slowest_stage_s"].get<double>() + 0.05;
  EXPECT_EQ(delta["within_overlap_target"].get<bool>(),
            delta["time_to_last_ack_s"].get<double>() <= target);
  const json& summary = report["summary"];
  EXPECT_EQ(summary["bit_exact"], true);
  EXPECT_EQ(summary["receivers_checked"], 2);
  EXPECT_EQ(summary["full_sync_s"], full["time_to_last_ack_s"]);
  EXPECT_EQ(summary["delta_sync_s_median"], delta["time_to_last_ack_s"]);
  EXPECT_TRUE(summary.contains("full_over_delta"));
  EXPECT_EQ(summary["deltas_with_stages_alone"], 1);
  EXPECT_EQ(summary["deltas_within_overlap_target"],
            delta["within_overlap_target"].get<bool>() ? 1 : 0);
  // Both receivers hold the model the bench compared.
  EXPECT_TRUE(std::filesystem::exists(dir / "work/r0/model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir / "work/r1/model.safetensors"));
}

// Receivers holding the model in memory (`refit recv --in-memory`, attached as an engine's
// parameters are): no model file, every delta applied in that memory, which each receiver writes
// out at exit for the bench's bit-exact check.
TEST(BenchE2eCli, InMemoryReceiversApplyEverySyncBitExact) {
  TempDir dir;
  auto r =
      RunBounded({"bench", "e2e", "--size", "4MiB", "--receivers", "2", "--syncs", "3",
                  "--in-memory", "--json", "--dir", dir / "work", "--config", NoFsyncConfig(dir)},
                 dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json report = json::parse(r.out);
  EXPECT_EQ(report["receivers_in_memory"], true);
  EXPECT_EQ(report["summary"]["bit_exact"], true);
  ASSERT_EQ(report["syncs"].size(), 3u);
  EXPECT_EQ(report["syncs"][2]["kind"], "delta");
  for (const char* id : {"r0", "r1"}) {
    EXPECT_FALSE(std::filesystem::exists(dir / ("work/" + std::string(id) + "/model.safetensors")))
        << id;
    EXPECT_TRUE(std::filesystem::exists(dir / ("work/" + std::string(id) + ".model.safetensors")))
        << id;
  }
}

// `refit recv --in-memory` with a tensor list that is not one: one error line, exit 2, nothing
// applied.
TEST(BenchE2eCli, RecvInMemoryRefusesABadTensorList) {
  TempDir dir;
  WriteAll(dir / "r.toml", "[receiver]\nid = \"r0\"\nstate_dir = \"" + (dir / "state") +
                               "\"\n\n[transport]\nname = \"disk\"\n\n[transport.disk]\ndir = \"" +
                               (dir / "sync") + "\"\n");
  WriteAll(dir / "tensors.json", "[{\"name\": \"w\", \"dtype\": \"NOPE\", \"shape\": [4]}]");
  auto r = RunBounded({"recv", "--config", dir / "r.toml", "--follow", "--until-version", "1",
                       "--timeout", "5", "--in-memory", dir / "tensors.json"},
                      dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("tensors.json"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  // A tensor too large for memory is the same one line, not an abort.
  WriteAll(dir / "tensors.json",
           "[{\"name\": \"w\", \"dtype\": \"bf16\", \"shape\": [1000000000000000]}]");
  r = RunBounded({"recv", "--config", dir / "r.toml", "--follow", "--until-version", "1",
                  "--timeout", "5", "--in-memory", dir / "tensors.json"},
                 dir);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("does not fit in memory"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(BenchE2eCli, BandwidthIsPerConnectionAndTheLinkStageIsPayloadOverIt) {
  TempDir dir;
  auto r = RunBounded({"bench", "e2e", "--size", "4MiB", "--syncs", "2", "--bandwidth", "100MB",
                       "--json", "--config", NoFsyncConfig(dir)},
                      dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json report = json::parse(r.out);
  EXPECT_EQ(report["bandwidth_bytes_per_s"], 100'000'000);
  const json& delta = report["syncs"][1];
  const double payload = delta["payload_bytes"].get<double>();
  EXPECT_DOUBLE_EQ(delta["stages_alone"]["link_s"].get<double>(), payload / 1e8);
  EXPECT_EQ(report["summary"]["bit_exact"], true);
  // The human table: the header names the link.
  auto table = RunBounded({"bench", "e2e", "--size", "1MiB", "--syncs", "2", "--bandwidth", "100MB",
                           "--config", NoFsyncConfig(dir)},
                          dir);
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("at 100.00 MB/s per connection"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("bit-exact: yes"), std::string::npos) << table.out;
}

TEST(BenchE2eCli, AReceiverThatDiesFailsTheBenchWithOneLine) {
  TempDir dir;
  // Every receiver process kills itself when it starts applying a delta in place; the bench
  // (the sender) never passes that point.
  auto r = RunBounded({"bench", "e2e", "--size", "1MiB", "--receivers", "2", "--syncs", "2",
                       "--config", NoFsyncConfig(dir)},
                      dir, {"REFIT_KILL_AT=receiver.applying"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(LineCount(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("exited with status 137 before acknowledging version 2"), std::string::npos)
      << r.err;
}

TEST(BenchE2eCli, BadFlagsAreOneLineAndExitTwo) {
  TempDir dir;
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"bench", "e2e", "--receivers", "0"},
        std::vector<std::string>{"bench", "e2e", "--bandwidth", "fast"},
        std::vector<std::string>{"bench", "e2e", "--size", "8MiB", "--syncs", "1"},
        std::vector<std::string>{"bench", "e2e", "--size", "1MiB", "--transport", "nope"},
        std::vector<std::string>{"bench", "e2e", "--size", "1MiB", "--encoding", "nope"},
        std::vector<std::string>{"bench", "e2e", "--size", "1MiB", "--dir", dir.path()},
        std::vector<std::string>{"bench", "e2e", "--weights", dir / "missing.safetensors"}}) {
    auto r = RunBounded(args, dir);
    EXPECT_EQ(r.exit_code, 2) << args.back() << ": " << r.err;
    EXPECT_EQ(LineCount(r.err), 1) << r.err;
    EXPECT_EQ(r.err.find("error: :"), std::string::npos) << "names a flag or a file: " << r.err;
  }
}

}  // namespace
}  // namespace refit::testing
