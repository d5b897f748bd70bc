// The `refit` subcommands. Each cmd_*.cc registers its subcommands' flags (RegisterX) next to
// the code that runs them; main.cc only calls the registrations, parses, and runs the chosen
// command. Each returns a Status, printed by main as one line on stderr.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "refit/config.h"
#include "refit/receiver.h"
#include "refit/status.h"
#include "refit/tensor.h"

namespace CLI {
class App;
}  // namespace CLI

namespace refit::cli {

// A registered subcommand: `run` executes it once the command line is parsed and `app` (the
// subcommand) was given. The flags' values live in what `run` captures.
struct Command {
  CLI::App* app = nullptr;
  std::function<Status()> run;
};
using Commands = std::vector<Command>;

// Add their subcommands to `app` and append them to `commands`.
void RegisterDemo(CLI::App& app, Commands& commands);
void RegisterOffline(CLI::App& app, Commands& commands);  // diff, apply, inspect, plugins
void RegisterSendRecv(CLI::App& app, Commands& commands);
void RegisterServe(CLI::App& app, Commands& commands);
void RegisterPlan(CLI::App& app, Commands& commands);
void RegisterShard(CLI::App& app, Commands& commands);
void RegisterBench(CLI::App& app, Commands& commands);
void RegisterBenchApply(CLI::App& bench, Commands& commands);       // `bench apply`, under `bench`
void RegisterBenchTrajectory(CLI::App& bench, Commands& commands);  // `bench trajectory`
void RegisterBenchE2e(CLI::App& bench, Commands& commands);         // `bench e2e`, under `bench`

struct DemoOptions {
  uint64_t params = 100'000'000;
  int syncs = 5;  // versions published, the first one full
  double lr = 1e-6;
  std::string encoding = "auto";
  std::string dir;  // work dir; empty: a fresh temp dir, removed afterwards
  uint64_t seed = 1;
};
Status RunDemo(const DemoOptions& options);

Status RunDiff(const std::string& base, const std::string& next, const std::string& out,
               const std::string& encoding, const std::string& config_path);
Status RunApply(const std::string& base, const std::string& delta, const std::string& out,
                const std::string& config_path);
Status RunInspect(const std::string& path, bool records);
Status RunPlugins(const std::string& config_path);

struct SendOptions {
  std::string config_path;
  std::string weights;
  int rank = 0;
  int world = 1;
  bool wait = false;  // wait for the acks of the published version before exiting
  bool json = false;  // one JSON object on stdout instead of the summary lines
};
Status RunSend(const SendOptions& options);

struct RecvOptions {
  std::string config_path;
  bool follow = false;
  uint64_t until_version = 0;  // with follow: stop once this version is applied (0: never)
  double timeout_s = 0;        // with follow: give up after this long (0: never)
  bool quiet = false;
  bool json = false;        // one JSON object per applied version on stdout (JSON lines)
  std::string in_memory;    // with follow: a tensor list (JSON); the model is held in memory
  std::string write_model;  // with in_memory: the model written here (safetensors) once done
};
Status RunRecv(const RecvOptions& options);
// One line (two for a resumed apply) on stdout per applied version, as `refit recv` prints it.
void PrintApplied(const ApplyStats& stats, bool as_json = false);

struct ServeOptions {
  std::string config_path;
  std::string listen;  // HOST:PORT; empty: serve.listen of the config
};
// Serves until SIGINT/SIGTERM; only in `refit-serve` (cmd_serve.cc), which `refit serve` execs.
Status RunServe(const ServeOptions& options);
// --config and --listen, for `refit serve` and `refit-serve` alike.
void AddServeFlags(CLI::App& cmd, ServeOptions& options);

struct ShardOptions {
  std::string input;           // the HuggingFace checkpoint
  std::string layout;          // megatron, fsdp, vllm, ... (a layout with list_local)
  int tp = 0, pp = 0, ep = 0;  // 0: from the config, else 1
  int world = 0;               // layouts without a tp split (fsdp): the number of ranks
  std::string config_path;     // [layout.<name>] model description, [plugins]
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;  // 0: from the config or the shapes
  std::string out_dir;
};
Status RunShard(const ShardOptions& options);

struct BenchCodecOptions {
  std::vector<double> densities;  // sweep buffers of `bytes` bf16 at these change densities
  uint64_t bytes = 1ull << 30;
  std::vector<double> lrs;  // synthetic model steps at these learning rates
  uint64_t synthetic_params = 100'000'000;
  std::vector<std::pair<std::string, std::string>> pairs;  // real checkpoint pairs
  std::vector<std::string> encodings;                      // empty: every registered one plus auto
  std::vector<unsigned> threads;                           // empty: 1 and 2
  std::string json_path;                                   // "-": stdout
  std::string config_path;
  uint64_t seed = 1;
  int reps = 2;  // encode and apply timings: best of this many runs
};
Status RunBenchCodec(const BenchCodecOptions& options);

// "100M", "1.5G", "350k", "123" -> count.
Result<uint64_t> ParseCount(const std::string& text);
// Config::FromFile for a --config flag: a file that is missing or unreadable is a usage error.
Result<Config> LoadConfigFile(const std::string& path);
// Tensors of `expected` that the safetensors file at `path` lacks or holds with another dtype,
// shape or bits, plus 1 when the file holds another number of tensors: 0 means bit for bit equal.
Result<uint64_t> CountMismatchedTensors(const std::string& path,
                                        const std::vector<TensorView>& expected);
// main's exit: 0 for OK, else one line "refit: error: ..." on stderr and 2 for a wrong command
// line or config (scripts retrying a failed sync must not retry those), 1 for anything else.
int ReportExit(const Status& status);
// 1234567 -> "1.23 MB"
std::string HumanBytes(uint64_t bytes);
std::string HumanCount(uint64_t n);

}  // namespace refit::cli
