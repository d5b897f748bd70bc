// The torch adapter end to end: a small model (two Linear layers and a LayerNorm) trained with
// AdamW on fp32 masters, its bf16 copy published after every step, received by ANOTHER process
// (this binary run with --recv) that attached its own bf16 module and dumps its parameters' bits
// after every version it applied; every version's dump must equal the sender's bits.
//
// One binary, one translation unit with torch headers: the test and its receiver process.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "refit/refit.h"
#include "refit/torch_adapter.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using refit::torch_adapter::AttachModule;
using refit::torch_adapter::PublishModule;
using refit::torch_adapter::ViewOf;

constexpr int kSteps = 6;
constexpr int kBoundSeconds = 120;

struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(16, 48))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({48})))),
        fc2(register_module("fc2", torch::nn::Linear(48, 8))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::gelu(norm(fc1(x)))); }
  torch::nn::Linear fc1;
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Net);

// The module's parameters' bytes, in named_parameters() order.
std::string Bits(const torch::nn::Module& module) {
  std::string out;
  for (const auto& p : module.named_parameters()) {
    out.append(static_cast<const char*>(p.value().data_ptr()), p.value().nbytes());
  }
  return out;
}

std::string ConfigText(const fs::path& dir) {
  return "[sender]\nstate_dir = \"" + (dir / "sender").string() +
         "\"\nreceivers = [\"r0\"]\nack_timeout_s = 60\n\n[receiver]\nid = \"r0\"\n"
         "state_dir = \"" +
         (dir / "receiver").string() + "\"\n\n[transport]\nname = \"disk\"\n\n" +
         "[transport.disk]\ndir = \"" + (dir / "sync").string() + "\"\nfsync = false\n";
}

void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream(path.string() + ".tmp", std::ios::binary) << bytes;
  fs::rename(path.string() + ".tmp", path);
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int Fail(int code, const refit::Status& status) {
  std::cerr << "receiver process: " << status.message() << "\n";
  return code;
}

// The receiver process: attaches its own bf16 module (other initial values than the sender's)
// and dumps its bits to <dir>/v<N>.bin after applying version N, until version `last`.
int ReceiverMain(const fs::path& dir, uint64_t last) {
  torch::manual_seed(99);
  Net net;
  net->to(torch::kBFloat16);
  auto config = refit::Config::FromString(ConfigText(dir));
  if (!config.ok()) return Fail(10, config.status());
  auto receiver = refit::Receiver::Make(*config);
  if (!receiver.ok()) return Fail(11, receiver.status());
  refit::Status attached = AttachModule(**receiver, *net);
  if (!attached.ok()) return Fail(12, attached);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kBoundSeconds);
  while (std::chrono::steady_clock::now() < deadline) {
    auto applied = (*receiver)->PollOnce();
    if (!applied.ok()) return Fail(13, applied.status());
    if (!applied->has_value()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    WriteFile(dir / ("v" + std::to_string((*applied)->version) + ".bin"), Bits(*net));
    if ((*applied)->version == last) return 0;
  }
  return 14;
}

pid_t Spawn(const fs::path& dir, uint64_t last) {
  std::vector<std::string> args = {"/proc/self/exe", "--recv", dir.string(), std::to_string(last)};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

// The receiver's exit status, or -1 if it outlived the bound (it is then killed).
int WaitExit(pid_t pid) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kBoundSeconds);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

class TorchSync : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("refit_torch_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  fs::path dir_;
};

// The bf16 serving copy of the fp32 masters, as a trainer publishes it.
void CopyInto(Net& serving, const Net& master) {
  torch::NoGradGuard no_grad;
  auto dst = serving->named_parameters();
  for (const auto& p : master->named_parameters()) dst[p.key()].copy_(p.value());
}

TEST_F(TorchSync, AdamWStepsArriveBitExactInAnotherProcess) {
  torch::manual_seed(7);
  Net master;
  Net serving;
  serving->to(torch::kBFloat16);
  torch::optim::AdamW opt(master->parameters(), torch::optim::AdamWOptions(1e-2));
  torch::Tensor x = torch::randn({32, 16});
  torch::Tensor y = torch::randn({32, 8});

  auto config = refit::Config::FromString(ConfigText(dir_));
  ASSERT_TRUE(config.ok()) << config.status().message();
  auto sender = refit::Sender::Make(*config);
  ASSERT_TRUE(sender.ok()) << sender.status().message();
  pid_t pid = Spawn(dir_, kSteps + 1);
  ASSERT_GT(pid, 0);

  std::vector<std::string> expected;  // expected[v - 1]: the bits of version v
  for (int step = 0; step <= kSteps; ++step) {
    if (step > 0) {
      opt.zero_grad();
      torch::Tensor loss = torch::mse_loss(master->forward(x), y);
      loss.backward();
      opt.step();
    }
    CopyInto(serving, master);
    auto stats = PublishModule(**sender, *serving);
    ASSERT_TRUE(stats.ok()) << "step " << step << ": " << stats.status().message();
    EXPECT_EQ(stats->version, static_cast<uint64_t>(step + 1));
    EXPECT_EQ(stats->full, step == 0);
    if (step > 0) {
      EXPECT_GT(stats->counters.changed_elements, 0u) << "step " << step;
    }
    expected.push_back(Bits(*serving));
  }
  ASSERT_TRUE((*sender)->WaitAndAdvance(kBoundSeconds).ok());
  ASSERT_EQ(WaitExit(pid), 0) << "the receiver process failed";
  for (int v = 1; v <= kSteps + 1; ++v) {
    std::string got = ReadFile(dir_ / ("v" + std::to_string(v) + ".bin"));
    EXPECT_TRUE(got == expected[v - 1]) << "version " << v << " differs (" << got.size() << " of "
                                        << expected[v - 1].size() << " bytes)";
  }
}

TEST(TorchAdapter, ViewOfMapsDTypesAndRefusesWhatItCannotView) {
  torch::Tensor t = torch::zeros({3, 4}, torch::kBFloat16);
  auto view = ViewOf(t, "w");
  ASSERT_TRUE(view.ok()) << view.status().message();
  EXPECT_EQ(view->dtype, refit::DType::kBF16);
  EXPECT_EQ(view->shape, (refit::Shape{3, 4}));
  EXPECT_EQ(view->data, t.data_ptr());
  EXPECT_EQ(ViewOf(torch::zeros({2}, torch::kInt64), "i")->dtype, refit::DType::kI64);

  auto transposed = ViewOf(torch::zeros({3, 4}).t(), "layers.0.weight");
  ASSERT_FALSE(transposed.ok());
  EXPECT_NE(transposed.status().message().find("layers.0.weight"), std::string::npos);
  EXPECT_NE(transposed.status().message().find("contiguous"), std::string::npos);

  auto meta = ViewOf(torch::empty({2}, torch::Device(torch::kMeta)), "on_meta");
  ASSERT_FALSE(meta.ok());
  EXPECT_NE(meta.status().message().find("on_meta"), std::string::npos);

  auto complex = ViewOf(torch::zeros({2}, torch::kComplexFloat), "z");
  ASSERT_FALSE(complex.ok());
  EXPECT_EQ(complex.status().code(), refit::StatusCode::kUnsupported);
  EXPECT_NE(complex.status().message().find("'z'"), std::string::npos);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--recv") {
    return ReceiverMain(argv[2], std::strtoull(argv[3], nullptr, 10));
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
