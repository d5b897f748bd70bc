// A sender and a receiver (real `refit` processes) over the disk transport, for tests that forge
// or damage versions: numbered weights (version v publishes Weights(v)), bounded runs, a canary
// tree outside the roots, and checks of the receiver's model against its state.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_harness.h"
#include "forge.h"

namespace refit::testing {

// A process that outlives this is hung.
constexpr int kBoundSeconds = 30;

struct SyncConfig {
  std::string sender_extra;    // lines added to [sender]
  std::string receiver_extra;  // lines added to [receiver]
  std::string tail;            // further sections ([auth], ...)
  int ack_timeout_s = 2;
};

class SyncFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(outside_ + "/sub");
    WriteAll(outside_ + "/victim", "precious");
    WriteAll(outside_ + "/sub/nested", "also precious");
    for (int i = 1; i <= kWeights; ++i) {
      Checkpoint c = Checkpoint::Make(11);
      c.Mutate(0.05 * i, 200 + i);
      ASSERT_TRUE(c.Write(Weights(i)));
    }
    WriteConfig(SyncConfig{});
    canary_ = Snapshot();
  }

  static constexpr int kWeights = 5;

  void WriteConfig(const SyncConfig& c, const std::string& name = "refit.toml") {
    WriteAll(dir_ / name, "[sender]\nstate_dir = \"" + dir_ / "sender" +
                              "\"\nreceivers = [\"r0\"]\n" +
                              "ack_timeout_s = " + std::to_string(c.ack_timeout_s) + "\n" +
                              c.sender_extra + "\n[receiver]\nid = \"r0\"\nstate_dir = \"" +
                              dir_ / "receiver" + "\"\npoll_interval_ms = 20\n" + c.receiver_extra +
                              "\n[transport]\nname = \"disk\"\n\n[transport.disk]\ndir = \"" +
                              dir_ / "sync" + "\"\nfsync = false\n" + c.tail);
  }

  std::string Weights(int i) const { return dir_ / ("w" + std::to_string(i) + ".safetensors"); }
  std::string Model() const { return dir_ / "receiver/model.safetensors"; }
  std::string StateText() const { return ReadAll(dir_ / "receiver/receiver.json"); }
  nlohmann::json State() const {
    nlohmann::json j = nlohmann::json::parse(StateText(), nullptr, false);
    return j.is_object() ? j : nlohmann::json::object();
  }
  uint64_t StateVersion() const {
    nlohmann::json j = State();
    return j.contains("version") && j["version"].is_number_unsigned() ? j["version"].get<uint64_t>()
                                                                      : 0;
  }
  bool Applying() const { return State().contains("applying"); }
  SyncStore Store() const { return SyncStore(dir_ / "sync"); }
  bool Exists(const std::string& rel) const { return std::filesystem::exists(dir_ / rel); }

  CommandResult Run(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
                    int bound_s = kBoundSeconds) {
    RefitProcess p(args, dir_ / ("cmd" + std::to_string(counter_++)), env);
    CommandResult r;
    EXPECT_TRUE(p.WaitFor(bound_s, &r))
        << "refit " << args[0] << " ran past its bound of " << bound_s << " s: " << r.err;
    all_output_ += r.out + r.err;
    return r;
  }
  CommandResult Send(int i, const std::vector<std::string>& env = {},
                     const std::string& config = "refit.toml") {
    return Run({"send", "--config", dir_ / config, "--weights", Weights(i)}, env);
  }
  CommandResult Recv(const std::vector<std::string>& env = {},
                     const std::string& config = "refit.toml") {
    return Run({"recv", "--config", dir_ / config}, env);
  }

  // Publishes and applies versions 1..n honestly.
  void SyncUpTo(int n, const std::vector<std::string>& env = {}) {
    for (int v = 1; v <= n; ++v) {
      auto s = Send(v, env);
      ASSERT_EQ(s.exit_code, 0) << "honest send of version " << v << " failed: " << s.err;
      auto r = Recv(env);
      ASSERT_EQ(r.exit_code, 0) << "honest recv of version " << v << " failed: " << r.err;
      ASSERT_TRUE(SameTensors(Weights(v), Model())) << "after honest version " << v;
    }
  }

  // The receiver's model is the version its state names (v), whenever the state is not applying.
  void ExpectModelAt(int v, const std::string& when) const {
    EXPECT_FALSE(Applying()) << when << ": receiver.json says applying: " << StateText();
    EXPECT_EQ(StateVersion(), static_cast<uint64_t>(v))
        << when << ": receiver.json names another version: " << StateText();
    EXPECT_TRUE(SameTensors(Weights(v), Model()))
        << when << ": the model is not version " << v << " bit for bit";
  }

  // Every entry under the canary tree: kind, mtime and contents.
  std::map<std::string, std::string> Snapshot() const { return SnapshotTree(outside_); }
  void ExpectOutsideUntouched() const {
    EXPECT_EQ(Snapshot(), canary_) << "a file outside the sync and state roots changed";
  }

  TempDir dir_;
  std::string outside_ = dir_ / "outside";
  std::map<std::string, std::string> canary_;
  int counter_ = 0;
  std::string all_output_;  // stdout and stderr of every run so far
};

}  // namespace refit::testing
