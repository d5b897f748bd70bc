// `refit diff` / `refit apply` on real safetensors files, and their error paths.
#include <gtest/gtest.h>

#include "cli_harness.h"

namespace refit::testing {
namespace {

class OfflineCli : public ::testing::TestWithParam<std::string> {};

TEST_P(OfflineCli, DiffApplyReproducesNewByteForByte) {
  TempDir dir;
  for (double density : {0.0, 1e-3, 0.02, 0.5, 1.0}) {
    Checkpoint a = Checkpoint::Make(1);
    Checkpoint b = a;
    b.Mutate(density, 7);
    ASSERT_TRUE(a.Write(dir / "a.safetensors"));
    ASSERT_TRUE(b.Write(dir / "b.safetensors"));
    auto diff = RunRefit({"diff", dir / "a.safetensors", dir / "b.safetensors", "-o",
                          dir / "d.refit", "--encoding", GetParam()},
                         dir.path());
    ASSERT_EQ(diff.exit_code, 0) << diff.err;
    auto apply = RunRefit({"apply", dir / "a.safetensors", dir / "d.refit", "-o", dir / "c.safetensors"},
                          dir.path());
    ASSERT_EQ(apply.exit_code, 0) << apply.err;
    EXPECT_TRUE(SameTensors(dir / "b.safetensors", dir / "c.safetensors")) << density;
  }
}

TEST_P(OfflineCli, NewAndRemovedAndReshapedTensors) {
  TempDir dir;
  Checkpoint a = Checkpoint::Make(2);
  Checkpoint b = Checkpoint::Make(3);
  b.tensors.erase(b.tensors.begin() + 1);              // removed
  b.tensors[0].shape = {48, 64};                       // reshaped, same bytes
  b.tensors.push_back({"brand.new", DType::kI32, {5}, std::vector<uint8_t>(20, 7)});
  ASSERT_TRUE(a.Write(dir / "a.safetensors"));
  ASSERT_TRUE(b.Write(dir / "b.safetensors"));
  ASSERT_EQ(RunRefit({"diff", dir / "a.safetensors", dir / "b.safetensors", "-o", dir / "d.refit",
                      "--encoding", GetParam()},
                     dir.path())
                .exit_code,
            0);
  auto apply = RunRefit({"apply", dir / "a.safetensors", dir / "d.refit", "-o", dir / "c.safetensors"},
                        dir.path());
  ASSERT_EQ(apply.exit_code, 0) << apply.err;
  EXPECT_TRUE(SameTensors(dir / "b.safetensors", dir / "c.safetensors"));
}

INSTANTIATE_TEST_SUITE_P(Encodings, OfflineCli, ::testing::Values("dense", "indices"));

class OfflineErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = Checkpoint::Make(11);
    b_ = a_;
    b_.Mutate(0.05, 12);
    ASSERT_TRUE(a_.Write(dir_ / "a.safetensors"));
    ASSERT_TRUE(b_.Write(dir_ / "b.safetensors"));
    auto diff = RunRefit({"diff", dir_ / "a.safetensors", dir_ / "b.safetensors", "-o",
                          dir_ / "d.refit"},
                         dir_.path());
    ASSERT_EQ(diff.exit_code, 0) << diff.err;
    WriteAll(dir_ / "out.safetensors", "previous contents");
  }

  // The command fails with one line on stderr, and out.safetensors keeps its contents.
  void ExpectCleanFailure(const CommandResult& r, const std::string& needle) {
    EXPECT_NE(r.exit_code, 0);
    EXPECT_EQ(LineCount(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("refit: error: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_EQ(ReadAll(dir_ / "out.safetensors"), "previous contents");
    // No temporary files are left behind next to the output.
    for (const auto& e : std::filesystem::directory_iterator(dir_.path())) {
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
    }
  }

  CommandResult Apply(const std::string& base, const std::string& delta) {
    return RunRefit({"apply", base, delta, "-o", dir_ / "out.safetensors"}, dir_.path());
  }

  TempDir dir_;
  Checkpoint a_, b_;
};

TEST_F(OfflineErrors, TruncatedDelta) {
  std::string delta = ReadAll(dir_ / "d.refit");
  for (size_t keep : {size_t{0}, size_t{5}, size_t{12}, delta.size() / 2, delta.size() - 1}) {
    WriteAll(dir_ / "t.refit", delta.substr(0, keep));
    ExpectCleanFailure(Apply(dir_ / "a.safetensors", dir_ / "t.refit"), "t.refit");
  }
}

TEST_F(OfflineErrors, CorruptedRecordBytes) {
  std::string delta = ReadAll(dir_ / "d.refit");
  delta[delta.size() - 3] ^= 0x5A;  // inside the last record's values
  WriteAll(dir_ / "c.refit", delta);
  ExpectCleanFailure(Apply(dir_ / "a.safetensors", dir_ / "c.refit"), "record");
}

TEST_F(OfflineErrors, TruncatedBase) {
  std::string base = ReadAll(dir_ / "a.safetensors");
  WriteAll(dir_ / "short.safetensors", base.substr(0, base.size() - 10));
  ExpectCleanFailure(Apply(dir_ / "short.safetensors", dir_ / "d.refit"), "short.safetensors");
}

TEST_F(OfflineErrors, WrongBase) {
  ExpectCleanFailure(Apply(dir_ / "b.safetensors", dir_ / "d.refit"), "wrong base");
}

TEST_F(OfflineErrors, UnknownEncoding) {
  auto r = RunRefit({"diff", dir_ / "a.safetensors", dir_ / "b.safetensors", "-o",
                     dir_ / "out.safetensors", "--encoding", "nope"},
                    dir_.path());
  ExpectCleanFailure(r, "unknown encoding 'nope'");
}

TEST_F(OfflineErrors, UnknownConfigKeyNamesFileAndLine) {
  WriteAll(dir_ / "bad.toml", "[sender]\nencoding = \"indices\"\nbucket_byts = \"1MiB\"\n");
  auto r = RunRefit({"diff", dir_ / "a.safetensors", dir_ / "b.safetensors", "-o",
                     dir_ / "out.safetensors", "--config", dir_ / "bad.toml"},
                    dir_.path());
  ExpectCleanFailure(r, "bad.toml:3");
  EXPECT_NE(r.err.find("bucket_byts"), std::string::npos) << r.err;
}

TEST_F(OfflineErrors, MissingFile) {
  ExpectCleanFailure(Apply(dir_ / "nope.safetensors", dir_ / "d.refit"), "nope.safetensors");
}

TEST_F(OfflineErrors, InspectDescribesDeltaAndCheckpoint) {
  auto r = RunRefit({"inspect", dir_ / "d.refit", "--records"}, dir_.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("refit-delta-v1"), std::string::npos) << r.out;
  r = RunRefit({"inspect", dir_ / "a.safetensors"}, dir_.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("model.norm.weight"), std::string::npos) << r.out;
  WriteAll(dir_ / "junk", "not a safetensors file at all");
  r = RunRefit({"inspect", dir_ / "junk"}, dir_.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(LineCount(r.err), 1) << r.err;
}

}  // namespace
}  // namespace refit::testing
