// Faults at named points of the protocol, deterministically: corrupt and truncated payloads of a
// committed version, ENOSPC on the sender's puts, and sender/receiver processes killed at
// sender.manifest_put, sender.commit_put, sender.advance, receiver.model_synced and receiver.ack
// (docs/reliability.md). The random version of all of this is the soak (soak_driver.cc).
#include <gtest/gtest.h>

#include <fstream>

#include "cli_harness.h"

namespace refit::testing {
namespace {

namespace fs = std::filesystem;

std::string BaseConfig(const TempDir& dir, const std::string& encoding = "auto") {
  return "[sender]\nstate_dir = \"" + dir / "sender" +
         "\"\nreceivers = [\"r0\"]\n"
         "ack_timeout_s = 60\nchunk_bytes = \"2KiB\"\nbucket_bytes = \"4KiB\"\nencoding = \"" +
         encoding + "\"\n\n[receiver]\nid = \"r0\"\nstate_dir = \"" + dir / "receiver" +
         "\"\npoll_interval_ms = 20\n\n[transport]\nname = \"disk\"\n\n[transport.disk]\ndir = \"" +
         dir / "sync" + "\"\nfsync = false\n";
}

class FaultSync : public ::testing::Test {
 protected:
  void SetUp() override { Use("auto"); }
  void Use(const std::string& encoding, const std::string& receiver_keys = "") {
    std::string config = BaseConfig(dir_, encoding);
    if (!receiver_keys.empty()) {
      const std::string section = "[receiver]\n";
      config.insert(config.find(section) + section.size(), receiver_keys);
    }
    WriteAll(dir_ / "refit.toml", config);
  }

  CommandResult Send(const std::vector<std::string>& env = {},
                     const std::string& config = "refit.toml") {
    EXPECT_TRUE(weights_.Write(dir_ / "w.safetensors"));
    RefitProcess p({"send", "--config", dir_ / config, "--weights", dir_ / "w.safetensors"},
                   dir_ / ("send" + std::to_string(runs_++)), env);
    return p.Wait();
  }
  CommandResult Recv(const std::vector<std::string>& env = {}) {
    RefitProcess p({"recv", "--config", dir_ / "refit.toml"},
                   dir_ / ("recv" + std::to_string(runs_++)), env);
    return p.Wait();
  }
  void KillMidAdvanceThenResume(bool lose_pending_changes);
  // Publishes and applies versions 1 (full) and 2 (delta); keeps a copy of each version's weights.
  void TwoVersions() {
    for (int v = 1; v <= 2; ++v) {
      if (v > 1) weights_.Mutate(0.05, 70 + v);
      auto s = Send();
      ASSERT_EQ(s.exit_code, 0) << s.err;
      auto r = Recv();
      ASSERT_EQ(r.exit_code, 0) << r.err;
      fs::copy_file(dir_ / "w.safetensors", dir_ / ("w" + std::to_string(v) + ".safetensors"),
                    fs::copy_options::overwrite_existing);
    }
  }
  std::string Payload(int version, int seq) {
    char name[64];
    std::snprintf(name, sizeof(name), "sync/v%08d/payload.r0.%06d.st", version, seq);
    return dir_ / name;
  }
  std::string State() { return ReadAll(dir_ / "receiver/receiver.json"); }

  TempDir dir_;
  Checkpoint weights_ = Checkpoint::Make(61);
  int runs_ = 0;
};

// With receiver.verify_payloads_first, a payload of a committed version damaged in storage
// (flipped bytes or cut short) is refused with an error naming the payload and its records; the
// receiver keeps its committed version, bit for bit, and applies the version once the payload is
// whole again.
TEST_F(FaultSync, CorruptPayloadOfACommittedVersionIsRejectedAndTheModelKept) {
  Use("auto", "verify_payloads_first = true\n");
  TwoVersions();
  weights_.Mutate(0.3, 80);
  auto s = Send();
  ASSERT_EQ(s.exit_code, 0) << s.err;
  ASSERT_TRUE(fs::exists(Payload(3, 1))) << "the test needs a version of several payloads";
  for (bool truncate : {false, true}) {
    const std::string good = ReadAll(Payload(3, 1));
    std::string bad = good;
    if (truncate) {
      bad.resize(bad.size() / 2);
    } else {
      bad[bad.size() / 2] ^= 0x5a;
    }
    WriteAll(Payload(3, 1), bad);
    auto r = Recv();
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("v00000003/payload.r0.000001.st: payload rejected, its record"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("of version 3 not applied"), std::string::npos) << r.err;
    EXPECT_EQ(LineCount(r.err), 1) << r.err;
    // Nothing of version 3 reached the model: it is still version 2, and says so.
    EXPECT_NE(State().find("\"version\": 2"), std::string::npos) << State();
    EXPECT_EQ(State().find("applying"), std::string::npos) << State();
    EXPECT_TRUE(SameTensors(dir_ / "w2.safetensors", dir_ / "receiver/model.safetensors"));
    WriteAll(Payload(3, 1), good);
  }
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(SameTensors(dir_ / "w.safetensors", dir_ / "receiver/model.safetensors"));
}

// By default a delta crosses the link once: a payload cut short is still refused before the
// model is touched (its size is checked first), but one whose bytes rotted in storage is found
// during the apply. The receiver then stays `applying` - never reporting a mix as a version - and
// completes the version, bit for bit, once the payload reads whole.
TEST_F(FaultSync, PayloadCorruptInStorageIsFoundMidApplyAndTheVersionCompletedLater) {
  TwoVersions();
  weights_.Mutate(0.3, 80);
  auto s = Send();
  ASSERT_EQ(s.exit_code, 0) << s.err;
  ASSERT_TRUE(fs::exists(Payload(3, 1))) << "the test needs a version of several payloads";
  const std::string good = ReadAll(Payload(3, 1));

  WriteAll(Payload(3, 1), good.substr(0, good.size() / 2));
  auto cut = Recv();
  EXPECT_NE(cut.exit_code, 0);
  EXPECT_NE(cut.err.find("v00000003/payload.r0.000001.st: payload rejected"), std::string::npos)
      << cut.err;
  EXPECT_EQ(State().find("applying"), std::string::npos) << State();
  EXPECT_TRUE(SameTensors(dir_ / "w2.safetensors", dir_ / "receiver/model.safetensors"));

  std::string bad = good;
  bad[bad.size() / 2] ^= 0x5a;
  WriteAll(Payload(3, 1), bad);
  auto rotten = Recv();
  EXPECT_NE(rotten.exit_code, 0);
  EXPECT_NE(rotten.err.find("v00000003/payload.r0.000001.st: payload rejected"), std::string::npos)
      << rotten.err;
  EXPECT_EQ(LineCount(rotten.err), 1) << rotten.err;
  EXPECT_NE(State().find("\"applying\": 3"), std::string::npos) << State();
  EXPECT_NE(State().find("\"version\": 2"), std::string::npos) << State();

  WriteAll(Payload(3, 1), good);
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(SameTensors(dir_ / "w.safetensors", dir_ / "receiver/model.safetensors"));
  EXPECT_EQ(State().find("applying"), std::string::npos) << State();
}

// An ack object that does not parse, or names another receiver or version, is not an
// acknowledgement: the sender does not advance its baseline on it.
TEST_F(FaultSync, DamagedAckDoesNotAdvanceTheSender) {
  TwoVersions();
  weights_.Mutate(0.01, 81);
  auto s = Send();
  ASSERT_EQ(s.exit_code, 0) << s.err;  // version 3, never received
  std::string config = ReadAll(dir_ / "refit.toml");
  config.replace(config.find("ack_timeout_s = 60"), 18, "ack_timeout_s = 1");
  WriteAll(dir_ / "impatient.toml", config);
  const std::string ack = dir_ / "sync/acks/r0/v00000003";
  const std::string forged_ack = ReadAll(dir_ / "sync/acks/r0/v00000002");  // version 2's
  for (const std::string& bad : {std::string("{\"receiver\": \"r0\", \"ver"), forged_ack}) {
    WriteAll(ack, bad);
    weights_.Mutate(0.01, 82);
    auto next = Send({}, "impatient.toml");
    EXPECT_NE(next.exit_code, 0);
    EXPECT_NE(next.err.find("not acknowledged"), std::string::npos) << next.err;
    EXPECT_FALSE(fs::exists(dir_ / "sync/v00000004/COMMIT"));
  }
  fs::remove(ack);
  auto r = Recv();  // the real ack of version 3
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto next = Send({}, "impatient.toml");
  ASSERT_EQ(next.exit_code, 0) << next.err;
  EXPECT_NE(next.out.find("published version 4 (delta)"), std::string::npos) << next.out;
}

TEST_F(FaultSync, CorruptSinglePayloadIsRejectedBeforeTheStateSaysApplying) {
  TwoVersions();
  weights_.Mutate(0.002, 79);
  auto s = Send();
  ASSERT_EQ(s.exit_code, 0) << s.err;
  ASSERT_FALSE(fs::exists(Payload(3, 1))) << "the test needs a version of one payload";
  const std::string good = ReadAll(Payload(3, 0));
  std::string bad = good;
  bad[bad.size() - 3] ^= 0x21;
  WriteAll(Payload(3, 0), bad);
  auto r = Recv();
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("v00000003/payload.r0.000000.st: payload rejected, its record"),
            std::string::npos)
      << r.err;
  EXPECT_NE(State().find("\"version\": 2"), std::string::npos) << State();
  EXPECT_EQ(State().find("applying"), std::string::npos) << State();
  EXPECT_TRUE(SameTensors(dir_ / "w2.safetensors", dir_ / "receiver/model.safetensors"));
  WriteAll(Payload(3, 0), good);
  r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(SameTensors(dir_ / "w.safetensors", dir_ / "receiver/model.safetensors"));
}

TEST_F(FaultSync, EnospcOnTheSendersPutLeavesNoCommitAndTheNextPublishSucceeds) {
  TwoVersions();
  WriteAll(dir_ / "enospc.toml", BaseConfig(dir_) + "\n[faults]\nseed = 1\nenospc_put = 1\n");
  weights_.Mutate(0.05, 81);
  auto failed = Send({}, "enospc.toml");
  EXPECT_NE(failed.exit_code, 0);
  EXPECT_NE(failed.err.find("v00000003/payload.r0.000000.st"), std::string::npos) << failed.err;
  EXPECT_NE(failed.err.find("No space left on device"), std::string::npos) << failed.err;
  EXPECT_EQ(LineCount(failed.err), 1) << failed.err;
  EXPECT_FALSE(fs::exists(dir_ / "sync/v00000003/COMMIT"));
  auto s = Send();
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_NE(s.out.find("published version 3 (delta)"), std::string::npos) << s.out;
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(SameTensors(dir_ / "w.safetensors", dir_ / "receiver/model.safetensors"));
}

TEST_F(FaultSync, SilentPutFaultsNeverReachACommit) {
  // Every put is dropped, cut short or corrupted about half of the time: the sender reads each
  // object back and redoes it, so what it commits is whole.
  TwoVersions();
  WriteAll(dir_ / "lossy.toml", BaseConfig(dir_) +
                                    "\n[faults]\nseed = 5\ndrop_put = 0.15\ntruncate_put = 0.15\n"
                                    "corrupt_put = 0.15\ncorrupt_get = 0.05\n");
  for (int v = 3; v <= 5; ++v) {
    weights_.Mutate(0.05, 90 + v);
    auto s = Send({}, "lossy.toml");
    // A put that kept failing its read-back fails the publish (no commit); publish again.
    if (s.exit_code != 0) s = Send();
    ASSERT_EQ(s.exit_code, 0) << s.err;
    auto r = Recv();
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(SameTensors(dir_ / "w.safetensors", dir_ / "receiver/model.safetensors"));
  }
}

TEST_F(FaultSync, SenderKilledBeforeItsCommitRepublishesTheSameVersion) {
  TwoVersions();
  weights_.Mutate(0.05, 82);
  auto killed = Send({"REFIT_KILL_AT=sender.manifest_put"});
  ASSERT_EQ(killed.exit_code, 128 + SIGKILL) << killed.err;
  EXPECT_TRUE(fs::exists(dir_ / "sync/v00000003/manifest.r0.json"));
  EXPECT_FALSE(fs::exists(dir_ / "sync/v00000003/COMMIT"));
  weights_.Mutate(0.05, 83);  // the trainer moved on meanwhile
  auto s = Send();
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_NE(s.out.find("died before its commit; republished"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("published version 3 (delta)"), std::string::npos) << s.out;
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(SameTensors(dir_ / "w.safetensors", dir_ / "receiver/model.safetensors"));
}

TEST_F(FaultSync, SenderKilledAfterItsCommitAdoptsTheCommittedVersion) {
  TwoVersions();
  weights_.Mutate(0.05, 84);
  auto killed = Send({"REFIT_KILL_AT=sender.commit_put"});
  ASSERT_EQ(killed.exit_code, 128 + SIGKILL) << killed.err;
  ASSERT_TRUE(fs::exists(dir_ / "sync/v00000003/COMMIT"));
  fs::copy_file(dir_ / "w.safetensors", dir_ / "w3.safetensors");
  // Version 3 is committed: receivers apply it, and the sender must never publish another 3.
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(SameTensors(dir_ / "w3.safetensors", dir_ / "receiver/model.safetensors"));
  weights_.Mutate(0.05, 85);
  auto s = Send();
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_NE(s.out.find("version 3 was committed by an earlier attempt; adopted"), std::string::npos)
      << s.out;
  EXPECT_NE(s.out.find("published version 4 (delta)"), std::string::npos) << s.out;
  r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(SameTensors(dir_ / "w.safetensors", dir_ / "receiver/model.safetensors"));
}

// The sender's baseline advance applies a delta exactly once across a kill: by the changes its
// diff recorded (past the committed size of the baseline's redo log), or, with those lost, by
// decoding its own payloads (xor records through the redo log's skip of logged records).
void FaultSync::KillMidAdvanceThenResume(bool lose_pending_changes) {
  Use("xor");
  TwoVersions();
  // Not synced, the pending changes of version 2 may be lost to a power cut.
  const fs::path log(dir_ / "sender/baseline.r0.redo.log");
  const std::string state = dir_ / "sender/sender.r0.json";
  ASSERT_TRUE(LogHasUncommittedEntries(log.string(), state));
  if (lose_pending_changes) fs::resize_file(log, std::max<uint64_t>(CommittedLogBytes(state), 56));
  weights_.Mutate(0.05, 86);
  auto killed = Send({"REFIT_KILL_AT=sender.advance"});
  ASSERT_EQ(killed.exit_code, 128 + SIGKILL) << killed.out << killed.err;
  EXPECT_TRUE(fs::exists(dir_ / "sender/baseline.r0.redo.log"));
  auto s = Send();
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_NE(s.out.find("baseline advance resumed, replayed"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("published version 3 (delta)"), std::string::npos) << s.out;
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(SameTensors(dir_ / "w.safetensors", dir_ / "receiver/model.safetensors"));
  // A baseline with a record applied twice would make the next delta's digests fail.
  weights_.Mutate(0.05, 87);
  s = Send();
  ASSERT_EQ(s.exit_code, 0) << s.err;
  r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(SameTensors(dir_ / "w.safetensors", dir_ / "receiver/model.safetensors"));
}

TEST_F(FaultSync, SenderKilledMidBaselineAdvanceResumesThroughItsRedoLog) {
  KillMidAdvanceThenResume(/*lose_pending_changes=*/false);
}

TEST_F(FaultSync, SenderWithoutItsPendingChangesAdvancesByDecodingItsPayloads) {
  KillMidAdvanceThenResume(/*lose_pending_changes=*/true);
}

TEST_F(FaultSync, ReceiverKilledBeforeItsAckAcknowledgesOnRestart) {
  TwoVersions();
  weights_.Mutate(0.05, 88);
  auto s = Send();
  ASSERT_EQ(s.exit_code, 0) << s.err;
  auto killed = Recv({"REFIT_KILL_AT=receiver.ack"});
  ASSERT_EQ(killed.exit_code, 128 + SIGKILL) << killed.err;
  EXPECT_NE(State().find("\"version\": 3"), std::string::npos) << State();
  EXPECT_FALSE(fs::exists(dir_ / "sync/acks/r0/v00000003"));
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir_ / "sync/acks/r0/v00000003"));
  EXPECT_TRUE(SameTensors(dir_ / "w.safetensors", dir_ / "receiver/model.safetensors"));
}

// An ack damaged in storage (a corrupt put whose re-put then failed) is no answer: the receiver
// re-puts it on its next start instead of taking its mere existence for one (the sender would
// wait for that version forever).
TEST_F(FaultSync, ADamagedAckIsPutAgain) {
  TwoVersions();
  const std::string ack = dir_ / "sync/acks/r0/v00000002";
  std::string bytes = ReadAll(ack);
  ASSERT_FALSE(bytes.empty());
  bytes[bytes.size() / 2] ^= 0x5A;
  {
    std::ofstream out(ack, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string again = ReadAll(ack);
  EXPECT_NE(again, bytes);
  EXPECT_NE(again.find("\"receiver\":\"r0\""), std::string::npos) << again;
  EXPECT_NE(again.find("\"version\":2"), std::string::npos) << again;
}

TEST_F(FaultSync, ReceiverKilledAroundAFullSyncRenameKnowsWhichModelItHolds) {
  auto s = Send();
  ASSERT_EQ(s.exit_code, 0) << s.err;
  auto killed = Recv({"REFIT_KILL_AT=receiver.model_synced"});
  ASSERT_EQ(killed.exit_code, 128 + SIGKILL) << killed.err;
  EXPECT_NE(State().find("\"replacing\": 1"), std::string::npos) << State();
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(State().find("\"version\": 1"), std::string::npos) << State();
  EXPECT_EQ(State().find("replacing"), std::string::npos) << State();
  EXPECT_TRUE(fs::exists(dir_ / "sync/acks/r0/v00000001"));
  EXPECT_TRUE(SameTensors(dir_ / "w.safetensors", dir_ / "receiver/model.safetensors"));
  // No full sync was needed again: the next version is a delta and applies.
  weights_.Mutate(0.05, 89);
  s = Send();
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_NE(s.out.find("published version 2 (delta)"), std::string::npos) << s.out;
  r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(SameTensors(dir_ / "w.safetensors", dir_ / "receiver/model.safetensors"));
}

}  // namespace
}  // namespace refit::testing
