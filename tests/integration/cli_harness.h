// Runs the real `refit` binary for integration tests, and makes checkpoint files.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "format/safetensors.h"

namespace refit::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// A process running `refit args...` (or `binary args...`) with stdout/stderr captured to files.
class RefitProcess {
 public:
  // env: extra "NAME=value" entries for the child (e.g. REFIT_KILL_AT crash points); a bare
  // "NAME" removes NAME from the child's environment.
  RefitProcess(const std::vector<std::string>& args, const std::string& capture_prefix,
               const std::vector<std::string>& env = {}, std::string binary = REFIT_CLI_PATH)
      : out_path_(capture_prefix + ".out"), err_path_(capture_prefix + ".err") {
    pid_ = ::fork();
    if (pid_ == 0) {
      for (const std::string& e : env) {
        if (e.find('=') == std::string::npos) {
          ::unsetenv(e.c_str());
        } else {
          ::putenv(::strdup(e.c_str()));
        }
      }
      int out = ::open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(out, 1);
      ::dup2(err, 2);
      std::vector<char*> argv;
      argv.push_back(binary.data());
      std::vector<std::string> copy = args;
      for (std::string& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(binary.c_str(), argv.data());
      std::_Exit(127);
    }
  }
  ~RefitProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  // Sends `signal` while the process runs (e.g. SIGTERM to a server).
  void Signal(int signal) {
    if (pid_ > 0) ::kill(pid_, signal);
  }
  // Waits at most timeout_s; false (and the process killed, then reaped) when it was still running.
  bool WaitFor(int timeout_s, CommandResult* r) {
    for (int waited_ms = 0; waited_ms < timeout_s * 1000; waited_ms += 20) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        r->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        r->out = ReadAll(out_path_);
        r->err = ReadAll(err_path_);
        return true;
      }
      ::usleep(20 * 1000);
    }
    ::kill(pid_, SIGKILL);
    *r = Wait();
    return false;
  }
  CommandResult Wait() {
    CommandResult r;
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = ReadAll(out_path_);
    r.err = ReadAll(err_path_);
    return r;
  }

 private:
  pid_t pid_ = -1;
  std::string out_path_;
  std::string err_path_;
};

inline CommandResult RunRefit(const std::vector<std::string>& args, const std::string& dir,
                              const std::vector<std::string>& env = {}) {
  static int counter = 0;
  RefitProcess p(args, dir + "/cmd" + std::to_string(counter++), env);
  return p.Wait();
}

// Number of lines of text (a trailing newline does not start a line).
// Whether a receiver's redo log holds entries of an uncommitted attempt: more bytes than the
// size receiver.json recorded at its last commit (`log_bytes`, absent while 0).
// The redo log `log` has entries past the size its owner's state file recorded at its last
// commit (`log_bytes`, absent while 0).
inline uint64_t CommittedLogBytes(const std::string& state_json) {
  const std::string state = ReadAll(state_json);
  const size_t at = state.find("\"log_bytes\":");
  return at == std::string::npos ? 0 : std::stoull(state.substr(at + 12));
}
inline bool LogHasUncommittedEntries(const std::string& log, const std::string& state_json) {
  if (!std::filesystem::exists(log)) return false;
  return std::filesystem::file_size(log) > CommittedLogBytes(state_json);
}
inline bool LogHasUncommittedEntries(const std::string& state_dir) {
  return LogHasUncommittedEntries(state_dir + "/redo.log", state_dir + "/receiver.json");
}

inline int LineCount(const std::string& text) {
  int n = 0;
  for (char c : text) n += c == '\n';
  if (!text.empty() && text.back() != '\n') ++n;
  return n;
}

// Every entry under `root`: kind, mtime and contents - a canary tree compared before and after a
// run to prove nothing outside the roots was created, changed or deleted.
inline std::map<std::string, std::string> SnapshotTree(const std::string& root) {
  std::map<std::string, std::string> out;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    struct stat sb {};
    ::lstat(entry.path().c_str(), &sb);
    std::string value = std::to_string(sb.st_mode) + "@" + std::to_string(sb.st_mtim.tv_sec) + "." +
                        std::to_string(sb.st_mtim.tv_nsec);
    if (entry.is_regular_file()) value += ":" + ReadAll(entry.path().string());
    out[entry.path().string()] = value;
  }
  return out;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "refit-it-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    // REFIT_KEEP_TEST_DIRS=1 keeps them for a post-mortem.
    if (const char* keep = std::getenv("REFIT_KEEP_TEST_DIRS"); keep != nullptr && *keep == '1') {
      return;
    }
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A small multi-dtype checkpoint whose bits are random with adversarial patterns mixed in.
struct Checkpoint {
  struct Tensor {
    std::string name;
    DType dtype;
    Shape shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Tensor> tensors;

  static Checkpoint Make(uint64_t seed) {
    Checkpoint c;
    std::mt19937_64 rng(seed);
    auto add = [&](std::string name, DType dtype, Shape shape) {
      Tensor t{std::move(name), dtype, shape, {}};
      uint64_t n = 1;
      for (uint64_t d : shape) n *= d;
      t.bytes.resize(n * SizeOf(dtype));
      for (auto& b : t.bytes) b = static_cast<uint8_t>(rng());
      c.tensors.push_back(std::move(t));
    };
    add("model.embed_tokens.weight", DType::kBF16, {64, 48});
    add("model.layers.0.self_attn.q_proj.weight", DType::kBF16, {48, 48});
    add("model.layers.0.mlp.up_proj.weight", DType::kF16, {96, 48});
    add("model.layers.0.input_layernorm.weight", DType::kF32, {48});
    add("model.norm.weight", DType::kF32, {48});
    add("scalar", DType::kF32, {});
    add("empty", DType::kBF16, {0, 4});
    // Adversarial bit patterns at the start of every tensor (NaN payloads, +-0, inf, subnormal).
    const uint16_t half_patterns[] = {0x7FC1, 0xFFC3, 0x7F81, 0x0000,
                                      0x8000, 0x7F80, 0xFF80, 0x0001};
    for (Tensor& t : c.tensors) {
      if (SizeOf(t.dtype) == 2) {
        for (size_t i = 0; i < 8 && 2 * i + 1 < t.bytes.size(); ++i) {
          std::memcpy(&t.bytes[2 * i], &half_patterns[i], 2);
        }
      }
    }
    return c;
  }

  // Changes ~density of the elements of every tensor, including flips between +0/-0 and NaNs.
  void Mutate(double density, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(0, 1);
    for (Tensor& t : tensors) {
      uint32_t e = SizeOf(t.dtype);
      for (size_t i = 0; i + e <= t.bytes.size(); i += e) {
        if (u(rng) < density) t.bytes[i + (rng() % e)] ^= static_cast<uint8_t>(1 + rng() % 255);
      }
      if (e == 2 && t.bytes.size() >= 4) t.bytes[1] ^= 0x80;  // +0 <-> -0 style sign flip
    }
  }

  std::vector<TensorView> Views() {
    std::vector<TensorView> v;
    for (Tensor& t : tensors) {
      TensorView view;
      view.name = t.name;
      view.dtype = t.dtype;
      view.shape = t.shape;
      view.data = t.bytes.data();
      v.push_back(view);
    }
    return v;
  }

  bool Write(const std::string& path) { return WriteSafetensors(path, Views()).ok(); }
};

// True when the two files hold the same tensor names, dtypes, shapes and bytes.
inline ::testing::AssertionResult SameTensors(const std::string& a, const std::string& b) {
  auto fa = SafetensorsFile::Open(a);
  auto fb = SafetensorsFile::Open(b);
  if (!fa.ok()) return ::testing::AssertionFailure() << fa.status().message();
  if (!fb.ok()) return ::testing::AssertionFailure() << fb.status().message();
  if (fa.value()->tensors().size() != fb.value()->tensors().size()) {
    return ::testing::AssertionFailure() << "tensor counts differ";
  }
  for (const TensorView& t : fa.value()->tensors()) {
    const TensorView* o = fb.value()->Find(t.name);
    if (o == nullptr) return ::testing::AssertionFailure() << "missing " << t.name;
    if (o->dtype != t.dtype || o->shape != t.shape) {
      return ::testing::AssertionFailure() << "dtype/shape of " << t.name;
    }
    if (std::memcmp(o->data, t.data, t.nbytes()) != 0) {
      return ::testing::AssertionFailure() << "bytes of " << t.name;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace refit::testing
