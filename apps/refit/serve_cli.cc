// `refit serve`'s flags, and the exec of `refit-serve`, the binary that serves (cmd_serve.cc):
// only that binary links the HTTP server and the TLS libraries it pulls in.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"

namespace refit::cli {

namespace {

// Replaces this process with `refit-serve` from this binary's directory: the same pid, stdio,
// signals and exit status, so `refit serve` behaves as if it served itself.
Status ExecServe(const ServeOptions& o) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return Status::IoError("cannot find this binary (/proc/self/exe): " + ec.message());
  const std::string server = (self.parent_path() / "refit-serve").string();
  std::vector<std::string> args = {"refit-serve", "--config", o.config_path};
  if (!o.listen.empty()) args.insert(args.end(), {"--listen", o.listen});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(server.c_str(), argv.data());
  return Status::IoError("cannot run " + server +
                         " (installed next to refit): " + std::strerror(errno));
}

}  // namespace

void RegisterServe(CLI::App& app, Commands& commands) {
  auto options = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand(
      "serve", "Run the receiver as an HTTP service: POST /v1/sync, GET /v1/status, GET /metrics");
  AddServeFlags(*cmd, *options);
  commands.push_back({cmd, [options] { return ExecServe(*options); }});
}

void AddServeFlags(CLI::App& cmd, ServeOptions& options) {
  cmd.add_option("--config", options.config_path, "TOML config ([receiver], [serve], ...)")
      ->required();
  cmd.add_option("--listen", options.listen,
                 "HOST:PORT to listen on (default: serve.listen, 127.0.0.1:8470; port 0: any)");
}

}  // namespace refit::cli
