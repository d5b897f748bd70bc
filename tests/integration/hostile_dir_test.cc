// The shared sync directory is a trust boundary: any job on the shared filesystem can write into
// it. Real `refit send` and `refit recv` processes run against a directory with planted symlinks
// and FIFOs; each test checks that nothing outside the roots is created, changed or deleted, that
// no process hangs, that the receiver's model stays its last committed version, and that the next
// honest sync (once the planted object is gone) succeeds.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_harness.h"
#include "forge.h"

namespace refit::testing {
namespace {

namespace fs = std::filesystem;

// A process that outlives this is hung (a FIFO open, a wait that never ends).
constexpr int kMaxSeconds = 30;

class HostileDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteAll(dir_ / "refit.toml",
             "[sender]\nstate_dir = \"" + dir_ / "sender" +
                 "\"\nreceivers = [\"r0\"]\nack_timeout_s = 1\n\n[receiver]\nid = \"r0\"\n"
                 "state_dir = \"" +
                 dir_ / "receiver" +
                 "\"\npoll_interval_ms = 20\n\n[transport]\nname = \"disk\"\n\n"
                 "[transport.disk]\ndir = \"" +
                 dir_ / "sync" + "\"\nfsync = false\n");
    fs::create_directories(outside_ + "/sub");
    WriteAll(outside_ + "/victim", "precious");
    WriteAll(outside_ + "/sub/nested", "also precious");
    WriteAll(outside_ + "/COMMIT", "not yours");
    WriteAll(outside_ + "/manifest.r0.json", "{}");
    // Distinctive, and smaller than any payload, so a message leaking the target's size (a short
    // read) shows it.
    WriteAll(outside_ + "/secret", std::string(1111, 's'));
    for (int i = 1; i <= 4; ++i) {
      Checkpoint c = Checkpoint::Make(7);
      c.Mutate(0.05 * i, 100 + i);
      ASSERT_TRUE(c.Write(Weights(i)));
    }
    canary_ = Snapshot();
  }

  std::string Weights(int i) const { return dir_ / ("w" + std::to_string(i) + ".safetensors"); }
  std::string Model() const { return dir_ / "receiver/model.safetensors"; }
  std::string Sync(const std::string& key) const { return dir_ / ("sync/" + key); }

  // Every entry outside the sync directory's tree: kind, mtime and contents.
  std::map<std::string, std::string> Snapshot() const { return SnapshotTree(outside_); }

  CommandResult Bounded(const std::vector<std::string>& args, int bound_s = kMaxSeconds) {
    RefitProcess p(args, dir_ / ("cmd" + std::to_string(counter_++)));
    CommandResult r;
    EXPECT_TRUE(p.WaitFor(bound_s, &r))
        << "refit " << args[0] << " ran past its bound of " << bound_s << " s: " << r.err;
    return r;
  }
  CommandResult Send(int i) {
    return Bounded({"send", "--config", dir_ / "refit.toml", "--weights", Weights(i)});
  }
  CommandResult Recv() { return Bounded({"recv", "--config", dir_ / "refit.toml"}); }
  CommandResult Follow() {
    return Bounded({"recv", "--config", dir_ / "refit.toml", "--follow", "--timeout", "2"});
  }

  // Publishes and applies version 1 honestly.
  void SyncFirst() {
    auto s = Send(1);
    ASSERT_EQ(s.exit_code, 0) << s.err;
    auto r = Recv();
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_TRUE(SameTensors(Weights(1), Model()));
  }

  void ExpectOutsideUntouched() const { EXPECT_EQ(Snapshot(), canary_); }

  SyncStore Store() const { return SyncStore(dir_ / "sync"); }
  std::string StateText() const { return ReadAll(dir_ / "receiver/receiver.json"); }
  bool Applying() const { return StateText().find("\"applying\"") != std::string::npos; }
  // The receiver's state names version v, is not applying, and its model is Weights(v) exactly.
  void ExpectModelAt(int v, const std::string& when) const {
    EXPECT_FALSE(Applying()) << when << ": receiver.json says applying: " << StateText();
    nlohmann::json state = nlohmann::json::parse(StateText(), nullptr, false);
    EXPECT_TRUE(state.is_object() && state.contains("version") && state["version"] == v)
        << when << ": receiver.json does not name version " << v << ": " << StateText();
    EXPECT_TRUE(SameTensors(Weights(v), Model()))
        << when << ": the model is not version " << v << " bit for bit";
  }
  // A sync refused by the receiver: non-zero exit, one line, the model still version v.
  void ExpectRefused(const CommandResult& r, int v, const std::string& what) const {
    EXPECT_NE(r.exit_code, 0) << what << " was taken: " << r.out;
    EXPECT_EQ(LineCount(r.err), 1) << what << ": not one line: " << r.err;
    ExpectModelAt(v, what);
  }

  TempDir dir_;
  std::string outside_ = dir_ / "outside";
  std::map<std::string, std::string> canary_;
  int counter_ = 0;
};

TEST_F(HostileDirTest, SymlinkedVersionDirectoryIsNeitherWrittenNorApplied) {
  ASSERT_NO_FATAL_FAILURE(SyncFirst());
  // A directory the sender would otherwise fill with version 2 (and clear leftovers from).
  fs::create_directories(outside_ + "/vdir");
  WriteAll(outside_ + "/vdir/victim", "precious");
  canary_ = Snapshot();
  fs::create_directory_symlink(outside_ + "/vdir", Sync("v00000002"));
  Send(2);
  Recv();
  ExpectOutsideUntouched();
  EXPECT_TRUE(SameTensors(Weights(1), Model()));

  fs::remove(Sync("v00000002"));
  auto s = Send(2);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(SameTensors(Weights(2), Model()));
  ExpectOutsideUntouched();
}

TEST_F(HostileDirTest, SymlinkedAckDirectoryIsNeverWrittenThrough) {
  auto s = Send(1);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  fs::create_directories(Sync("acks"));
  fs::create_directory_symlink(outside_, Sync("acks/r0"));
  Recv();
  ExpectOutsideUntouched();
  if (fs::exists(Model())) {
    EXPECT_TRUE(SameTensors(Weights(1), Model()));
  }

  fs::remove(Sync("acks/r0"));
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(SameTensors(Weights(1), Model()));
  s = Send(2);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(SameTensors(Weights(2), Model()));
  ExpectOutsideUntouched();
}

TEST_F(HostileDirTest, SymlinkedPayloadIsRefusedWithoutRevealingTheTarget) {
  ASSERT_NO_FATAL_FAILURE(SyncFirst());
  auto s = Send(2);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  const std::string payload = Sync("v00000002/payload.r0.000000.st");
  ASSERT_TRUE(fs::is_regular_file(payload));
  fs::rename(payload, dir_ / "honest-payload");
  fs::create_symlink(outside_ + "/secret", payload);
  auto r = Recv();
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("1111"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(outside_), std::string::npos) << r.err;
  EXPECT_TRUE(SameTensors(Weights(1), Model()));
  ExpectOutsideUntouched();

  fs::remove(payload);
  fs::rename(dir_ / "honest-payload", payload);
  r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(SameTensors(Weights(2), Model()));
  ExpectOutsideUntouched();
}

// The local state directories are the operator's, but nothing under them may be written through
// a symlink either: a link planted in place of the redo log or the model must not carry the
// receiver's writes to its target.
TEST_F(HostileDirTest, SymlinkedJournalInTheStateDirIsNeverWrittenThrough) {
  ASSERT_NO_FATAL_FAILURE(SyncFirst());
  auto s = Send(2);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  fs::remove(dir_ / "receiver/redo.log");
  fs::create_symlink(outside_ + "/victim", dir_ / "receiver/redo.log");
  auto refused = Recv();
  EXPECT_NE(refused.exit_code, 0) << refused.out;
  EXPECT_EQ(LineCount(refused.err), 1) << refused.err;
  ExpectOutsideUntouched();
  EXPECT_TRUE(SameTensors(Weights(1), Model()));

  fs::remove(dir_ / "receiver/redo.log");
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(SameTensors(Weights(2), Model()));
  ExpectOutsideUntouched();
}

TEST_F(HostileDirTest, SymlinkedModelInTheStateDirIsNeverWrittenThrough) {
  ASSERT_NO_FATAL_FAILURE(SyncFirst());
  auto s = Send(2);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  // The receiver's own model, moved outside and linked back: applying v2 in place would change it.
  const std::string moved = outside_ + "/model.safetensors";
  fs::rename(Model(), moved);
  fs::create_symlink(moved, Model());
  canary_ = Snapshot();
  Recv();
  ExpectOutsideUntouched();

  // The receiver may have replaced the link (a rename over it, never a write through it).
  if (fs::is_symlink(Model())) {
    fs::remove(Model());
    fs::rename(moved, Model());
  } else {
    fs::remove(moved);
  }
  canary_ = Snapshot();
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(SameTensors(Weights(2), Model()));
  ExpectOutsideUntouched();
}

TEST_F(HostileDirTest, SymlinkedBaselineInTheStateDirIsNeverWrittenThrough) {
  ASSERT_NO_FATAL_FAILURE(SyncFirst());
  // The second send finds version 1 acked and advances its baseline file.
  auto s = Send(2);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string baseline = dir_ / "sender/baseline.r0.safetensors";
  ASSERT_TRUE(fs::is_regular_file(baseline));
  const std::string moved = outside_ + "/baseline.safetensors";
  fs::rename(baseline, moved);
  fs::create_symlink(moved, baseline);
  canary_ = Snapshot();
  Send(3);
  ExpectOutsideUntouched();

  if (fs::is_symlink(baseline)) {
    fs::remove(baseline);
    fs::rename(moved, baseline);
  } else {
    fs::remove(moved);
  }
  canary_ = Snapshot();
  s = Send(3);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(SameTensors(Weights(3), Model()));
  ExpectOutsideUntouched();
}

// ---- Forged versions (forge.h): objects a writer of the directory planted, every transport
// checksum recomputed so only the chain and the receiver's structural checks can catch them.

// Version 1's full objects re-stored as version 99: a receiver holding version 1 does not jump to
// it (versions 2..98 do not exist, so it does not extend the chain), neither now nor after the
// honest version 2.
TEST_F(HostileDirTest, PlantedFullSyncWithAJumpedVersionIsNotTaken) {
  ASSERT_NO_FATAL_FAILURE(SyncFirst());
  const SyncStore store = Store();
  ForgedVersion v;
  ASSERT_TRUE(store.Load(1, &v));
  store.Store(v, 99);
  Recv();  // ignored or refused
  ExpectModelAt(1, "after a planted full sync at version 99");

  auto s = Send(2);
  ASSERT_EQ(s.exit_code, 0) << "the honest version 2 was not published: " << s.err;
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << "the honest version 2 was not applied: " << r.err;
  ExpectModelAt(2, "after the honest version 2");
  Recv();
  ExpectModelAt(2, "a second recv with the planted version 99 still there");
  ExpectOutsideUntouched();
}

// A full sync planted at the receiver's next version, chained correctly, whose records do not
// cover one tensor: refused before the model is replaced (no .incoming left); the sender then
// publishes version 2 honestly over the planted objects, and that applies.
TEST_F(HostileDirTest, PlantedFullSyncMissingRecordsIsRefusedThenRepublishedHonestly) {
  ASSERT_NO_FATAL_FAILURE(SyncFirst());
  const SyncStore store = Store();
  ForgedVersion v;
  ASSERT_TRUE(store.Load(1, &v));
  v.commit.prev = store.CommitSha(1);
  bool removed = false;
  for (ForgedPayload& p : v.parts[0].payloads) {
    for (size_t i = 0; i < p.records.size() && !removed; ++i) {
      if (p.records[i].header.tensor != "model.layers.0.mlp.up_proj.weight") continue;
      p.records.erase(p.records.begin() + static_cast<long>(i));
      removed = true;
    }
  }
  ASSERT_TRUE(removed) << "version 1 has no record of model.layers.0.mlp.up_proj.weight";
  store.Store(v, 2);
  ExpectRefused(Recv(), 1, "a full sync that leaves a tensor uncovered");
  EXPECT_FALSE(fs::exists(Model() + ".incoming")) << "the refused full sync's file was left";

  auto s = Send(2);
  ASSERT_EQ(s.exit_code, 0) << "the sender did not republish version 2 over the planted one: "
                            << s.err;
  EXPECT_NE(s.out.find("published version 2"), std::string::npos) << s.out;
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << "the honest version 2 was not applied: " << r.err;
  ExpectModelAt(2, "after the honest version 2");
  ExpectOutsideUntouched();
}

// Largest apparent or allocated size of a regular file under dir.
uint64_t LargestFile(const std::string& dir) {
  uint64_t largest = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    struct stat sb {};
    if (::lstat(e.path().c_str(), &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
    largest = std::max(
        {largest, static_cast<uint64_t>(sb.st_size), static_cast<uint64_t>(sb.st_blocks) * 512});
  }
  return largest;
}

// A chained full sync at the next version declaring a tensor of 1 TiB (more than the state
// directory's free space; no record covers it either), or one of 8 MiB (covered by a record)
// against receiver.max_model_bytes = 1MiB: refused quickly, before the model file is grown.
class HugeTensorTest : public HostileDirTest, public ::testing::WithParamInterface<bool> {};

TEST_P(HugeTensorTest, FullSyncDeclaringTooManyBytesIsRefusedBeforeTheFileGrows) {
  const bool bounded = GetParam();
  if (bounded) {
    std::string config = ReadAll(dir_ / "refit.toml");
    const std::string section = "[receiver]\n";
    config.insert(config.find(section) + section.size(), "max_model_bytes = \"1MiB\"\n");
    WriteAll(dir_ / "refit.toml", config);
  }
  ASSERT_NO_FATAL_FAILURE(SyncFirst());
  const SyncStore store = Store();
  ForgedVersion v;
  ASSERT_TRUE(store.Load(1, &v));
  v.commit.prev = store.CommitSha(1);
  Manifest& m = v.parts[0].manifest;
  if (!bounded) {
    m.tensors.push_back({"huge.weight", DType::kF32, {uint64_t{1} << 18, uint64_t{1} << 20}});
    m.total_elements += uint64_t{1} << 38;
    m.model_bytes += uint64_t{1} << 40;
  } else {
    const uint64_t n = 8ull << 20;
    m.tensors.push_back({"big.weight", DType::kU8, {n}});
    m.total_elements += n;
    m.model_bytes += n;
    ForgedPayload extra = v.parts[0].payloads[0];
    ForgedRecord r = extra.records[0];
    r.header.tensor = "big.weight";
    r.header.dtype = DType::kU8;
    r.header.shape = r.header.box_extent = {n};
    r.header.box_offset = {0};
    r.header.encoding = "dense";
    r.header.changed = n;
    r.bytes.assign(n, '\0');
    r.header.digest = Xxh3(r.bytes);
    extra.records = {r};
    v.parts[0].payloads.push_back(extra);
  }
  store.Store(v, 2);
  const auto start = std::chrono::steady_clock::now();
  // A short bound: a receiver that grows the file instead of refusing it writes gigabytes.
  auto r = Bounded({"recv", "--config", dir_ / "refit.toml"}, 10);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ExpectRefused(r, 1, bounded ? "an 8 MiB model over max_model_bytes" : "a 1 TiB tensor");
  EXPECT_LT(seconds, 10) << "the refusal took " << seconds << " s";
  EXPECT_LE(LargestFile(dir_ / "receiver"), 4ull << 20)
      << "a file of more than 4 MiB was made in the receiver's state dir";

  auto s = Send(2);
  ASSERT_EQ(s.exit_code, 0) << "the sender did not republish version 2 over the planted one: "
                            << s.err;
  auto ok = Recv();
  ASSERT_EQ(ok.exit_code, 0) << "the honest version 2 was not applied: " << ok.err;
  ExpectModelAt(2, "after the honest version 2");
  ExpectOutsideUntouched();
}

INSTANTIATE_TEST_SUITE_P(Bounds, HugeTensorTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "MaxModelBytes" : "FreeSpace");
                         });

// A record that fails to decode (transport checksums recomputed) is the hostile case of
// RepeatedFailureTest/UndecodableRecordDefaultLimit in receiver_stall_test.cc: abandoned after
// three failures, replaced by a full sync, and the next delta applies.

// Version 1 replayed into the next slot (version fields rewritten, its prev left as it was):
// it does not extend the receiver's chain, so it is refused; the honest version 3 then applies.
TEST_F(HostileDirTest, ReplayedOlderVersionIsRefusedByTheChain) {
  ASSERT_NO_FATAL_FAILURE(SyncFirst());
  auto s = Send(2);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const SyncStore store = Store();
  ForgedVersion v;
  ASSERT_TRUE(store.Load(1, &v));
  store.Store(v, 3);
  ExpectRefused(Recv(), 2, "version 1 replayed as version 3");

  s = Send(3);
  ASSERT_EQ(s.exit_code, 0) << "the sender did not republish version 3 over the replay: " << s.err;
  r = Recv();
  ASSERT_EQ(r.exit_code, 0) << "the honest version 3 was not applied: " << r.err;
  ExpectModelAt(3, "after the honest version 3");
  ExpectOutsideUntouched();
}

class HostileFifoTest : public HostileDirTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(HostileFifoTest, AFifoInPlaceOfAnObjectNeverHangsTheReceiver) {
  ASSERT_NO_FATAL_FAILURE(SyncFirst());
  auto s = Send(2);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  const std::string object = Sync("v00000002/" + GetParam());
  ASSERT_TRUE(fs::is_regular_file(object));
  fs::rename(object, dir_ / "honest-object");
  ASSERT_EQ(::mkfifo(object.c_str(), 0666), 0);
  Recv();
  Follow();
  EXPECT_TRUE(SameTensors(Weights(1), Model()));

  // The receiver failed version 2 the same way at every poll: unless it was the commit (never
  // read, so never tried), it abandoned version 2 and asked for a full sync. Either way the
  // next honest sync goes through.
  fs::remove(object);
  fs::rename(dir_ / "honest-object", object);
  Recv();
  s = Send(3);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(SameTensors(Weights(3), Model()));
  ExpectOutsideUntouched();
}

INSTANTIATE_TEST_SUITE_P(Objects, HostileFifoTest,
                         ::testing::Values("manifest.r0.json", "COMMIT", "payload.r0.000000.st"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name;
                           for (char c : info.param)
                             name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

}  // namespace
}  // namespace refit::testing
