// The one file I/O layer: atomic replacement, mkdir -p and mappings.
#include "common/file_util.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "scoped_env.h"
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

// Small files are registered too while a test lives (by default only those of 16 MiB or more).
class MappedFileRegistryTest : public FileUtilTest {
 protected:
  void SetUp() override { SetMappedFileRegistrationBytesForTesting(1); }
  void TearDown() override { SetMappedFileRegistrationBytesForTesting(16ull << 20); }
};

// A writable mapping of `bytes` bytes (value i % 251 at byte i) under dir.
std::unique_ptr<MappedFile> PatternFile(const fs::path& dir, uint64_t bytes) {
  std::string contents(bytes, '\0');
  for (uint64_t i = 0; i < bytes; ++i) contents[i] = static_cast<char>(i % 251);
  const std::string path = (dir / "patterned").string();
  EXPECT_TRUE(WriteFileAtomic(path, contents).ok());
  auto file = MappedFile::Open(path, /*writable=*/true);
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  return file.ok() ? std::move(file).value() : nullptr;
}

TEST_F(MappedFileRegistryTest, AMappedRangeIsFoundOnlyWhileItsFileIsMappedAndOnlyWhole) {
  std::unique_ptr<MappedFile> file = PatternFile(dir_, 3 * 4096 + 10);
  ASSERT_NE(file, nullptr);
  const uint8_t* data = file->data();
  FileRange range;
  ASSERT_TRUE(FindMappedFile(data + 100, 4096, &range));
  EXPECT_EQ(range.offset, 100u);
  EXPECT_EQ(range.file_size, file->size());
  EXPECT_TRUE(range.writable);
  EXPECT_TRUE(FindMappedFile(data, file->size(), &range));
  EXPECT_FALSE(FindMappedFile(data + 1, file->size(), &range));  // runs past the end
  std::vector<uint8_t> heap(64);
  EXPECT_FALSE(FindMappedFile(heap.data(), heap.size(), &range));

  std::vector<uint8_t> copy(4096);
  ASSERT_TRUE(FindMappedFile(data + 5000, copy.size(), &range));
  ASSERT_TRUE(PreadMapped(range, copy.data(), copy.size()).ok());
  EXPECT_EQ(0, std::memcmp(copy.data(), data + 5000, copy.size()));

  file.reset();
  EXPECT_FALSE(FindMappedFile(data + 100, 1, &range));
}

TEST_F(FileUtilTest, OnlyLargeMappedFilesAreRegistered) {
  std::unique_ptr<MappedFile> small = PatternFile(dir_, 4096);
  ASSERT_NE(small, nullptr);
  FileRange range;
  EXPECT_FALSE(FindMappedFile(small->data(), 1, &range));
  const uint64_t position = 0;
  const uint8_t value = 'x';
  Result<bool> written = OverwriteInMappedFile(small->mutable_data(), 1, &position, 1, &value);
  ASSERT_TRUE(written.ok());
  EXPECT_FALSE(written.value());   // left to the caller:
  small->mutable_data()[0] = 'x';  // through the mapping, synced by msync
  EXPECT_TRUE(small->Sync().ok());
  small.reset();
  EXPECT_EQ(Slurp(dir_ / "patterned")[0], 'x');

  std::unique_ptr<MappedFile> large = PatternFile(dir_, 16ull << 20);
  ASSERT_NE(large, nullptr);
  EXPECT_TRUE(FindMappedFile(large->data() + 5, 100, &range));
}

TEST_F(MappedFileRegistryTest, AReadPastATruncatedFileIsAnErrorNotACrash) {
  std::unique_ptr<MappedFile> file = PatternFile(dir_, 2 * 4096);
  ASSERT_NE(file, nullptr);
  FileRange range;
  ASSERT_TRUE(FindMappedFile(file->data() + 4096, 4096, &range));
  ASSERT_EQ(::truncate((dir_ / "patterned").c_str(), 4096), 0);
  std::vector<uint8_t> out(4096);
  Status st = PreadMapped(range, out.data(), out.size());
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.ToString();
}

// A registered file is warm only once its mapping is populated for reading, until it is
// unmapped; an unregistered one has nothing to populate.
TEST_F(MappedFileRegistryTest, AFileIsWarmOnceItsMappingIsPopulatedForReading) {
  std::unique_ptr<MappedFile> file = PatternFile(dir_, 3 * 4096 + 10);
  ASSERT_NE(file, nullptr);
  FileRange range;
  ASSERT_TRUE(FindMappedFile(file->data(), 4096, &range));
  EXPECT_FALSE(range.warm);
  ASSERT_TRUE(file->PopulateForReading().ok());
  ASSERT_TRUE(FindMappedFile(file->data() + 4096, 4096, &range));
  EXPECT_TRUE(range.warm) << "a kernel before 5.14 lacks MADV_POPULATE_READ";
  EXPECT_EQ(range.offset, 4096u);
  const uint8_t* data = file->data();
  file.reset();
  EXPECT_FALSE(FindMappedFile(data, 4096, &range));
  file = PatternFile(dir_, 3 * 4096 + 10);  // mapped anew: cold again
  ASSERT_TRUE(FindMappedFile(file->data(), 4096, &range));
  EXPECT_FALSE(range.warm);

  SetMappedFileRegistrationBytesForTesting(16ull << 20);
  std::unique_ptr<MappedFile> small = PatternFile(dir_, 4096);
  EXPECT_TRUE(small->PopulateForReading().ok());
  EXPECT_FALSE(FindMappedFile(small->data(), 1, &range));
}

// REFIT_FILE_READS decides how a registered file is read; unset, a probe of the file decides
// (read in place when its fault costs less than pread's copy) and reports both costs. A file too
// small to probe stays read with pread, and a bad value is refused without marking anything.
TEST_F(MappedFileRegistryTest, ReadInPlaceIfCheaperFollowsTheProbeOrTheEnvironment) {
  struct Case {
    const char* env;
    uint64_t bytes;
  };
  for (const Case& c :
       {Case{"pread", 20ull << 20}, Case{"mapping", 3 * 4096 + 10}, Case{"sometimes", 20ull << 20},
        Case{nullptr, 20ull << 20}, Case{"auto", 20ull << 20}, Case{nullptr, 3 * 4096 + 10}}) {
    SCOPED_TRACE(std::string(c.env != nullptr ? c.env : "(unset)") + ", " +
                 std::to_string(c.bytes) + " bytes");
    refit::testing::ScopedEnv env("REFIT_FILE_READS", c.env);
    std::unique_ptr<MappedFile> file = PatternFile(dir_, c.bytes);
    ASSERT_NE(file, nullptr);
    bool in_place = true;
    MappedFile::ReadCosts costs{-1, -1};
    Status st = file->ReadInPlaceIfCheaper(&in_place, &costs);
    FileRange range;
    ASSERT_TRUE(FindMappedFile(file->data() + c.bytes / 2, 4096, &range));
    const std::string mode = c.env != nullptr ? c.env : "auto";
    if (mode == "sometimes") {
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
      EXPECT_FALSE(in_place);
      EXPECT_FALSE(range.warm);
      continue;
    }
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(range.warm, in_place);
    if (mode == "auto" && c.bytes >= (16ull << 20)) {
      EXPECT_GT(costs.fault_s_per_gb, 0);
      EXPECT_GT(costs.pread_s_per_gb, 0);
      EXPECT_EQ(in_place, costs.fault_s_per_gb < costs.pread_s_per_gb);
      // The probe only reads: the file's bytes are as written.
      for (uint64_t i = 0; i < c.bytes; i += 4093) {
        ASSERT_EQ(file->data()[i], static_cast<uint8_t>(i % 251)) << "byte " << i;
      }
    } else {
      EXPECT_EQ(costs.fault_s_per_gb, 0);
      EXPECT_EQ(costs.pread_s_per_gb, 0);
      EXPECT_EQ(in_place, mode == "mapping");
    }
  }
}

// Element overwrites through the file land exactly where stores into memory would, for
// positions in order, out of order, repeated, far apart (several spans) and at the file's end;
// with the mapping populated (the spans are read from it) as without.
TEST_F(MappedFileRegistryTest, OverwritesThroughTheFileMatchStoresIntoMemory) {
  constexpr uint64_t kBytes = 4 * 1024 * 1024 + 6;  // not a whole number of pages
  for (const bool warm : {false, true}) {
    for (uint32_t elem : {1u, 2u, 4u, 8u}) {
      std::unique_ptr<MappedFile> file = PatternFile(dir_, kBytes);
      ASSERT_NE(file, nullptr);
      if (warm) {
        ASSERT_TRUE(file->PopulateForReading().ok());
      }
      const uint64_t n = (kBytes - 2) / elem;  // elements from byte 2 on
      std::vector<uint8_t> expected(file->data(), file->data() + kBytes);
      std::vector<uint64_t> positions = {0, 1, 1, 7, 4096, 4095, 300000, n / 2, n - 1};
      for (uint64_t p = 3; p < n; p += 97 + p % 13) positions.push_back(p);  // dense runs
      positions.push_back(n - 1);
      std::vector<uint8_t> values(positions.size() * elem);
      for (size_t k = 0; k < values.size(); ++k) values[k] = static_cast<uint8_t>(k * 7 + elem);
      for (size_t k = 0; k < positions.size(); ++k) {
        std::memcpy(expected.data() + 2 + positions[k] * elem, values.data() + k * elem, elem);
      }
      Result<bool> written = OverwriteInMappedFile(file->mutable_data() + 2, elem, positions.data(),
                                                   positions.size(), values.data());
      ASSERT_TRUE(written.ok()) << written.status().ToString();
      EXPECT_TRUE(written.value());
      // The mapping sees what was written through the file, and so does the file itself.
      EXPECT_EQ(0, std::memcmp(file->data(), expected.data(), kBytes)) << "elem " << elem;
      file.reset();
      EXPECT_EQ(Slurp(dir_ / "patterned"), std::string(expected.begin(), expected.end()));
    }
  }
}

TEST_F(MappedFileRegistryTest, OverwritesOfMemoryOrAReadOnlyMappingAreLeftToTheCaller) {
  std::vector<uint8_t> heap(64, 0);
  const uint64_t position = 3;
  const uint8_t value = 9;
  Result<bool> written = OverwriteInMappedFile(heap.data(), 1, &position, 1, &value);
  ASSERT_TRUE(written.ok());
  EXPECT_FALSE(written.value());
  EXPECT_EQ(heap[3], 0);

  ASSERT_NE(PatternFile(dir_, 4096), nullptr);
  auto ro = MappedFile::Open((dir_ / "patterned").string());
  ASSERT_TRUE(ro.ok());
  written =
      OverwriteInMappedFile(const_cast<uint8_t*>(ro.value()->data()), 1, &position, 1, &value);
  ASSERT_TRUE(written.ok());
  EXPECT_FALSE(written.value());
  EXPECT_EQ(ro.value()->data()[3], 3);
}

// Threads writing disjoint ranges that share pages never undo each other's changes: a span is
// read and written back from its first change to its last, never the rest of a page.
TEST_F(MappedFileRegistryTest, OverwritesOfDisjointRangesSharingPagesFromManyThreadsAllLand) {
  constexpr uint64_t kRangeBytes = 1000;  // ranges cut pages anywhere
  constexpr size_t kThreads = 8;
  constexpr uint64_t kRanges = 4000;
  std::unique_ptr<MappedFile> file = PatternFile(dir_, kRanges * kRangeBytes);
  ASSERT_NE(file, nullptr);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t r = t; r < kRanges; r += kThreads) {
        std::vector<uint64_t> positions;
        for (uint64_t p = 0; p < kRangeBytes; p += 3) positions.push_back(p);
        positions.push_back(kRangeBytes - 1);
        std::vector<uint8_t> values(positions.size(), static_cast<uint8_t>(0xA0 + t));
        Result<bool> written =
            OverwriteInMappedFile(file->mutable_data() + r * kRangeBytes, 1, positions.data(),
                                  positions.size(), values.data());
        if (!written.ok() || !written.value()) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(failures.load(), 0);
  for (uint64_t r = 0; r < kRanges; ++r) {
    const uint8_t* range = file->data() + r * kRangeBytes;
    for (uint64_t p = 0; p < kRangeBytes; ++p) {
      const bool changed = p % 3 == 0 || p == kRangeBytes - 1;
      const uint8_t want = changed ? static_cast<uint8_t>(0xA0 + r % kThreads)
                                   : static_cast<uint8_t>((r * kRangeBytes + p) % 251);
      ASSERT_EQ(range[p], want) << "range " << r << " byte " << p;
    }
  }
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
