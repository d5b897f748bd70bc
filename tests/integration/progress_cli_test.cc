// The progress line of long commands: drawn on stderr when REFIT_PROGRESS=1 (or stderr is a
// terminal: tests/unit/progress_test.cc), and nothing at all when stderr is a file.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../unit/layout_test_util.h"
#include "cli_harness.h"

namespace refit::testing {
namespace {

const std::vector<std::string> kForcedOn = {"REFIT_PROGRESS=1"};
const std::vector<std::string> kUnset = {"REFIT_PROGRESS"};  // stderr is a file: off
const std::vector<std::string> kForcedOff = {"REFIT_PROGRESS=0"};

// A drawn meter: "\r<label>: <bytes> of <bytes> (<n>%), <rate>/s", ended by one newline.
void ExpectProgress(const CommandResult& r, const std::string& label) {
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t at = r.err.find("\r" + label + ": ");
  ASSERT_NE(at, std::string::npos) << r.err;
  const std::string last = r.err.substr(r.err.rfind('\r'));
  EXPECT_NE(last.find(" of "), std::string::npos) << r.err;
  EXPECT_NE(last.find("(100%), "), std::string::npos) << r.err;
  EXPECT_NE(last.find("B/s\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.back(), '\n') << r.err;
  EXPECT_EQ(LineCount(r.err), 1) << r.err;  // redrawn in place, one line in all
}

void ExpectSilent(const CommandResult& r) {
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
}

TEST(ProgressCli, DiffAndApply) {
  TempDir dir;
  Checkpoint a = Checkpoint::Make(3);
  Checkpoint b = a;
  b.Mutate(0.05, 4);
  ASSERT_TRUE(a.Write(dir / "a.safetensors"));
  ASSERT_TRUE(b.Write(dir / "b.safetensors"));
  const std::vector<std::string> diff = {"diff", dir / "a.safetensors", dir / "b.safetensors", "-o",
                                         dir / "d.refit"};
  const std::vector<std::string> apply = {"apply", dir / "a.safetensors", dir / "d.refit", "-o",
                                          dir / "c.safetensors"};
  ExpectProgress(RunRefit(diff, dir.path(), kForcedOn), "diff");
  ExpectSilent(RunRefit(diff, dir.path(), kUnset));
  ExpectSilent(RunRefit(diff, dir.path(), kForcedOff));
  ExpectProgress(RunRefit(apply, dir.path(), kForcedOn), "apply");
  ExpectSilent(RunRefit(apply, dir.path(), kUnset));
  EXPECT_TRUE(SameTensors(dir / "b.safetensors", dir / "c.safetensors"));
}

TEST(ProgressCli, AFailureBeforeAnyWorkPrintsOnlyItsError) {
  TempDir dir;
  auto r = RunRefit(
      {"diff", dir / "missing.safetensors", dir / "missing.safetensors", "-o", dir / "d.refit"},
      dir.path(), kForcedOn);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(LineCount(r.err), 1) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << r.err;
}

TEST(ProgressCli, Shard) {
  TempDir dir;
  ModelDesc m;
  m.heads = 8;
  m.kv_heads = 2;
  std::vector<CanonicalTensor> canonical = MakeCheckpoint(m);
  ASSERT_TRUE(WriteSafetensors(dir / "hf.safetensors", Views(canonical)).ok());
  auto shard = [&](const std::string& out, const std::vector<std::string>& env) {
    return RunRefit({"shard", dir / "hf.safetensors", "--layout", "megatron", "--tp", "2",
                     "--num-heads", "8", "-o", dir / out},
                    dir.path(), env);
  };
  const CommandResult on = shard("on", kForcedOn);
  ExpectProgress(on, "shard");
  EXPECT_EQ(LineCount(on.out), 3) << on.out;  // stdout keeps its lines: two files and a summary
  ExpectSilent(shard("off", kUnset));
}

TEST(ProgressCli, Send) {
  TempDir dir;
  WriteAll(dir / "refit.toml", "[sender]\nstate_dir = \"" + dir / "sender" +
                                   "\"\n\n[transport]\nname = \"disk\"\n\n[transport.disk]\n"
                                   "dir = \"" +
                                   dir / "sync" + "\"\nfsync = false\n");
  Checkpoint weights = Checkpoint::Make(9);
  ASSERT_TRUE(weights.Write(dir / "w.safetensors"));
  const std::vector<std::string> send = {"send", "--config", dir / "refit.toml", "--weights",
                                         dir / "w.safetensors"};
  ExpectProgress(RunRefit(send, dir.path(), kForcedOn), "send");
  weights.Mutate(0.01, 10);
  ASSERT_TRUE(weights.Write(dir / "w.safetensors"));
  ExpectSilent(RunRefit(send, dir.path(), kUnset));
}

}  // namespace
}  // namespace refit::testing
