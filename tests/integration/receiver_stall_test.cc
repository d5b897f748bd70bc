// A receiver that never stalls (docs/reliability.md): a version whose apply keeps failing the same
// way is abandoned after receiver.max_apply_failures attempts (a need-full request, answered by
// the sender with a full sync); `refit recv --follow` reports a failed version and goes on; `refit
// recv` says "up to date" only when it is; and a delta refused for a structural reason leaves the
// receiver exactly at its committed version, never `applying`.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "sync_fixture.h"

namespace refit::testing {
namespace {

namespace fs = std::filesystem;

class ReceiverStallTest : public SyncFixture {
 protected:
  bool NeedFull() const { return Store().Has(NeedFullKey("r0")); }

  // Version 2 (published honestly) with one record damaged so its apply fails; returns false
  // when the version has no record to damage.
  ::testing::AssertionResult DamageVersion2(bool undecodable) {
    const SyncStore store = Store();
    ForgedVersion v;
    if (auto ok = store.Load(2, &v); !ok) return ok;
    ForgedRecord* victim = nullptr;  // the record with the most encoded bytes
    for (ForgedPayload& p : v.parts[0].payloads) {
      for (ForgedRecord& r : p.records) {
        if (victim == nullptr || r.bytes.size() > victim->bytes.size()) victim = &r;
      }
    }
    if (victim == nullptr || victim->bytes.size() < 8) {
      return ::testing::AssertionFailure() << "version 2 has no record of 8 bytes or more";
    }
    if (undecodable) {
      victim->bytes = std::string(3, '\xff');  // no encoding decodes 3 bytes into that box
    } else {
      victim->bytes[victim->bytes.size() / 2] ^= 0x40;  // dense: decodes, fails its digest
    }
    store.Store(v, 2);
    return ::testing::AssertionSuccess();
  }

  // Waits until the receiver's state names version v (a --follow process applying it).
  bool WaitForStateVersion(uint64_t v, int seconds) const {
    for (int i = 0; i < seconds * 50; ++i) {
      if (StateVersion() == v && !Applying()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
};

enum class StallKind {
  kUndecodable,     // a record whose bytes no encoding decodes (forged, checksums recomputed)
  kDigestMismatch,  // a dense record that decodes but fails its digest (forged likewise)
  kOverApplyBytes,  // an honest payload larger than receiver.apply_bytes (nothing forged)
};

struct StallCase {
  const char* name;
  StallKind kind;
  int max_failures;  // 0: the default (3)
};

void PrintTo(const StallCase& c, std::ostream* os) { *os << c.name; }

class RepeatedFailureTest : public ReceiverStallTest,
                            public ::testing::WithParamInterface<StallCase> {
 protected:
  // Writes refit.toml (and big.toml for kOverApplyBytes); returns the config version 2 is sent
  // with.
  std::string Configure(const StallCase& c) {
    SyncConfig config;
    const std::string limit =
        c.max_failures != 0 ? "max_apply_failures = " + std::to_string(c.max_failures) + "\n" : "";
    if (c.kind != StallKind::kOverApplyBytes) {
      config.sender_extra = "encoding = \"dense\"\n";
      config.receiver_extra = limit;
      WriteConfig(config);
      return "refit.toml";
    }
    config.sender_extra = "chunk_bytes = \"2KiB\"\nbucket_bytes = \"4KiB\"\n";
    config.receiver_extra = "apply_bytes = \"8KiB\"\n" + limit;
    WriteConfig(config);
    SyncConfig big = config;  // one dense payload of the whole model (~20 KiB)
    big.sender_extra = "encoding = \"dense\"\nchunk_bytes = \"64KiB\"\nbucket_bytes = \"64KiB\"\n";
    WriteConfig(big, "big.toml");
    return "big.toml";
  }
};

// Each plain `refit recv` counts one failure of version 2; at the limit the receiver writes a
// need-full request, the sender answers with a full version 3, and a delta version 4 follows.
TEST_P(RepeatedFailureTest, VersionFailingEveryTimeIsAbandonedForAFullSync) {
  const StallCase c = GetParam();
  const std::string v2_config = Configure(c);
  const int limit = c.max_failures != 0 ? c.max_failures : 3;
  ASSERT_NO_FATAL_FAILURE(SyncUpTo(1));
  auto s = Send(2, {}, v2_config);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  if (c.kind != StallKind::kOverApplyBytes) {
    ASSERT_TRUE(DamageVersion2(c.kind == StallKind::kUndecodable));
  }
  for (int run = 1; run <= limit; ++run) {
    const std::string what = "recv run " + std::to_string(run) + " of the damaged version 2";
    auto r = Recv();
    EXPECT_NE(r.exit_code, 0) << what << " succeeded: " << r.out;
    EXPECT_EQ(LineCount(r.err), 1) << what << ": " << r.err;
    if (!Applying()) ExpectModelAt(1, what);
    EXPECT_EQ(NeedFull(), run == limit)
        << what << ": need-full request present = " << NeedFull() << ", expected one exactly from "
        << "failure " << limit << " (receiver.max_apply_failures) on";
  }
  s = Send(3);
  ASSERT_EQ(s.exit_code, 0) << "the sender did not answer the need-full request: " << s.err;
  EXPECT_NE(s.out.find("published version 3 (full)"), std::string::npos) << s.out;
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << "the full version 3 was not applied: " << r.err;
  ExpectModelAt(3, "after the full version 3");
  s = Send(4);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_NE(s.out.find("published version 4 (delta)"), std::string::npos) << s.out;
  r = Recv();
  ASSERT_EQ(r.exit_code, 0) << "the delta after the full sync was not applied: " << r.err;
  ExpectModelAt(4, "after the delta version 4");
  ExpectOutsideUntouched();
}

INSTANTIATE_TEST_SUITE_P(
    Failures, RepeatedFailureTest,
    ::testing::Values(StallCase{"UndecodableRecordDefaultLimit", StallKind::kUndecodable, 0},
                      StallCase{"DigestMismatchLimitTwo", StallKind::kDigestMismatch, 2},
                      StallCase{"PayloadOverApplyBytes", StallKind::kOverApplyBytes, 0}),
    [](const ::testing::TestParamInfo<StallCase>& info) { return std::string(info.param.name); });

// `refit recv --follow` meets a version whose payload exceeds receiver.apply_bytes: it reports the
// failure on stderr and keeps running; once it gives the version up, the sender's full version 3
// and the delta version 4 apply, and it exits at --until-version 4.
TEST_F(ReceiverStallTest, FollowReportsAFailedVersionAndGoesOn) {
  SyncConfig small;  // payloads of a few KiB, under apply_bytes
  small.ack_timeout_s = 15;
  small.sender_extra = "chunk_bytes = \"2KiB\"\nbucket_bytes = \"4KiB\"\n";
  small.receiver_extra = "apply_bytes = \"8KiB\"\n";
  WriteConfig(small);
  SyncConfig big = small;  // one dense payload of the whole model (~20 KiB)
  big.sender_extra = "encoding = \"dense\"\nchunk_bytes = \"64KiB\"\nbucket_bytes = \"64KiB\"\n";
  WriteConfig(big, "big.toml");

  auto s = Send(1);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  RefitProcess follow({"recv", "--config", dir_ / "refit.toml", "--follow", "--until-version", "4",
                       "--timeout", "60"},
                      dir_ / "follow");
  ASSERT_TRUE(WaitForStateVersion(1, 20)) << "recv --follow did not apply version 1";
  s = Send(2, {}, "big.toml");
  ASSERT_EQ(s.exit_code, 0) << s.err;
  s = Send(3);  // waits for the answer to version 2: the receiver's need-full request
  EXPECT_EQ(s.exit_code, 0) << "no answer to version 2 from recv --follow: " << s.err;
  EXPECT_NE(s.out.find("published version 3 (full)"), std::string::npos) << s.out;
  EXPECT_TRUE(WaitForStateVersion(3, 20)) << "recv --follow did not apply the full version 3";
  s = Send(4);
  EXPECT_EQ(s.exit_code, 0) << s.err;
  CommandResult f;
  ASSERT_TRUE(follow.WaitFor(40, &f)) << "recv --follow did not exit at version 4: " << f.err;
  EXPECT_EQ(f.exit_code, 0) << "recv --follow exited because of a failed version: " << f.err;
  EXPECT_NE(f.err.find("apply_bytes"), std::string::npos)
      << "the failure of version 2 was not reported: " << f.err;
  EXPECT_NE(f.out.find("applied version 3 (full)"), std::string::npos) << f.out;
  EXPECT_NE(f.out.find("applied version 4 (delta)"), std::string::npos) << f.out;
  ExpectModelAt(4, "after recv --follow");
  ExpectOutsideUntouched();
}

// "up to date" is printed when the receiver holds the newest version, never while its state says
// it is applying a version whose commit has gone: then it asks for a full sync and fails.
TEST_F(ReceiverStallTest, UpToDateOnlyWhenItIsTrue) {
  ASSERT_NO_FATAL_FAILURE(SyncUpTo(2));
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("up to date at version 2"), std::string::npos) << r.out;

  auto s = Send(3);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  r = Recv({"REFIT_KILL_AT=receiver.applying"});
  ASSERT_EQ(r.exit_code, 128 + SIGKILL) << "not killed at receiver.applying: " << r.err;
  ASSERT_TRUE(Applying()) << StateText();
  const SyncStore store = Store();
  const std::string commit3 = store.Get(CommitKey(3));
  fs::remove(store.Path(CommitKey(3)));
  r = Recv();
  EXPECT_EQ(r.out.find("up to date"), std::string::npos)
      << "recv said up to date while applying version 3: " << r.out;
  EXPECT_NE(r.exit_code, 0) << "recv succeeded while its model is part of version 3: " << r.out;
  EXPECT_TRUE(NeedFull()) << "no need-full request for a version that cannot be completed";

  store.Put(CommitKey(3), commit3);  // the commit is back: the interrupted apply completes
  r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ExpectModelAt(3, "after version 3 completed");
  s = Send(4);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ExpectModelAt(4, "after version 4");
  ExpectOutsideUntouched();
}

enum class Structural { kAbsentTensor, kWrongDtype };

void PrintTo(Structural s, std::ostream* os) {
  *os << (s == Structural::kAbsentTensor ? "absent tensor" : "wrong dtype");
}

class StructuralRefusalTest : public ReceiverStallTest,
                              public ::testing::WithParamInterface<Structural> {};

// A delta whose last record names a tensor the model lacks, or has the wrong dtype (BF16 <-> F16:
// same size, so only a dtype check sees it), is refused before the first model byte changes: no
// "applying" in receiver.json, no redo log entry, the model file bit-exact as before.
TEST_P(StructuralRefusalTest, StructurallyBadDeltaLeavesTheReceiverUntouched) {
  ASSERT_NO_FATAL_FAILURE(SyncUpTo(1));
  auto s = Send(2);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  const SyncStore store = Store();
  const auto honest = store.SaveVersion(2);
  ForgedVersion v;
  ASSERT_TRUE(store.Load(2, &v));
  ForgedRecord* victim = nullptr;  // the last record (of the required dtype)
  for (ForgedPayload& p : v.parts[0].payloads) {
    for (ForgedRecord& r : p.records) {
      if (GetParam() == Structural::kAbsentTensor || r.header.dtype == DType::kBF16) victim = &r;
    }
  }
  ASSERT_NE(victim, nullptr) << "version 2 has no record to damage";
  if (GetParam() == Structural::kAbsentTensor) {
    victim->header.tensor = "model.no_such_tensor.weight";
  } else {
    victim->header.dtype = DType::kF16;
  }
  store.Store(v, 2);
  const std::string before = ReadAll(Model());
  auto r = Recv();
  EXPECT_NE(r.exit_code, 0) << "the bad delta was taken: " << r.out;
  EXPECT_EQ(LineCount(r.err), 1) << r.err;
  EXPECT_FALSE(Applying()) << "refused before any write, yet applying: " << StateText();
  EXPECT_FALSE(LogHasUncommittedEntries(dir_ / "receiver"))
      << "refused before any write, yet logged";
  EXPECT_TRUE(ReadAll(Model()) == before) << "the model file changed";
  EXPECT_EQ(StateVersion(), 1u) << StateText();

  store.RestoreVersion(2, honest);
  r = Recv();
  ASSERT_EQ(r.exit_code, 0) << "the honest version 2 was not applied: " << r.err;
  ExpectModelAt(2, "after the honest version 2");
  ExpectOutsideUntouched();
}

INSTANTIATE_TEST_SUITE_P(Reasons, StructuralRefusalTest,
                         ::testing::Values(Structural::kAbsentTensor, Structural::kWrongDtype),
                         [](const ::testing::TestParamInfo<Structural>& info) {
                           return std::string(info.param == Structural::kAbsentTensor
                                                  ? "AbsentTensor"
                                                  : "WrongDtype");
                         });

}  // namespace
}  // namespace refit::testing
