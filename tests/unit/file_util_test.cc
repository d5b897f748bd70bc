// The one file I/O layer: atomic replacement, mkdir -p and mappings.
#include "common/file_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "temp_dir_util.h"

namespace refit::internal {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Names under dir that hold ".tmp." (temporary files left behind).
int TmpFiles(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    n += e.path().filename().string().find(".tmp.") != std::string::npos;
  }
  return n;
}

class FileUtilTest : public ::testing::Test {
 protected:
  refit::testing::ScopedTempDir temp_{"refit-file-util-test"};
  fs::path dir_ = temp_.path();
};

TEST_F(FileUtilTest, WriteFileAtomicReplacesTheWholeFile) {
  const std::string path = (dir_ / "state.json").string();
  ASSERT_TRUE(WriteFileAtomic(path, "first, longer contents").ok());
  ASSERT_TRUE(WriteFileAtomic(path, "second", /*durable=*/false).ok());
  EXPECT_EQ(Slurp(path), "second");
  EXPECT_EQ(TmpFiles(dir_), 0);
}

TEST_F(FileUtilTest, UncommittedAtomicFileLeavesTheOldFile) {
  const std::string path = (dir_ / "model").string();
  ASSERT_TRUE(WriteFileAtomic(path, "old").ok());
  {
    auto file = AtomicFile::Create(path);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    const std::string bytes = "new";
    ASSERT_TRUE(file.value()->Write(reinterpret_cast<const uint8_t*>(bytes.data()), 3).ok());
    EXPECT_TRUE(fs::exists(file.value()->tmp_path()));
  }
  EXPECT_EQ(Slurp(path), "old");
  EXPECT_EQ(TmpFiles(dir_), 0);
}

TEST_F(FileUtilTest, FailedCommitRemovesTheTmpFileAndNamesThePath) {
  // A non-empty directory cannot be renamed over.
  fs::create_directories(dir_ / "x" / "child");
  Status st = WriteFileAtomic((dir_ / "x").string(), "data");
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.ToString();
  EXPECT_NE(st.message().find((dir_ / "x").string()), std::string::npos) << st.ToString();
  EXPECT_EQ(TmpFiles(dir_), 0);
}

TEST_F(FileUtilTest, CreateMakesParentsOnlyWhenAsked) {
  const std::string path = (dir_ / "a" / "b" / "obj").string();
  EXPECT_EQ(AtomicFile::Create(path).status().code(), StatusCode::kIoError);
  AtomicFileOptions options;
  options.make_parents = true;
  auto file = AtomicFile::Create(path, options);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ASSERT_TRUE(file.value()->Commit().ok());
  EXPECT_TRUE(fs::is_regular_file(path));
}

TEST_F(FileUtilTest, TempNamesAreUnique) {
  const std::string path = (dir_ / "f").string();
  EXPECT_NE(TempPathFor(path), TempPathFor(path));
  EXPECT_EQ(TempPathFor(path).rfind(path + ".tmp.", 0), 0u);
}

TEST_F(FileUtilTest, ReplaceFileReportsAMissingSourceAsNotFound) {
  Status st = ReplaceFile((dir_ / "missing").string(), (dir_ / "target").string());
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
  ASSERT_TRUE(WriteFileAtomic((dir_ / "from").string(), "bits").ok());
  ASSERT_TRUE(ReplaceFile((dir_ / "from").string(), (dir_ / "target").string()).ok());
  EXPECT_EQ(Slurp(dir_ / "target"), "bits");
  EXPECT_FALSE(fs::exists(dir_ / "from"));
}

TEST_F(FileUtilTest, MakeDirsCreatesEveryParentAndIsIdempotent) {
  const fs::path deep = dir_ / "one" / "two" / "three";
  ASSERT_TRUE(MakeDirs(deep.string(), /*durable=*/true).ok());
  EXPECT_TRUE(fs::is_directory(deep));
  EXPECT_TRUE(MakeDirs(deep.string()).ok());
  EXPECT_TRUE(MakeDirs(deep.string() + "/").ok());
}

TEST_F(FileUtilTest, MakeDirsRefusesAFileInTheWay) {
  std::ofstream(dir_ / "file") << "x";
  Status st = MakeDirs((dir_ / "file").string());
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.ToString();
  st = MakeDirs((dir_ / "file" / "below").string());
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.ToString();
  EXPECT_NE(st.message().find((dir_ / "file" / "below").string()), std::string::npos)
      << st.ToString();
}

TEST_F(FileUtilTest, MappedFileReadsAndWritesThrough) {
  const std::string path = (dir_ / "m").string();
  ASSERT_TRUE(WriteFileAtomic(path, "abcd").ok());
  {
    auto ro = MappedFile::Open(path);
    ASSERT_TRUE(ro.ok()) << ro.status().ToString();
    ASSERT_EQ(ro.value()->size(), 4u);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(ro.value()->data()), 4), "abcd");
    EXPECT_EQ(ro.value()->mutable_data(), nullptr);
  }
  {
    auto rw = MappedFile::Open(path, /*writable=*/true);
    ASSERT_TRUE(rw.ok()) << rw.status().ToString();
    rw.value()->mutable_data()[0] = 'z';
    ASSERT_TRUE(rw.value()->Sync().ok());
  }
  EXPECT_EQ(Slurp(path), "zbcd");

  ASSERT_TRUE(WriteFileAtomic((dir_ / "empty").string(), "").ok());
  auto empty = MappedFile::Open((dir_ / "empty").string());
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ(empty.value()->size(), 0u);
  EXPECT_EQ(MappedFile::Open((dir_ / "nope").string()).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(MappedFile::Open(dir_.string()).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace refit::internal
