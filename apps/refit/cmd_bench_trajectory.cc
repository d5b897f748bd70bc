// refit bench trajectory: a synthetic training run written as safetensors checkpoints (the BF16
// cast after each step), for measuring `refit send` / `refit recv` and the codec on the same
// pairs (docs/benchmarks.md). Deterministic for a seed.
#include <CLI/CLI.hpp>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "commands.h"
#include "format/safetensors.h"
#include "refit/refit.h"
#include "synthetic/synthetic.h"

namespace refit::cli {

namespace {

struct TrajectoryOptions {
  uint64_t params = 500'000'000;
  double lr = 1e-6;
  int steps = 2;
  std::string out;
  uint64_t seed = 1;
};

Status RunTrajectory(const TrajectoryOptions& o) {
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) return Status::IoError(o.out + ": " + ec.message());
  SyntheticModel model(SyntheticModelSpec::ForParams(o.params, o.seed));
  for (int step = 0; step <= o.steps; ++step) {
    if (step > 0) model.Step(o.lr);
    char name[32];
    std::snprintf(name, sizeof(name), "ckpt_%02d.safetensors", step);
    const std::string path = o.out + "/" + name;
    REFIT_RETURN_NOT_OK(
        WriteSafetensors(path, model.bf16(), {{"refit.synthetic.step", std::to_string(step)}}));
    std::printf("%s: %" PRIu64 " parameters, step %d at lr %g\n", path.c_str(),
                model.num_parameters(), step, step == 0 ? 0.0 : o.lr);
    std::fflush(stdout);
  }
  return Status::OK();
}

}  // namespace

void RegisterBenchTrajectory(CLI::App& bench, Commands& commands) {
  struct Flags {
    TrajectoryOptions o;
    std::string params = "500M";
  };
  auto flags = std::make_shared<Flags>();
  auto* cmd = bench.add_subcommand(
      "trajectory", "Write a synthetic training run as BF16 safetensors checkpoints (ckpt_NN)");
  cmd->add_option("--params", flags->params, "model size, e.g. 100M, 1.5G")->capture_default_str();
  cmd->add_option("--lr", flags->o.lr, "learning rate of the synthetic Adam steps")
      ->capture_default_str();
  cmd->add_option("--steps", flags->o.steps, "optimizer steps after the first checkpoint")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--out", flags->o.out, "directory of the checkpoints")->required();
  cmd->add_option("--seed", flags->o.seed, "random seed")->capture_default_str();
  commands.push_back({cmd, [flags]() -> Status {
                        REFIT_ASSIGN_OR_RAISE(flags->o.params, ParseCount(flags->params));
                        return RunTrajectory(flags->o);
                      }});
}

}  // namespace refit::cli
