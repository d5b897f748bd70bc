// Retention (docs/reliability.md, "Retention"): the sender keeps sender.keep_versions committed
// versions and deletes older ones, commit first, so the store stays bounded; a receiver left
// behind by the window asks for a full sync and takes it through its chain bridge; a kill in
// the middle of a deletion is finished by the next publish. Real `refit send` / `refit recv`
// processes over the disk transport.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "sync_fixture.h"

namespace refit::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kKeep = 2;

class RetentionTest : public SyncFixture {
 protected:
  void SetUp() override {
    SyncFixture::SetUp();
    // refit.toml: the sender waits for r0 only; both.toml: for r0 and r1; observer.toml: the
    // receiver r1 (the sender's state, the store and the window are the same for all three).
    WriteConfigFor("refit.toml", "[\"r0\"]", "r0", "receiver");
    WriteConfigFor("both.toml", "[\"r0\", \"r1\"]", "r1", "receiver1");
    WriteConfigFor("observer.toml", "[\"r0\"]", "r1", "receiver1");
  }

  void WriteConfigFor(const std::string& name, const std::string& receivers,
                      const std::string& receiver_id, const std::string& receiver_dir,
                      const std::string& keep = std::to_string(kKeep)) {
    WriteAll(dir_ / name,
             "[sender]\nstate_dir = \"" + dir_ / "sender" + "\"\nreceivers = " + receivers +
                 "\nack_timeout_s = 5\nkeep_versions = " + keep +
                 "\nbucket_bytes = \"4KiB\"\nchunk_bytes = \"4KiB\"\nencoding = \"indices\"\n"
                 "\n[receiver]\nid = \"" +
                 receiver_id + "\"\nstate_dir = \"" + dir_ / receiver_dir +
                 "\"\npoll_interval_ms = 20\n" +
                 "\n[transport]\nname = \"disk\"\n\n[transport.disk]\ndir = \"" + dir_ / "sync" +
                 "\"\nfsync = false\n");
  }

  // Version v publishes these weights (five files, cycled; consecutive versions differ).
  std::string WeightsOf(int v) const { return Weights((v - 1) % kWeights + 1); }

  CommandResult SendVersion(int v, const std::string& config = "refit.toml",
                            const std::vector<std::string>& env = {}) {
    return Run({"send", "--config", dir_ / config, "--weights", WeightsOf(v)}, env);
  }

  // Sends and applies (receiver r0) versions from..to, each checked bit-exact.
  void SyncRange(int from, int to, const std::string& send_config = "refit.toml") {
    for (int v = from; v <= to; ++v) {
      auto s = SendVersion(v, send_config);
      ASSERT_EQ(s.exit_code, 0) << "send of version " << v << ": " << s.err;
      CheckBound("after the send of version " + std::to_string(v));
      auto r = Recv();
      ASSERT_EQ(r.exit_code, 0) << "recv of version " << v << ": " << r.err;
      ASSERT_TRUE(SameTensors(WeightsOf(v), Model())) << "r0 after version " << v;
    }
  }

  // Version directories in the store, and which of them hold a COMMIT.
  std::set<uint64_t> VersionDirs() const {
    std::set<uint64_t> out;
    for (const auto& e : fs::directory_iterator(dir_ / "sync")) {
      const std::string name = e.path().filename().string();
      if (name.size() == 9 && name[0] == 'v') out.insert(std::stoull(name.substr(1)));
    }
    return out;
  }
  std::set<uint64_t> Committed() const {
    std::set<uint64_t> out;
    for (uint64_t v : VersionDirs()) {
      if (Store().Has(CommitKey(v))) out.insert(v);
    }
    return out;
  }
  void CheckBound(const std::string& when) const {
    EXPECT_LE(Committed().size(), static_cast<size_t>(kKeep + 1)) << when;
    EXPECT_LE(VersionDirs().size(), static_cast<size_t>(kKeep + 1)) << when;
  }

  std::string R1Model() const { return dir_ / "receiver1/model.safetensors"; }
  nlohmann::json R1State() const {
    auto j = nlohmann::json::parse(ReadAll(dir_ / "receiver1/receiver.json"), nullptr, false);
    return j.is_object() ? j : nlohmann::json::object();
  }
};

TEST_F(RetentionTest, StoreHoldsAtMostKeepPlusOneVersionsOverTwentySyncs) {
  SyncRange(1, 20);
  EXPECT_EQ(Committed(), (std::set<uint64_t>{18, 19, 20}));
  EXPECT_EQ(VersionDirs(), Committed()) << "a deleted version left objects behind";
  // Acks of deleted versions go too; the latest of each receiver stays.
  std::set<std::string> acks;
  for (const auto& e : fs::directory_iterator(dir_ / "sync/acks/r0")) {
    acks.insert(e.path().filename().string());
  }
  EXPECT_EQ(acks, (std::set<std::string>{"v00000018", "v00000019", "v00000020"}));
  ExpectOutsideUntouched();
}

TEST_F(RetentionTest, KeepVersionsZeroKeepsEveryVersionAndNegativeIsRefused) {
  WriteConfigFor("all.toml", "[\"r0\"]", "r0", "receiver", "0");
  for (int v = 1; v <= 5; ++v) {
    ASSERT_EQ(SendVersion(v, "all.toml").exit_code, 0);
    ASSERT_EQ(Recv({}, "all.toml").exit_code, 0);
  }
  EXPECT_EQ(Committed(), (std::set<uint64_t>{1, 2, 3, 4, 5}));
  WriteConfigFor("bad.toml", "[\"r0\"]", "r0", "receiver", "-1");
  auto bad = SendVersion(6, "bad.toml");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(LineCount(bad.err), 1) << bad.err;
  EXPECT_NE(bad.err.find("keep_versions"), std::string::npos) << bad.err;
  EXPECT_EQ(Committed().size(), 5u);
}

// r1 applies versions 1-2 and is then left out (the sender waits for r0 only) while versions
// 3-6 are published: K+2 versions behind, its successors deleted. It asks for a full sync; once
// listed again in sender.receivers it gets one and takes it through its chain bridge.
TEST_F(RetentionTest, ReceiverKeepPlusTwoBehindGetsAFullSyncAndEndsBitExact) {
  for (int v = 1; v <= 2; ++v) {
    ASSERT_EQ(SendVersion(v, "both.toml").exit_code, 0);
    ASSERT_EQ(Recv().exit_code, 0);
    ASSERT_EQ(Recv({}, "observer.toml").exit_code, 0);
  }
  ASSERT_TRUE(SameTensors(WeightsOf(2), R1Model()));
  SyncRange(3, 2 + kKeep + 2);
  const int newest = 2 + kKeep + 2;
  ASSERT_FALSE(Store().Has(CommitKey(3)))
      << "version 3 should be gone (kept: " << Committed().size() << " versions)";
  EXPECT_TRUE(Store().Has("chain/r1")) << "no chain bridge for the receiver left behind";

  auto behind = Recv({}, "observer.toml");
  EXPECT_EQ(behind.exit_code, 1) << behind.err;
  EXPECT_NE(behind.err.find("need full sync: receiver 'r1' holds version 2"), std::string::npos)
      << behind.err;
  EXPECT_EQ(LineCount(behind.err), 1) << behind.err;
  EXPECT_TRUE(Store().Has(NeedFullKey("r1")));
  EXPECT_TRUE(SameTensors(WeightsOf(2), R1Model())) << "r1's model changed while behind";

  // Listed again: its need-full request answers the newest version, the next one is full.
  auto full = SendVersion(newest + 1, "both.toml");
  ASSERT_EQ(full.exit_code, 0) << full.err;
  CheckBound("after the full sync");
  auto caught_up = Recv({}, "observer.toml");
  ASSERT_EQ(caught_up.exit_code, 0) << caught_up.err;
  EXPECT_NE(caught_up.out.find("(full)"), std::string::npos) << caught_up.out;
  EXPECT_EQ(R1State().value("version", uint64_t{0}), static_cast<uint64_t>(newest + 1));
  EXPECT_TRUE(SameTensors(WeightsOf(newest + 1), R1Model()));
  EXPECT_FALSE(Store().Has(NeedFullKey("r1")));
  ASSERT_EQ(Recv().exit_code, 0);
  EXPECT_TRUE(SameTensors(WeightsOf(newest + 1), Model()));
  // Both receivers follow the next deltas, and the bridge goes once r1 is inside the window.
  for (int v = newest + 2; v <= newest + 2 + kKeep; ++v) {
    ASSERT_EQ(SendVersion(v, "both.toml").exit_code, 0) << "version " << v;
    ASSERT_EQ(Recv().exit_code, 0);
    ASSERT_EQ(Recv({}, "observer.toml").exit_code, 0);
    EXPECT_TRUE(SameTensors(WeightsOf(v), R1Model())) << "r1 after version " << v;
  }
  EXPECT_FALSE(Store().Has("chain/r1"));
  ExpectOutsideUntouched();
}

// A sender killed right after deleting an expired version's COMMIT leaves its other objects:
// no receiver takes them for a version, and the next publish removes them.
TEST_F(RetentionTest, KillMidDeletionIsFinishedByTheNextPublish) {
  ASSERT_EQ(SendVersion(1, "both.toml").exit_code, 0);
  ASSERT_EQ(Recv().exit_code, 0);
  ASSERT_EQ(Recv({}, "observer.toml").exit_code, 0);
  SyncRange(2, 4);  // publishing 4 deleted version 1
  auto killed = SendVersion(5, "refit.toml", {"REFIT_KILL_AT=sender.retention:1"});
  ASSERT_EQ(killed.exit_code, 128 + SIGKILL) << killed.err;
  EXPECT_TRUE(fs::exists(dir_ / "sync/v00000002")) << "nothing left to finish";
  EXPECT_FALSE(Store().Has(CommitKey(2)));
  EXPECT_FALSE(Store().Has(CommitKey(5)));

  // r1 (at version 1) does not take version 2's leftovers for a version: it asks for a full sync.
  auto r1 = Recv({}, "observer.toml");
  EXPECT_EQ(r1.exit_code, 1) << r1.err;
  EXPECT_NE(r1.err.find("need full sync"), std::string::npos) << r1.err;
  EXPECT_EQ(R1State().value("version", uint64_t{0}), 1u);
  EXPECT_FALSE(R1State().contains("applying"));
  EXPECT_TRUE(SameTensors(WeightsOf(1), R1Model()));
  auto r0 = Recv();
  EXPECT_EQ(r0.exit_code, 0) << r0.err;
  ExpectModelAt(4, "r0 after the kill");

  auto next = SendVersion(5);
  ASSERT_EQ(next.exit_code, 0) << next.err;
  EXPECT_EQ(VersionDirs(), (std::set<uint64_t>{3, 4, 5}));
  EXPECT_EQ(Committed(), VersionDirs());
  ASSERT_EQ(Recv().exit_code, 0);
  EXPECT_TRUE(SameTensors(WeightsOf(5), Model()));
  EXPECT_NE(Recv({}, "observer.toml").exit_code, 0);
  EXPECT_TRUE(SameTensors(WeightsOf(1), R1Model()));
  EXPECT_TRUE(Store().Has("chain/r1")) << "r1 lost the bridge it needs for its full sync";
}

// r1 is killed in the middle of applying version 2 (part of it in its model); the window moves
// past version 2 while it is down. It never reports version 2, asks for a full sync, and ends
// bit-exact on it.
TEST_F(RetentionTest, SlowReceiverWhoseVersionIsDeletedRecoversWithAFullSync) {
  ASSERT_EQ(SendVersion(1, "both.toml").exit_code, 0);
  ASSERT_EQ(Recv().exit_code, 0);
  ASSERT_EQ(Recv({}, "observer.toml").exit_code, 0);
  ASSERT_EQ(SendVersion(2).exit_code, 0);
  ASSERT_GE(Store().ParsedCommit(2).manifests.size(), 1u);
  auto killed = Recv({"REFIT_KILL_AT=receiver.record_applied:1"}, "observer.toml");
  ASSERT_EQ(killed.exit_code, 128 + SIGKILL) << "version 2 needs two payloads: " << killed.err;
  ASSERT_EQ(R1State().value("applying", uint64_t{0}), 2u);
  ASSERT_EQ(Recv().exit_code, 0);
  SyncRange(3, 5);  // publishing 5 deleted versions 1 and 2
  ASSERT_FALSE(fs::exists(dir_ / "sync/v00000002"));

  auto stuck = Recv({}, "observer.toml");
  EXPECT_EQ(stuck.exit_code, 1) << stuck.err;
  EXPECT_NE(stuck.err.find("holds part of version 2, which can no longer be completed"),
            std::string::npos)
      << stuck.err;
  EXPECT_EQ(R1State().value("version", uint64_t{0}), 1u) << "r1 reported a partial version";

  ASSERT_EQ(SendVersion(6, "both.toml").exit_code, 0);
  auto full = Recv({}, "observer.toml");
  ASSERT_EQ(full.exit_code, 0) << full.err;
  EXPECT_EQ(R1State().value("version", uint64_t{0}), 6u);
  EXPECT_FALSE(R1State().contains("applying"));
  EXPECT_TRUE(SameTensors(WeightsOf(6), R1Model()));
  ASSERT_EQ(Recv().exit_code, 0);
  EXPECT_TRUE(SameTensors(WeightsOf(6), Model()));
}

}  // namespace
}  // namespace refit::testing
