// The nccl transport through the real loader. Without a GPU (here and in CI): the plugin loads,
// is listed, and creating an instance fails with one clear line. With GPUs: payloads broadcast
// bit-exact to receivers in this process and in another one; these skip with the reason when
// the machine has too few devices (NCCL refuses two ranks on one GPU).
// Built a second time as refit_nccl_fake_tests (REFIT_NCCL_FAKE): the plugin's sources over a CPU
// fake of libcudart/libnccl, so the in-process GPU cases run everywhere.
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "nccl_test_util.h"

extern char** environ;

namespace refit::nccl_test {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> Pattern(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

Result<std::unique_ptr<Transport>> Make(const Registry& registry, const Config& config,
                                        refit_transport_role_t role, const std::string& peer) {
  return registry.CreateTransport("nccl", role, peer, &config, "transport.nccl");
}

void ExpectObject(Transport& t, const std::string& key, const std::vector<uint8_t>& want) {
  auto size = t.Size(key);
  ASSERT_TRUE(size.ok()) << size.status().ToString();
  ASSERT_TRUE(size.value().has_value()) << key << " missing";
  ASSERT_EQ(*size.value(), want.size()) << key;
  std::vector<uint8_t> got(want.size() + 1, 0xEE);
  Status st = t.Get(key, 0, got.data(), want.size());
  ASSERT_TRUE(st.ok()) << st.ToString();
  got.pop_back();
  EXPECT_TRUE(got == want) << "bytes of '" << key << "' differ";
}

// Polls (bounded in count) until `key` is gone from t. A remove returns once every receiver
// answered it, so this is one look in practice; the bound keeps a regression from hanging.
bool GoneWithin(Transport& t, const std::string& key) {
  for (int i = 0; i < 500; ++i) {
    auto size = t.Size(key);
    if (size.ok() && !size.value().has_value()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(NcclPlugin, IsListedByTheLoader) {
  if (kFake) GTEST_SKIP() << "checks the real plugin and loader";
  auto registry = LoadNcclRegistry();
  ASSERT_TRUE(registry.ok()) << registry.status().ToString();
  const ComponentInfo* info = registry.value()->Find(REFIT_KIND_TRANSPORT, "nccl");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->origin, kPluginPath);
  std::vector<std::string> keys;
  for (const ConfigKeySpec& k : info->config_keys) keys.push_back(k.name);
  for (const char* want : {"control_dir", "receivers", "bucket_bytes", "inbox_bytes", "device"}) {
    EXPECT_NE(std::find(keys.begin(), keys.end(), want), keys.end()) << want;
  }
}

TEST(NcclPlugin, AMissingControlDirIsAConfigError) {
  if (kFake) GTEST_SKIP() << "checks the real plugin and loader";
  auto registry = LoadNcclRegistry();
  ASSERT_TRUE(registry.ok()) << registry.status().ToString();
  auto config = Config::FromString("[transport.nccl]\nreceivers = 2\n");
  ASSERT_TRUE(config.ok());
  auto made = Make(*registry.value(), config.value(), REFIT_ROLE_SENDER, "s");
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("control_dir is required"), std::string::npos)
      << made.status().ToString();
}

TEST(NcclPlugin, CreatingWithoutAGpuFailsWithOneClearLine) {
  if (kFake) GTEST_SKIP() << "checks the real plugin and loader";
  std::string why;
  if (GpuCount(&why) > 0) GTEST_SKIP() << "this machine has a GPU (" << why << ")";
  auto registry = LoadNcclRegistry();
  ASSERT_TRUE(registry.ok()) << registry.status().ToString();
  ScratchDir scratch;
  const std::string dir = scratch.path() + "/channel";
  auto config = NcclConfig(dir, "");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  for (refit_transport_role_t role : {REFIT_ROLE_SENDER, REFIT_ROLE_RECEIVER}) {
    auto made = Make(*registry.value(), config.value(), role, "r0");
    ASSERT_FALSE(made.ok());
    const std::string message = made.status().message();
    EXPECT_NE(message.find("nccl transport: no CUDA device: "), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_FALSE(fs::exists(dir)) << "a failed create left files in the control directory";
}

// One GPU is enough for a sender alone (receivers = 0): a one-rank communicator, so every CUDA
// and NCCL call of the send path runs, though nobody receives.
TEST(NcclGpu, SenderAloneRunsTheSendPath) {
  std::string why;
  if (GpuCount(&why) < 1) GTEST_SKIP() << "needs 1 CUDA device: " << why;
  auto registry = LoadNcclRegistry();
  ASSERT_TRUE(registry.ok()) << registry.status().ToString();
  ScratchDir scratch;
  auto config = NcclConfig(scratch.path(), "receivers = 0\nbucket_bytes = \"64KiB\"\n");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  auto made = Make(*registry.value(), config.value(), REFIT_ROLE_SENDER, "sender-r0");
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Transport& sender = *made.value();
  const std::string key = "v00000001/payload.r0.000000.st";
  std::vector<uint8_t> payload = Pattern((3 << 20) + 7, 1);
  ASSERT_TRUE(sender.Put(key, payload.data(), payload.size()).ok());
  auto size = sender.Size(key);
  ASSERT_TRUE(size.ok() && size.value() == std::optional<uint64_t>(payload.size()));
  Status get = sender.Get(key, 0, payload.data(), 1);
  EXPECT_EQ(get.code(), StatusCode::kUnsupported) << get.ToString();
  std::vector<uint8_t> manifest = Pattern(999, 2);
  ASSERT_TRUE(sender.Put("v00000001/manifest.r0.json", manifest.data(), manifest.size()).ok());
  ExpectObject(sender, "v00000001/manifest.r0.json", manifest);
  auto listed = sender.List("v00000001/");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed.value().size(), 2u);
  EXPECT_TRUE(sender.Remove(key).ok());
  EXPECT_TRUE(GoneWithin(sender, key));
}

TEST(NcclGpu, BroadcastIsBitExactInOneProcess) {
  std::string why;
  if (GpuCount(&why) < 2) GTEST_SKIP() << "needs 2 CUDA devices (one rank per GPU): " << why;
  auto registry = LoadNcclRegistry();
  ASSERT_TRUE(registry.ok()) << registry.status().ToString();
  ScratchDir scratch;
  auto config = NcclConfig(scratch.path(), "receivers = 1\nbucket_bytes = \"64KiB\"\n");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  // The receiver first: it joins in the background; the sender's create waits for it.
  auto receiver = Make(*registry.value(), config.value(), REFIT_ROLE_RECEIVER, "r0");
  ASSERT_TRUE(receiver.ok()) << receiver.status().ToString();
  for (int session = 0; session < 2; ++session) {
    SCOPED_TRACE("session " + std::to_string(session));
    auto sender = Make(*registry.value(), config.value(), REFIT_ROLE_SENDER, "sender-r0");
    ASSERT_TRUE(sender.ok()) << sender.status().ToString();
    const std::string v = "v0000000" + std::to_string(session + 1);
    size_t i = 0;
    for (size_t n : {size_t{0}, size_t{1}, size_t{65535}, size_t{65536}, size_t{65537},
                     size_t{5 * 65536 + 3}, size_t{3} << 20}) {
      const std::string key = v + "/payload.r0." + std::to_string(i++) + ".st";
      std::vector<uint8_t> payload = Pattern(n, 100 * session + i);
      ASSERT_TRUE(sender.value()->Put(key, payload.data(), payload.size()).ok()) << key;
      ExpectObject(*receiver.value(), key, payload);
    }
    std::vector<uint8_t> commit = Pattern(64, 7);
    ASSERT_TRUE(sender.value()->Put(v + "/COMMIT", commit.data(), commit.size()).ok());
    ExpectObject(*receiver.value(), v + "/COMMIT", commit);
    auto listed = receiver.value()->List(v + "/");
    ASSERT_TRUE(listed.ok()) << listed.status().ToString();
    EXPECT_EQ(listed.value().size(), 8u);
    const std::string removed = v + "/payload.r0.6.st";
    ASSERT_TRUE(sender.value()->Remove(removed).ok());
    EXPECT_TRUE(GoneWithin(*receiver.value(), removed));
  }
}

TEST(NcclGpu, InboxEvictsOlderVersionsAndRefusesWhatDoesNotFit) {
  std::string why;
  if (GpuCount(&why) < 2) GTEST_SKIP() << "needs 2 CUDA devices (one rank per GPU): " << why;
  auto registry = LoadNcclRegistry();
  ASSERT_TRUE(registry.ok()) << registry.status().ToString();
  ScratchDir scratch;
  auto config = NcclConfig(scratch.path(), "bucket_bytes = \"64KiB\"\ninbox_bytes = \"1MiB\"\n");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  auto receiver = Make(*registry.value(), config.value(), REFIT_ROLE_RECEIVER, "r0");
  ASSERT_TRUE(receiver.ok()) << receiver.status().ToString();
  auto sender = Make(*registry.value(), config.value(), REFIT_ROLE_SENDER, "sender-r0");
  ASSERT_TRUE(sender.ok()) << sender.status().ToString();
  std::vector<uint8_t> a = Pattern(600 << 10, 1);
  std::vector<uint8_t> b = Pattern(600 << 10, 2);
  std::vector<uint8_t> big = Pattern(2 << 20, 3);
  ASSERT_TRUE(sender.value()->Put("v00000001/payload.r0.0.st", a.data(), a.size()).ok());
  ASSERT_TRUE(sender.value()->Put("v00000002/payload.r0.0.st", b.data(), b.size()).ok());
  ExpectObject(*receiver.value(), "v00000002/payload.r0.0.st", b);
  auto old = receiver.value()->Size("v00000001/payload.r0.0.st");
  ASSERT_TRUE(old.ok());
  EXPECT_FALSE(old.value().has_value()) << "the older version was not evicted";
  // The put reports the receiver's refusal (its answer to the put), and so does the receiver.
  Status put = sender.value()->Put("v00000002/payload.r0.1.st", big.data(), big.size());
  ASSERT_FALSE(put.ok());
  EXPECT_NE(put.message().find("inbox_bytes"), std::string::npos) << put.ToString();
  auto refused = receiver.value()->Size("v00000002/payload.r0.1.st");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("inbox_bytes"), std::string::npos)
      << refused.status().ToString();
  // The session survives a refused payload: the next one arrives.
  ASSERT_TRUE(sender.value()->Put("v00000002/payload.r0.2.st", a.data(), 1000).ok());
  ExpectObject(*receiver.value(), "v00000002/payload.r0.2.st",
               std::vector<uint8_t>(a.begin(), a.begin() + 1000));
}

// The receiver of BroadcastIsBitExactAcrossProcesses, run as a child process of it (skipped
// when run on its own). It checks every payload against the pattern and answers with an object.
TEST(NcclGpu, ChildReceiver) {
  const char* dir = std::getenv("REFIT_NCCL_CHILD_DIR");
  if (dir == nullptr || kFake)
    GTEST_SKIP() << "runs as the child of BroadcastIsBitExactAcrossProcesses";
  auto registry = LoadNcclRegistry();
  ASSERT_TRUE(registry.ok()) << registry.status().ToString();
  auto config = NcclConfig(dir, "bucket_bytes = \"1MiB\"\n");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  auto receiver = Make(*registry.value(), config.value(), REFIT_ROLE_RECEIVER, "r0");
  ASSERT_TRUE(receiver.ok()) << receiver.status().ToString();
  bool done = false;
  for (int i = 0; i < 6000 && !done; ++i) {  // at most ~60 s
    auto size = receiver.value()->Size("v00000001/COMMIT");
    ASSERT_TRUE(size.ok()) << size.status().ToString();
    done = size.value().has_value();
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(done) << "no COMMIT within 60 s";
  std::string verdict = "ok";
  for (int k = 0; k < 4; ++k) {
    const std::string key = "v00000001/payload.r0." + std::to_string(k) + ".st";
    std::vector<uint8_t> want = Pattern((size_t{5} << 20) * k + 13, 40 + k);
    std::vector<uint8_t> got(want.size() + 1);
    Status st = receiver.value()->Get(key, 0, got.data(), want.size());
    got.pop_back();
    if (!st.ok()) verdict = st.ToString();
    if (st.ok() && got != want) verdict = "bytes of " + key + " differ";
  }
  ASSERT_TRUE(receiver.value()
                  ->Put("acks/r0/v00000001", reinterpret_cast<const uint8_t*>(verdict.data()),
                        verdict.size())
                  .ok());
  EXPECT_EQ(verdict, "ok");
  // Stay in the session until the sender ended it (it then writes "bye"), so that its
  // shutdown broadcast has a receiver.
  bool bye = false;
  for (int i = 0; i < 6000 && !bye; ++i) {
    auto size = receiver.value()->Size("bye");
    bye = size.ok() && size.value().has_value();
    if (!bye) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(bye) << "the sender did not say bye within 60 s";
}

TEST(NcclGpu, BroadcastIsBitExactAcrossProcesses) {
  if (kFake) GTEST_SKIP() << "the fake runtime connects ranks of one process only";
  std::string why;
  if (GpuCount(&why) < 2) GTEST_SKIP() << "needs 2 CUDA devices (one rank per GPU): " << why;
  ScratchDir scratch;
  // The child starts before this process touches CUDA through the plugin.
  std::string env_dir = "REFIT_NCCL_CHILD_DIR=" + scratch.path();
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  env.push_back(env_dir.data());
  env.push_back(nullptr);
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=NcclGpu.ChildReceiver";
  char* argv[] = {self.data(), filter.data(), nullptr};
  pid_t child = 0;
  ASSERT_EQ(::posix_spawn(&child, self.c_str(), nullptr, nullptr, argv, env.data()), 0);
  auto registry = LoadNcclRegistry();
  ASSERT_TRUE(registry.ok()) << registry.status().ToString();
  auto config = NcclConfig(scratch.path(), "bucket_bytes = \"1MiB\"\n");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  {
    auto sender = Make(*registry.value(), config.value(), REFIT_ROLE_SENDER, "sender-r0");
    ASSERT_TRUE(sender.ok()) << sender.status().ToString();
    for (int k = 0; k < 4; ++k) {
      std::vector<uint8_t> payload = Pattern((size_t{5} << 20) * k + 13, 40 + k);
      const std::string key = "v00000001/payload.r0." + std::to_string(k) + ".st";
      ASSERT_TRUE(sender.value()->Put(key, payload.data(), payload.size()).ok()) << key;
    }
    const std::string commit = "commit";
    ASSERT_TRUE(sender.value()
                    ->Put("v00000001/COMMIT", reinterpret_cast<const uint8_t*>(commit.data()),
                          commit.size())
                    .ok());
    std::optional<uint64_t> verdict_size;
    for (int i = 0; i < 6000 && !verdict_size; ++i) {  // at most ~60 s
      auto size = sender.value()->Size("acks/r0/v00000001");
      ASSERT_TRUE(size.ok()) << size.status().ToString();
      verdict_size = size.value();
      if (!verdict_size) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(verdict_size.has_value()) << "no verdict from the child within 60 s";
    std::vector<uint8_t> verdict(*verdict_size);
    ASSERT_TRUE(sender.value()->Get("acks/r0/v00000001", 0, verdict.data(), verdict.size()).ok());
    EXPECT_EQ(std::string(verdict.begin(), verdict.end()), "ok");
  }
  // The sender is gone (its session ended): let the child go.
  { std::ofstream(scratch.path() + "/objects/bye") << "bye"; }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child receiver failed";
}

}  // namespace
}  // namespace refit::nccl_test
