// Fault injection: named crash points (REFIT_KILL_AT, [faults] kill) and the transport decorator
// of [faults] (faults.h).
#include "faults/faults.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/stopwatch.h"
#include "protocol/verified_io.h"
#include "refit/kernels/diff.h"
#include "refit/sdk/plugin.hpp"

namespace refit::internal {

namespace {

std::shared_ptr<FaultInjector>& KillFaults() {
  static std::shared_ptr<FaultInjector> faults;
  return faults;
}
std::mutex& KillFaultsMutex() {
  static std::mutex mu;
  return mu;
}

}  // namespace

const std::vector<std::string>& KillPoints() {
  static const std::vector<std::string> points = {
      "sender.payload_put",       // a payload put returned, more may follow
      "sender.manifest_put",      // this rank's manifest is stored, the commit is not
      "sender.commit_put",        // the commit is stored, the sender's state does not say so yet
      "sender.advance",           // mid baseline advance: some of our records are in the baseline
      "sender.retention",         // an expired version's COMMIT is removed, its other objects not
      "receiver.applying",        // the state says `applying`, nothing written into the model yet
      "receiver.record_applied",  // a record is in the model, more of the version remain
      "receiver.journaled",  // a batch of records is in the redo log, its bits not yet in the file
      "redo.replay",         // mid replay of a redo log into the model or the baseline
      "redo.checkpoint",     // a checkpoint is due: the file's pages are not synced yet
      "redo.checkpoint_synced",  // the file is synced, its redo log not yet emptied
      "receiver.model_synced",   // the model is the new version, the state does not say so yet
      "receiver.ack",            // the state says the new version, its ack is not written yet
  };
  return points;
}

void MaybeKillAt(const char* point) {
  static const char* const spec = std::getenv("REFIT_KILL_AT");
  if (spec != nullptr) {
    const char* colon = std::strchr(spec, ':');
    const size_t name_len =
        colon != nullptr ? static_cast<size_t>(colon - spec) : std::strlen(spec);
    if (std::strlen(point) == name_len && std::strncmp(spec, point, name_len) == 0) {
      static std::atomic<long> hits{0};
      const long wanted = colon != nullptr ? std::strtol(colon + 1, nullptr, 10) : 1;
      if (++hits == wanted) ::kill(::getpid(), SIGKILL);
    }
  }
  std::shared_ptr<FaultInjector> faults;
  {
    std::lock_guard<std::mutex> lock(KillFaultsMutex());
    faults = KillFaults();
  }
  if (faults != nullptr) faults->MaybeKill(point);
}

void InstallKillFaults(std::shared_ptr<FaultInjector> faults) {
  std::lock_guard<std::mutex> lock(KillFaultsMutex());
  KillFaults() = std::move(faults);
}

// ---------------------------------------------------------------- config

namespace {

// The probability keys of [faults]: one row gives the key, its FaultOptions field and its doc.
struct ProbabilityKey {
  const char* key;
  double FaultOptions::*field;
  const char* meaning;
};
constexpr ProbabilityKey kProbabilityKeys[] = {
    {"drop_put", &FaultOptions::drop_put, "probability a put reports success and writes nothing"},
    {"truncate_put", &FaultOptions::truncate_put,
     "probability a put writes a strict prefix and reports success"},
    {"corrupt_put", &FaultOptions::corrupt_put,
     "probability a put flips bytes of what it writes and reports success"},
    {"enospc_put", &FaultOptions::enospc_put, "probability a put fails with ENOSPC"},
    {"eio_put", &FaultOptions::eio_put, "probability a put fails with EIO"},
    {"fail_get", &FaultOptions::fail_get, "probability a read fails with EIO"},
    {"corrupt_get", &FaultOptions::corrupt_get, "probability a read returns flipped bytes"},
    {"delay", &FaultOptions::delay, "probability any transport operation is delayed"},
    {"kill", &FaultOptions::kill,
     "probability the process is killed (SIGKILL) at each visit of a kill point"},
};

}  // namespace

std::vector<ConfigKeySpec> FaultConfigSpecs() {
  std::vector<ConfigKeySpec> specs = {
      {"enabled", REFIT_CFG_BOOL, "true", "inject the faults of this section"},
      {"seed", REFIT_CFG_INT, "0", "seed of every fault decision (a run is reproducible from it)"},
      {"delay_ms", REFIT_CFG_INT, "20", "longest injected delay, milliseconds"},
      {"kill_points", REFIT_CFG_STRING_LIST, "[]",
       "kill points armed (docs/reliability.md); empty: every point"},
      {"log", REFIT_CFG_STRING, "\"\"", "file every injected fault is appended to"},
  };
  for (const ProbabilityKey& p : kProbabilityKeys) {
    specs.push_back({p.key, REFIT_CFG_DOUBLE, "0", p.meaning});
  }
  return specs;
}

Result<std::optional<FaultOptions>> FaultOptionsFromConfig(const Config& config) {
  if (config.KeysUnder("faults").empty()) return std::optional<FaultOptions>();
  REFIT_ASSIGN_OR_RAISE(bool enabled, config.GetBool("faults.enabled", true));
  if (!enabled) return std::optional<FaultOptions>();
  FaultOptions o;
  REFIT_ASSIGN_OR_RAISE(int64_t seed, config.GetInt("faults.seed", 0));
  o.seed = static_cast<uint64_t>(seed);
  for (const ProbabilityKey& p : kProbabilityKeys) {
    const std::string key = std::string("faults.") + p.key;
    double& value = o.*p.field;
    REFIT_ASSIGN_OR_RAISE(value, config.GetDouble(key, 0));
    if (!(value >= 0 && value <= 1)) {
      return Status::Invalid(config.Where(key) + ": " + key + " must be a probability in [0, 1]");
    }
  }
  if (o.drop_put + o.truncate_put + o.corrupt_put + o.enospc_put + o.eio_put > 1) {
    return Status::Invalid(config.Where("faults.drop_put") +
                           ": the put fault probabilities of [faults] sum to more than 1");
  }
  if (o.fail_get + o.corrupt_get > 1) {
    return Status::Invalid(config.Where("faults.fail_get") +
                           ": faults.fail_get + faults.corrupt_get is more than 1");
  }
  REFIT_ASSIGN_OR_RAISE(int64_t delay_ms, config.GetInt("faults.delay_ms", 20));
  if (delay_ms < 1 || delay_ms > 60'000) {
    return Status::Invalid(config.Where("faults.delay_ms") +
                           ": faults.delay_ms must be in [1, 60000]");
  }
  o.delay_ms = static_cast<uint64_t>(delay_ms);
  REFIT_ASSIGN_OR_RAISE(o.kill_points, config.GetStringList("faults.kill_points", {}));
  for (const std::string& point : o.kill_points) {
    const auto& known = KillPoints();
    if (std::find(known.begin(), known.end(), point) == known.end()) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      return Status::Invalid(config.Where("faults.kill_points") + ": unknown kill point '" + point +
                             "' (known: " + list + ")");
    }
  }
  REFIT_ASSIGN_OR_RAISE(o.log, config.GetString("faults.log", ""));
  return std::optional<FaultOptions>(std::move(o));
}

// ---------------------------------------------------------------- injector

FaultInjector::FaultInjector(FaultOptions options) : options_(std::move(options)) {}

uint64_t FaultInjector::Next(std::string_view op, std::string_view key) {
  std::string id(op);
  id.push_back('\0');
  id.append(key);
  uint64_t n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    n = seen_[id]++;
  }
  // (seed, op, key, n) -> 64 bits: the same for every run with this seed, whatever the threads.
  id.push_back('\0');
  id.append(reinterpret_cast<const char*>(&options_.seed), sizeof(options_.seed));
  id.append(reinterpret_cast<const char*>(&n), sizeof(n));
  return kernels::Digest64(id.data(), id.size());
}

double FaultInjector::Draw(std::string_view op, std::string_view key) {
  return static_cast<double>(Next(op, key) >> 11) * 0x1.0p-53;
}

uint64_t FaultInjector::Bits(std::string_view op, std::string_view key) {
  return Next(std::string(op) + ".bits", key);
}

void FaultInjector::Record(std::string_view kind, std::string_view key) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_[std::string(kind)];
  }
  if (options_.log.empty()) return;
  // One O_APPEND write per line: lines of concurrent processes never interleave.
  std::string line = std::string(kind) + " " + std::string(key) + "\n";
  int fd = ::open(options_.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  ssize_t written = ::write(fd, line.data(), line.size());
  (void)written;  // the log is best effort: a fault is injected whether or not it is logged
  ::close(fd);
}

std::map<std::string, uint64_t> FaultInjector::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

uint64_t FaultInjector::total() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const auto& [kind, count] : counts_) n += count;
  return n;
}

void FaultInjector::MaybeKill(const char* point) {
  if (options_.kill <= 0) return;
  if (!options_.kill_points.empty() &&
      std::find(options_.kill_points.begin(), options_.kill_points.end(), point) ==
          options_.kill_points.end()) {
    return;
  }
  if (Draw("kill", point) >= options_.kill) return;
  Record("kill", point);
  ::kill(::getpid(), SIGKILL);
}

// ---------------------------------------------------------------- the decorator

namespace {

// Flips 1..3 bytes of buf (each XOR with a non-zero mask).
void FlipBytes(FaultInjector& faults, std::string_view op, std::string_view key, uint8_t* buf,
               uint64_t len) {
  if (len == 0) return;
  const uint64_t bits = faults.Bits(op, key);
  const int flips = 1 + static_cast<int>(bits % 3);
  for (int i = 0; i < flips; ++i) {
    const uint64_t b = faults.Bits(op, key);
    buf[b % len] ^= static_cast<uint8_t>(1 + (b >> 32) % 255);
  }
}

Status Injected(const char* doing, const std::string& key, int errno_value) {
  return Status::IoError(std::string("injected fault: ") + doing + " '" + key +
                         "': " + std::strerror(errno_value));
}

// The decorator, shaped as an SDK transport (sdk::TransportAdapter makes its C vtable): every
// operation may be delayed, puts and gets draw their faults, the rest passes through.
class FaultTransport {
 public:
  FaultTransport(std::unique_ptr<Transport> inner, std::shared_ptr<FaultInjector> faults)
      : inner_(std::move(inner)), faults_(std::move(faults)) {}

  // Never called: the decorator wraps an existing transport, WrapTransportWithFaults adopts it.
  static Result<std::unique_ptr<FaultTransport>> Create(const sdk::ConfigView&,
                                                        refit_transport_role_t,
                                                        const std::string&) {
    return Status::Internal("the faults transport is made by [faults], not by name");
  }

  Status Put(const std::string& key, const uint8_t* data, uint64_t len) {
    MaybeDelay("put", key);
    const FaultOptions& o = faults_->options();
    double u = faults_->Draw("put", key);
    if ((u -= o.drop_put) < 0) {
      faults_->Record("drop_put", key);
      return Status::OK();
    }
    if ((u -= o.truncate_put) < 0) {
      faults_->Record("truncate_put", key);
      const uint64_t keep = len == 0 ? 0 : faults_->Bits("truncate", key) % len;
      return inner_->Put(key, data, keep);
    }
    if ((u -= o.corrupt_put) < 0) {
      faults_->Record("corrupt_put", key);
      std::vector<uint8_t> copy(data, data + len);
      FlipBytes(*faults_, "corrupt_put", key, copy.data(), copy.size());
      return inner_->Put(key, copy.data(), copy.size());
    }
    if ((u -= o.enospc_put) < 0) {
      faults_->Record("enospc_put", key);
      return Injected("writing", key, ENOSPC);
    }
    if ((u -= o.eio_put) < 0) {
      faults_->Record("eio_put", key);
      return Injected("writing", key, EIO);
    }
    return inner_->Put(key, data, len);
  }

  Result<std::optional<uint64_t>> Size(const std::string& key) {
    MaybeDelay("size", key);
    return inner_->Size(key);
  }

  Status Get(const std::string& key, uint64_t offset, uint8_t* buf, uint64_t len) {
    MaybeDelay("get", key);
    const FaultOptions& o = faults_->options();
    double u = faults_->Draw("get", key);
    if ((u -= o.fail_get) < 0) {
      faults_->Record("fail_get", key);
      return Injected("reading", key, EIO);
    }
    REFIT_RETURN_NOT_OK(inner_->Get(key, offset, buf, len));
    if ((u -= o.corrupt_get) < 0 && len > 0) {
      faults_->Record("corrupt_get", key);
      FlipBytes(*faults_, "corrupt_get", key, buf, len);
    }
    return Status::OK();
  }

  Result<std::vector<std::pair<std::string, uint64_t>>> List(const std::string& prefix) {
    MaybeDelay("list", prefix);
    return inner_->List(prefix);
  }

  Status Remove(const std::string& key) {
    MaybeDelay("remove", key);
    return inner_->Remove(key);
  }
  // Wake-ups pass through: faults act on the operations, not on when a receiver looks.
  Result<bool> Wait(uint32_t timeout_ms) { return inner_->Wait(timeout_ms); }

 private:
  void MaybeDelay(std::string_view op, std::string_view key) {
    const FaultOptions& o = faults_->options();
    if (o.delay <= 0 || faults_->Draw(std::string(op) + ".delay", key) >= o.delay) return;
    faults_->Record("delay", key);
    const uint64_t ms = 1 + faults_->Bits("delay", key) % o.delay_ms;
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }

  std::unique_ptr<Transport> inner_;
  std::shared_ptr<FaultInjector> faults_;
};

}  // namespace

Result<std::unique_ptr<Transport>> WrapTransportWithFaults(std::unique_ptr<Transport> inner,
                                                           std::shared_ptr<FaultInjector> faults) {
  return Transport::Adopt("faults", sdk::TransportAdapter<FaultTransport>::Vtable(),
                          new FaultTransport(std::move(inner), std::move(faults)));
}

}  // namespace refit::internal
