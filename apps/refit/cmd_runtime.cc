// refit send / recv / demo: the runtime over a transport.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "commands.h"
#include "common/file_util.h"
#include "common/progress.h"
#include "format/safetensors.h"
#include "format/wire.h"
#include "refit/refit.h"
#include "synthetic/synthetic.h"

namespace refit::cli {

namespace {

using json = nlohmann::ordered_json;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// When the program was loaded: the process's own seconds include plugin loading.
const double kProcessStart = Now();

// "name 0.012 s, ..." of the stages (refit/metrics.h).
std::string StageLine(const std::vector<std::pair<std::string, double>>& stages) {
  std::string line;
  for (const auto& [name, seconds] : stages) {
    char item[64];
    std::snprintf(item, sizeof(item), "%s%s %.3f s", line.empty() ? "" : ", ", name.c_str(),
                  seconds);
    line += item;
  }
  return line;
}

json StagesJson(const std::vector<std::pair<std::string, double>>& stages) {
  json j = json::object();
  for (const auto& [name, seconds] : stages) j[name] = seconds;
  return j;
}

// sender.metrics_file: a file that cannot be written is a warning, not an error, because the
// version is published and scripts retry a failed `refit send` (which would publish another).
void RecordSendMetrics(SenderMetrics& metrics, const Result<SyncStats>& published) {
  Status written = metrics.Record(published);
  if (!written.ok()) {
    std::fprintf(stderr, "refit: warning: sender.metrics_file not written: %s\n",
                 written.message().c_str());
  }
}

}  // namespace

// Shared with `refit serve` (commands.h).
void PrintApplied(const ApplyStats& s, bool as_json) {
  if (as_json) {
    json j = {{"version", s.version},
              {"full", s.full},
              {"records", s.counters.records},
              {"changed_elements", s.counters.changed_elements},
              {"payloads", s.payloads},
              {"payload_bytes", s.payload_bytes},
              {"early_payloads", s.early_payloads},
              {"resumed", s.resumed},
              {"resumed_entries", s.resumed_entries},
              {"resumed_skipped_records", s.resumed_skipped_records},
              {"seconds", s.total_seconds},
              {"process_seconds", Now() - kProcessStart},
              {"stages", StagesJson(ReceiverStageSeconds(s))}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
    return;
  }
  std::printf("applied version %" PRIu64 " (%s): %" PRIu64 " records in %" PRIu64
              " payloads, %s, %.3f s\n",
              s.version, s.full ? "full" : "delta", s.counters.records, s.payloads,
              HumanBytes(s.payload_bytes).c_str(), s.total_seconds);
  std::printf("  stages: %s\n", StageLine(ReceiverStageSeconds(s)).c_str());
  if (s.resumed || s.resumed_entries > 0 || s.resumed_skipped_records > 0) {
    std::printf("  resumed an interrupted apply: replayed %" PRIu64
                " journal entries, skipped %" PRIu64 " records already applied\n",
                s.resumed_entries, s.resumed_skipped_records);
  }
  std::fflush(stdout);
}

namespace {

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

namespace {

// `refit send --json`: the version published (and, with --wait, acknowledged) as one object.
Status PrintSendJson(const SendOptions& o, const Config& config, Sender& sender,
                     const SyncStats& s) {
  json j = {{"version", s.version},
            {"full", s.full},
            {"density", s.counters.density()},
            {"changed_elements", s.counters.changed_elements},
            {"total_elements", s.counters.total_elements},
            {"model_bytes", s.counters.model_bytes},
            {"payload_bytes", s.payload_bytes},
            {"payloads", s.payloads},
            {"adopted_commit", s.adopted_commit},
            {"republished", s.republished},
            {"advance_resumed_entries", s.advance_resumed_entries},
            {"advanced_in_diff", s.advanced_in_diff},
            {"seconds", s.total_seconds},
            {"stages", StagesJson(SenderStageSeconds(s))}};
  if (o.wait) {
    REFIT_ASSIGN_OR_RAISE(double timeout, config.GetDouble("sender.ack_timeout_s", 600));
    const double start = Now();
    REFIT_RETURN_NOT_OK(sender.WaitAndAdvance(timeout));
    j["ack_wait_seconds"] = Now() - start;
    j["acks"] = sender.acks().size();
  }
  j["process_seconds"] = Now() - kProcessStart;
  j["peak_resident_bytes"] = PeakResidentBytes();
  std::printf("%s\n", j.dump().c_str());
  return Status::OK();
}

}  // namespace

Status RunSend(const SendOptions& o) {
  REFIT_ASSIGN_OR_RAISE(Config config, LoadConfigFile(o.config_path));
  // The whole file is checked before anything it leaves out is reported: a typo in a key would
  // otherwise show only once the missing weights are given.
  REFIT_ASSIGN_OR_RAISE(std::shared_ptr<Registry> registry, LoadRegistry(&config));
  REFIT_RETURN_NOT_OK(ValidateConfig(config, *registry));
  std::string weights_path = o.weights;
  if (weights_path.empty()) {
    REFIT_ASSIGN_OR_RAISE(weights_path, config.GetString("sender.weights", ""));
    if (weights_path.empty()) {
      return Status::Invalid("no weights: pass --weights FILE or set sender.weights in " +
                             o.config_path);
    }
  }
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<Sender> sender,
                        Sender::Make(config, o.rank, o.world, std::move(registry)));
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<SenderMetrics> metrics,
                        SenderMetrics::Make(config, o.rank, o.world));
  const double read_start = Now();
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<SafetensorsFile> weights,
                        SafetensorsFile::Open(weights_path));
  const double read_seconds = Now() - read_start;
  internal::ProgressMeter progress("send");
  sender->SetProgress(progress.Callback());
  Result<SyncStats> published = sender->Publish(weights->tensors());
  progress.Finish();
  RecordSendMetrics(*metrics, published);
  REFIT_ASSIGN_OR_RAISE(SyncStats s, std::move(published));
  s.read_seconds = read_seconds;
  if (o.json) return PrintSendJson(o, config, *sender, s);
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
  std::printf(
      "published version %" PRIu64
      " (%s): density %.4f%%, %s changed of %s, payload %s "
      "(%.4fx dense) in %" PRIu64 " payloads, %.3f s\n",
      s.version, s.full ? "full" : "delta", 100 * s.counters.density(),
      HumanCount(s.counters.changed_elements).c_str(),
      HumanCount(s.counters.total_elements).c_str(), HumanBytes(s.payload_bytes).c_str(),
      s.counters.model_bytes ? static_cast<double>(s.payload_bytes) / s.counters.model_bytes : 0.0,
      s.payloads, s.total_seconds);
  std::printf("  stages: %s\n", StageLine(SenderStageSeconds(s)).c_str());
  if (o.wait) {
    REFIT_ASSIGN_OR_RAISE(double timeout, config.GetDouble("sender.ack_timeout_s", 600));
    REFIT_ASSIGN_OR_RAISE(std::vector<std::string> receivers,
                          config.GetStringList("sender.receivers", {}));
    // The wait can last minutes with nothing printed; say once what the process is waiting for.
    std::string names;
    for (const std::string& r : receivers) names += (names.empty() ? "" : ", ") + r;
    std::fprintf(stderr, "refit: waiting for acks of version %" PRIu64 " from %s (timeout %g s)\n",
                 s.version, names.empty() ? "no receivers" : names.c_str(), timeout);
    std::fflush(stderr);
    REFIT_RETURN_NOT_OK(sender->WaitAndAdvance(timeout));
    std::printf("version %" PRIu64 " acknowledged by %zu receivers; baseline advanced\n",
                sender->baseline_version(), sender->acks().size());
  }
  std::printf("peak resident memory: %s (%" PRIu64 " bytes)\n",
              HumanBytes(PeakResidentBytes()).c_str(), PeakResidentBytes());
  return Status::OK();
}

namespace {

// --in-memory: the model lives in this process's memory, attached to the receiver as an inference
// engine's own parameters are (refit_receiver_attach): a full sync is copied into it and a delta
// applied in place, with no model file. The memory holds no version at start: the first
// version this receiver applies must be a full sync (it asks for one).
class MemoryModel {
 public:
  // The tensors of `spec_path` (a JSON list of {"name", "dtype", "shape"}), attached.
  static Result<std::unique_ptr<MemoryModel>> Attach(Receiver& receiver,
                                                     const std::string& spec_path) {
    REFIT_ASSIGN_OR_RAISE(std::string text, internal::ReadSmallFile(spec_path, 64ull << 20));
    REFIT_ASSIGN_OR_RAISE(std::vector<TensorSpec> specs, ParseTensorSpecs(text, spec_path));
    auto model = std::unique_ptr<MemoryModel>(new MemoryModel());
    model->bits_.resize(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      TensorView v;
      v.name = specs[i].name;
      v.dtype = specs[i].dtype;
      v.shape = specs[i].shape;
      REFIT_ASSIGN_OR_RAISE(uint64_t n, NumElements(v.shape));
      uint64_t bytes = 0;
      const bool overflows = __builtin_mul_overflow(n, uint64_t{SizeOf(v.dtype)}, &bytes);
      try {
        if (overflows) throw std::bad_alloc();
        model->bits_[i].resize(bytes);
      } catch (const std::exception&) {  // bad_alloc, or length_error past the vector's bound
        return Status::Invalid(spec_path + ": tensor '" + v.name + "' (" + std::to_string(n) +
                               " elements) does not fit in memory");
      }
      v.data = model->bits_[i].data();
      model->views_.push_back(std::move(v));
    }
    REFIT_RETURN_NOT_OK(receiver.Attach(model->views_).WithContext(spec_path));
    return model;
  }
  Status Write(const std::string& path) const { return WriteSafetensors(path, views_); }

 private:
  MemoryModel() = default;
  std::vector<std::vector<uint8_t>> bits_;
  std::vector<TensorView> views_;
};

// What a `refit recv` poll loop answers: keep polling, or stop with this status.
std::optional<Status> AfterPoll(const RecvOptions& o, Receiver& receiver,
                                const Result<std::optional<ApplyStats>>& r,
                                std::string& last_error) {
  if (!r.ok()) {
    if (!o.follow) return r.status();
    // Following: every failure is reported (once while it repeats) and polling goes on. A
    // failed read is retried, a refused version waits for the next one, a version failing
    // the same way receiver.max_apply_failures times is abandoned for a full sync: no stall.
    if (r.status().message() != last_error) {
      const bool asked = r.status().code() == StatusCode::kVersionMismatch;
      std::fprintf(stderr, "refit: %s; %s\n", r.status().message().c_str(),
                   asked ? "requested a full sync" : "retrying");
      std::fflush(stderr);
      last_error = r.status().message();
    }
  } else if (r.value()) {
    last_error.clear();
    if (!o.quiet || o.json) PrintApplied(*r.value(), o.json);
    if (o.until_version != 0 && receiver.version() >= o.until_version) return Status::OK();
  } else if (o.until_version != 0 && receiver.version() >= o.until_version) {
    // Already there (nothing pending): following would wait for a version never needed.
    if (!o.quiet && !o.json) {
      std::printf("at version %" PRIu64 " (%s)\n", receiver.version(),
                  receiver.model_path().c_str());
    }
    return Status::OK();
  } else if (!o.follow) {
    if (receiver.applying() != 0) {
      return Status::VersionMismatch("the model holds part of version " +
                                     std::to_string(receiver.applying()) +
                                     "; not up to date until a full sync replaces it");
    }
    if (!o.quiet && !o.json) {
      std::printf("up to date at version %" PRIu64 " (%s)\n", receiver.version(),
                  receiver.model_path().c_str());
    }
    return Status::OK();
  }
  return std::nullopt;
}

Status PollUntilDone(const RecvOptions& o, Receiver& receiver, int64_t poll_ms) {
  const double start = Now();
  std::string last_error;
  // Following: once idle for a while after applying, the model is checkpointed (synced, its redo
  // log emptied) off the critical path of the next version, if its log is halfway to a due one.
  constexpr double kIdleCheckpointSeconds = 2;
  double last_applied = 0;
  while (true) {
    Result<std::optional<ApplyStats>> r = receiver.PollOnce();
    if (o.follow && r.ok() && !r.value() && last_applied != 0 &&
        Now() - last_applied > kIdleCheckpointSeconds) {
      last_applied = 0;
      if (Status st = receiver.IdleCheckpoint(); !st.ok()) {
        std::fprintf(stderr, "refit: checkpoint: %s\n", st.message().c_str());
      }
    }
    if (std::optional<Status> done = AfterPoll(o, receiver, r, last_error)) return *done;
    if (r.ok() && r.value()) {
      last_applied = Now();
      continue;  // there may be more pending versions: poll again at once
    }
    if (o.timeout_s > 0 && Now() - start > o.timeout_s) {
      char seconds[32];
      std::snprintf(seconds, sizeof(seconds), "%g", o.timeout_s);
      const std::string awaited = o.until_version != 0
                                      ? "version " + std::to_string(o.until_version)
                                      : std::string("a new version");
      return Status::Timeout("gave up after " + std::string(seconds) + " s waiting for " + awaited +
                             " (the receiver is at version " + std::to_string(receiver.version()) +
                             ")");
    }
    // Woken when the sender's objects arrive (ucx), else after poll_ms (never past --timeout):
    // polling stays the fallback, so a wake that never comes costs poll_ms, not a version.
    double wait_ms = static_cast<double>(poll_ms);
    if (o.timeout_s > 0) {
      wait_ms = std::clamp(1000 * (o.timeout_s - (Now() - start)) + 1, 1.0, wait_ms);
    }
    REFIT_RETURN_NOT_OK(receiver.WaitForArrival(static_cast<uint32_t>(wait_ms)).status());
  }
}

}  // namespace

Status RunRecv(const RecvOptions& o) {
  REFIT_ASSIGN_OR_RAISE(Config config, LoadConfigFile(o.config_path));
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<Receiver> receiver, Receiver::Make(config));
  REFIT_ASSIGN_OR_RAISE(int64_t poll_ms, config.GetInt("receiver.poll_interval_ms", 100));
  std::unique_ptr<MemoryModel> memory;
  if (!o.in_memory.empty()) {
    REFIT_ASSIGN_OR_RAISE(memory, MemoryModel::Attach(*receiver, o.in_memory));
  }
  REFIT_RETURN_NOT_OK(PollUntilDone(o, *receiver, poll_ms));
  if (memory != nullptr && !o.write_model.empty()) return memory->Write(o.write_model);
  return Status::OK();
}

// ------------------------------------------------------------------ demo

Result<uint64_t> CountMismatchedTensors(const std::string& path,
                                        const std::vector<TensorView>& expected) {
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<SafetensorsFile> received, SafetensorsFile::Open(path));
  uint64_t mismatched = received->tensors().size() != expected.size() ? 1 : 0;
  for (const TensorView& t : expected) {
    const TensorView* r = received->Find(t.name);
    if (r == nullptr || r->dtype != t.dtype || r->shape != t.shape ||
        std::memcmp(r->data, t.data, t.nbytes()) != 0) {
      ++mismatched;
    }
  }
  return mismatched;
}

namespace {

// Sender and receiver over the disk transport, all under `dir`.
std::string DemoConfig(const std::string& dir, const std::string& encoding) {
  return "# written by `refit demo`: sender and receiver over the disk transport\n"
         "[sender]\nstate_dir = \"" +
         dir + "/sender\"\nencoding = \"" + encoding +
         "\"\nreceivers = [\"r0\"]\nack_timeout_s = 600\n\n"
         "[receiver]\nid = \"r0\"\nstate_dir = \"" +
         dir +
         "/receiver\"\n\n"
         "[transport]\nname = \"disk\"\n\n[transport.disk]\ndir = \"" +
         dir + "/sync\"\n";
}

// The receiver is a second process: this very binary, `refit recv --follow`.
Result<ChildProcess> StartReceiver(const std::string& config_path, int syncs) {
  return ChildProcess::SpawnSelf({"recv", "--config", config_path, "--follow", "--until-version",
                                  std::to_string(syncs), "--quiet"},
                                 /*quiet_stdout=*/false);
}

// Publishes one version and waits for the receiver's ack, noticing at once if the receiver
// process died; prints the version's row.
Status SyncOnce(Sender& sender, const SyntheticModel& model, ChildProcess& receiver) {
  REFIT_ASSIGN_OR_RAISE(SyncStats s, sender.Publish(model.bf16()));
  while (true) {
    Status st = sender.WaitAndAdvance(0.5);
    if (st.ok()) break;
    if (st.code() != StatusCode::kTimeout) return st;
    if (std::optional<int> rc = receiver.Poll()) {
      return Status::Internal("the receiver process exited with status " + std::to_string(*rc) +
                              " before acknowledging version " + std::to_string(s.version));
    }
  }
  double apply = sender.acks().empty() ? 0 : sender.acks()[0].apply_seconds;
  std::printf("%7" PRIu64 "  %-5s  %7.3f%%  %9s  %11s  %8.4fx  %8.3f  %8.3f  %8.3f\n", s.version,
              s.full ? "full" : "delta", 100 * s.counters.density(),
              HumanCount(s.counters.changed_elements).c_str(), HumanBytes(s.payload_bytes).c_str(),
              static_cast<double>(s.payload_bytes) / static_cast<double>(s.counters.model_bytes),
              s.diff_seconds + s.encode_seconds, s.send_seconds, apply);
  std::fflush(stdout);
  return Status::OK();
}

// Bit-exact: the receiver's file against the sender's in-memory bits, byte for byte.
Status CheckBitExact(const std::string& received_path, const SyntheticModel& model,
                     uint64_t model_bytes) {
  REFIT_ASSIGN_OR_RAISE(uint64_t mismatched, CountMismatchedTensors(received_path, model.bf16()));
  std::printf("\nbit-exact: %s (%zu tensors, %s compared against the sender's bits)\n",
              mismatched == 0 ? "yes" : "NO", model.bf16().size(), HumanBytes(model_bytes).c_str());
  if (mismatched != 0) {
    return Status::Corrupt(std::to_string(mismatched) + " tensors differ after the last sync");
  }
  return Status::OK();
}

}  // namespace

Status RunDemo(const DemoOptions& o) {
  REFIT_ASSIGN_OR_RAISE(const std::string dir, MakeWorkDir(o.dir, "refit-demo"));
  RemoveDirOnExit cleanup{dir, o.dir.empty()};

  const std::string config_path = dir + "/demo.toml";
  REFIT_RETURN_NOT_OK(WriteText(config_path, DemoConfig(dir, o.encoding)));
  REFIT_ASSIGN_OR_RAISE(Config config, LoadConfigFile(config_path));
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<Sender> sender, Sender::Make(config));

  std::printf("refit demo: building a synthetic model of ~%s parameters (bf16)...\n",
              HumanCount(o.params).c_str());
  std::fflush(stdout);
  SyntheticModel model(SyntheticModelSpec::ForParams(o.params, o.seed));
  REFIT_ASSIGN_OR_RAISE(ChildProcess receiver, StartReceiver(config_path, o.syncs));

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
    REFIT_RETURN_NOT_OK(SyncOnce(*sender, model, receiver));
  }
  REFIT_ASSIGN_OR_RAISE(int rc, receiver.Wait(60));  // it exits once it applied the last one
  if (rc != 0) return Status::Internal("receiver process exited with status " + std::to_string(rc));
  return CheckBitExact(dir + "/receiver/model.safetensors", model, model_bytes);
}

void RegisterDemo(CLI::App& app, Commands& commands) {
  struct Flags {
    DemoOptions demo;
    std::string params = "100M";
  };
  auto flags = std::make_shared<Flags>();
  DemoOptions& demo = flags->demo;
  auto* cmd = app.add_subcommand(
      "demo", "Run sender and receiver (two processes, disk transport) on a synthetic model");
  cmd->add_option("--params", flags->params, "model size, e.g. 100M, 1.5G")->capture_default_str();
  cmd->add_option("--syncs", demo.syncs, "versions to publish (the first is full)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--lr", demo.lr, "learning rate of the synthetic Adam steps")
      ->capture_default_str();
  cmd->add_option("--encoding", demo.encoding, "encoding of delta records")->capture_default_str();
  cmd->add_option("--dir", demo.dir, "work directory to keep (default: a temp dir, removed)");
  cmd->add_option("--seed", demo.seed, "random seed")->capture_default_str();
  commands.push_back({cmd, [flags]() -> Status {
                        REFIT_ASSIGN_OR_RAISE(flags->demo.params, ParseCount(flags->params));
                        return RunDemo(flags->demo);
                      }});
}

void RegisterSendRecv(CLI::App& app, Commands& commands) {
  auto send = std::make_shared<SendOptions>();
  auto* send_cmd = app.add_subcommand("send", "Publish the next version of the weights");
  send_cmd->add_option("--config", send->config_path, "TOML config")->required();
  send_cmd->add_option("--weights", send->weights, "safetensors file (default: sender.weights)");
  send_cmd->add_option("--rank", send->rank, "this sender's rank")->capture_default_str();
  send_cmd->add_option("--world", send->world, "number of sender ranks")->capture_default_str();
  send_cmd->add_flag("--wait", send->wait, "wait for the receivers' acks before exiting");
  send_cmd->add_flag("--json", send->json,
                     "print one JSON object (counts, seconds per stage) instead of the summary");
  commands.push_back({send_cmd, [send] { return RunSend(*send); }});

  auto recv = std::make_shared<RecvOptions>();
  auto* recv_cmd = app.add_subcommand("recv", "Apply pending versions into the receiver's model");
  recv_cmd->add_option("--config", recv->config_path, "TOML config")->required();
  auto* follow = recv_cmd->add_flag("--follow", recv->follow, "keep polling for new versions");
  // Without --follow recv returns after one poll, so these would be silently ignored.
  recv_cmd
      ->add_option("--until-version", recv->until_version,
                   "with --follow: exit once this version is applied (or already is)")
      ->check(CLI::NonNegativeNumber)
      ->needs(follow);
  recv_cmd
      ->add_option("--timeout", recv->timeout_s, "with --follow: give up after SECONDS (0: never)")
      ->check(CLI::NonNegativeNumber)
      ->needs(follow);
  auto* in_memory =
      recv_cmd
          ->add_option("--in-memory", recv->in_memory,
                       "hold the model in this process's memory, as an engine attached through "
                       "the C API does (no model file): SPEC lists its tensors as JSON "
                       "[{\"name\", \"dtype\", \"shape\"}]; the first version must be full")
          ->check(CLI::ExistingFile)
          ->needs(follow);
  recv_cmd
      ->add_option("--write-model", recv->write_model,
                   "with --in-memory: write the model to FILE (safetensors) once done")
      ->needs(in_memory);
  recv_cmd->add_flag("--quiet", recv->quiet, "print nothing on success");
  recv_cmd->add_flag("--json", recv->json,
                     "print one JSON object per applied version (counts, seconds per stage)");
  commands.push_back({recv_cmd, [recv] { return RunRecv(*recv); }});
}

}  // namespace refit::cli
