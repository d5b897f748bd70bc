// `refit send` and `refit recv` over state files whose values have the wrong JSON type: each must
// fail with one error line naming the file and the key, never abort on an uncaught exception.
#include <gtest/gtest.h>

#include <csignal>
#include <string>

#include "cli_harness.h"

namespace refit::testing {
namespace {

std::string Config(const TempDir& dir) {
  return "[sender]\nstate_dir = \"" + dir / "sender" +
         "\"\nreceivers = [\"r0\"]\nack_timeout_s = 1\n"
         "\n[receiver]\nid = \"r0\"\nstate_dir = \"" +
         dir / "receiver" +
         "\"\npoll_interval_ms = 20\n\n[transport]\nname = \"disk\"\n\n[transport.disk]\ndir = \"" +
         dir / "sync" + "\"\nfsync = false\n";
}

struct BadState {
  const char* key;
  const char* json;  // the whole state file
};

// A failure reported as a Status: a clean exit code (not SIGABRT's 134), one stderr line.
void ExpectOneErrorLine(const CommandResult& r, const std::string& file, const std::string& key) {
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.exit_code, 128 + SIGABRT) << r.err;
  EXPECT_LT(r.exit_code, 128) << r.err;
  EXPECT_EQ(LineCount(r.err), 1) << r.err;
  EXPECT_EQ(r.err.rfind("refit: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(file), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'" + key + "'"), std::string::npos) << r.err;
}

class SenderStateTest : public ::testing::TestWithParam<BadState> {};

TEST_P(SenderStateTest, MistypedValueIsOneErrorLine) {
  TempDir dir;
  WriteAll(dir / "refit.toml", Config(dir));
  Checkpoint weights = Checkpoint::Make(41);
  ASSERT_TRUE(weights.Write(dir / "w.safetensors"));
  const std::vector<std::string> send = {"send", "--config", dir / "refit.toml", "--weights",
                                         dir / "w.safetensors"};
  auto first = RunRefit(send, dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.err;

  const std::string state = dir / "sender/sender.r0.json";
  ASSERT_TRUE(std::filesystem::exists(state));
  WriteAll(state, GetParam().json);
  ExpectOneErrorLine(RunRefit(send, dir.path()), state, GetParam().key);
}

INSTANTIATE_TEST_SUITE_P(
    StateFile, SenderStateTest,
    ::testing::Values(
        BadState{"force_full",
                 R"({"baseline_version": 1, "published_version": 1, "published_full": true,
                     "force_full": "yes"})"},
        BadState{"published_full",
                 R"({"baseline_version": 1, "published_version": 1, "published_full": 1})"},
        BadState{"published_version", R"({"baseline_version": 1, "published_version": "1"})"},
        BadState{"baseline_version", R"({"baseline_version": -1, "published_version": 1})"}));

class ReceiverStateTest : public ::testing::TestWithParam<BadState> {};

TEST_P(ReceiverStateTest, MistypedValueIsOneErrorLine) {
  TempDir dir;
  WriteAll(dir / "refit.toml", Config(dir));
  Checkpoint weights = Checkpoint::Make(42);
  ASSERT_TRUE(weights.Write(dir / "w.safetensors"));
  auto send = RunRefit({"send", "--config", dir / "refit.toml", "--weights", dir / "w.safetensors"},
                       dir.path());
  ASSERT_EQ(send.exit_code, 0) << send.err;
  const std::vector<std::string> recv = {"recv", "--config", dir / "refit.toml"};
  auto first = RunRefit(recv, dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.err;

  const std::string state = dir / "receiver/receiver.json";
  ASSERT_TRUE(std::filesystem::exists(state));
  WriteAll(state, GetParam().json);
  ExpectOneErrorLine(RunRefit(recv, dir.path()), state, GetParam().key);
}

INSTANTIATE_TEST_SUITE_P(
    StateFile, ReceiverStateTest,
    ::testing::Values(BadState{"applying", R"({"version": 1, "receiver": "r0", "applying": "2"})"},
                      BadState{"replacing",
                               R"({"version": 1, "receiver": "r0", "replacing": true})"},
                      BadState{"version", R"({"version": "1", "receiver": "r0"})"}));

}  // namespace
}  // namespace refit::testing
