// Disk-specific behaviour of the builtin `disk` transport (what every transport must do is in
// tests/conformance/transport_conformance_test.cc). Driven through the Registry, like users do.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "refit/config.h"
#include "refit/registry.h"
#include "temp_dir_util.h"

namespace refit {
namespace {

namespace fs = std::filesystem;

constexpr char kSection[] = "transport.disk";

class DiskTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto registry = Registry::WithBuiltins();
    ASSERT_TRUE(registry.ok()) << registry.status().ToString();
    registry_ = std::move(registry).value();
  }

  Result<std::unique_ptr<Transport>> Make(const std::string& dir,
                                          std::optional<bool> fsync = std::nullopt) {
    Config config;
    if (!dir.empty()) config.SetString(std::string(kSection) + ".dir", dir);
    if (fsync.has_value()) {
      ConfigValue value;
      value.type = REFIT_CFG_BOOL;
      value.bool_value = *fsync;
      config.Set(std::string(kSection) + ".fsync", value);
    }
    return registry_->CreateTransport("disk", REFIT_ROLE_SENDER, "", &config, kSection);
  }

  // Files under dir whose name holds ".tmp." (puts in flight or left behind).
  static std::vector<std::string> TmpFiles(const fs::path& dir) {
    std::vector<std::string> found;
    for (const auto& entry : fs::recursive_directory_iterator(dir)) {
      if (entry.path().filename().string().find(".tmp.") != std::string::npos) {
        found.push_back(entry.path().string());
      }
    }
    return found;
  }

  static std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
    return v;
  }

  refit::testing::ScopedTempDir temp_{"refit-disk-test"};
  fs::path root_ = temp_.path();
  std::shared_ptr<Registry> registry_;
};

TEST_F(DiskTransportTest, MissingDirKeyIsAnErrorNamingTheKey) {
  auto made = Make("");
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument) << made.status().ToString();
  EXPECT_NE(made.status().message().find("dir"), std::string::npos) << made.status().ToString();
}

TEST_F(DiskTransportTest, UnwritableDirIsAClearIoError) {
  // Root ignores permission bits, but nobody can create a directory below a regular file.
  fs::path file = root_ / "a-file";
  std::ofstream(file) << "not a directory";
  fs::path dir = file / "channel";
  auto made = Make(dir.string());
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kIoError) << made.status().ToString();
  EXPECT_NE(made.status().message().find(dir.string()), std::string::npos)
      << made.status().ToString();
  EXPECT_NE(made.status().message().find("Not a directory"), std::string::npos)
      << made.status().ToString();
}

TEST_F(DiskTransportTest, CreatesAMissingDirectoryTree) {
  fs::path dir = root_ / "deep" / "er" / "channel";
  auto made = Make(dir.string());
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_TRUE(fs::is_directory(dir));
}

TEST_F(DiskTransportTest, KeyMapsToAFileUnderDir) {
  auto made = Make(root_.string(), /*fsync=*/false);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Transport& t = *made.value();
  std::vector<uint8_t> data = Bytes(4099, 3);
  ASSERT_TRUE(t.Put("v00000007/payload.r0.000003.st", data.data(), data.size()).ok());

  fs::path file = root_ / "v00000007" / "payload.r0.000003.st";
  ASSERT_TRUE(fs::is_regular_file(file));
  ASSERT_EQ(fs::file_size(file), data.size());
  std::ifstream in(file, std::ios::binary);
  std::vector<uint8_t> on_disk(data.size());
  in.read(reinterpret_cast<char*>(on_disk.data()), static_cast<std::streamsize>(on_disk.size()));
  EXPECT_EQ(on_disk, data);
  EXPECT_TRUE(TmpFiles(root_).empty());
}

TEST_F(DiskTransportTest, FsyncFalseRoundTrips) {
  auto made = Make(root_.string(), /*fsync=*/false);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Transport& t = *made.value();
  std::vector<uint8_t> data = Bytes(1 << 16, 11);
  ASSERT_TRUE(t.Put("acks/r0/v00000001", data.data(), data.size()).ok());
  std::vector<uint8_t> back(data.size());
  ASSERT_TRUE(t.Get("acks/r0/v00000001", 0, back.data(), back.size()).ok());
  EXPECT_EQ(back, data);
}

TEST_F(DiskTransportTest, FailedRenameRemovesTheTmpFileAndNamesThePath) {
  auto made = Make(root_.string());
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Transport& t = *made.value();
  // "x" is a non-empty directory: the tmp file is written, then rename over it fails (EISDIR).
  fs::create_directories(root_ / "x" / "child");
  std::vector<uint8_t> data = Bytes(1000, 5);
  Status st = t.Put("x", data.data(), data.size());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.ToString();
  EXPECT_NE(st.message().find((root_ / "x").string()), std::string::npos) << st.ToString();
  EXPECT_TRUE(TmpFiles(root_).empty());
}

// Restores a resource limit and the SIGXFSZ disposition on scope exit.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    saved_handler_ = ::signal(SIGXFSZ, SIG_IGN);  // so write() fails with EFBIG instead of killing
    rlimit limited = saved_;
    limited.rlim_cur = bytes;
    ok_ = ::setrlimit(RLIMIT_FSIZE, &limited) == 0;
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    ::signal(SIGXFSZ, saved_handler_);
  }
  bool ok() const { return ok_; }

 private:
  rlimit saved_{};
  sighandler_t saved_handler_ = SIG_DFL;
  bool ok_ = false;
};

TEST_F(DiskTransportTest, FailedWriteRemovesTheTmpFileAndKeepsTheOldObject) {
  auto made = Make(root_.string());
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Transport& t = *made.value();
  std::vector<uint8_t> old_data = Bytes(100, 1);
  ASSERT_TRUE(t.Put("v1/obj", old_data.data(), old_data.size()).ok());

  // A file size limit makes the kernel stop the write part way (a short write, then EFBIG),
  // which fails for root too: the stand-in for ENOSPC/EIO.
  std::vector<uint8_t> new_data = Bytes(1 << 20, 2);
  Status st;
  {
    FileSizeLimit limit(64 * 1024);
    ASSERT_TRUE(limit.ok());
    st = t.Put("v1/obj", new_data.data(), new_data.size());
  }
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.ToString();
  EXPECT_NE(st.message().find((root_ / "v1" / "obj").string()), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("File too large"), std::string::npos) << st.ToString();
  EXPECT_TRUE(TmpFiles(root_).empty());

  auto size = t.Size("v1/obj");
  ASSERT_TRUE(size.ok()) << size.status().ToString();
  ASSERT_EQ(size.value(), std::optional<uint64_t>(old_data.size()));
  std::vector<uint8_t> back(old_data.size());
  ASSERT_TRUE(t.Get("v1/obj", 0, back.data(), back.size()).ok());
  EXPECT_EQ(back, old_data);
}

TEST_F(DiskTransportTest, LeftoverTmpFilesAreInvisibleAndTheirNamesReserved) {
  auto made = Make(root_.string());
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Transport& t = *made.value();
  uint8_t byte = 42;
  ASSERT_TRUE(t.Put("v2/COMMIT", &byte, 1).ok());
  // What a writer that crashed between create and rename leaves behind.
  std::ofstream(root_ / "v2" / "manifest.r0.json.tmp.4242.7") << "partial";

  auto listed = t.List("v2/");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed.value().size(), 1u);
  EXPECT_EQ(listed.value()[0].first, "v2/COMMIT");

  Status st = t.Put("v2/manifest.r0.json.tmp.4242.7", &byte, 1);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  // Names merely containing "tmp" are ordinary keys.
  EXPECT_TRUE(t.Put("v2/model.tmp.safetensors", &byte, 1).ok());
}

TEST_F(DiskTransportTest, RemovePrunesEmptyParentsButNotDir) {
  auto made = Make(root_.string());
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Transport& t = *made.value();
  uint8_t byte = 1;
  ASSERT_TRUE(t.Put("acks/r0/v00000001", &byte, 1).ok());
  ASSERT_TRUE(t.Put("acks/r1/v00000001", &byte, 1).ok());

  ASSERT_TRUE(t.Remove("acks/r0/v00000001").ok());
  EXPECT_FALSE(fs::exists(root_ / "acks" / "r0"));
  EXPECT_TRUE(fs::exists(root_ / "acks" / "r1" / "v00000001"));

  ASSERT_TRUE(t.Remove("acks/r1/v00000001").ok());
  EXPECT_FALSE(fs::exists(root_ / "acks"));
  EXPECT_TRUE(fs::is_directory(root_));
}

TEST_F(DiskTransportTest, ADirectoryIsNotAnObject) {
  auto made = Make(root_.string());
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Transport& t = *made.value();
  uint8_t byte = 1;
  ASSERT_TRUE(t.Put("v3/COMMIT", &byte, 1).ok());
  auto size = t.Size("v3");
  ASSERT_TRUE(size.ok()) << size.status().ToString();
  EXPECT_FALSE(size.value().has_value());
  EXPECT_FALSE(t.Get("v3", 0, &byte, 0).ok());
  EXPECT_TRUE(t.Remove("v3").ok());  // a no-op: the object under it stays
  EXPECT_TRUE(fs::exists(root_ / "v3" / "COMMIT"));
}

// The shared directory is a trust boundary: any job that can write into it may plant symlinks,
// FIFOs or devices. Nothing outside the directory may be read, written, removed or sized
// through them, and nothing planted may block a call.
class HostileDirTest : public DiskTransportTest {
 protected:
  void SetUp() override {
    DiskTransportTest::SetUp();
    fs::create_directories(sync_);
    fs::create_directories(outside_ / "sub");
    std::ofstream(outside_ / "victim") << "precious";
    std::ofstream(outside_ / "sub" / "nested") << "also precious";
    std::ofstream(outside_ / "COMMIT") << "old";
    canary_ = Snapshot();
    auto made = Make(sync_.string(), /*fsync=*/false);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    t_ = std::move(made).value();
  }

  // Every file and directory outside the sync directory: contents and mtimes.
  std::map<std::string, std::string> Snapshot() const {
    std::map<std::string, std::string> out;
    for (const auto& entry : fs::recursive_directory_iterator(outside_)) {
      struct stat sb {};
      ::lstat(entry.path().c_str(), &sb);
      std::string value = std::to_string(sb.st_mode) + ":" + std::to_string(sb.st_mtim.tv_sec) +
                          "." + std::to_string(sb.st_mtim.tv_nsec);
      if (entry.is_regular_file()) {
        std::ifstream in(entry.path());
        value += ":" + std::string(std::istreambuf_iterator<char>(in), {});
      }
      out[entry.path().string()] = value;
    }
    return out;
  }

  void ExpectOutsideUntouched() const { EXPECT_EQ(Snapshot(), canary_); }

  fs::path sync_ = root_ / "sync";
  fs::path outside_ = root_ / "outside";
  std::map<std::string, std::string> canary_;
  std::unique_ptr<Transport> t_;
};

TEST_F(HostileDirTest, SymlinkedVersionDirectoryIsNeverWrittenReadOrRemovedThrough) {
  fs::create_directory_symlink(outside_, sync_ / "v00000005");
  uint8_t byte = 1;
  EXPECT_FALSE(t_->Put("v00000005/COMMIT", &byte, 1).ok());
  EXPECT_FALSE(t_->Put("v00000005/new/payload", &byte, 1).ok());
  // Refused, or a no-op (no directory of its own holds the key): never a removal through the link.
  (void)t_->Remove("v00000005/victim");
  (void)t_->Remove("v00000005/sub/nested");
  EXPECT_FALSE(t_->Get("v00000005/victim", 0, &byte, 1).ok());
  auto size = t_->Size("v00000005/victim");
  EXPECT_FALSE(size.ok() && size.value().has_value());
  auto listed = t_->List("v00000005/");
  EXPECT_TRUE(!listed.ok() || listed.value().empty());
  auto all = t_->List("");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_TRUE(all.value().empty());
  ExpectOutsideUntouched();

  // Once the planted link is gone, the honest writer proceeds.
  fs::remove(sync_ / "v00000005");
  ASSERT_TRUE(t_->Put("v00000005/COMMIT", &byte, 1).ok());
  EXPECT_TRUE(fs::is_regular_file(sync_ / "v00000005" / "COMMIT"));
}

TEST_F(HostileDirTest, SymlinkedAckDirectoryIsNeverWrittenThrough) {
  fs::create_directories(sync_ / "acks");
  fs::create_directory_symlink(outside_, sync_ / "acks" / "rollout-0");
  uint8_t byte = 1;
  Status st = t_->Put("acks/rollout-0/v00000001", &byte, 1);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.message().find(outside_.string()), std::string::npos) << st.ToString();
  (void)t_->Remove("acks/rollout-0/COMMIT");  // refused or a no-op, checked below
  ExpectOutsideUntouched();
  fs::remove(sync_ / "acks" / "rollout-0");
  EXPECT_TRUE(t_->Put("acks/rollout-0/v00000001", &byte, 1).ok());
}

TEST_F(HostileDirTest, SymlinkedPayloadIsRefusedWithoutRevealingTheTarget) {
  // A target whose size is distinctive, so a leak would show in the message.
  std::ofstream(outside_ / "secret") << std::string(12345, 's');
  canary_ = Snapshot();
  fs::create_directories(sync_ / "v00000001");
  fs::create_symlink(outside_ / "secret", sync_ / "v00000001" / "payload.r0.bin");
  std::vector<uint8_t> buf(16);
  Status st = t_->Get("v00000001/payload.r0.bin", 0, buf.data(), buf.size());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message().find("12345"), std::string::npos) << st.ToString();
  EXPECT_EQ(st.message().find("secret"), std::string::npos) << st.ToString();
  auto size = t_->Size("v00000001/payload.r0.bin");
  if (size.ok()) {
    EXPECT_FALSE(size.value().has_value());
  } else {
    EXPECT_EQ(size.status().message().find("12345"), std::string::npos);
  }
  auto listed = t_->List("v00000001/");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_TRUE(listed.value().empty());
  // The link itself is what a Remove or a Put replaces; the target stays.
  EXPECT_TRUE(t_->Remove("v00000001/payload.r0.bin").ok());
  ExpectOutsideUntouched();
}

TEST_F(HostileDirTest, AFifoInPlaceOfAnObjectNeverBlocks) {
  fs::create_directories(sync_ / "v00000001");
  const std::string fifo = (sync_ / "v00000001" / "manifest.r0.json").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0666), 0);
  auto get = std::async(std::launch::async, [&] {
    uint8_t byte = 0;
    return t_->Get("v00000001/manifest.r0.json", 0, &byte, 1);
  });
  if (get.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    // Release the blocked open so the test can finish and report.
    int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) ::close(w);
    ADD_FAILURE() << "Get blocked on a FIFO";
  }
  Status st = get.get();
  EXPECT_FALSE(st.ok());
  auto size = t_->Size("v00000001/manifest.r0.json");
  EXPECT_FALSE(size.ok() && size.value().has_value());
  ExpectOutsideUntouched();
  fs::remove(fifo);
  uint8_t byte = 7;
  ASSERT_TRUE(t_->Put("v00000001/manifest.r0.json", &byte, 1).ok());
  uint8_t back = 0;
  ASSERT_TRUE(t_->Get("v00000001/manifest.r0.json", 0, &back, 1).ok());
  EXPECT_EQ(back, 7);
}

}  // namespace
}  // namespace refit
