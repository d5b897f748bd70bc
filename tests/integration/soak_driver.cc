// refit_soak: the soak test of docs/reliability.md. A real sender (`refit send` once per trainer
// step, weights from a synthetic model stepped each time) and a real receiver (`refit recv
// --follow`) run over the disk transport (or, with --transport ucx, over the ucx transport: each
// `refit send` listens on a free port published in a rendezvous file and keeps its objects in a
// spool directory; the receiver reconnects to every new sender) with [faults] on in both (random
// put/get faults at every operation, kills at every named protocol point), while this driver also
// SIGKILLs either process at random moments. Every committed version's weights digest is kept;
// whenever the receiver's state says it holds version V (not mid-apply), its model must equal
// version V bit for bit. At the end faults stop, a final version is published, and the receiver
// must reach it exactly.
//
//   refit_soak --syncs 200 [--seed 1] [--dir DIR] [--params 200000] [--require-journal-resume]
//              [--keep-versions K] [--transport disk|ucx] [--tls TLS]
//
// Exit status 0 only when every check passed, the final version was reached bit-exact and
// full-sync fallbacks stayed <= 5% of recoveries (and, when asked, a journal resume happened;
// with --keep-versions, the store never held more than K+1 committed versions after a send).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_harness.h"
#include "format/safetensors.h"
#include "refit/refit.h"
#include "synthetic/synthetic.h"

namespace refit::soak {
namespace {

namespace fs = std::filesystem;
using testing::ReadAll;
using testing::WriteAll;

struct Options {
  int syncs = 30;
  uint64_t seed = 1;
  std::string dir;
  uint64_t params = 200'000;
  double lr = 3e-3;
  bool verbose = false;
  // Fail unless an interrupted xor/step apply resumed through the journal at least once (a long
  // run meets one for sure; a short one may not, and must not be flaky for it).
  bool require_journal_resume = false;
  // sender.keep_versions for every send, and the bound checked after each: at most K+1
  // committed versions in the store (the K kept and the one being published). Unset: the
  // config default, unchecked.
  std::optional<uint64_t> keep_versions;
  std::string transport = "disk";  // or "ucx"
  std::string tls = "tcp";         // [transport.ucx] tls, with --transport ucx
};

// A child `refit` process with its output in files, that can be polled, stopped and killed.
class Child {
 public:
  Child() = default;
  Child(const std::vector<std::string>& args, const std::string& prefix) : prefix_(prefix) {
    pid_ = ::fork();
    if (pid_ == 0) {
      int out = ::open((prefix + ".out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = ::open((prefix + ".err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(out, 1);
      ::dup2(err, 2);
      std::vector<std::string> copy = args;
      std::string bin = REFIT_CLI_PATH;
      std::vector<char*> argv{bin.data()};
      for (std::string& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(bin.c_str(), argv.data());
      std::_Exit(127);
    }
  }
  bool running() const { return pid_ > 0; }
  // Exit code (128 + signal when killed) once it ended.
  std::optional<int> Poll(bool block = false) {
    if (pid_ <= 0) return exit_code_;
    int status = 0;
    if (::waitpid(pid_, &status, block ? 0 : WNOHANG) != pid_) return std::nullopt;
    pid_ = -1;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return exit_code_;
  }
  void Signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  std::string Out() const { return ReadAll(prefix_ + ".out"); }
  std::string Err() const { return ReadAll(prefix_ + ".err"); }

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::string prefix_;
};

uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E5ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class Soak {
 public:
  explicit Soak(Options o) : o_(std::move(o)), rng_(o_.seed) {}

  int Run() {
    if (o_.dir.empty()) {
      temp_.emplace();
      dir_ = temp_->path();
    } else {
      dir_ = o_.dir;
      fs::remove_all(dir_);
      fs::create_directories(dir_);
    }
    fs::create_directories(dir_ + "/logs");
    SyntheticModel model(SyntheticModelSpec::ForParams(o_.params, o_.seed));
    const auto start = std::chrono::steady_clock::now();

    StartReceiver(/*faults=*/true);
    for (int step = 1; step <= o_.syncs && failures_.empty(); ++step) {
      if (step > 1) model.Step(o_.lr);
      if (!Publish(model, step, /*faults=*/true)) break;
      CheckWhileStopped();
    }
    // Faults stop: a clean receiver and sender must reach one more version, exactly.
    StopReceiver();
    if (failures_.empty()) Finish(model);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return Report(seconds);
  }

 private:
  std::string Config(bool sender_side, bool faults, const std::string& encoding) {
    std::ostringstream c;
    c << "[sender]\nstate_dir = \"" << dir_ << "/sender\"\nreceivers = [\"r0\"]\n"
      << "ack_timeout_s = 60\npoll_interval_ms = 10\nchunk_bytes = \"16KiB\"\n"
      << "bucket_bytes = \"48KiB\"\nthreads = 1\nencoding = \"" << encoding << "\"\n";
    if (o_.keep_versions) c << "keep_versions = " << *o_.keep_versions << "\n";
    c << "\n"
      << "[receiver]\nid = \"r0\"\nstate_dir = \"" << dir_ << "/receiver\"\n"
      << "poll_interval_ms = 10\n\n";
    TransportConfig(c);
    if (faults) {
      // A fresh seed per process start: a restarted process must not replay the same kill.
      c << "\n[faults]\nseed = " << (Mix(o_.seed, ++launches_) & 0x7fffffffffffull) << "\n"
        << "log = \"" << dir_ << "/faults.log\"\n"
        << "drop_put = 0.02\ntruncate_put = 0.02\ncorrupt_put = 0.02\n"
        << "enospc_put = 0.006\neio_put = 0.006\nfail_get = 0.01\ncorrupt_get = 0.01\n"
        << "delay = 0.02\ndelay_ms = 5\n";
      // Each process start arms one kill point, so that every point gets its share of kills:
      // points met once per version get a high probability, points met per payload or record
      // (and the journal point, met per xor/step record) a low one.
      static const char* const kSenderPoints[] = {
          "sender.payload_put", "sender.manifest_put", "sender.commit_put", "sender.advance",
          "sender.retention",   "receiver.journaled",  "redo.overlay_write"};
      static const char* const kReceiverPoints[] = {"receiver.applying", "receiver.record_applied",
                                                    "receiver.journaled", "receiver.model_synced",
                                                    "receiver.ack"};
      const std::string point =
          sender_side ? kSenderPoints[rng_() % 7] : kReceiverPoints[rng_() % 5];
      const bool once_per_version = point == "sender.manifest_put" || point == "sender.retention" ||
                                    point == "redo.overlay_write" || point == "sender.commit_put" ||
                                    point == "receiver.applying" ||
                                    point == "receiver.model_synced" || point == "receiver.ack";
      c << "kill_points = [\"" << point << "\"]\nkill = " << (once_per_version ? 0.12 : 0.03)
        << "\n";
    }
    return c.str();
  }

  // The directory holding the sender's objects, laid out as a disk transport's: the disk
  // transport's dir, or the ucx sender's spool (the same engine).
  std::string StoreDir() const { return dir_ + (o_.transport == "ucx" ? "/spool" : "/sync"); }

  void TransportConfig(std::ostringstream& c) const {
    if (o_.transport != "ucx") {
      c << "[transport]\nname = \"disk\"\n\n[transport.disk]\ndir = \"" << StoreDir()
        << "\"\nfsync = false\n";
      return;
    }
    // One config for both sides: the sender listens on a free port and writes it to the
    // rendezvous file, the receiver reads that file on every (re)connect. Short connect and
    // backoff bounds: a new `refit send` runs every few hundred ms.
    c << "[transport]\nname = \"ucx\"\n\n[transport.ucx]\nlisten = \"127.0.0.1:0\"\n"
      << "rendezvous_file = \"" << dir_ << "/sender.addr\"\nspool_dir = \"" << StoreDir()
      << "\"\nspool_fsync = false\ntls = \"" << o_.tls << "\"\nconnect_timeout_ms = 200\n"
      << "reconnect_max_ms = 200\n";
  }

  void StartReceiver(bool faults) {
    const std::string path = dir_ + "/recv.toml";
    WriteAll(path, Config(false, faults, "auto"));
    std::vector<std::string> args = {"recv", "--config", path, "--follow"};
    receiver_ = Child(args, dir_ + "/logs/recv" + std::to_string(receiver_runs_++));
  }

  // The receiver's output so far, tallied once it ended.
  void TallyReceiver(const Child& r) {
    const std::string out = r.Out();
    const std::string err = r.Err();
    for (size_t at = out.find("resumed an interrupted apply: replayed "); at != std::string::npos;
         at = out.find("resumed an interrupted apply: replayed ", at + 1)) {
      const uint64_t entries = std::strtoull(out.c_str() + at + 39, nullptr, 10);
      ++recoveries_[entries > 0 ? "receiver journal resume" : "receiver overwrite re-apply"];
    }
    recoveries_["receiver retry (failed/corrupt read)"] += Count(err, "; retrying");
    const size_t need_full = Count(err, "requested a full sync");
    recoveries_["need-full / full-sync fallback"] += need_full;
    applied_full_after_first_ += Count(out, "(full)");
    applied_ += Count(out, "applied version ");
  }

  // Restarts the receiver if it died, after checking what it left.
  void Watch() {
    std::optional<int> rc = receiver_.Poll();
    if (!rc) return;
    TallyReceiver(receiver_);
    if (*rc == 128 + SIGKILL) {
      ++kills_[receiver_killed_by_driver_ ? "receiver (driver SIGKILL)" : "receiver (kill point)"];
      // Mid-apply, the restarted receiver's resume line classifies the recovery (journal or
      // overwrite re-apply); otherwise its state was intact and it simply goes on.
      auto j = nlohmann::json::parse(ReadAll(dir_ + "/receiver/receiver.json"), nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("applying")) {
        ++recoveries_["receiver restart (state intact)"];
      }
    } else {
      Fail("the receiver exited with status " + std::to_string(*rc) + ": " + receiver_.Err());
    }
    receiver_killed_by_driver_ = false;
    CheckReceiver("after the receiver died");
    StartReceiver(/*faults=*/true);
  }

  void ScanCommits(uint64_t digest) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(StoreDir(), ec)) {
      const std::string name = entry.path().filename().string();
      if (name.size() != 9 || name[0] != 'v') continue;
      const uint64_t v = std::strtoull(name.c_str() + 1, nullptr, 10);
      if (committed_.count(v) || !fs::exists(entry.path() / "COMMIT")) continue;
      committed_[v] = digest;
    }
  }

  // After each send: the versions the store (the ucx sender's spool too) holds (directories with a
  // COMMIT) stay within keep_versions + 1; directories without one are leftovers of a deletion or
  // an attempt.
  void CheckRetention() {
    uint64_t versions = 0, dirs = 0;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(StoreDir(), ec)) {
      const std::string name = entry.path().filename().string();
      if (name.size() != 9 || name[0] != 'v') continue;
      ++dirs;
      versions += fs::exists(entry.path() / "COMMIT") ? 1 : 0;
    }
    max_versions_held_ = std::max(max_versions_held_, versions);
    max_dirs_held_ = std::max(max_dirs_held_, dirs);
    if (o_.keep_versions && versions > *o_.keep_versions + 1) {
      Fail("the store holds " + std::to_string(versions) + " committed versions, over " +
           "keep_versions + 1 = " + std::to_string(*o_.keep_versions + 1));
    }
  }

  // The receiver's state and model, read while it is dead or stopped: a version that is not
  // mid-apply must be, bit for bit, the committed version of that number.
  void CheckReceiver(const std::string& when) {
    auto text = ReadAll(dir_ + "/receiver/receiver.json");
    if (text.empty()) return;  // nothing committed yet
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      Fail("unreadable receiver.json " + when);
      return;
    }
    const uint64_t version = j.value("version", uint64_t{0});
    if (version == 0 || j.contains("applying") || j.contains("replacing")) {
      ++checks_mid_apply_;
      return;
    }
    auto model = SafetensorsFile::Open(dir_ + "/receiver/model.safetensors");
    if (!model.ok()) {
      Fail("receiver model unreadable " + when + ": " + model.status().message());
      return;
    }
    const uint64_t digest = ModelDigest(model.value()->tensors());
    auto it = committed_.find(version);
    if (it == committed_.end()) {
      Fail("receiver holds version " + std::to_string(version) + ", never committed (" + when +
           ")");
    } else if (it->second != digest) {
      bool other = false;
      for (const auto& [v, d] : committed_) other = other || d == digest;
      Fail("receiver's model is not version " + std::to_string(version) + " " + when +
           (other ? " (it is another committed version)" : " (it is no committed version: a mix)"));
    } else {
      ++checks_passed_;
    }
  }

  // Between two steps: lets the receiver catch up with the newest commit (a few seconds at
  // most, restarting it if it dies), then stops it for a moment (SIGSTOP) to check it.
  void CheckWhileStopped() {
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t newest = committed_.empty() ? 0 : committed_.rbegin()->first;
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
      Watch();
      auto j = nlohmann::json::parse(ReadAll(dir_ + "/receiver/receiver.json"), nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.value("version", uint64_t{0}) == newest &&
          !j.contains("applying")) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!receiver_.running()) return;
    receiver_.Signal(SIGSTOP);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    CheckReceiver("between steps");
    receiver_.Signal(SIGCONT);
  }

  void StopReceiver() {
    if (receiver_.running()) {
      receiver_.Signal(SIGKILL);
      receiver_.Poll(/*block=*/true);
      TallyReceiver(receiver_);
      CheckReceiver("when faults stopped");
    }
  }

  // Publishes one trainer step, retrying until a `refit send` succeeds.
  bool Publish(SyntheticModel& model, int step, bool faults) {
    const std::string weights = dir_ + "/w.safetensors";
    if (!WriteSafetensors(weights, model.bf16()).ok()) {
      Fail("cannot write " + weights);
      return false;
    }
    const uint64_t digest = ModelDigest(model.bf16());
    static const char* const kEncodings[] = {"xor", "ctx", "auto", "indices"};
    const std::string encoding = kEncodings[step % 4];
    std::uniform_real_distribution<double> u(0, 1);
    for (int attempt = 0; attempt < 40; ++attempt) {
      const std::string config = dir_ + "/send.toml";
      WriteAll(config, Config(true, faults, encoding));
      Child sender({"send", "--config", config, "--weights", weights},
                   dir_ + "/logs/send" + std::to_string(sender_runs_++));
      // The driver's own SIGKILLs, at a random moment of this attempt.
      const bool kill_sender = faults && u(rng_) < 0.06;
      const bool kill_receiver = faults && u(rng_) < 0.06;
      const auto t0 = std::chrono::steady_clock::now();
      const double sender_at = u(rng_) * 0.3, receiver_at = u(rng_) * 0.5;
      bool sender_killed = false, receiver_killed = false;
      std::optional<int> rc;
      while (!(rc = sender.Poll())) {
        const double t =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (kill_sender && !sender_killed && t >= sender_at) {
          sender.Signal(SIGKILL);
          sender_killed = true;
        }
        if (kill_receiver && !receiver_killed && t >= receiver_at && receiver_.running()) {
          receiver_.Signal(SIGKILL);
          receiver_killed = receiver_killed_by_driver_ = true;
        }
        if (faults) Watch();
        if (t > 300) {
          sender.Signal(SIGKILL);
          Fail("a send ran for 300 s: " + sender.Err());
          return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      ScanCommits(digest);
      CheckRetention();
      if (attempt > 0) ClassifySenderRecovery(sender.Out());
      if (*rc == 0) {
        if (o_.verbose) std::printf("step %d published after %d attempts\n", step, attempt + 1);
        return true;
      }
      if (*rc == 128 + SIGKILL) {
        ++kills_[sender_killed ? "sender (driver SIGKILL)" : "sender (kill point)"];
      } else {
        ++sender_errors_;
        if (o_.verbose) std::printf("step %d: send failed: %s", step, sender.Err().c_str());
      }
    }
    Fail("step " + std::to_string(step) + " could not be published in 40 attempts");
    return false;
  }

  void Finish(SyntheticModel& model) {
    model.Step(o_.lr);
    const std::string weights = dir_ + "/w.safetensors";
    if (!WriteSafetensors(weights, model.bf16()).ok()) {
      Fail("cannot write " + weights);
      return;
    }
    StartReceiver(/*faults=*/false);
    const std::string config = dir_ + "/send.toml";
    WriteAll(config, Config(true, false, "xor"));
    // --wait: returns once the receiver acknowledged the final version (it is then committed in
    // the receiver's state too).
    Child sender({"send", "--config", config, "--weights", weights, "--wait"},
                 dir_ + "/logs/send-final");
    std::optional<int> rc;
    const auto t0 = std::chrono::steady_clock::now();
    while (!(rc = sender.Poll())) {
      if (auto r = receiver_.Poll()) {
        Fail("the clean receiver exited with status " + std::to_string(*r) + ": " +
             receiver_.Err());
        sender.Signal(SIGKILL);
        sender.Poll(true);
        return;
      }
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(300)) {
        Fail("the final send did not finish within 300 s");
        sender.Signal(SIGKILL);
        sender.Poll(true);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (*rc != 0) {
      Fail("the final send failed: " + sender.Err());
      return;
    }
    ScanCommits(ModelDigest(model.bf16()));
    CheckRetention();
    final_version_ = committed_.rbegin()->first;
    StopReceiver();
    auto received = SafetensorsFile::Open(dir_ + "/receiver/model.safetensors");
    if (!received.ok()) {
      Fail(received.status().message());
      return;
    }
    auto j = nlohmann::json::parse(ReadAll(dir_ + "/receiver/receiver.json"), nullptr, false);
    if (j.is_discarded() || j.value("version", uint64_t{0}) != final_version_) {
      Fail("the receiver did not reach the final version " + std::to_string(final_version_));
      return;
    }
    for (const TensorView& t : model.bf16()) {
      const TensorView* r = received.value()->Find(t.name);
      if (r == nullptr || r->nbytes() != t.nbytes() ||
          std::memcmp(r->data, t.data, t.nbytes()) != 0) {
        Fail("final model differs in " + t.name);
        return;
      }
    }
    final_exact_ = true;
  }

  // One recovery per failed attempt, by what the next attempt had to do.
  void ClassifySenderRecovery(const std::string& out) {
    if (Count(out, "adopted") > 0) {
      ++recoveries_["sender adopted its committed version"];
    } else if (Count(out, "republished") > 0) {
      ++recoveries_["sender republished (died before commit)"];
    } else if (Count(out, "baseline advance resumed") > 0) {
      ++recoveries_["sender advance journal resume"];
    } else {
      ++recoveries_["sender retry (state intact)"];
    }
  }

  void Fail(const std::string& what) {
    failures_.push_back(what);
    std::fprintf(stderr, "soak: FAILED: %s\n", what.c_str());
  }

  int Report(double seconds) {
    std::map<std::string, uint64_t> faults;
    std::istringstream log(ReadAll(dir_ + "/faults.log"));
    std::string kind, key;
    while (log >> kind >> key) ++faults[kind];
    uint64_t total_faults = 0, total_recoveries = 0, total_kills = 0;
    std::printf("soak: %d trainer steps, seed %" PRIu64 ", transport %s, %.1f s, work dir %s\n",
                o_.syncs, o_.seed,
                (o_.transport == "ucx" ? "ucx (tls " + o_.tls + ")" : o_.transport).c_str(),
                seconds, dir_.c_str());
    std::printf(
        "syncs: %zu versions committed, %zu applies reported by receiver processes, "
        "final version %" PRIu64 " %s\n",
        committed_.size(), applied_, final_version_,
        final_exact_ ? "reached bit-exact (zero syncs lost)" : "NOT reached");
    std::printf("faults injected by kind:\n");
    for (const auto& [k, n] : faults) {
      std::printf("  %-24s %" PRIu64 "\n", k.c_str(), n);
      total_faults += n;
    }
    std::printf("  %-24s %" PRIu64 "\n", "total", total_faults);
    std::printf("kills (SIGKILL):\n");
    for (const auto& [k, n] : kills_) {
      std::printf("  %-40s %" PRIu64 "\n", k.c_str(), n);
      total_kills += n;
    }
    std::printf("  %-40s %" PRIu64 "\n", "total", total_kills);
    std::printf("sends failed with an error (retried): %" PRIu64 "\n", sender_errors_);
    std::printf("recoveries by path:\n");
    for (const auto& [k, n] : recoveries_) {
      std::printf("  %-40s %" PRIu64 "\n", k.c_str(), n);
      total_recoveries += n;
    }
    std::printf("  %-40s %" PRIu64 "\n", "total", total_recoveries);
    const uint64_t fallbacks = recoveries_["need-full / full-sync fallback"];
    const double pct = total_recoveries ? 100.0 * fallbacks / total_recoveries : 0.0;
    const uint64_t journal = recoveries_["receiver journal resume"];
    std::printf("full-sync fallbacks: %" PRIu64
                " (%.2f%% of recoveries; full versions applied "
                "after the first: %zu)\n",
                fallbacks, pct, applied_full_after_first_ > 0 ? applied_full_after_first_ - 1 : 0);
    std::printf("journal resumes (xor/step records): %" PRIu64 "\n", journal);
    std::printf("receiver checks: %" PRIu64 " bit-exact equal to their committed version, %" PRIu64
                " skipped mid-apply, %zu failed\n",
                checks_passed_, checks_mid_apply_, failures_.size());
    std::printf("store: at most %" PRIu64
                " committed versions held after a send (%s), at most %" PRIu64
                " version directories\n",
                max_versions_held_,
                o_.keep_versions ? ("keep_versions " + std::to_string(*o_.keep_versions) +
                                    ", limit " + std::to_string(*o_.keep_versions + 1))
                                       .c_str()
                                 : "keep_versions: config default, unchecked",
                max_dirs_held_);
    bool ok = failures_.empty() && final_exact_ && pct <= 5.0;
    if (o_.require_journal_resume && journal == 0) {
      std::printf("soak: FAILED: no journal resume happened\n");
      ok = false;
    }
    std::printf("soak: %s\n", ok ? "PASSED" : "FAILED");
    return ok ? 0 : 1;
  }

  Options o_;
  std::mt19937_64 rng_;
  std::optional<testing::TempDir> temp_;
  std::string dir_;
  Child receiver_;
  bool receiver_killed_by_driver_ = false;
  uint64_t launches_ = 0;
  int receiver_runs_ = 0;
  int sender_runs_ = 0;
  uint64_t final_version_ = 0;
  bool final_exact_ = false;
  std::map<uint64_t, uint64_t> committed_;  // version -> ModelDigest of its weights
  std::map<std::string, uint64_t> kills_;
  std::map<std::string, uint64_t> recoveries_;
  uint64_t sender_errors_ = 0;
  size_t applied_ = 0;
  size_t applied_full_after_first_ = 0;
  uint64_t checks_passed_ = 0;
  uint64_t checks_mid_apply_ = 0;
  uint64_t max_versions_held_ = 0;
  uint64_t max_dirs_held_ = 0;
  std::vector<std::string> failures_;
};

}  // namespace
}  // namespace refit::soak

int main(int argc, char** argv) {
  refit::soak::Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--syncs") {
      o.syncs = std::atoi(next().c_str());
    } else if (a == "--seed") {
      o.seed = std::strtoull(next().c_str(), nullptr, 10);
    } else if (a == "--dir") {
      o.dir = next();
    } else if (a == "--params") {
      o.params = std::strtoull(next().c_str(), nullptr, 10);
    } else if (a == "--verbose") {
      o.verbose = true;
    } else if (a == "--require-journal-resume") {
      o.require_journal_resume = true;
    } else if (a == "--keep-versions") {
      o.keep_versions = std::strtoull(next().c_str(), nullptr, 10);
    } else if (a == "--transport" && i + 1 < argc &&
               (argv[i + 1] == std::string("disk") || argv[i + 1] == std::string("ucx"))) {
      o.transport = next();
    } else if (a == "--tls" && i + 1 < argc) {
      o.tls = next();
    } else {
      std::fprintf(
          stderr,
          "usage: refit_soak [--syncs N] [--seed S] [--dir DIR] [--params N] "
          "[--require-journal-resume] [--keep-versions K] [--transport disk|ucx] [--tls TLS] "
          "[--verbose]\n");
      return 2;
    }
  }
  if (o.syncs < 1) o.syncs = 1;
  return refit::soak::Soak(o).Run();
}
