// `refit`: the command line (README.md "The command line"). Exit 0 on success; on any error one
// line "refit: error: ..." on stderr and a non-zero exit.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"

namespace refit::cli {

// Kept here rather than in cmd_shard.cc while that file is being reworked on another branch;
// it belongs next to RunShard.
void RegisterShard(CLI::App& app, Commands& commands) {
  auto shard = std::make_shared<ShardOptions>();
  auto* cmd = app.add_subcommand(
      "shard", "Cut a HuggingFace checkpoint into one safetensors file per rank of a layout");
  cmd->add_option("HF", shard->input, "HuggingFace checkpoint (.safetensors)")->required();
  cmd->add_option("--layout", shard->layout, "megatron, fsdp or vllm (docs/layouts.md)")
      ->required();
  cmd->add_option("--tp", shard->tp, "tensor-parallel size (default: config, else 1)");
  cmd->add_option("--pp", shard->pp, "pipeline-parallel size (megatron)");
  cmd->add_option("--ep", shard->ep, "expert-parallel size (megatron MoE)");
  cmd->add_option("--world", shard->world, "number of ranks (fsdp)");
  cmd->add_option("--num-heads", shard->num_heads, "attention heads, when not inferable");
  cmd->add_option("--num-kv-heads", shard->num_kv_heads, "key/value heads (default: inferred)");
  cmd->add_option("--head-dim", shard->head_dim, "rows per head (default: inferred)");
  cmd->add_option("--config", shard->config_path,
                  "TOML with [layout.<name>] model description keys and [plugins]");
  cmd->add_option("-o,--output", shard->out_dir, "directory for the shard files")->required();
  cmd->footer(
      "Files: tp{t}_pp{p}[_ep{e}].safetensors (rank = pp*tp*ep + ep*tp + tp), fsdp: "
      "rank{r}.safetensors.\nThe model description (num_layers, hidden, ffn, vocab, experts, "
      "heads) is read off the checkpoint;\nnum_heads needs --num-heads unless a q_norm gives "
      "head_dim.");
  commands.push_back({cmd, [shard] { return RunShard(*shard); }});
}

}  // namespace refit::cli

namespace {

int Report(const refit::Status& st) {
  if (st.ok()) return 0;
  std::fprintf(stderr, "refit: error: %s\n", st.message().c_str());
  return st.code() == refit::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "refit: delta-compressed, bit-exact weight sync between RL trainers and rollout "
      "engines"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "refit 0.1.0");

  using namespace refit::cli;
  Commands commands;
  RegisterDemo(app, commands);
  RegisterOffline(app, commands);
  RegisterSendRecv(app, commands);
  RegisterPlan(app, commands);
  RegisterShard(app, commands);
  RegisterBench(app, commands);

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
  for (const Command& command : commands) {
    if (*command.app) return Report(command.run());
  }
  return 2;
}
