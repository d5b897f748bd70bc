// `refit send` and `refit recv` as separate processes over the disk transport.
#include <gtest/gtest.h>

#include "cli_harness.h"

namespace refit::testing {
namespace {

std::string Config(const TempDir& dir, int ack_timeout_s = 60) {
  return "[sender]\nstate_dir = \"" + dir / "sender" +
         "\"\nreceivers = [\"r0\"]\n"
         "ack_timeout_s = " +
         std::to_string(ack_timeout_s) + "\nchunk_bytes = \"4KiB\"\nbucket_bytes = \"16KiB\"\n" +
         "\n[receiver]\nid = \"r0\"\nstate_dir = \"" + dir / "receiver" +
         "\"\n"
         "poll_interval_ms = 20\n\n[transport]\nname = \"disk\"\n\n[transport.disk]\ndir = \"" +
         dir / "sync" + "\"\nfsync = false\n";
}

TEST(RuntimeSync, SenderAndReceiverProcessesStayBitExactOverManyVersions) {
  TempDir dir;
  WriteAll(dir / "refit.toml", Config(dir));
  const int versions = 4;
  RefitProcess receiver({"recv", "--config", dir / "refit.toml", "--follow", "--until-version",
                         std::to_string(versions), "--timeout", "120"},
                        dir / "recv");
  Checkpoint weights = Checkpoint::Make(21);
  for (int v = 1; v <= versions; ++v) {
    if (v > 1) weights.Mutate(v == 3 ? 0.2 : 0.01, 100 + v);
    ASSERT_TRUE(weights.Write(dir / "w.safetensors"));
    // Each send waits for the previous version's ack before it diffs (baseline rule).
    auto send = RunRefit(
        {"send", "--config", dir / "refit.toml", "--weights", dir / "w.safetensors"}, dir.path());
    ASSERT_EQ(send.exit_code, 0) << send.err;
    EXPECT_NE(send.out.find("published version " + std::to_string(v)), std::string::npos)
        << send.out;
    EXPECT_NE(send.out.find(v == 1 ? "(full)" : "(delta)"), std::string::npos) << send.out;
  }
  auto r = receiver.Wait();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("applied version 4 (delta)"), std::string::npos) << r.out;
  EXPECT_TRUE(SameTensors(dir / "w.safetensors", dir / "receiver/model.safetensors"));
  // Every version has its commit marker and the receiver's ack.
  for (int v = 1; v <= versions; ++v) {
    char name[32];
    std::snprintf(name, sizeof(name), "v%08d", v);
    EXPECT_TRUE(std::filesystem::exists(dir / ("sync/" + std::string(name) + "/COMMIT")));
    EXPECT_TRUE(std::filesystem::exists(dir / ("sync/acks/r0/" + std::string(name))));
  }
}

TEST(RuntimeSync, SenderDoesNotAdvanceWithoutAcks) {
  TempDir dir;
  WriteAll(dir / "refit.toml", Config(dir, /*ack_timeout_s=*/1));
  Checkpoint weights = Checkpoint::Make(5);
  ASSERT_TRUE(weights.Write(dir / "w.safetensors"));
  ASSERT_EQ(RunRefit({"send", "--config", dir / "refit.toml", "--weights", dir / "w.safetensors"},
                     dir.path())
                .exit_code,
            0);
  // No receiver ran: the next publish must refuse (timeout) rather than diff against v1.
  weights.Mutate(0.01, 6);
  ASSERT_TRUE(weights.Write(dir / "w.safetensors"));
  auto second = RunRefit(
      {"send", "--config", dir / "refit.toml", "--weights", dir / "w.safetensors"}, dir.path());
  EXPECT_NE(second.exit_code, 0);
  EXPECT_NE(second.err.find("not acknowledged"), std::string::npos) << second.err;
  EXPECT_EQ(LineCount(second.err), 1) << second.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "sync/v00000002/COMMIT"));
  // Once the receiver catches up, the same send goes through as a delta on version 1.
  auto recv = RunRefit({"recv", "--config", dir / "refit.toml"}, dir.path());
  ASSERT_EQ(recv.exit_code, 0) << recv.err;
  auto third = RunRefit(
      {"send", "--config", dir / "refit.toml", "--weights", dir / "w.safetensors"}, dir.path());
  ASSERT_EQ(third.exit_code, 0) << third.err;
  EXPECT_NE(third.out.find("published version 2 (delta)"), std::string::npos) << third.out;
  recv = RunRefit({"recv", "--config", dir / "refit.toml"}, dir.path());
  ASSERT_EQ(recv.exit_code, 0) << recv.err;
  EXPECT_TRUE(SameTensors(dir / "w.safetensors", dir / "receiver/model.safetensors"));
}

TEST(RuntimeSync, ReceiverWithUnknownStateGetsAFullSync) {
  TempDir dir;
  WriteAll(dir / "refit.toml", Config(dir));
  Checkpoint weights = Checkpoint::Make(8);
  for (int v = 1; v <= 2; ++v) {
    if (v > 1) weights.Mutate(0.02, v);
    ASSERT_TRUE(weights.Write(dir / "w.safetensors"));
    ASSERT_EQ(RunRefit({"send", "--config", dir / "refit.toml", "--weights", dir / "w.safetensors"},
                       dir.path())
                  .exit_code,
              0);
    ASSERT_EQ(RunRefit({"recv", "--config", dir / "refit.toml"}, dir.path()).exit_code, 0);
  }
  // The receiver loses its state and the full sync it started from is gone (retention): it
  // must not guess, it asks for a full sync.
  std::filesystem::remove(dir / "receiver/receiver.json");
  std::filesystem::remove_all(dir / "sync/v00000001");
  weights.Mutate(0.02, 3);
  ASSERT_TRUE(weights.Write(dir / "w.safetensors"));
  ASSERT_EQ(RunRefit({"send", "--config", dir / "refit.toml", "--weights", dir / "w.safetensors"},
                     dir.path())
                .exit_code,
            0);
  auto recv = RunRefit({"recv", "--config", dir / "refit.toml"}, dir.path());
  EXPECT_NE(recv.exit_code, 0);
  EXPECT_NE(recv.err.find("need full sync"), std::string::npos) << recv.err;
  EXPECT_TRUE(std::filesystem::exists(dir / "sync/acks/r0/need-full"));
  // The sender answers the request with a full sync, which the receiver applies.
  weights.Mutate(0.02, 4);
  ASSERT_TRUE(weights.Write(dir / "w.safetensors"));
  auto send = RunRefit({"send", "--config", dir / "refit.toml", "--weights", dir / "w.safetensors"},
                       dir.path());
  ASSERT_EQ(send.exit_code, 0) << send.err;
  EXPECT_NE(send.out.find("published version 4 (full)"), std::string::npos) << send.out;
  recv = RunRefit({"recv", "--config", dir / "refit.toml"}, dir.path());
  ASSERT_EQ(recv.exit_code, 0) << recv.err;
  EXPECT_TRUE(SameTensors(dir / "w.safetensors", dir / "receiver/model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir / "sync/acks/r0/need-full"));
}

// Invariant 4 (exactly-once, docs/architecture.md) under a crash: a receiver killed in the middle
// of applying xor (or step) records resumes through its redo log and applies each record exactly
// once. The delta spans several payloads (4 KiB buckets); the kill comes right after the first
// payload's records are logged (synced) and before they are written into the model: every
// logged record is replayed and skipped, the rest applied afresh.
void KillMidApplyThenResume(const std::string& encoding, int threads) {
  TempDir dir;
  std::string config = Config(dir);
  config.insert(config.find("[sender]\n") + 9, "encoding = \"" + encoding + "\"\n");
  config.replace(config.find("bucket_bytes = \"16KiB\""), 22, "bucket_bytes = \"4KiB\"");
  config.insert(config.find("[receiver]\n") + 11, "threads = " + std::to_string(threads) + "\n");
  WriteAll(dir / "refit.toml", config);
  Checkpoint weights = Checkpoint::Make(31);
  ASSERT_TRUE(weights.Write(dir / "w.safetensors"));
  auto send = RunRefit({"send", "--config", dir / "refit.toml", "--weights", dir / "w.safetensors"},
                       dir.path());
  ASSERT_EQ(send.exit_code, 0) << send.err;
  ASSERT_EQ(RunRefit({"recv", "--config", dir / "refit.toml"}, dir.path()).exit_code, 0);
  weights.Mutate(0.3, 32);  // dense enough that the delta spans several payloads
  ASSERT_TRUE(weights.Write(dir / "w.safetensors"));
  send = RunRefit({"send", "--config", dir / "refit.toml", "--weights", dir / "w.safetensors"},
                  dir.path());
  ASSERT_EQ(send.exit_code, 0) << send.err;

  // Killed right after logging the first payload's records, before writing them.
  RefitProcess killed({"recv", "--config", dir / "refit.toml"}, dir / "killed",
                      {"REFIT_KILL_AT=receiver.journaled:1"});
  auto k = killed.Wait();
  ASSERT_EQ(k.exit_code, 128 + SIGKILL) << k.out << k.err;
  const std::string state = ReadAll(dir / "receiver/receiver.json");
  EXPECT_NE(state.find("\"applying\": 2"), std::string::npos) << state;
  const auto log_size = std::filesystem::file_size(dir / "receiver/redo.log");

  auto resumed = RunRefit({"recv", "--config", dir / "refit.toml"}, dir.path());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("applied version 2 (delta)"), std::string::npos) << resumed.out;
  const size_t at = resumed.out.find("replayed ");
  ASSERT_NE(at, std::string::npos) << resumed.out;
  unsigned replayed = 0, skipped = 0;
  ASSERT_EQ(std::sscanf(resumed.out.c_str() + at, "replayed %u journal entries, skipped %u records",
                        &replayed, &skipped),
            2)
      << resumed.out;
  EXPECT_EQ(replayed, skipped) << resumed.out;
  EXPECT_GE(replayed, 1u) << resumed.out;
  unsigned records = 0;
  ASSERT_EQ(std::sscanf(resumed.out.c_str() + resumed.out.find("applied version 2"),
                        "applied version 2 (delta): %u records", &records),
            1)
      << resumed.out;
  EXPECT_LT(replayed, records) << "the kill came after the whole version: " << resumed.out;
  EXPECT_TRUE(SameTensors(dir / "w.safetensors", dir / "receiver/model.safetensors"));
  // The log keeps the version's changes (the model file is synced at a checkpoint).
  EXPECT_GT(std::filesystem::file_size(dir / "receiver/redo.log"), log_size);
  EXPECT_EQ(ReadAll(dir / "receiver/receiver.json").find("applying"), std::string::npos);
}

TEST(RuntimeSync, ReceiverKilledMidApplyResumesXorRecordsExactlyOnce) {
  KillMidApplyThenResume("xor", 1);
}

TEST(RuntimeSync, ReceiverKilledMidApplyResumesStepRecordsExactlyOnce) {
  KillMidApplyThenResume("ctx", 1);
}

TEST(RuntimeSync, ReceiverWithTwoApplyThreadsKilledMidApplyResumesExactlyOnce) {
  KillMidApplyThenResume("xor", 2);
}

TEST(RuntimeSync, DemoPrintsBitExact) {
  TempDir dir;
  auto r = RunRefit({"demo", "--params", "2M", "--syncs", "3", "--dir", dir / "demo"}, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("bit-exact: yes"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace refit::testing
