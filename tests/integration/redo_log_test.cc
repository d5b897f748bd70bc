// Durability through the redo logs (receive/journal.h): the receiver's model and the sender's
// baseline are synced only at checkpoints, so every point where a process can die around the log
// is tested with real processes - after the log sync, before and during a checkpoint, during a
// replay - plus a torn log tail cut at many bytes and an emulated power cut (the file's pages
// since the checkpoint lost, the log from another boot): each recovers bit-exact.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "cli_harness.h"
#include "refit/kernels/diff.h"

namespace refit::testing {
namespace {

namespace fs = std::filesystem;

class RedoLogSync : public ::testing::Test {
 protected:
  // checkpoint_versions for both sides (the log's size never forces one here); xor records (not
  // idempotent) make a record applied twice visible.
  void Use(int checkpoint_versions, const std::string& encoding = "xor") {
    const std::string every = std::to_string(checkpoint_versions);
    WriteAll(dir_ / "refit.toml",
             "[sender]\nstate_dir = \"" + dir_ / "sender" +
                 "\"\nreceivers = [\"r0\"]\nack_timeout_s = 60\nchunk_bytes = \"2KiB\"\n"
                 "bucket_bytes = \"4KiB\"\nencoding = \"" +
                 encoding + "\"\ncheckpoint_versions = " + every +
                 "\ncheckpoint_bytes = \"1GiB\"\n\n[receiver]\nid = \"r0\"\nstate_dir = \"" +
                 dir_ / "receiver" + "\"\ncheckpoint_versions = " + every +
                 "\ncheckpoint_bytes = \"1GiB\"\n\n[transport]\nname = "
                 "\"disk\"\n\n[transport.disk]\ndir = \"" +
                 dir_ / "sync" + "\"\nfsync = false\n");
  }
  CommandResult Send(const std::vector<std::string>& env = {}) {
    EXPECT_TRUE(weights_.Write(dir_ / "w.safetensors"));
    RefitProcess p({"send", "--config", dir_ / "refit.toml", "--weights", dir_ / "w.safetensors"},
                   dir_ / ("send" + std::to_string(runs_++)), env);
    return p.Wait();
  }
  CommandResult Recv(const std::vector<std::string>& env = {}) {
    RefitProcess p({"recv", "--config", dir_ / "refit.toml"},
                   dir_ / ("recv" + std::to_string(runs_++)), env);
    return p.Wait();
  }
  // Publishes and applies the next version (mutated first unless it is the first).
  void SyncOnce(uint64_t seed) {
    if (seed != 0) weights_.Mutate(0.3, seed);
    auto s = Send();
    ASSERT_EQ(s.exit_code, 0) << s.out << s.err;
    auto r = Recv();
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    ASSERT_TRUE(SameTensors(dir_ / "w.safetensors", dir_ / "receiver/model.safetensors"));
  }
  // Two more versions after a recovery: a model or baseline with a record applied twice or
  // missed would fail the receivers' digests here.
  void ThenTwoMoreVersionsAreBitExact() {
    SyncOnce(901);
    SyncOnce(902);
  }
  // What a reboot leaves: the log header names another boot (pages since the checkpoint lost).
  static void MarkLogFromAnotherBoot(const fs::path& log) {
    std::fstream f(log, std::ios::binary | std::ios::in | std::ios::out);
    std::string header(56, '\0');  // magic, version, 36-byte boot id, xxh3
    f.read(header.data(), 56);
    header.replace(12, 36, std::string(36, '0'));
    const uint64_t digest = kernels::Digest64(header.data(), 48);
    std::memcpy(header.data() + 48, &digest, 8);
    f.seekp(0);
    f.write(header.data(), 56);
  }

  TempDir dir_;
  Checkpoint weights_ = Checkpoint::Make(91);
  int runs_ = 0;
};

// The receiver killed after a window's log sync, at a due checkpoint before the model is synced,
// and after the model is synced but before its log is emptied.
TEST_F(RedoLogSync, ReceiverKilledAroundTheLogAndCheckpointsRecoversBitExact) {
  for (const char* point :
       {"receiver.journaled:1", "redo.checkpoint:1", "redo.checkpoint_synced:1"}) {
    SCOPED_TRACE(point);
    Use(/*checkpoint_versions=*/1);
    if (runs_ == 0) SyncOnce(0);
    weights_.Mutate(0.3, 100 + runs_);
    ASSERT_EQ(Send().exit_code, 0);
    auto killed = Recv({std::string("REFIT_KILL_AT=") + point});
    ASSERT_EQ(killed.exit_code, 128 + SIGKILL) << killed.out << killed.err;
    auto r = Recv();
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_TRUE(SameTensors(dir_ / "w.safetensors", dir_ / "receiver/model.safetensors"));
    ThenTwoMoreVersionsAreBitExact();
  }
}

// Killed during the replay of an interrupted attempt's entries, and again: each replay starts
// over (entries are overwrites) and the version completes exactly once.
TEST_F(RedoLogSync, ReceiverKilledDuringReplayRecoversBitExact) {
  Use(/*checkpoint_versions=*/8);
  SyncOnce(0);
  weights_.Mutate(0.3, 7);
  ASSERT_EQ(Send().exit_code, 0);
  ASSERT_EQ(Recv({"REFIT_KILL_AT=receiver.journaled:1"}).exit_code, 128 + SIGKILL);
  for (int i = 0; i < 2; ++i) {
    auto killed = Recv({"REFIT_KILL_AT=redo.replay:1"});
    ASSERT_EQ(killed.exit_code, 128 + SIGKILL) << killed.out << killed.err;
  }
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("resumed an interrupted apply"), std::string::npos) << r.out;
  EXPECT_TRUE(SameTensors(dir_ / "w.safetensors", dir_ / "receiver/model.safetensors"));
  ThenTwoMoreVersionsAreBitExact();
}

// The sender killed after its advance's log sync (sender.advance), during the replay into the
// baseline, and around a due checkpoint of the baseline.
TEST_F(RedoLogSync, SenderKilledAroundTheLogAndCheckpointsRecoversBitExact) {
  for (const char* point :
       {"sender.advance:1", "redo.replay:1", "redo.checkpoint:1", "redo.checkpoint_synced:1"}) {
    SCOPED_TRACE(point);
    Use(/*checkpoint_versions=*/1);
    if (runs_ == 0) SyncOnce(0);
    SyncOnce(200 + runs_);  // a delta, acknowledged: the next send advances the baseline by it
    weights_.Mutate(0.3, 300 + runs_);
    auto killed = Send({std::string("REFIT_KILL_AT=") + point});
    ASSERT_EQ(killed.exit_code, 128 + SIGKILL) << killed.out << killed.err;
    auto s = Send();
    ASSERT_EQ(s.exit_code, 0) << s.out << s.err;
    auto r = Recv();
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_TRUE(SameTensors(dir_ / "w.safetensors", dir_ / "receiver/model.safetensors"));
    ThenTwoMoreVersionsAreBitExact();
  }
}

// With no checkpoint due, the advance is left to the next version's diff (RedoOverlay): the
// sender killed after the advance's log sync, after the diff's first write into the baseline, and
// then again during the restarted sender's replay of the interrupted advance. Each restart
// replays the advance whole and diffs the version again.
TEST_F(RedoLogSync, SenderKilledWhileItsDiffAdvancesTheBaselineRecoversBitExact) {
  const std::vector<std::vector<std::string>> kills = {
      {"sender.advance:1"}, {"redo.overlay_write:1"}, {"redo.overlay_write:1", "redo.replay:1"}};
  for (const std::vector<std::string>& points : kills) {
    SCOPED_TRACE(points.back());
    Use(/*checkpoint_versions=*/8);
    if (runs_ == 0) SyncOnce(0);
    SyncOnce(400 + runs_);  // a delta, acknowledged: the next send's diff advances the baseline
    weights_.Mutate(0.3, 500 + runs_);
    for (const std::string& point : points) {
      auto killed = Send({"REFIT_KILL_AT=" + point});
      ASSERT_EQ(killed.exit_code, 128 + SIGKILL) << point << killed.out << killed.err;
    }
    auto s = Send();
    ASSERT_EQ(s.exit_code, 0) << s.out << s.err;
    EXPECT_NE(s.out.find("baseline advance resumed"), std::string::npos) << s.out;
    auto r = Recv();
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_TRUE(SameTensors(dir_ / "w.safetensors", dir_ / "receiver/model.safetensors"));
    ThenTwoMoreVersionsAreBitExact();
  }
}

// A crash while the log was being written leaves its last entry torn anywhere: the restarted
// receiver cuts it (that record was never written into the model) and applies it afresh.
TEST_F(RedoLogSync, ATornLogTailIsCutAndTheVersionCompletes) {
  Use(/*checkpoint_versions=*/8);
  SyncOnce(0);
  weights_.Mutate(0.3, 11);
  ASSERT_EQ(Send().exit_code, 0);
  ASSERT_EQ(Recv({"REFIT_KILL_AT=receiver.journaled:1"}).exit_code, 128 + SIGKILL);
  const fs::path log = dir_ / "receiver/redo.log";
  const uint64_t full = fs::file_size(log);
  // The last entry's start: the smallest cut that the restarted receiver keeps whole before it.
  const fs::path saved = dir_ / "saved";
  fs::copy(dir_ / "receiver", saved, fs::copy_options::recursive);
  std::vector<uint64_t> cuts;
  for (uint64_t back : {1, 2, 7, 12, 13, 40, 100}) {
    if (back < full) cuts.push_back(full - back);
  }
  for (uint64_t cut : cuts) {
    SCOPED_TRACE("log cut to " + std::to_string(cut) + " of " + std::to_string(full) + " bytes");
    fs::remove_all(dir_ / "receiver");
    fs::copy(saved, dir_ / "receiver", fs::copy_options::recursive);
    fs::resize_file(log, cut);
    auto r = Recv();
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_TRUE(SameTensors(dir_ / "w.safetensors", dir_ / "receiver/model.safetensors"));
  }
  ThenTwoMoreVersionsAreBitExact();
}

// A power cut loses the model's and the baseline's pages written since their last checkpoint
// (here: both files put back to their content at that checkpoint); the logs, synced, survive and
// name the boot that wrote them. The restarted processes replay them whole.
TEST_F(RedoLogSync, AfterAPowerCutTheLogsAreReplayedIntoTheirFiles) {
  Use(/*checkpoint_versions=*/100);
  SyncOnce(0);  // full: the receiver's model is synced
  fs::copy_file(dir_ / "receiver/model.safetensors", dir_ / "model.at-checkpoint");
  SyncOnce(21);  // this send swapped in the sender's full copy of version 1 (synced)
  fs::copy_file(dir_ / "sender/baseline.r0.safetensors", dir_ / "baseline.at-checkpoint");
  SyncOnce(22);  // this send advanced the baseline to version 2 through its log
  ASSERT_FALSE(SameTensors(dir_ / "w.safetensors", dir_ / "model.at-checkpoint"));

  fs::copy_file(dir_ / "model.at-checkpoint", dir_ / "receiver/model.safetensors",
                fs::copy_options::overwrite_existing);
  MarkLogFromAnotherBoot(dir_ / "receiver/redo.log");
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(SameTensors(dir_ / "w.safetensors", dir_ / "receiver/model.safetensors"));

  fs::copy_file(dir_ / "baseline.at-checkpoint", dir_ / "sender/baseline.r0.safetensors",
                fs::copy_options::overwrite_existing);
  MarkLogFromAnotherBoot(dir_ / "sender/baseline.r0.redo.log");
  ThenTwoMoreVersionsAreBitExact();
}

}  // namespace
}  // namespace refit::testing
