// A receiver computes the next version's payloads while their commit is not there yet
// (receiver.early_bytes) and writes nothing before it; once the commit is read, the computed
// changes are used only when the manifest names the same bytes. The sender cuts a delta into
// several payloads (sender.stream_bytes) so that there is something to compute early. Sender
// and receiver run in this process over the disk transport.
#include <gtest/gtest.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "cli_harness.h"
#include "format/wire.h"
#include "refit/refit.h"

namespace refit::testing {
namespace {

namespace fs = std::filesystem;

class EarlyApplyTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(""); }

  // Sender and receiver over one config (`tail` appended), version 1 published and applied.
  void Start(const std::string& tail) {
    sender_.reset();
    receiver_.reset();
    fs::remove_all(dir_ / "sender");
    fs::remove_all(dir_ / "receiver");
    fs::remove_all(dir_ / "sync");
    const std::string text =
        "[sender]\nstate_dir = \"" + dir_ / "sender" +
        "\"\nreceivers = [\"r0\"]\nack_timeout_s = 5\nchunk_bytes = \"2KiB\"\n" + sender_keys_ +
        "stream_bytes = \"" + stream_bytes_ + "\"\n\n[receiver]\nid = \"r0\"\n" + receiver_keys_ +
        "state_dir = \"" + dir_ / "receiver" +
        "\"\n\n[transport]\nname = \"disk\"\n\n[transport.disk]\ndir = \"" + dir_ / "sync" +
        "\"\nfsync = false\n" + tail;
    auto config = Config::FromString(text, "early.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = std::move(config).value();
    auto sender = Sender::Make(config_);
    ASSERT_TRUE(sender.ok()) << sender.status().ToString();
    sender_ = std::move(sender).value();
    auto receiver = Receiver::Make(config_);
    ASSERT_TRUE(receiver.ok()) << receiver.status().ToString();
    receiver_ = std::move(receiver).value();
    weights_ = Checkpoint::Make(41);
    if (attach_) {
      // The model in this process's memory, as an engine's parameters: zeros until version 1.
      memory_.clear();
      std::vector<TensorView> views;
      for (auto& t : weights_.tensors) {
        memory_.emplace_back(t.bytes.size(), 0);
        views.push_back({t.name, t.dtype, t.shape, memory_.back().data()});
      }
      Status attached = receiver_->Attach(views);
      ASSERT_TRUE(attached.ok()) << attached.ToString();
    }
    Publish();
    Poll(/*expect_version=*/1);
  }

  // The attached memory is the trainer's weights, bit for bit.
  void ExpectMemoryIsWeights() {
    ASSERT_EQ(memory_.size(), weights_.tensors.size());
    for (size_t i = 0; i < memory_.size(); ++i) {
      EXPECT_EQ(memory_[i], weights_.tensors[i].bytes) << weights_.tensors[i].name;
    }
  }

  static std::vector<TensorView> Views(Checkpoint& c) {
    std::vector<TensorView> out;
    for (auto& t : c.tensors) out.push_back({t.name, t.dtype, t.shape, t.bytes.data()});
    return out;
  }

  void Publish() {
    auto s = sender_->Publish(Views(weights_));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
  }

  // One poll; the version it applied (0: none).
  uint64_t Poll(uint64_t expect_version, ApplyStats* stats = nullptr) {
    auto applied = receiver_->PollOnce();
    EXPECT_TRUE(applied.ok()) << applied.status().ToString();
    if (!applied.ok() || !applied->has_value()) {
      EXPECT_EQ(expect_version, 0u) << "no version applied";
      return 0;
    }
    if (stats != nullptr) *stats = **applied;
    EXPECT_EQ((*applied)->version, expect_version);
    return (*applied)->version;
  }

  // Publishes the next weights with the commit taken away: the payloads and manifests are there.
  std::string PublishWithoutCommit(uint64_t version) {
    weights_.Mutate(0.05, 300 + version);
    Publish();
    const std::string commit = Path(CommitKey(version));
    std::string bytes = ReadAll(commit);
    fs::remove(commit);
    return bytes;
  }

  std::vector<std::string> PayloadPaths(uint64_t version) const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(Path(VersionDir(version)))) {
      if (e.path().filename().string().rfind("payload.", 0) == 0) out.push_back(e.path());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  std::string Path(const std::string& key) const { return dir_ / ("sync/" + key); }
  std::string Model() const { return dir_ / "receiver/model.safetensors"; }
  std::string State() const { return ReadAll(dir_ / "receiver/receiver.json"); }

  // The receiver's model is the trainer's weights, bit for bit.
  void ExpectModelIsWeights() {
    const std::string path = dir_ / "expected.safetensors";
    ASSERT_TRUE(weights_.Write(path));
    EXPECT_TRUE(SameTensors(path, Model()));
  }

  // With the payload at `path` planted: a poll computes version 2 early; then the good bytes and
  // the commit are put back and version 2 applies bit-exact, that payload read again.
  void ExpectOneReadAgain(const std::string& path, const std::string& good,
                          const std::string& commit) {
    EXPECT_EQ(Poll(0), 0u);
    WriteAll(path, good);
    WriteAll(Path(CommitKey(2)), commit);
    ApplyStats stats;
    ASSERT_EQ(Poll(2, &stats), 2u);
    EXPECT_EQ(stats.early_payloads, stats.payloads - 1);
    ExpectModelIsWeights();
  }

  // The next version, with its commit, is applied as usual (nothing computed early), bit-exact.
  void ExpectVersion3AsUsual() {
    weights_.Mutate(0.05, 999);
    Publish();
    ApplyStats stats;
    ASSERT_EQ(Poll(3, &stats), 3u);
    EXPECT_EQ(stats.early_payloads, 0u);
    if (attach_) {
      ExpectMemoryIsWeights();
    } else {
      ExpectModelIsWeights();
    }
  }

  // Version 2 published without its commit, a poll, then the commit: applied bit-exact, with
  // no payload computed before it.
  void ExpectNothingEarly() {
    const std::string commit = PublishWithoutCommit(2);
    EXPECT_EQ(Poll(0), 0u);
    WriteAll(Path(CommitKey(2)), commit);
    ApplyStats stats;
    ASSERT_EQ(Poll(2, &stats), 2u);
    EXPECT_EQ(stats.early_payloads, 0u);
    ExpectModelIsWeights();
  }

  void RetryAFailedAttempt();

  // The same records as payload bytes `good` in another container (one more metadata key): every
  // digest holds, but the bytes are not the ones the manifest names.
  static std::string OtherContainer(const std::string& good, const std::string& path) {
    auto parsed = Payload::Parse(reinterpret_cast<const uint8_t*>(good.data()), good.size(), path);
    EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
    if (!parsed.ok()) return good;
    PayloadBuilder builder(Metadata{{"planted", "yes"}});
    for (const RecordHeader& r : parsed->records()) {
      builder.Add(r, parsed->record_bytes(r), r.data_end - r.data_begin);
    }
    auto other = builder.Finish();
    EXPECT_TRUE(other.ok());
    return other.ok() ? std::string(other->begin(), other->end()) : good;
  }

  bool attach_ = false;      // Start attaches memory_ to the receiver
  std::string sender_keys_;  // more lines of [sender]
  std::vector<std::vector<uint8_t>> memory_;
  std::string stream_bytes_ = "4KiB";
  std::string receiver_keys_;  // more lines of [receiver]
  TempDir dir_;
  Config config_;
  std::unique_ptr<Sender> sender_;
  std::unique_ptr<Receiver> receiver_;
  Checkpoint weights_;
};

TEST_F(EarlyApplyTest, PayloadsComputedBeforeTheCommitApplyBitExactAndNothingIsWrittenBefore) {
  const std::string commit = PublishWithoutCommit(2);
  ASSERT_GE(PayloadPaths(2).size(), 2u) << "stream_bytes should cut the delta into payloads";
  const std::string model = ReadAll(Model());
  const std::string state = State();
  EXPECT_EQ(Poll(0), 0u);  // computes version 2's payloads
  EXPECT_EQ(ReadAll(Model()), model) << "the model changed before the commit was there";
  EXPECT_EQ(State(), state);
  EXPECT_EQ(receiver_->version(), 1u);
  WriteAll(Path(CommitKey(2)), commit);
  ApplyStats stats;
  ASSERT_EQ(Poll(2, &stats), 2u);
  EXPECT_EQ(stats.early_payloads, stats.payloads);
  EXPECT_EQ(stats.payloads, PayloadPaths(2).size());
  ExpectModelIsWeights();
  ExpectVersion3AsUsual();
}

// Attached memory (an engine's parameters): the payloads are computed before the commit too, the
// memory untouched until it, and only the writes are left after it.
TEST_F(EarlyApplyTest, AttachedMemoryIsComputedBeforeTheCommitAndWrittenAfterIt) {
  attach_ = true;
  Start("");
  ExpectMemoryIsWeights();
  const std::string commit = PublishWithoutCommit(2);
  ASSERT_GE(PayloadPaths(2).size(), 2u);
  const std::vector<std::vector<uint8_t>> before = memory_;
  EXPECT_EQ(Poll(0), 0u);  // computes version 2's payloads
  EXPECT_EQ(memory_, before) << "the memory changed before the commit was there";
  WriteAll(Path(CommitKey(2)), commit);
  ApplyStats stats;
  ASSERT_EQ(Poll(2, &stats), 2u);
  EXPECT_EQ(stats.early_payloads, stats.payloads);
  EXPECT_GT(stats.counters.records, 0u);
  EXPECT_EQ(stats.resumed_skipped_records, 0u);
  EXPECT_GT(stats.write_seconds, 0) << "the computed changes were not the ones written";
  ExpectMemoryIsWeights();
  ExpectVersion3AsUsual();
}

// Attached memory has no redo log: an attempt that fails after the early payloads were written
// leaves them marked applied, and the retry writes each record once (xor and step records
// applied twice would not give the weights back).
TEST_F(EarlyApplyTest, AttachedMemoryRetriedAfterAFailedAttemptAppliesEveryRecordOnce) {
  for (const bool write_early : {false, true}) {
    SCOPED_TRACE(write_early ? "written early" : "written after the commit");
    attach_ = true;
    sender_keys_ = "encoding = \"xor\"\n";
    receiver_keys_ = write_early ? "write_early = true\n" : "";
    Start("");
    RetryAFailedAttempt();
  }
}

// Version 2 with its last payload corrupt: the first attempt fails, the retry (the payload
// good again) applies bit-exact, the records applied in the failed attempt skipped.
void EarlyApplyTest::RetryAFailedAttempt() {
  const std::string commit = PublishWithoutCommit(2);
  const std::string last = PayloadPaths(2).back();
  const std::string good = ReadAll(last);
  std::string bad = good;
  bad[bad.size() / 2] ^= 0x5a;  // not computed early, then refused by the manifest's digest
  WriteAll(last, bad);
  EXPECT_EQ(Poll(0), 0u);  // computes version 2's other payloads
  WriteAll(Path(CommitKey(2)), commit);
  auto failed = receiver_->PollOnce();
  ASSERT_FALSE(failed.ok()) << "a payload that fails its digest must fail the attempt";
  WriteAll(last, good);
  ApplyStats stats;
  ASSERT_EQ(Poll(2, &stats), 2u);
  EXPECT_GT(stats.resumed_skipped_records, 0u) << "the early records were not kept as applied";
  ExpectMemoryIsWeights();
}

// receiver.write_early: attached memory (an engine that does not read it during a sync) gets
// each payload's changes as soon as they are computed, before the commit; once it is there,
// only the payloads not computed yet are left.
TEST_F(EarlyApplyTest, AttachedMemoryWrittenEarlyHoldsTheVersionOnceItCommits) {
  attach_ = true;
  receiver_keys_ = "write_early = true\n";
  Start("");
  const std::string commit = PublishWithoutCommit(2);
  ASSERT_GE(PayloadPaths(2).size(), 2u);
  const std::vector<std::vector<uint8_t>> before = memory_;
  EXPECT_EQ(Poll(0), 0u);  // computes and writes version 2's payloads
  EXPECT_NE(memory_, before) << "nothing was written before the commit";
  EXPECT_EQ(receiver_->version(), 1u);
  WriteAll(Path(CommitKey(2)), commit);
  ApplyStats stats;
  ASSERT_EQ(Poll(2, &stats), 2u);
  EXPECT_EQ(stats.early_payloads, stats.payloads);
  EXPECT_GT(stats.counters.records, 0u);
  ExpectMemoryIsWeights();
  ExpectVersion3AsUsual();
}

// Bytes written early that the commit does not name (the same records in another container)
// are put back before anything else is applied: xor records written twice would not give the
// weights back.
TEST_F(EarlyApplyTest, MemoryWrittenEarlyIsPutBackWhenTheCommitNamesOtherBytes) {
  attach_ = true;
  sender_keys_ = "encoding = \"xor\"\n";
  receiver_keys_ = "write_early = true\n";
  Start("");
  const std::string commit = PublishWithoutCommit(2);
  const std::string path = PayloadPaths(2).front();
  const std::string good = ReadAll(path);
  WriteAll(path, OtherContainer(good, path));
  const std::vector<std::vector<uint8_t>> before = memory_;
  EXPECT_EQ(Poll(0), 0u);
  EXPECT_NE(memory_, before);
  WriteAll(path, good);
  WriteAll(Path(CommitKey(2)), commit);
  ASSERT_EQ(Poll(2), 2u);
  ExpectMemoryIsWeights();
  ExpectVersion3AsUsual();
}

// Memory attached again (here the same, said to hold version 1) gets what was written early put
// back first: it verifies as version 1, and version 2 applies on it once committed.
TEST_F(EarlyApplyTest, MemoryWrittenEarlyIsPutBackWhenItIsAttachedAgain) {
  attach_ = true;
  receiver_keys_ = "write_early = true\n";
  Start("");
  const std::string commit = PublishWithoutCommit(2);
  const std::vector<std::vector<uint8_t>> before = memory_;
  EXPECT_EQ(Poll(0), 0u);
  ASSERT_NE(memory_, before);
  std::vector<TensorView> views;
  for (size_t i = 0; i < memory_.size(); ++i) {
    const auto& t = weights_.tensors[i];
    views.push_back({t.name, t.dtype, t.shape, memory_[i].data()});
  }
  ASSERT_TRUE(receiver_->Attach(views, /*loaded_version=*/1).ok());
  EXPECT_EQ(memory_, before) << "what was written before the commit is still there";
  WriteAll(Path(CommitKey(2)), commit);
  ApplyStats stats;
  ASSERT_EQ(Poll(2, &stats), 2u);
  EXPECT_FALSE(stats.full);
  ExpectMemoryIsWeights();
}

TEST_F(EarlyApplyTest, APayloadThatFailsItsDigestsEarlyIsAppliedAfterTheCommit) {
  const std::string commit = PublishWithoutCommit(2);
  const std::string payload = PayloadPaths(2).front();
  const std::string good = ReadAll(payload);
  std::string bad = good;
  bad[bad.size() - 1] ^= 0x40;  // inside the last record's bytes
  WriteAll(payload, bad);
  ExpectOneReadAgain(payload, good, commit);
}

TEST_F(EarlyApplyTest, EarlyBytesOtherThanTheManifestsAreReadAgain) {
  const std::string commit = PublishWithoutCommit(2);
  const std::string path = PayloadPaths(2).front();
  const std::string good = ReadAll(path);
  WriteAll(path, OtherContainer(good, path));
  ExpectOneReadAgain(path, good, commit);
}

// Each payload's last window of log entries lands while the next payload of the version is
// computed (ApplySink::defer_last_sync): versions of one payload and of several, whose changes
// hit the same elements version after version, apply bit-exact.
TEST_F(EarlyApplyTest, VersionsOfOneAndOfSeveralPayloadsApplyBitExact) {
  for (const char* stream_bytes : {"4KiB", "1GiB"}) {
    SCOPED_TRACE(stream_bytes);
    stream_bytes_ = stream_bytes;
    Start("");
    for (uint64_t v = 2; v <= 4; ++v) {
      weights_.Mutate(0.3, 500 + v);
      Publish();
      ApplyStats stats;
      ASSERT_EQ(Poll(v, &stats), v);
      EXPECT_EQ(stats.payloads, PayloadPaths(v).size());
      EXPECT_EQ(stats.payloads > 1, std::string(stream_bytes) == "4KiB");
      ExpectModelIsWeights();
    }
  }
}

// A follower gone idle checkpoints (syncs the model, empties the log) only once its log is halfway
// to a due checkpoint, here 2 of 4 versions: a sync after every version would clean the model's
// pages, and the next version would fault every page it touches writable again. Checkpoint()
// syncs whatever the log holds.
TEST_F(EarlyApplyTest, AnIdleCheckpointWaitsUntilTheLogIsHalfwayToADueOne) {
  receiver_keys_ = "checkpoint_versions = 4\n";
  Start("");
  const fs::path log = dir_ / "receiver/redo.log";
  auto next_version = [&](uint64_t v) {
    weights_.Mutate(0.05, 700 + v);
    Publish();
    ASSERT_EQ(Poll(v), v);
    ExpectModelIsWeights();
  };
  next_version(2);  // 1 version since the full sync's checkpoint
  const uint64_t one_version = fs::file_size(log);
  ASSERT_TRUE(receiver_->IdleCheckpoint().ok());
  EXPECT_EQ(fs::file_size(log), one_version) << "checkpointed after one version of four";
  next_version(3);  // 2 of 4: halfway
  const uint64_t two_versions = fs::file_size(log);
  EXPECT_GT(two_versions, one_version);
  ASSERT_TRUE(receiver_->IdleCheckpoint().ok());
  EXPECT_LT(fs::file_size(log), one_version) << "not checkpointed halfway";
  const uint64_t empty = fs::file_size(log);
  next_version(4);
  EXPECT_GT(fs::file_size(log), empty);
  ASSERT_TRUE(receiver_->Checkpoint().ok());  // now, after one version
  EXPECT_EQ(fs::file_size(log), empty);
  next_version(5);  // the model and its log agree after both kinds of checkpoint
}

// An ack names the commit it answers: one naming another commit at that version number (left by
// another history in the same store, e.g. a sender that lost its state_dir) is no answer, to the
// sender nor to a receiver that checks its own ack after a restart. An ack without the field (a
// receiver older than it) is taken.
TEST_F(EarlyApplyTest, AnAckOfAnotherCommitAtTheSameVersionIsNoAnswer) {
  const std::string ack_path = Path(AckKey("r0", 2));
  const std::string foreign =
      R"({"receiver":"r0","version":2,"commit_sha256":")" + std::string(64, '0') + R"("})";
  weights_.Mutate(0.05, 800);
  Publish();
  WriteAll(ack_path, foreign);
  EXPECT_EQ(sender_->Unanswered(), std::vector<std::string>{"r0"});
  WriteAll(ack_path, R"({"receiver":"r0","version":2})");
  EXPECT_TRUE(sender_->Unanswered().empty());
  fs::remove(ack_path);
  EXPECT_EQ(sender_->Unanswered(), std::vector<std::string>{"r0"});
  ASSERT_EQ(Poll(2), 2u);
  EXPECT_TRUE(sender_->Unanswered().empty());
  ExpectModelIsWeights();
  // A restarted receiver finds a foreign ack where its own was and answers again.
  WriteAll(ack_path, foreign);
  receiver_.reset();
  auto receiver = Receiver::Make(config_);
  ASSERT_TRUE(receiver.ok()) << receiver.status().ToString();
  receiver_ = std::move(receiver).value();
  EXPECT_EQ(Poll(0), 0u);
  EXPECT_TRUE(sender_->Unanswered().empty());
  EXPECT_EQ(ReadAll(ack_path).find(std::string(64, '0')), std::string::npos);
}

// A sender whose state_dir was lost, over a transport that kept its versions, goes on after the
// newest of them with a full sync chained to it: the receiver that followed the old versions
// takes it, acknowledges it, and the deltas after it.
TEST_F(EarlyApplyTest, ASenderThatLostItsStateContinuesAfterTheStoredVersions) {
  for (uint64_t v = 2; v <= 3; ++v) {
    weights_.Mutate(0.05, 900 + v);
    Publish();
    ASSERT_EQ(Poll(v), v);
  }
  sender_.reset();
  fs::remove_all(dir_ / "sender");
  auto sender = Sender::Make(config_);
  ASSERT_TRUE(sender.ok()) << sender.status().ToString();
  sender_ = std::move(sender).value();
  weights_.Mutate(0.05, 904);
  auto stats = sender_->Publish(Views(weights_));
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->version, 4u);
  EXPECT_TRUE(stats->full);
  ASSERT_EQ(Poll(4), 4u);
  EXPECT_TRUE(sender_->Unanswered().empty());
  ExpectModelIsWeights();
  weights_.Mutate(0.05, 905);
  Publish();
  ApplyStats applied;
  ASSERT_EQ(Poll(5, &applied), 5u);
  EXPECT_FALSE(applied.full);
  ExpectModelIsWeights();
}

// Reads of `path` (inotify IN_ACCESS: one per read(2); a small file is read by one) while `fn`
// runs. Opens and closes are watched too: inotify merges identical events in a row, and they
// keep two reads of two opens apart.
template <typename Fn>
int CountReads(const std::string& path, Fn&& fn) {
  const int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  EXPECT_GE(fd, 0);
  EXPECT_GE(inotify_add_watch(fd, path.c_str(), IN_OPEN | IN_ACCESS | IN_CLOSE), 0) << path;
  fn();
  int reads = 0;
  alignas(inotify_event) char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) {
    for (char* at = buf; at < buf + n;) {
      const auto* e = reinterpret_cast<const inotify_event*>(at);
      reads += (e->mask & IN_ACCESS) != 0;
      at += sizeof(inotify_event) + e->len;
    }
  }
  ::close(fd);
  return reads;
}

// The first payload computed before the commit and the next one not (it was not stored yet):
// once the commit is there, the next one is read once. (Before, the receiver fetched it to
// check the version before touching the model, the early payload's bytes then took its buffer,
// and it was read again: over ucx a second transfer from the sender.)
TEST_F(EarlyApplyTest, APayloadAfterAnEarlyOneIsReadOnce) {
  const std::string commit = PublishWithoutCommit(2);
  const std::vector<std::string> payloads = PayloadPaths(2);
  ASSERT_GE(payloads.size(), 2u);
  std::vector<std::string> later;
  for (size_t i = 1; i < payloads.size(); ++i) {
    later.push_back(ReadAll(payloads[i]));
    fs::remove(payloads[i]);
  }
  EXPECT_EQ(Poll(0), 0u);  // computes the first payload only
  for (size_t i = 1; i < payloads.size(); ++i) WriteAll(payloads[i], later[i - 1]);
  WriteAll(Path(CommitKey(2)), commit);
  ApplyStats stats;
  const int reads = CountReads(payloads[1], [&] { ASSERT_EQ(Poll(2, &stats), 2u); });
  EXPECT_EQ(stats.early_payloads, 1u);
  EXPECT_EQ(reads, 1) << payloads[1] << " was read more than once";
  ExpectModelIsWeights();
}

// A full sync's payloads read before its commit (a receiver that holds a version, version 2 full
// by `full_every`) are kept, not read again once the commit is there: over ucx the second read
// crossed the link again, from the sender (10 reads served per receiver in a 256 MiB bench e2e).
TEST_F(EarlyApplyTest, AFullSyncsPayloadsReadBeforeTheCommitAreNotReadAgain) {
  for (const bool attach : {false, true}) {
    SCOPED_TRACE(attach ? "attached memory" : "model file");
    attach_ = attach;
    sender_keys_ = "full_every = 2\n";
    Start("");
    const std::string commit = PublishWithoutCommit(2);
    const std::vector<std::string> payloads = PayloadPaths(2);
    ASSERT_FALSE(payloads.empty());
    EXPECT_EQ(Poll(0), 0u);  // reads them
    WriteAll(Path(CommitKey(2)), commit);
    ApplyStats stats;
    int reads = 0;
    const auto apply = [&] { ASSERT_EQ(Poll(2, &stats), 2u); };
    const auto count = [&](size_t i, const auto& self) -> void {
      if (i == payloads.size()) return apply();
      reads += CountReads(payloads[i], [&] { self(i + 1, self); });
    };
    count(0, count);
    EXPECT_TRUE(stats.full);
    EXPECT_EQ(reads, 0) << "a payload read before the commit was read again";
    if (attach) {
      ExpectMemoryIsWeights();
    } else {
      ExpectModelIsWeights();
    }
  }
}

// With a key, a payload is decoded only once its signed manifest names it: nothing early.
TEST_F(EarlyApplyTest, SignedVersionsAreNotComputedBeforeTheirManifest) {
  WriteAll(dir_ / "key", "0123456789abcdef0123456789abcdef");
  Start("\n[auth]\nkey_file = \"" + dir_ / "key" + "\"\n");
  ExpectNothingEarly();
}

TEST_F(EarlyApplyTest, OffComputesNothingEarly) {
  auto config = Config::FromString(
      "[receiver]\nid = \"r0\"\nearly_bytes = 0\nstate_dir = \"" + dir_ / "receiver" +
          "\"\n\n[transport]\nname = \"disk\"\n\n[transport.disk]\ndir = \"" + dir_ / "sync" +
          "\"\nfsync = false\n",
      "off.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  receiver_.reset();
  auto receiver = Receiver::Make(config.value());
  ASSERT_TRUE(receiver.ok()) << receiver.status().ToString();
  receiver_ = std::move(receiver).value();
  ExpectNothingEarly();
}

}  // namespace
}  // namespace refit::testing
