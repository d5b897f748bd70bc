// refit send / recv / demo: the runtime over a transport.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "commands.h"
#include "common/file_util.h"
#include "format/safetensors.h"
#include "refit/refit.h"
#include "synthetic/synthetic.h"

namespace refit::cli {

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void PrintApplied(const ApplyStats& s) {
  std::printf("applied version %" PRIu64 " (%s): %" PRIu64 " records in %" PRIu64
              " payloads, %s, %.3f s\n",
              s.version, s.full ? "full" : "delta", s.records, s.payloads,
              HumanBytes(s.payload_bytes).c_str(), s.total_seconds);
  if (s.resumed || s.resumed_entries > 0 || s.resumed_skipped_records > 0) {
    std::printf("  resumed an interrupted apply: replayed %" PRIu64
                " journal entries, skipped %" PRIu64 " records already applied\n",
                s.resumed_entries, s.resumed_skipped_records);
  }
  std::fflush(stdout);
}

// The process's peak resident set (VmHWM: anonymous memory plus the touched pages of mapped
// files, i.e. the weights and baseline this rank maps); 0 where /proc is unavailable.
uint64_t PeakResidentBytes() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t kib = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "VmHWM: %" SCNu64 " kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib * 1024;
}

}  // namespace

Status RunSend(const SendOptions& o) {
  REFIT_ASSIGN_OR_RAISE(Config config, Config::FromFile(o.config_path));
  std::string weights_path = o.weights;
  if (weights_path.empty()) {
    REFIT_ASSIGN_OR_RAISE(weights_path, config.GetString("sender.weights", ""));
    if (weights_path.empty()) {
      return Status::Invalid("no weights: pass --weights FILE or set sender.weights in " +
                             o.config_path);
    }
  }
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<Sender> sender, Sender::Make(config, o.rank, o.world));
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<SafetensorsFile> weights,
                        SafetensorsFile::Open(weights_path));
  REFIT_ASSIGN_OR_RAISE(SyncStats s, sender->Publish(weights->tensors()));
  // Recovery of an earlier attempt that died (docs/reliability.md), one line each.
  if (s.adopted_commit) {
    std::printf("recovered: version %" PRIu64 " was committed by an earlier attempt; adopted\n",
                s.version - 1);
  }
  if (s.republished) {
    std::printf("recovered: an earlier attempt at version %" PRIu64
                " died before its commit; republished\n",
                s.version);
  }
  if (s.advance_resumed_entries > 0) {
    std::printf("recovered: baseline advance resumed, replayed %" PRIu64 " journal entries\n",
                s.advance_resumed_entries);
  }
  std::printf("published version %" PRIu64
              " (%s): density %.4f%%, %s changed of %s, payload %s "
              "(%.4fx dense) in %" PRIu64 " payloads, %.3f s\n",
              s.version, s.full ? "full" : "delta", 100 * s.density(),
              HumanCount(s.changed_elements).c_str(), HumanCount(s.total_elements).c_str(),
              HumanBytes(s.payload_bytes).c_str(),
              s.model_bytes ? static_cast<double>(s.payload_bytes) / s.model_bytes : 0.0,
              s.payloads, s.total_seconds);
  if (o.wait) {
    REFIT_ASSIGN_OR_RAISE(double timeout, config.GetDouble("sender.ack_timeout_s", 600));
    REFIT_RETURN_NOT_OK(sender->WaitAndAdvance(timeout));
    std::printf("version %" PRIu64 " acknowledged by %zu receivers; baseline advanced\n",
                sender->baseline_version(), sender->acks().size());
  }
  std::printf("peak resident memory: %s (%" PRIu64 " bytes)\n",
              HumanBytes(PeakResidentBytes()).c_str(), PeakResidentBytes());
  return Status::OK();
}

Status RunRecv(const RecvOptions& o) {
  REFIT_ASSIGN_OR_RAISE(Config config, Config::FromFile(o.config_path));
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<Receiver> receiver, Receiver::Make(config));
  REFIT_ASSIGN_OR_RAISE(int64_t poll_ms, config.GetInt("receiver.poll_interval_ms", 100));
  const double start = Now();
  bool mismatch_reported = false;
  std::string last_error;
  while (true) {
    Result<std::optional<ApplyStats>> r = receiver->PollOnce();
    if (!r.ok()) {
      const StatusCode code = r.status().code();
      if (!o.follow) return r.status();
      if (code == StatusCode::kVersionMismatch) {
        // Following: a full sync was requested and will come; say so once.
        if (!mismatch_reported) {
          std::fprintf(stderr, "refit: %s; requested a full sync\n", r.status().message().c_str());
          mismatch_reported = true;
        }
      } else if (code == StatusCode::kIoError || code == StatusCode::kCorrupt ||
                 code == StatusCode::kNotFound || code == StatusCode::kTimeout) {
        // Following: a failed or corrupted read, or a payload not (yet) there, is retried; the
        // model still is the last committed version (or an `applying` one that resumes).
        if (r.status().message() != last_error) {
          std::fprintf(stderr, "refit: %s; retrying\n", r.status().message().c_str());
          std::fflush(stderr);
          last_error = r.status().message();
        }
      } else {
        return r.status();
      }
    } else if (r.value()) {
      mismatch_reported = false;
      last_error.clear();
      if (!o.quiet) PrintApplied(*r.value());
      if (o.until_version != 0 && receiver->version() >= o.until_version) return Status::OK();
      continue;  // there may be more pending versions: poll again at once
    } else if (!o.follow) {
      if (!o.quiet) {
        std::printf("up to date at version %" PRIu64 " (%s)\n", receiver->version(),
                    receiver->model_path().c_str());
      }
      return Status::OK();
    }
    if (o.timeout_s > 0 && Now() - start > o.timeout_s) {
      return Status::Timeout("no version " + std::to_string(o.until_version) + " within " +
                             std::to_string(o.timeout_s) + " s (at version " +
                             std::to_string(receiver->version()) + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
  }
}

// ------------------------------------------------------------------ demo

namespace {

struct ChildProcess {
  pid_t pid = -1;
  ~ChildProcess() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      ::waitpid(pid, nullptr, 0);
    }
  }
  // Exit status if the process has ended, nullopt while it runs.
  std::optional<int> Poll() {
    int status = 0;
    if (pid <= 0 || ::waitpid(pid, &status, WNOHANG) != pid) return std::nullopt;
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  Result<int> Wait() {
    int status = 0;
    if (::waitpid(pid, &status, 0) < 0) return Status::IoError("waitpid failed");
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) return Status::IoError("cannot write " + path);
  return Status::OK();
}

}  // namespace

Status RunDemo(const DemoOptions& o) {
  namespace fs = std::filesystem;
  std::string dir = o.dir;
  const bool temporary = dir.empty();
  if (temporary) {
    std::string tmpl = (fs::temp_directory_path() / "refit-demo-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) return Status::IoError("mkdtemp failed");
    dir = tmpl;
  } else {
    REFIT_RETURN_NOT_OK(internal::MakeDirs(dir));
  }
  struct Cleanup {
    std::string dir;
    bool enabled;
    ~Cleanup() {
      std::error_code ec;
      if (enabled) std::filesystem::remove_all(dir, ec);
    }
  } cleanup{dir, temporary};

  const std::string config_path = dir + "/demo.toml";
  REFIT_RETURN_NOT_OK(
      WriteText(config_path,
                "# written by `refit demo`: sender and receiver over the disk transport\n"
                "[sender]\nstate_dir = \"" +
                    dir + "/sender\"\nencoding = \"" + o.encoding +
                    "\"\nreceivers = [\"r0\"]\nack_timeout_s = 600\n\n"
                    "[receiver]\nid = \"r0\"\nstate_dir = \"" +
                    dir +
                    "/receiver\"\n\n"
                    "[transport]\nname = \"disk\"\n\n[transport.disk]\ndir = \"" +
                    dir + "/sync\"\n"));
  REFIT_ASSIGN_OR_RAISE(Config config, Config::FromFile(config_path));
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<Sender> sender, Sender::Make(config));

  std::printf("refit demo: building a synthetic model of ~%s parameters (bf16)...\n",
              HumanCount(o.params).c_str());
  std::fflush(stdout);
  SyntheticModel model(SyntheticModelSpec::ForParams(o.params, o.seed));

  // The receiver is a second process: this very binary, `refit recv --follow`.
  ChildProcess receiver;
  receiver.pid = ::fork();
  if (receiver.pid < 0) return Status::IoError("fork failed");
  if (receiver.pid == 0) {
    std::string until = std::to_string(o.syncs);
    execl("/proc/self/exe", "refit", "recv", "--config", config_path.c_str(), "--follow",
          "--until-version", until.c_str(), "--quiet", static_cast<char*>(nullptr));
    std::perror("refit demo: exec receiver");
    std::_Exit(127);
  }

  uint64_t model_bytes = 0;
  for (const TensorView& t : model.bf16()) model_bytes += t.nbytes();
  std::printf(
      "model: %s parameters in %zu tensors, %s; %d syncs at lr %g, encoding %s, work dir "
      "%s\n\n",
      HumanCount(model.num_parameters()).c_str(), model.bf16().size(),
      HumanBytes(model_bytes).c_str(), o.syncs, o.lr, o.encoding.c_str(), dir.c_str());
  std::printf("%7s  %-5s  %8s  %9s  %11s  %9s  %8s  %8s  %8s\n", "version", "kind", "density",
              "changed", "payload", "vs dense", "encode s", "send s", "apply s");
  for (int v = 1; v <= o.syncs; ++v) {
    if (v > 1) model.Step(o.lr);
    REFIT_ASSIGN_OR_RAISE(SyncStats s, sender->Publish(model.bf16()));
    // Wait for the receiver's ack, but notice at once if the receiver process died.
    while (true) {
      Status st = sender->WaitAndAdvance(0.5);
      if (st.ok()) break;
      if (st.code() != StatusCode::kTimeout) return st;
      if (std::optional<int> rc = receiver.Poll()) {
        return Status::Internal("the receiver process exited with status " + std::to_string(*rc) +
                                " before acknowledging version " + std::to_string(s.version));
      }
    }
    double apply = sender->acks().empty() ? 0 : sender->acks()[0].apply_seconds;
    std::printf("%7" PRIu64 "  %-5s  %7.3f%%  %9s  %11s  %8.4fx  %8.3f  %8.3f  %8.3f\n", s.version,
                s.full ? "full" : "delta", 100 * s.density(),
                HumanCount(s.changed_elements).c_str(), HumanBytes(s.payload_bytes).c_str(),
                static_cast<double>(s.payload_bytes) / static_cast<double>(s.model_bytes),
                s.diff_seconds + s.encode_seconds, s.send_seconds, apply);
    std::fflush(stdout);
  }
  REFIT_ASSIGN_OR_RAISE(int rc, receiver.Wait());
  if (rc != 0) return Status::Internal("receiver process exited with status " + std::to_string(rc));

  // Bit-exact: the receiver's file against the sender's in-memory bits, byte for byte.
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<SafetensorsFile> received,
                        SafetensorsFile::Open(dir + "/receiver/model.safetensors"));
  uint64_t mismatched = 0;
  for (const TensorView& t : model.bf16()) {
    const TensorView* r = received->Find(t.name);
    if (r == nullptr || r->dtype != t.dtype || r->shape != t.shape ||
        std::memcmp(r->data, t.data, t.nbytes()) != 0) {
      ++mismatched;
    }
  }
  if (received->tensors().size() != model.bf16().size()) ++mismatched;
  std::printf("\nbit-exact: %s (%zu tensors, %s compared against the sender's bits)\n",
              mismatched == 0 ? "yes" : "NO", model.bf16().size(), HumanBytes(model_bytes).c_str());
  if (mismatched != 0) {
    return Status::Corrupt(std::to_string(mismatched) + " tensors differ after the last sync");
  }
  return Status::OK();
}

}  // namespace refit::cli
