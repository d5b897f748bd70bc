// `refit`: the command line (README.md "The command line"). Exit 0 on success; on any error one
// line "refit: error: ..." on stderr and exit 2 when the command line or the config is wrong
// (scripts retrying a failed sync must not retry those), 1 for a failure while running.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"

namespace {

// The first argument that is not a flag: the command the user meant to run.
const char* FirstCommandWord(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] != '-') return argv[i];
  }
  return nullptr;
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
  RegisterServe(app, commands);
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
    // CLI11 reports an unknown command as "A subcommand is required", which hides the typo.
    const char* word = FirstCommandWord(argc, argv);
    // Top-level commands, group commands (`bench`) included: a parse error inside `bench e2e`
    // is that error, not an unknown `bench`.
    bool known = false;
    const CLI::App& top = app;
    for (const CLI::App* command : top.get_subcommands(std::function<bool(const CLI::App*)>())) {
      if (word != nullptr && command->check_name(word)) known = true;
    }
    if (word != nullptr && !known) {
      std::fprintf(stderr, "refit: error: unknown command '%s' (see refit --help)\n", word);
      return 2;
    }
    std::fprintf(stderr, "refit: error: %s (see refit --help)\n", e.what());
    return 2;
  }
  for (const Command& command : commands) {
    if (*command.app) return ReportExit(command.run());
  }
  return 2;
}
