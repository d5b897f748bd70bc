#include "child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/file_util.h"

namespace refit::cli {

namespace {

int ExitStatus(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
  }
}

Result<ChildProcess> ChildProcess::SpawnSelf(const std::vector<std::string>& args,
                                             bool quiet_stdout) {
  // argv is built before fork: the child only execs (or exits).
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>("refit"));
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  ChildProcess child;
  child.pid_ = ::fork();
  if (child.pid_ < 0) return Status::IoError("fork failed");
  if (child.pid_ == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (quiet_stdout) {
      const int null = ::open("/dev/null", O_WRONLY);
      if (null >= 0) ::dup2(null, 1);
    }
    ::execv("/proc/self/exe", argv.data());
    std::perror("refit: exec");
    std::_Exit(127);
  }
  return child;
}

std::optional<int> ChildProcess::Poll() {
  int status = 0;
  if (pid_ <= 0 || ::waitpid(pid_, &status, WNOHANG) != pid_) return std::nullopt;
  pid_ = -1;
  return ExitStatus(status);
}

Result<int> ChildProcess::Wait(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    if (std::optional<int> status = Poll()) return *status;
    if (pid_ <= 0) return Status::Internal("waiting for a process that was never started");
    if (std::chrono::steady_clock::now() > deadline) {
      return Status::Timeout("process " + std::to_string(pid_) + " still running after " +
                             std::to_string(static_cast<int>(timeout_s)) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Result<std::string> MakeWorkDir(const std::string& dir, const std::string& prefix) {
  namespace fs = std::filesystem;
  if (dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) return Status::IoError("mkdtemp failed");
    return tmpl;
  }
  REFIT_RETURN_NOT_OK(internal::MakeDirs(dir));
  return dir;
}

RemoveDirOnExit::~RemoveDirOnExit() {
  std::error_code ec;
  if (enabled) std::filesystem::remove_all(dir, ec);
}

Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) return Status::IoError("cannot write " + path);
  return Status::OK();
}

}  // namespace refit::cli
