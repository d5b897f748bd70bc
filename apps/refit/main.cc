// `refit`: the command line (DESIGN.md "Command line contract"). Exit 0 on success; on any
// error one line "refit: error: ..." on stderr and a non-zero exit.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "plan.h"
#include "refit/config.h"

namespace {

int Report(const refit::Status& st) {
  if (st.ok()) return 0;
  std::fprintf(stderr, "refit: error: %s\n", st.message().c_str());
  return st.code() == refit::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"refit: delta-compressed, bit-exact weight sync between RL trainers and rollout "
               "engines"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "refit 0.1.0");

  refit::cli::DemoOptions demo;
  std::string demo_params = "100M";
  auto* demo_cmd = app.add_subcommand(
      "demo", "Run sender and receiver (two processes, disk transport) on a synthetic model");
  demo_cmd->add_option("--params", demo_params, "model size, e.g. 100M, 1.5G")
      ->capture_default_str();
  demo_cmd->add_option("--syncs", demo.syncs, "versions to publish (the first is full)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  demo_cmd->add_option("--lr", demo.lr, "learning rate of the synthetic Adam steps")
      ->capture_default_str();
  demo_cmd->add_option("--encoding", demo.encoding, "encoding of delta records")
      ->capture_default_str();
  demo_cmd->add_option("--dir", demo.dir, "work directory to keep (default: a temp dir, removed)");
  demo_cmd->add_option("--seed", demo.seed, "random seed")->capture_default_str();

  std::string base, next, out, delta, encoding = "auto", config_path;
  auto* diff_cmd = app.add_subcommand("diff", "Write the delta from BASE to NEW (safetensors)");
  diff_cmd->add_option("BASE", base, "base checkpoint")->required();
  diff_cmd->add_option("NEW", next, "new checkpoint")->required();
  diff_cmd->add_option("-o,--output", out, "delta file to write")->required();
  diff_cmd->add_option("--encoding", encoding, "encoding of changed records")
      ->capture_default_str();
  diff_cmd->add_option("--config", config_path, "TOML config (plugins, encoding settings)");

  auto* apply_cmd = app.add_subcommand("apply", "Apply DELTA to BASE, writing OUT atomically");
  apply_cmd->add_option("BASE", base, "base checkpoint")->required();
  apply_cmd->add_option("DELTA", delta, "delta from `refit diff`")->required();
  apply_cmd->add_option("-o,--output", out, "checkpoint to write")->required();
  apply_cmd->add_option("--config", config_path, "TOML config (plugins)");

  std::string inspect_path;
  bool inspect_records = false;
  auto* inspect_cmd =
      app.add_subcommand("inspect", "Describe a checkpoint, delta, payload or manifest");
  inspect_cmd->add_option("FILE", inspect_path, "file to describe")->required();
  inspect_cmd->add_flag("--records", inspect_records, "list every record of a delta/payload");

  auto* plugins_cmd = app.add_subcommand("plugins", "List encodings, transports and layouts");
  plugins_cmd->add_option("--config", config_path, "TOML config whose [plugins] to load too");

  refit::cli::SendOptions send;
  auto* send_cmd = app.add_subcommand("send", "Publish the next version of the weights");
  send_cmd->add_option("--config", send.config_path, "TOML config")->required();
  send_cmd->add_option("--weights", send.weights, "safetensors file (default: sender.weights)");
  send_cmd->add_option("--rank", send.rank, "this sender's rank")->capture_default_str();
  send_cmd->add_option("--world", send.world, "number of sender ranks")->capture_default_str();
  send_cmd->add_flag("--wait", send.wait, "wait for the receivers' acks before exiting");

  refit::cli::RecvOptions recv;
  auto* recv_cmd = app.add_subcommand("recv", "Apply pending versions into the receiver's model");
  recv_cmd->add_option("--config", recv.config_path, "TOML config")->required();
  recv_cmd->add_flag("--follow", recv.follow, "keep polling for new versions");
  recv_cmd->add_option("--until-version", recv.until_version,
                       "with --follow: exit once this version is applied");
  recv_cmd->add_option("--timeout", recv.timeout_s, "with --follow: give up after SECONDS");
  recv_cmd->add_flag("--quiet", recv.quiet, "print nothing on success");

  std::string plan_config;
  auto* plan_cmd = app.add_subcommand(
      "plan", "Recommend PP-level/TP-level sharded diff per path from a bandwidth model");
  plan_cmd->add_option("--config", plan_config, "topology TOML (e.g. configs/plan-seed.toml)")
      ->required();

  refit::cli::ShardOptions shard;
  auto* shard_cmd = app.add_subcommand(
      "shard", "Cut a HuggingFace checkpoint into one safetensors file per rank of a layout");
  shard_cmd->add_option("HF", shard.input, "HuggingFace checkpoint (.safetensors)")->required();
  shard_cmd->add_option("--layout", shard.layout, "megatron, fsdp or vllm (docs/layouts.md)")
      ->required();
  shard_cmd->add_option("--tp", shard.tp, "tensor-parallel size (default: config, else 1)");
  shard_cmd->add_option("--pp", shard.pp, "pipeline-parallel size (megatron)");
  shard_cmd->add_option("--ep", shard.ep, "expert-parallel size (megatron MoE)");
  shard_cmd->add_option("--world", shard.world, "number of ranks (fsdp)");
  shard_cmd->add_option("--num-heads", shard.num_heads, "attention heads, when not inferable");
  shard_cmd->add_option("--num-kv-heads", shard.num_kv_heads, "key/value heads (default: inferred)");
  shard_cmd->add_option("--head-dim", shard.head_dim, "rows per head (default: inferred)");
  shard_cmd->add_option("--config", shard.config_path,
                        "TOML with [layout.<name>] model description keys and [plugins]");
  shard_cmd->add_option("-o,--output", shard.out_dir, "directory for the shard files")->required();
  shard_cmd->footer(
      "Files: tp{t}_pp{p}[_ep{e}].safetensors (rank = pp*tp*ep + ep*tp + tp), fsdp: "
      "rank{r}.safetensors.\nThe model description (num_layers, hidden, ffn, vocab, experts, "
      "heads) is read off the checkpoint;\nnum_heads needs --num-heads unless a q_norm gives "
      "head_dim.");

  refit::cli::BenchCodecOptions bench;
  std::string bench_bytes = "1GiB";
  std::vector<std::string> bench_pairs;
  bool bench_sweep = false, bench_synthetic = false;
  std::string bench_params = "100M";
  auto* bench_cmd = app.add_subcommand("bench", "Measure encodings and the machine");
  bench_cmd->require_subcommand(1);
  auto* codec_cmd = bench_cmd->add_subcommand(
      "codec", "Payload vs the order-0 bound and published formats; encode/apply throughput");
  codec_cmd->add_option("--density", bench.densities,
                        "sweep buffers at these densities (repeatable; --sweep: 0.001 0.01 0.03 0.1)");
  codec_cmd->add_flag("--sweep", bench_sweep, "sweep densities 0.1%, 1%, 3%, 10%");
  codec_cmd->add_option("--bytes", bench_bytes, "size of each sweep buffer (bf16)")
      ->capture_default_str();
  codec_cmd->add_option("--lr", bench.lrs, "synthetic model steps at these learning rates");
  codec_cmd->add_flag("--synthetic", bench_synthetic, "synthetic model at lr 1e-6 and 1e-5");
  codec_cmd->add_option("--params", bench_params, "synthetic model size")->capture_default_str();
  codec_cmd->add_option("--pair", bench_pairs, "A.safetensors B.safetensors (repeatable)")
      ->expected(2)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  codec_cmd->add_option("--encoding", bench.encodings,
                        "encodings to measure (repeatable; default: every registered one + auto)");
  codec_cmd->add_option("--threads", bench.threads, "thread counts (repeatable; default 1 2)");
  codec_cmd->add_option("--json", bench.json_path, "write the results as JSON (- for stdout)");
  codec_cmd->add_option("--config", bench.config_path, "TOML config (plugins, encoding settings)");
  codec_cmd->add_option("--seed", bench.seed, "random seed")->capture_default_str();
  codec_cmd->add_option("--reps", bench.reps, "timings: best of this many runs")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "refit: error: %s (see refit --help)\n", e.what());
    return 2;
  }

  using namespace refit::cli;
  if (*demo_cmd) {
    auto params = ParseCount(demo_params);
    if (!params.ok()) return Report(params.status());
    demo.params = params.value();
    return Report(RunDemo(demo));
  }
  if (*diff_cmd) return Report(RunDiff(base, next, out, encoding, config_path));
  if (*apply_cmd) return Report(RunApply(base, delta, out, config_path));
  if (*inspect_cmd) return Report(RunInspect(inspect_path, inspect_records));
  if (*plugins_cmd) return Report(RunPlugins(config_path));
  if (*send_cmd) return Report(RunSend(send));
  if (*recv_cmd) return Report(RunRecv(recv));
  if (*plan_cmd) return Report(RunPlan(plan_config));
  if (*shard_cmd) return Report(RunShard(shard));
  if (*codec_cmd) {
    auto bytes = refit::ParseSize(bench_bytes);
    if (!bytes.ok()) return Report(bytes.status());
    bench.bytes = bytes.value();
    auto params = ParseCount(bench_params);
    if (!params.ok()) return Report(params.status());
    bench.synthetic_params = params.value();
    if (bench_sweep) {
      for (double d : {0.001, 0.01, 0.03, 0.1}) bench.densities.push_back(d);
    }
    if (bench_synthetic) {
      for (double lr : {1e-6, 1e-5}) bench.lrs.push_back(lr);
    }
    for (size_t i = 0; i + 1 < bench_pairs.size(); i += 2) {
      bench.pairs.emplace_back(bench_pairs[i], bench_pairs[i + 1]);
    }
    return Report(RunBenchCodec(bench));
  }
  return 2;
}
