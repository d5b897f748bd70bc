// A sender's baseline advance to the acknowledged version is written by the next version's diff
// as it reads the baseline (receive/journal.h, RedoOverlay), not replayed over the whole file in
// a pass of its own first. Sender and receiver run in this process over the disk transport; after
// every version the receiver's model and the sender's baseline are checked bit for bit. The
// three ways a diff reads the baseline:
// - a sender made for each version (`refit send`) reads a registered file through it: each
//   chunk's copy is patched and written back;
// - a long-lived sender reads it in place once populated (from its second advance): the changes
//   are written through the file before the chunk is read;
// - an unregistered (small) file is read in place: the changes are stored into its mapping.
#include <gtest/gtest.h>

#include <filesystem>

#include "cli_harness.h"
#include "common/file_util.h"
#include "format/wire.h"
#include "refit/refit.h"

namespace refit::testing {
namespace {

namespace fs = std::filesystem;

enum class Reads { kThroughTheFile, kInPlaceWarm, kInPlaceUnregistered };

class AdvanceInDiffTest : public ::testing::TestWithParam<Reads> {
 protected:
  void SetUp() override {
    // Registered, the baseline file is read through it (pread into the diff's buffers).
    if (GetParam() != Reads::kInPlaceUnregistered) {
      internal::SetMappedFileRegistrationBytesForTesting(1);
    }
    const std::string text =
        "[sender]\nstate_dir = \"" + dir_ / "sender" +
        "\"\nreceivers = [\"r0\"]\nack_timeout_s = 5\nchunk_bytes = \"2KiB\"\nbucket_bytes = "
        "\"4KiB\"\n\n[receiver]\nid = "
        "\"r0\"\nstate_dir = \"" +
        dir_ / "receiver" + "\"\n\n[transport]\nname = \"disk\"\n\n[transport.disk]\ndir = \"" +
        dir_ / "sync" + "\"\nfsync = false\n";
    auto config = Config::FromString(text, "advance.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = std::move(config).value();
    MakeSender();
    auto receiver = Receiver::Make(config_);
    ASSERT_TRUE(receiver.ok()) << receiver.status().ToString();
    receiver_ = std::move(receiver).value();
  }
  void MakeSender() {
    sender_.reset();
    auto sender = Sender::Make(config_);
    ASSERT_TRUE(sender.ok()) << sender.status().ToString();
    sender_ = std::move(sender).value();
  }
  void TearDown() override {
    sender_.reset();
    receiver_.reset();
    internal::SetMappedFileRegistrationBytesForTesting(16ull << 20);
  }

  // Publishes the weights and applies them; the receiver's model is the weights.
  SyncStats SyncOnce(uint64_t version) {
    if (GetParam() == Reads::kThroughTheFile) MakeSender();  // never warm
    auto published = sender_->Publish(weights_.Views());
    EXPECT_TRUE(published.ok()) << published.status().ToString();
    if (!published.ok()) return {};
    EXPECT_EQ(published->version, version);
    auto applied = receiver_->PollOnce();
    EXPECT_TRUE(applied.ok() && applied->has_value()) << applied.status().ToString();
    EXPECT_TRUE(weights_.Write(dir_ / "weights.safetensors"));
    EXPECT_TRUE(SameTensors(dir_ / "weights.safetensors", dir_ / "receiver/model.safetensors"))
        << "version " << version;
    return *published;
  }

  TempDir dir_;
  Config config_;
  std::unique_ptr<Sender> sender_;
  std::unique_ptr<Receiver> receiver_;
  Checkpoint weights_ = Checkpoint::Make(61);
};

// Thirteen deltas: each advance but the one a due checkpoint takes (every 8 versions, replayed
// then synced) is written by the diff, and the baseline holds the acknowledged version after
// each publish. A change missed or written wrong would show in the baseline or, through the next
// diff, in the receiver's digests.
TEST_P(AdvanceInDiffTest, TheBaselineAdvancesInTheNextDiffBitExact) {
  SyncOnce(1);
  int in_diff = 0;
  int advances = 0;
  for (uint64_t version = 2; version <= 14; ++version) {
    ASSERT_TRUE(weights_.Write(dir_ / "previous.safetensors"));
    weights_.Mutate(0.02, 500 + version);  // the log stays under the checkpoint's size
    const SyncStats s = SyncOnce(version);
    ASSERT_FALSE(HasFailure());
    ASSERT_FALSE(s.full);
    if (version >= 3) {  // the advance of version - 1, a delta (version 2's was the full copy)
      ++advances;
      in_diff += s.advanced_in_diff ? 1 : 0;
      EXPECT_TRUE(
          SameTensors(dir_ / "previous.safetensors", dir_ / "sender/baseline.r0.safetensors"))
          << "baseline after publishing version " << version;
    }
  }
  EXPECT_EQ(in_diff, advances - 1) << "one advance of twelve is replayed, at the due checkpoint";
}

// A publish that fails while its diff is advancing the baseline (a payload put refused: the
// version's directory is a file) leaves the advance half written; the same sender's next publish
// replays it whole from its marker and diffs again, bit-exact.
TEST_P(AdvanceInDiffTest, APublishThatFailsMidDiffIsRedoneByTheSameSender) {
  SyncOnce(1);
  weights_.Mutate(0.02, 601);
  SyncOnce(2);
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(weights_.Write(dir_ / "previous.safetensors"));
  const Checkpoint version_2 = weights_;
  weights_.Mutate(0.3, 602);  // payloads fill (4 KiB) and are put while the diff goes on
  const std::string blocked = dir_ / ("sync/" + VersionDir(3));
  WriteAll(blocked, "not a directory");
  auto failed = sender_->Publish(weights_.Views());
  ASSERT_FALSE(failed.ok()) << "the put into a file's path succeeded";
  ASSERT_EQ(sender_->baseline_version(), 1u) << "the advance was complete before the failure";
  fs::remove(blocked);
  // Published again with the weights of now (other changes): a change of the failed attempt
  // left in the log would advance the baseline to bits no version had.
  weights_ = version_2;
  weights_.Mutate(0.3, 603);
  auto published = sender_->Publish(weights_.Views());
  ASSERT_TRUE(published.ok()) << published.status().ToString();
  EXPECT_EQ(published->version, 3u);
  EXPECT_EQ(sender_->baseline_version(), 2u);
  EXPECT_TRUE(SameTensors(dir_ / "previous.safetensors", dir_ / "sender/baseline.r0.safetensors"));
  auto applied = receiver_->PollOnce();
  ASSERT_TRUE(applied.ok() && applied->has_value()) << applied.status().ToString();
  ASSERT_TRUE(weights_.Write(dir_ / "weights.safetensors"));
  EXPECT_TRUE(SameTensors(dir_ / "weights.safetensors", dir_ / "receiver/model.safetensors"));
  for (uint64_t version = 4; version <= 5; ++version) {
    ASSERT_TRUE(weights_.Write(dir_ / "previous.safetensors"));
    weights_.Mutate(0.02, 600 + version);
    SyncOnce(version);
    EXPECT_TRUE(
        SameTensors(dir_ / "previous.safetensors", dir_ / "sender/baseline.r0.safetensors"));
  }
}

// A full sync's copy of the weights (the next baseline) is written while its payloads are encoded
// and put; the commit waits for it. A copy that cannot be written (its path is a directory) fails
// the publish with no commit, and the same sender publishes the version once the path is free.
TEST_P(AdvanceInDiffTest, AFullSyncWhoseCopyCannotBeWrittenIsNotCommitted) {
  const fs::path blocker = dir_ / "sender/pending.r0.safetensors";
  fs::create_directories(blocker / "in_the_way");
  auto failed = sender_->Publish(weights_.Views());
  ASSERT_FALSE(failed.ok()) << "committed without its full copy";
  EXPECT_FALSE(fs::exists(dir_ / ("sync/" + CommitKey(1))));
  auto nothing = receiver_->PollOnce();
  ASSERT_TRUE(nothing.ok()) << nothing.status().ToString();
  EXPECT_FALSE(nothing->has_value());
  fs::remove_all(blocker);
  SyncOnce(1);
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(weights_.Write(dir_ / "previous.safetensors"));
  weights_.Mutate(0.02, 701);
  const SyncStats delta = SyncOnce(2);
  EXPECT_FALSE(delta.full);
  EXPECT_TRUE(SameTensors(dir_ / "previous.safetensors", dir_ / "sender/baseline.r0.safetensors"));
}

INSTANTIATE_TEST_SUITE_P(BaselineReads, AdvanceInDiffTest,
                         ::testing::Values(Reads::kThroughTheFile, Reads::kInPlaceWarm,
                                           Reads::kInPlaceUnregistered),
                         [](const ::testing::TestParamInfo<Reads>& p) {
                           switch (p.param) {
                             case Reads::kThroughTheFile:
                               return "ThroughTheFile";
                             case Reads::kInPlaceWarm:
                               return "InPlaceWarm";
                             default:
                               return "InPlaceUnregistered";
                           }
                         });

}  // namespace
}  // namespace refit::testing
