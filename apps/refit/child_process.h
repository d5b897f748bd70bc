// Child `refit` processes (the demo's and the end-to-end bench's receivers) and the work
// directory they share with their parent.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "refit/status.h"

namespace refit::cli {

// A child process, killed (SIGTERM) and reaped when this goes away while it still runs.
class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess();
  ChildProcess(ChildProcess&& other) noexcept : pid_(other.pid_) { other.pid_ = -1; }
  // Swaps: the process this held (if any) ends with `other`.
  ChildProcess& operator=(ChildProcess&& other) noexcept {
    std::swap(pid_, other.pid_);
    return *this;
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Runs this very binary (/proc/self/exe) with `args` (argv[0] is "refit"); its stdout goes to
  // /dev/null when `quiet_stdout` (so a parent printing JSON keeps stdout to itself), its stderr
  // is the parent's. It gets SIGTERM if the parent dies first, so none outlives a killed parent.
  static Result<ChildProcess> SpawnSelf(const std::vector<std::string>& args, bool quiet_stdout);

  pid_t pid() const { return pid_; }
  // Exit status if the process has ended (128 + signal when killed), nullopt while it runs.
  std::optional<int> Poll();
  // Waits at most `timeout_s` for the exit status; a Timeout error (the process left running)
  // after that.
  Result<int> Wait(double timeout_s);

 private:
  pid_t pid_ = -1;
};

// `dir` (created), or a fresh temporary directory "<prefix>-XXXXXX" when empty.
Result<std::string> MakeWorkDir(const std::string& dir, const std::string& prefix);

// Removes the directory at scope exit when `enabled` (a temp dir the command made itself).
struct RemoveDirOnExit {
  std::string dir;
  bool enabled = false;
  ~RemoveDirOnExit();
};

Status WriteText(const std::string& path, const std::string& text);

}  // namespace refit::cli
