// The one file I/O layer: atomic replacement, mkdir -p and mappings.
#include "common/file_util.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
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

// ConfinedDir, under both resolvers: openat2 where the kernel has it, and the O_NOFOLLOW walk
// that kernels without it (or a seccomp filter refusing it) fall back to.
class ConfinedDirTest : public FileUtilTest, public ::testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    SetOpenat2ForTesting(GetParam());
    fs::create_directories(root_ / "v1");
    fs::create_directories(outside_);
    std::ofstream(outside_ / "victim") << "precious";
    std::ofstream(root_ / "v1" / "object") << "inside";
    auto opened = ConfinedDir::Open(root_.string());
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    root_dir_ = std::move(opened).value();
  }
  void TearDown() override { SetOpenat2ForTesting(true); }

  fs::path root_ = dir_ / "root";
  fs::path outside_ = dir_ / "outside";
  std::unique_ptr<ConfinedDir> root_dir_;
};

TEST_P(ConfinedDirTest, ReadsAndWritesBeneathTheRoot) {
  auto text = root_dir_->ReadSmallFile("v1/object", 100);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(text.value(), "inside");
  ASSERT_TRUE(root_dir_->WriteAtomic("v2/deep/new", "fresh", false, /*make_parents=*/true).ok());
  EXPECT_EQ(Slurp(root_ / "v2" / "deep" / "new"), "fresh");
  EXPECT_EQ(TmpFiles(root_), 0);
  EXPECT_EQ(root_dir_->WriteAtomic("v3/new", "x", false).code(), StatusCode::kNotFound);
  ASSERT_TRUE(root_dir_->Remove("v2/deep/new").ok());
  ASSERT_TRUE(root_dir_->Remove("v2/deep", /*directory=*/true).ok());
  EXPECT_FALSE(fs::exists(root_ / "v2" / "deep"));
  EXPECT_EQ(root_dir_->Remove("v2/deep/new").code(), StatusCode::kNotFound);
}

TEST_P(ConfinedDirTest, PathsLeavingTheRootAreRefusedBeforeAnySyscall) {
  for (const char* bad : {"../outside/victim", "/etc/passwd", "v1//object", "v1/./object",
                          "v1/../../outside/victim", "v1/"}) {
    EXPECT_EQ(root_dir_->OpenFile(bad).status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(root_dir_->WriteAtomic(bad, "x", false, true).code(), StatusCode::kInvalidArgument)
        << bad;
    EXPECT_EQ(root_dir_->Remove(bad).code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(Slurp(outside_ / "victim"), "precious");
}

TEST_P(ConfinedDirTest, ALinkedDirectoryIsNeverFollowed) {
  fs::create_directory_symlink(outside_, root_ / "v5");
  EXPECT_FALSE(root_dir_->OpenFile("v5/victim").ok());
  EXPECT_FALSE(root_dir_->WriteAtomic("v5/victim", "overwritten", false, true).ok());
  EXPECT_FALSE(root_dir_->WriteAtomic("v5/sub/new", "created", false, true).ok());
  EXPECT_FALSE(root_dir_->Remove("v5/victim").ok());
  EXPECT_FALSE(root_dir_->OpenDir("v5").ok());
  EXPECT_FALSE(root_dir_->OpenDir("v5/sub", /*create=*/true).ok());
  EXPECT_EQ(Slurp(outside_ / "victim"), "precious");
  EXPECT_FALSE(fs::exists(outside_ / "sub"));
  EXPECT_EQ(std::distance(fs::directory_iterator(outside_), fs::directory_iterator()), 1);
}

TEST_P(ConfinedDirTest, ALinkedFileIsReplacedOrRemovedButNeverFollowed) {
  // A distinctive size, so a message that leaks the target's size shows it.
  std::ofstream(outside_ / "secret") << std::string(54321, 's');
  fs::create_symlink(outside_ / "secret", root_ / "v1" / "link");
  auto opened = root_dir_->OpenFile("v1/link");
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(opened.status().message().find("54321"), std::string::npos);
  EXPECT_EQ(opened.status().message().find("secret"), std::string::npos);
  ASSERT_TRUE(root_dir_->WriteAtomic("v1/link", "mine", false).ok());
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(root_ / "v1" / "link")));
  EXPECT_EQ(fs::file_size(outside_ / "secret"), 54321u);
  fs::remove(root_ / "v1" / "link");
  fs::create_symlink(outside_ / "victim", root_ / "v1" / "link");
  ASSERT_TRUE(root_dir_->Remove("v1/link").ok());
  EXPECT_EQ(Slurp(outside_ / "victim"), "precious");
}

TEST_P(ConfinedDirTest, AFifoOrADirectoryIsRefusedWithoutBlocking) {
  ASSERT_EQ(::mkfifo((root_ / "v1" / "fifo").c_str(), 0666), 0);
  // A blocking open would never return: the test would hang here.
  auto fifo = root_dir_->OpenFile("v1/fifo");
  EXPECT_EQ(fifo.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(root_dir_->ReadSmallFile("v1/fifo", 10).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(root_dir_->OpenFile("v1").status().code(), StatusCode::kInvalidArgument);
  // The same message for every kind: it tells a planter nothing.
  EXPECT_EQ(fifo.status().message().substr(fifo.status().message().find(": ")),
            root_dir_->OpenFile("v1").status().message().substr(
                root_dir_->OpenFile("v1").status().message().find(": ")));
}

INSTANTIATE_TEST_SUITE_P(Resolvers, ConfinedDirTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("Openat2") : std::string("Walk");
                         });

TEST_F(FileUtilTest, ReadSmallFileRefusesAFifoWithoutBlocking) {
  const fs::path fifo = dir_ / "state.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0666), 0);
  EXPECT_EQ(ReadSmallFile(fifo.string(), 100).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MappedFile::Open(fifo.string()).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(FileUtilTest, ADirectoryWhereAFileIsExpectedSaysSoInOneLine) {
  const std::string dir = (dir_ / "checkpoint").string();
  ASSERT_TRUE(MakeDirs(dir).ok());
  const Status statuses[] = {MappedFile::Open(dir).status(),
                             MappedFile::Open(dir, /*writable=*/true).status(),
                             ReadSmallFile(dir, 100).status()};
  for (const Status& st : statuses) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_EQ(st.message(), dir + ": is a directory");
  }
}

TEST_F(FileUtilTest, AWritableMappingIsNeverOpenedThroughALink) {
  ASSERT_TRUE(WriteFileAtomic((dir_ / "target").string(), "abcd").ok());
  fs::create_symlink(dir_ / "target", dir_ / "model");
  auto rw = MappedFile::Open((dir_ / "model").string(), /*writable=*/true);
  EXPECT_EQ(rw.status().code(), StatusCode::kInvalidArgument) << rw.status().ToString();
  // Read-only mappings of inputs the operator names may still go through a link.
  EXPECT_TRUE(MappedFile::Open((dir_ / "model").string()).ok());
}

}  // namespace
}  // namespace refit::internal
