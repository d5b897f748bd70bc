// The in-memory receiver: Receiver::Attach binds caller-owned tensors (an engine's parameters) and
// every version is applied into them - a full sync copied in, deltas in place - with no model
// file. Sender and receiver run in this process over the disk transport.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "cli_harness.h"
#include "refit/refit.h"

namespace refit::testing {
namespace {

namespace fs = std::filesystem;

class AttachTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_text_ = "[sender]\nstate_dir = \"" + dir_ / "sender" +
                   "\"\nreceivers = [\"r0\"]\nack_timeout_s = 5\nchunk_bytes = \"2KiB\"\n"
                   "bucket_bytes = \"8KiB\"\n\n[receiver]\nid = \"r0\"\nstate_dir = \"" +
                   dir_ / "receiver" +
                   "\"\n\n[transport]\nname = \"disk\"\n\n[transport.disk]\ndir = \"" +
                   dir_ / "sync" + "\"\nfsync = false\n";
    auto config = Config::FromString(config_text_, "attach.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = std::move(config).value();
    auto sender = Sender::Make(config_);
    ASSERT_TRUE(sender.ok()) << sender.status().ToString();
    sender_ = std::move(sender).value();
    trainer_ = Checkpoint::Make(31);
  }

  static std::vector<TensorView> Views(Checkpoint& c) {
    std::vector<TensorView> out;
    for (auto& t : c.tensors) out.push_back({t.name, t.dtype, t.shape, t.bytes.data()});
    return out;
  }

  // An engine's parameters: same names, dtypes and shapes, other bits.
  static Checkpoint EngineMemory() {
    Checkpoint c = Checkpoint::Make(99);
    for (auto& t : c.tensors) std::fill(t.bytes.begin(), t.bytes.end(), 0xAB);
    return c;
  }

  std::unique_ptr<Receiver> MakeReceiver() {
    auto r = Receiver::Make(config_);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }

  // Publishes the trainer's weights and applies them on `receiver` (acks included).
  void Sync(Receiver& receiver, bool expect_full) {
    auto s = sender_->Publish(Views(trainer_));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->full, expect_full);
    auto applied = receiver.PollOnce();
    ASSERT_TRUE(applied.ok()) << applied.status().ToString();
    ASSERT_TRUE(applied->has_value());
    EXPECT_EQ(applied->value().version, s->version);
    ASSERT_TRUE(sender_->WaitAndAdvance(5).ok());
  }

  static void ExpectSameBits(const Checkpoint& a, const Checkpoint& b) {
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    for (size_t i = 0; i < a.tensors.size(); ++i) {
      EXPECT_TRUE(a.tensors[i].bytes == b.tensors[i].bytes) << a.tensors[i].name;
    }
  }

  TempDir dir_;
  std::string config_text_;
  Config config_;
  std::unique_ptr<Sender> sender_;
  Checkpoint trainer_;
};

TEST_F(AttachTest, VersionsLandInTheCallersMemoryBitExactWithNoModelFile) {
  Checkpoint engine = EngineMemory();
  std::vector<const void*> pointers;
  for (auto& t : engine.tensors) pointers.push_back(t.bytes.data());
  auto receiver = MakeReceiver();
  ASSERT_TRUE(receiver->Attach(Views(engine)).ok());
  ASSERT_NO_FATAL_FAILURE(Sync(*receiver, /*expect_full=*/true));
  ExpectSameBits(engine, trainer_);
  for (int step = 0; step < 3; ++step) {
    trainer_.Mutate(0.02, 40 + step);  // NaN payloads, +-0, inf and subnormals among the changes
    ASSERT_NO_FATAL_FAILURE(Sync(*receiver, /*expect_full=*/false));
    ExpectSameBits(engine, trainer_);
  }
  for (size_t i = 0; i < engine.tensors.size(); ++i) {
    EXPECT_EQ(engine.tensors[i].bytes.data(), pointers[i]) << "the receiver wrote elsewhere";
  }
  EXPECT_EQ(receiver->version(), 4u);
  EXPECT_FALSE(fs::exists(dir_ / "receiver/model.safetensors"));
  EXPECT_FALSE(fs::exists(dir_ / "receiver/model.safetensors.incoming"));
}

TEST_F(AttachTest, TensorsThatDoNotMatchAreRefusedByName) {
  Checkpoint engine = EngineMemory();
  std::vector<TensorView> views = Views(engine);
  views[1].shape = {48, 47};
  auto receiver = MakeReceiver();
  ASSERT_TRUE(receiver->Attach(views).ok());
  ASSERT_TRUE(sender_->Publish(Views(trainer_)).ok());
  auto applied = receiver->PollOnce();
  ASSERT_FALSE(applied.ok());
  EXPECT_NE(applied.status().message().find("'model.layers.0.self_attn.q_proj.weight'"),
            std::string::npos)
      << applied.status().message();

  views = Views(engine);
  views.pop_back();  // one tensor missing
  ASSERT_TRUE(receiver->Attach(views).ok());
  applied = receiver->PollOnce();
  ASSERT_FALSE(applied.ok());
  EXPECT_NE(applied.status().message().find("'empty' is not attached"), std::string::npos)
      << applied.status().message();

  views = Views(engine);
  views.push_back(views[0]);  // given twice
  EXPECT_FALSE(receiver->Attach(views).ok());
  ASSERT_TRUE(receiver->Attach(Views(engine)).ok());
  applied = receiver->PollOnce();
  ASSERT_TRUE(applied.ok()) << applied.status().ToString();
  ExpectSameBits(engine, trainer_);
}

TEST_F(AttachTest, ARestartedEngineThatDeclaresItsVersionContinuesWithDeltas) {
  Checkpoint engine = EngineMemory();
  {
    auto receiver = MakeReceiver();
    ASSERT_TRUE(receiver->Attach(Views(engine)).ok());
    ASSERT_NO_FATAL_FAILURE(Sync(*receiver, true));
    trainer_.Mutate(0.02, 7);
    ASSERT_NO_FATAL_FAILURE(Sync(*receiver, false));
  }
  // The engine restarts and loads version 2 from its own checkpoint (here: the same bits).
  Checkpoint reloaded = engine;
  auto receiver = MakeReceiver();
  ASSERT_TRUE(receiver->Attach(Views(reloaded), /*loaded_version=*/2).ok());
  trainer_.Mutate(0.02, 8);
  ASSERT_NO_FATAL_FAILURE(Sync(*receiver, /*expect_full=*/false));
  ExpectSameBits(reloaded, trainer_);
}

TEST_F(AttachTest, MemoryThatIsNotTheDeclaredVersionGetsAFullSync) {
  Checkpoint engine = EngineMemory();
  {
    auto receiver = MakeReceiver();
    ASSERT_TRUE(receiver->Attach(Views(engine)).ok());
    ASSERT_NO_FATAL_FAILURE(Sync(*receiver, true));
  }
  Checkpoint reloaded = engine;
  reloaded.tensors[2].bytes[5] ^= 1;  // one bit off version 1
  auto receiver = MakeReceiver();
  ASSERT_TRUE(receiver->Attach(Views(reloaded), /*loaded_version=*/1).ok());
  trainer_.Mutate(0.02, 9);
  ASSERT_TRUE(sender_->Publish(Views(trainer_)).ok());  // a delta on version 1
  auto refused = receiver->PollOnce();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kVersionMismatch) << refused.status().message();
  // The sender takes the need-full request as the answer and sends a full sync.
  ASSERT_NO_FATAL_FAILURE(Sync(*receiver, /*expect_full=*/true));
  ExpectSameBits(reloaded, trainer_);
}

// Attached memory has no journal (it dies with the process): xor records are decoded straight
// into it, and a retry after a failed attempt skips the records the attempt applied.
TEST_F(AttachTest, XorRecordsAreAppliedOnceAcrossAFailedAttempt) {
  config_text_.insert(config_text_.find("[sender]\n") + 9, "encoding = \"xor\"\n");
  config_text_.replace(config_text_.find("\"2KiB\""), 6, "\"1KiB\"");
  config_text_.replace(config_text_.find("\"8KiB\""), 6, "\"4KiB\"");
  config_ = Config::FromString(config_text_, "attach.toml").value();
  sender_ = Sender::Make(config_).value();
  Checkpoint engine = EngineMemory();
  auto receiver = MakeReceiver();
  ASSERT_TRUE(receiver->Attach(Views(engine)).ok());
  ASSERT_NO_FATAL_FAILURE(Sync(*receiver, /*expect_full=*/true));
  trainer_.Mutate(0.5, 11);
  auto s = sender_->Publish(Views(trainer_));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_GE(s->payloads, 2u);
  // The last payload rots in storage: the attempt applies the others, then fails.
  const std::string last =
      dir_ / ("sync/v00000002/payload.r0.00000" + std::to_string(s->payloads - 1) + ".st");
  const std::string good = ReadAll(last);
  std::string bad = good;
  bad[bad.size() / 2] ^= 0x40;
  WriteAll(last, bad);
  auto failed = receiver->PollOnce();
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(receiver->applying(), 2u);
  WriteAll(last, good);
  auto applied = receiver->PollOnce();
  ASSERT_TRUE(applied.ok()) << applied.status().ToString();
  ASSERT_TRUE(applied->has_value());
  EXPECT_GT(applied->value().resumed_skipped_records, 0u);
  ExpectSameBits(engine, trainer_);
  EXPECT_FALSE(fs::exists(dir_ / "receiver/redo.log"));  // memory that dies with the process
}

}  // namespace
}  // namespace refit::testing
