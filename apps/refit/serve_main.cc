// `refit-serve`: what `refit serve` execs (serve_cli.cc). The same flags, errors and exit codes.
#include <CLI/CLI.hpp>

#include "commands.h"

int main(int argc, char** argv) {
  using namespace refit::cli;
  CLI::App app{"refit-serve: the receiver as an HTTP service (run it as `refit serve`)"};
  ServeOptions options;
  AddServeFlags(app, options);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "refit: error: %s (see refit serve --help)\n", e.what());
    return 2;
  }
  return ReportExit(RunServe(options));
}
