// What a new user runs into first: a mistyped command, a flag or config value out of range, an
// output that would overwrite an input. Each is one error line and exit 2 (the command line or the
// config is wrong) or exit 1 (a valid command failed while running), and nothing hangs.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cli_harness.h"

namespace refit::testing {
namespace {

// Sender and receiver over the disk transport; `sender_extra` is appended to [sender],
// `receiver_extra` replaces the receiver's poll interval and `tail` is appended to the file.
std::string Config(const TempDir& dir, const std::string& sender_extra = "",
                   const std::string& receiver_extra = "", const std::string& tail = "") {
  return "[sender]\nstate_dir = \"" + dir / "sender" + "\"\nreceivers = [\"r0\"]\n" + sender_extra +
         "\n[receiver]\nid = \"r0\"\nstate_dir = \"" + dir / "receiver" + "\"\n" +
         (receiver_extra.empty() ? "poll_interval_ms = 20\n" : receiver_extra) +
         "\n[transport]\nname = \"disk\"\n\n[transport.disk]\ndir = \"" + dir / "sync" +
         "\"\nfsync = false\n" + tail;
}

void ExpectUsageError(const CommandResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(LineCount(r.err), 1) << r.err;
  EXPECT_EQ(r.err.rfind("refit: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

TEST(CliUsage, UnknownCommandIsNamed) {
  TempDir dir;
  auto r = RunRefit({"bogus"}, dir.path());
  ExpectUsageError(r, "unknown command 'bogus'");
  EXPECT_NE(r.err.find("refit --help"), std::string::npos) << r.err;
  r = RunRefit({"bogus", "--config", "x.toml"}, dir.path());
  ExpectUsageError(r, "unknown command 'bogus'");
  // A mistake inside a command group names the mistake, not the group as unknown.
  r = RunRefit({"bench", "e2e", "--syncs", "2", "stray-argument"}, dir.path());
  ExpectUsageError(r, "stray-argument");
  EXPECT_EQ(r.err.find("unknown command"), std::string::npos) << r.err;
  // No command at all still says one is required.
  r = RunRefit({}, dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err.find("unknown command"), std::string::npos) << r.err;
}

// Exit 2 for every usage or config mistake, whichever layer notices it.
TEST(CliUsage, UsageAndConfigErrorsExitTwo) {
  TempDir dir;
  ExpectUsageError(RunRefit({"recv", "--config", dir / "missing.toml"}, dir.path()),
                   "missing.toml");
  WriteAll(dir / "no_state_dir.toml", "[receiver]\nid = \"r0\"\n");
  ExpectUsageError(RunRefit({"recv", "--config", dir / "no_state_dir.toml"}, dir.path()),
                   "receiver.state_dir");
  WriteAll(dir / "unknown_key.toml", Config(dir, "bucket_byts = 1\n"));
  ExpectUsageError(RunRefit({"recv", "--config", dir / "unknown_key.toml"}, dir.path()),
                   "sender.bucket_byts");
  ExpectUsageError(RunRefit({"recv", "--config", dir / "unknown_key.toml", "--nope"}, dir.path()),
                   "--nope");
  // A config mistake is named before what the file leaves out (here: the weights), so a typo
  // does not hide behind another error until that one is fixed.
  ExpectUsageError(RunRefit({"send", "--config", dir / "unknown_key.toml"}, dir.path()),
                   "sender.bucket_byts");
  WriteAll(dir / "no_weights.toml", Config(dir));
  ExpectUsageError(RunRefit({"send", "--config", dir / "no_weights.toml"}, dir.path()),
                   "no weights");
}

TEST(CliUsage, RecvFollowUntilAVersionAlreadyAppliedExits) {
  TempDir dir;
  WriteAll(dir / "refit.toml", Config(dir));
  Checkpoint weights = Checkpoint::Make(7);
  ASSERT_TRUE(weights.Write(dir / "w.safetensors"));
  auto send = RunRefit({"send", "--config", dir / "refit.toml", "--weights", dir / "w.safetensors"},
                       dir.path());
  ASSERT_EQ(send.exit_code, 0) << send.err;
  auto first = RunRefit({"recv", "--config", dir / "refit.toml"}, dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.err;
  // Already at version 1: the follow must end at once, not wait for a version never needed.
  auto again = RunRefit({"recv", "--config", dir / "refit.toml", "--follow", "--until-version", "1",
                         "--timeout", "30"},
                        dir.path());
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.err, "");
}

TEST(CliUsage, RecvFlagsOutOfRangeOrWithoutFollowAreRefused) {
  TempDir dir;
  WriteAll(dir / "refit.toml", Config(dir));
  const std::string config = dir / "refit.toml";
  ExpectUsageError(
      RunRefit({"recv", "--config", config, "--follow", "--timeout", "-1"}, dir.path()),
      "--timeout");
  ExpectUsageError(
      RunRefit({"recv", "--config", config, "--follow", "--until-version", "-1", "--timeout", "5"},
               dir.path()),
      "--until-version");
  ExpectUsageError(RunRefit({"recv", "--config", config, "--timeout", "5"}, dir.path()),
                   "--follow");
  ExpectUsageError(RunRefit({"recv", "--config", config, "--until-version", "3"}, dir.path()),
                   "--follow");
}

TEST(CliUsage, RecvTimeoutSaysWhatItWaitedFor) {
  TempDir dir;
  WriteAll(dir / "refit.toml", Config(dir));
  auto r = RunRefit({"recv", "--config", dir / "refit.toml", "--follow", "--until-version", "3",
                     "--timeout", "0.3"},
                    dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(LineCount(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("0.3 s waiting for version 3"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("0.300000"), std::string::npos) << r.err;
  r = RunRefit({"recv", "--config", dir / "refit.toml", "--follow", "--timeout", "0.2"},
               dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("waiting for a new version"), std::string::npos) << r.err;
}

struct BadValue {
  const char* sender_extra;
  const char* receiver_extra;
  const char* tail;
  const char* key;  // named in the error with the file and its line
};

class ConfigRangeTest : public ::testing::TestWithParam<BadValue> {};

// Both sides validate the whole file: recv refuses a bad sender value as send does.
TEST_P(ConfigRangeTest, RefusedByBothSidesNamingFileLineAndKey) {
  TempDir dir;
  const BadValue& bad = GetParam();
  WriteAll(dir / "refit.toml", Config(dir, bad.sender_extra, bad.receiver_extra, bad.tail));
  Checkpoint weights = Checkpoint::Make(9);
  ASSERT_TRUE(weights.Write(dir / "w.safetensors"));
  const std::string file = dir / "refit.toml";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"send", "--config", file, "--weights", dir / "w.safetensors"},
        std::vector<std::string>{"recv", "--config", file}}) {
    auto r = RunRefit(args, dir.path());
    ExpectUsageError(r, file + ":");
    EXPECT_NE(r.err.find(bad.key), std::string::npos) << r.err;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Config, ConfigRangeTest,
    ::testing::Values(BadValue{"poll_interval_ms = -1\n", "", "", "sender.poll_interval_ms"},
                      BadValue{"poll_interval_ms = 0\n", "", "", "sender.poll_interval_ms"},
                      BadValue{"", "poll_interval_ms = 0\n", "", "receiver.poll_interval_ms"},
                      BadValue{"ack_timeout_s = -5\n", "", "", "sender.ack_timeout_s"},
                      BadValue{"threads = -2\n", "", "", "sender.threads"},
                      BadValue{"full_every = -1\n", "", "", "sender.full_every"},
                      BadValue{"bucket_bytes = 1\n", "", "", "sender.bucket_bytes"},
                      BadValue{"bucket_bytes = \"8KiB\"\nchunk_bytes = \"16KiB\"\n", "", "",
                               "sender.chunk_bytes"},
                      BadValue{"encoding = \"deltas_zstd\"\n", "",
                               "\n[encoding.deltas_zstd]\nlevel = 99\n", "'level'"}));

TEST(CliUsage, ReceiverStateDirIsCreatedWithItsParents) {
  TempDir dir;
  std::string config = Config(dir);
  const std::string nested = dir / "deep/er/receiver";
  config.replace(config.find(dir / "receiver"), (dir / "receiver").size(), nested);
  WriteAll(dir / "refit.toml", config);
  auto r = RunRefit({"recv", "--config", dir / "refit.toml"}, dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::is_directory(nested));
}

TEST(CliUsage, OutputThatIsAnInputIsRefused) {
  TempDir dir;
  Checkpoint a = Checkpoint::Make(1);
  ASSERT_TRUE(a.Write(dir / "a.safetensors"));
  Checkpoint b = a;
  b.Mutate(0.01, 2);
  ASSERT_TRUE(b.Write(dir / "b.safetensors"));
  const std::string before_b = ReadAll(dir / "b.safetensors");
  ExpectUsageError(
      RunRefit({"diff", dir / "a.safetensors", dir / "b.safetensors", "-o", dir / "b.safetensors"},
               dir.path()),
      "is the new checkpoint");
  EXPECT_EQ(ReadAll(dir / "b.safetensors"), before_b);
  // Another spelling of the same file, and a hard link to it.
  ExpectUsageError(RunRefit({"diff", dir / "a.safetensors", dir / "b.safetensors", "-o",
                             dir.path() + "/./a.safetensors"},
                            dir.path()),
                   "is the base");
  auto d = RunRefit({"diff", dir / "a.safetensors", dir / "b.safetensors", "-o", dir / "d.delta"},
                    dir.path());
  ASSERT_EQ(d.exit_code, 0) << d.err;
  const std::string before_a = ReadAll(dir / "a.safetensors");
  ExpectUsageError(
      RunRefit({"apply", dir / "a.safetensors", dir / "d.delta", "-o", dir / "a.safetensors"},
               dir.path()),
      "is the base");
  std::filesystem::create_hard_link(dir / "a.safetensors", dir / "link.safetensors");
  ExpectUsageError(
      RunRefit({"apply", dir / "a.safetensors", dir / "d.delta", "-o", dir / "link.safetensors"},
               dir.path()),
      "is the base");
  EXPECT_EQ(ReadAll(dir / "a.safetensors"), before_a);
  auto ok = RunRefit({"apply", dir / "a.safetensors", dir / "d.delta", "-o", dir / "c.safetensors"},
                     dir.path());
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

TEST(CliUsage, DirectoryGivenAsAFileIsNamed) {
  TempDir dir;
  Checkpoint a = Checkpoint::Make(3);
  ASSERT_TRUE(a.Write(dir / "a.safetensors"));
  std::filesystem::create_directory(dir / "d");
  ExpectUsageError(
      RunRefit({"apply", dir / "a.safetensors", dir / "d", "-o", dir / "out.safetensors"},
               dir.path()),
      "is a directory");
  ExpectUsageError(RunRefit({"inspect", dir / "d"}, dir.path()), "is a directory");
}

TEST(CliUsage, SendWaitSaysWhatItWaitsFor) {
  TempDir dir;
  WriteAll(dir / "refit.toml", Config(dir, "ack_timeout_s = 0.3\n"));
  Checkpoint weights = Checkpoint::Make(5);
  ASSERT_TRUE(weights.Write(dir / "w.safetensors"));
  auto r = RunRefit(
      {"send", "--config", dir / "refit.toml", "--weights", dir / "w.safetensors", "--wait"},
      dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("waiting for acks of version 1 from r0 (timeout 0.3 s)"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace refit::testing
