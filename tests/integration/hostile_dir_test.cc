// The shared sync directory is a trust boundary: any job on the shared filesystem can write into
// it. Real `refit send` and `refit recv` processes run against a directory with planted symlinks
// and FIFOs; each test checks that nothing outside the roots is created, changed or deleted, that
// no process hangs, that the receiver's model stays its last committed version, and that the next
// honest sync (once the planted object is gone) succeeds.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cctype>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "cli_harness.h"

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
    for (int i = 1; i <= 3; ++i) {
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
  std::map<std::string, std::string> Snapshot() const {
    std::map<std::string, std::string> out;
    for (const auto& entry : fs::recursive_directory_iterator(outside_)) {
      struct stat sb {};
      ::lstat(entry.path().c_str(), &sb);
      std::string value = std::to_string(sb.st_mode) + "@" + std::to_string(sb.st_mtim.tv_sec) +
                          "." + std::to_string(sb.st_mtim.tv_nsec);
      if (entry.is_regular_file()) value += ":" + ReadAll(entry.path().string());
      out[entry.path().string()] = value;
    }
    return out;
  }

  CommandResult Bounded(const std::vector<std::string>& args) {
    RefitProcess p(args, dir_ / ("cmd" + std::to_string(counter_++)));
    CommandResult r;
    EXPECT_TRUE(p.WaitFor(kMaxSeconds, &r)) << "refit " << args[0] << " hung: " << r.err;
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
// a symlink either: a link planted in place of the apply journal or the model must not carry the
// receiver's writes to its target.
TEST_F(HostileDirTest, SymlinkedJournalInTheStateDirIsNeverWrittenThrough) {
  ASSERT_NO_FATAL_FAILURE(SyncFirst());
  auto s = Send(2);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  fs::create_symlink(outside_ + "/victim", dir_ / "receiver/apply.journal");
  Recv();
  ExpectOutsideUntouched();
  EXPECT_TRUE(SameTensors(Weights(1), Model()) || SameTensors(Weights(2), Model()));

  fs::remove(dir_ / "receiver/apply.journal");
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
