// refit bench apply: the in-memory receiver's apply time per thread count on one run's deltas.
// One sender and one attached receiver per thread count, in this process, over the disk
// transport; every receiver applies the same versions into its own memory, checked bit-exact.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "common/stopwatch.h"
#include "refit/refit.h"
#include "synthetic/synthetic.h"

namespace refit::cli {

using internal::Stopwatch;

namespace {

struct BenchApplyOptions {
  uint64_t params = 500'000'000;
  double lr = 1e-6;
  int versions = 3;
  std::vector<int> threads = {1, 2};
  std::string dir;
  uint64_t seed = 1;
};

// An engine's parameters: memory of the model's shapes, attached to one receiver.
struct Engine {
  int threads = 1;
  std::unique_ptr<Receiver> receiver;
  std::vector<std::vector<uint8_t>> memory;
  std::vector<double> apply_seconds;
};

std::string BenchConfig(const std::string& dir, const BenchApplyOptions& o) {
  std::string receivers;
  for (int t : o.threads)
    receivers += (receivers.empty() ? "\"t" : ", \"t") + std::to_string(t) + "\"";
  return "[sender]\nstate_dir = \"" + dir + "/sender\"\nreceivers = [" + receivers +
         "]\n\n[transport]\nname = \"disk\"\n\n[transport.disk]\ndir = \"" + dir +
         "/sync\"\nfsync = false\n";
}

Result<Engine> MakeEngine(const std::string& dir, const BenchApplyOptions& o, int threads,
                          const SyntheticModel& model) {
  Engine e;
  e.threads = threads;
  const std::string id = "t" + std::to_string(threads);
  REFIT_ASSIGN_OR_RAISE(
      Config config,
      Config::FromString(BenchConfig(dir, o) + "\n[receiver]\nid = \"" + id + "\"\nstate_dir = \"" +
                             dir + "/" + id + "\"\nthreads = " + std::to_string(threads) + "\n",
                         "bench-apply.toml"));
  REFIT_ASSIGN_OR_RAISE(e.receiver, Receiver::Make(config));
  std::vector<TensorView> views;
  for (const TensorView& t : model.bf16()) {
    e.memory.emplace_back(t.nbytes(), 0);
    views.push_back({t.name, t.dtype, t.shape, e.memory.back().data()});
  }
  REFIT_RETURN_NOT_OK(e.receiver->Attach(views));
  return e;
}

Status ApplyAndCheck(Engine& e, const SyntheticModel& model, uint64_t version) {
  Stopwatch clock;
  REFIT_ASSIGN_OR_RAISE(std::optional<ApplyStats> applied, e.receiver->PollOnce());
  const double seconds = clock.Seconds();
  if (!applied || applied->version != version) {
    return Status::Internal("receiver t" + std::to_string(e.threads) + " did not apply version " +
                            std::to_string(version));
  }
  if (version > 1) e.apply_seconds.push_back(seconds);
  for (size_t i = 0; i < model.bf16().size(); ++i) {
    const TensorView& t = model.bf16()[i];
    if (std::memcmp(e.memory[i].data(), t.data, t.nbytes()) != 0) {
      return Status::Corrupt("receiver t" + std::to_string(e.threads) + ": tensor " + t.name +
                             " differs after version " + std::to_string(version));
    }
  }
  return Status::OK();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[(v.size() - 1) / 2];  // the lower middle
}

}  // namespace

Status RunBenchApply(const BenchApplyOptions& o) {
  namespace fs = std::filesystem;
  std::string dir = o.dir;
  if (dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "refit-bench-apply-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) return Status::IoError("mkdtemp failed");
    dir = tmpl;
  }
  struct Cleanup {
    std::string dir;
    bool on;
    ~Cleanup() {
      std::error_code ec;
      if (on) fs::remove_all(dir, ec);
    }
  } cleanup{dir, o.dir.empty()};
  SyntheticModel model(SyntheticModelSpec::ForParams(o.params, o.seed));
  REFIT_ASSIGN_OR_RAISE(Config config, Config::FromString(BenchConfig(dir, o), "bench-apply.toml"));
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<Sender> sender, Sender::Make(config));
  std::vector<Engine> engines;
  for (int t : o.threads) {
    REFIT_ASSIGN_OR_RAISE(Engine e, MakeEngine(dir, o, t, model));
    engines.push_back(std::move(e));
  }
  std::printf("bench apply: %s parameters (%s bf16), lr %g, %d deltas, receivers with threads",
              HumanCount(model.num_parameters()).c_str(),
              HumanBytes(model.num_parameters() * 2).c_str(), o.lr, o.versions);
  for (int t : o.threads) std::printf(" %d", t);
  std::printf("\n%7s  %8s  %10s", "version", "density", "payload");
  for (int t : o.threads) std::printf("  %9s", ("apply t" + std::to_string(t)).c_str());
  std::printf("\n");
  for (int v = 1; v <= o.versions + 1; ++v) {
    if (v > 1) model.Step(o.lr);
    REFIT_ASSIGN_OR_RAISE(SyncStats s, sender->Publish(model.bf16()));
    for (Engine& e : engines) REFIT_RETURN_NOT_OK(ApplyAndCheck(e, model, s.version));
    REFIT_RETURN_NOT_OK(sender->WaitAndAdvance(60));
    if (v == 1) continue;  // the full sync: a copy, not what this measures
    std::printf("%7" PRIu64 "  %7.4f%%  %10s", s.version, 100 * s.counters.density(),
                HumanBytes(s.payload_bytes).c_str());
    for (const Engine& e : engines) std::printf("  %8.3fs", e.apply_seconds.back());
    std::printf("\n");
    std::fflush(stdout);
  }
  const double base = Median(engines.front().apply_seconds);
  std::printf("median apply seconds (bit-exact every version):");
  for (const Engine& e : engines) {
    const double m = Median(e.apply_seconds);
    std::printf("  t%d %.3f s (%.2fx of t%d)", e.threads, m, base > 0 ? m / base : 0,
                engines.front().threads);
  }
  std::printf("\n");
  return Status::OK();
}

void RegisterBenchApply(CLI::App& bench, Commands& commands) {
  struct Flags {
    BenchApplyOptions o;
    std::string params = "500M";
  };
  auto f = std::make_shared<Flags>();
  auto* cmd = bench.add_subcommand(
      "apply", "In-memory receiver: apply time of each delta per receiver.threads, bit-exact");
  cmd->add_option("--params", f->params, "synthetic model size (bf16)")->capture_default_str();
  cmd->add_option("--lr", f->o.lr, "learning rate of the synthetic steps")->capture_default_str();
  cmd->add_option("--versions", f->o.versions, "deltas to apply")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  cmd->add_option("--threads", f->o.threads, "receiver thread counts (the first is the base)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--dir", f->o.dir, "work directory to keep (default: a temp dir, removed)");
  cmd->add_option("--seed", f->o.seed, "random seed")->capture_default_str();
  commands.push_back({cmd, [f]() -> Status {
                        REFIT_ASSIGN_OR_RAISE(f->o.params, ParseCount(f->params));
                        return RunBenchApply(f->o);
                      }});
}

}  // namespace refit::cli
