// Fault injection: named crash points (REFIT_KILL_AT, [faults] kill) and the transport decorator
// of [faults] (faults.h).
#include "faults.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "engine.h"
#include "refit/kernels/diff.h"

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
      "receiver.applying",        // the state says `applying`, nothing written into the model yet
      "receiver.record_applied",  // a record is in the model, more of the version remain
      "receiver.journaled",       // an xor/step record is journaled, its bits not yet in the model
      "receiver.model_synced",    // the model is the new version, the state does not say so yet
      "receiver.ack",             // the state says the new version, its ack is not written yet
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

std::vector<ConfigKeySpec> FaultConfigSpecs() {
  return {
      {"enabled", REFIT_CFG_BOOL, "true", "inject the faults of this section"},
      {"seed", REFIT_CFG_INT, "0", "seed of every fault decision (a run is reproducible from it)"},
      {"drop_put", REFIT_CFG_DOUBLE, "0", "probability a put reports success and writes nothing"},
      {"truncate_put", REFIT_CFG_DOUBLE, "0",
       "probability a put writes a strict prefix and reports success"},
      {"corrupt_put", REFIT_CFG_DOUBLE, "0",
       "probability a put flips bytes of what it writes and reports success"},
      {"enospc_put", REFIT_CFG_DOUBLE, "0", "probability a put fails with ENOSPC"},
      {"eio_put", REFIT_CFG_DOUBLE, "0", "probability a put fails with EIO"},
      {"fail_get", REFIT_CFG_DOUBLE, "0", "probability a read fails with EIO"},
      {"corrupt_get", REFIT_CFG_DOUBLE, "0", "probability a read returns flipped bytes"},
      {"delay", REFIT_CFG_DOUBLE, "0", "probability any transport operation is delayed"},
      {"delay_ms", REFIT_CFG_INT, "20", "longest injected delay, milliseconds"},
      {"kill", REFIT_CFG_DOUBLE, "0",
       "probability the process is killed (SIGKILL) at each visit of a kill point"},
      {"kill_points", REFIT_CFG_STRING_LIST, "[]",
       "kill points armed (docs/reliability.md); empty: every point"},
      {"log", REFIT_CFG_STRING, "\"\"", "file every injected fault is appended to"},
  };
}

Result<std::optional<FaultOptions>> FaultOptionsFromConfig(const Config& config) {
  if (config.KeysUnder("faults").empty()) return std::optional<FaultOptions>();
  ASSIGN_OR_RAISE(bool enabled, config.GetBool("faults.enabled", true));
  if (!enabled) return std::optional<FaultOptions>();
  FaultOptions o;
  ASSIGN_OR_RAISE(int64_t seed, config.GetInt("faults.seed", 0));
  o.seed = static_cast<uint64_t>(seed);
  struct Prob {
    const char* key;
    double* value;
  };
  const Prob probs[] = {{"drop_put", &o.drop_put},
                        {"truncate_put", &o.truncate_put},
                        {"corrupt_put", &o.corrupt_put},
                        {"enospc_put", &o.enospc_put},
                        {"eio_put", &o.eio_put},
                        {"fail_get", &o.fail_get},
                        {"corrupt_get", &o.corrupt_get},
                        {"delay", &o.delay},
                        {"kill", &o.kill}};
  for (const Prob& p : probs) {
    const std::string key = std::string("faults.") + p.key;
    ASSIGN_OR_RAISE(*p.value, config.GetDouble(key, 0));
    if (!(*p.value >= 0 && *p.value <= 1)) {
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
  ASSIGN_OR_RAISE(int64_t delay_ms, config.GetInt("faults.delay_ms", 20));
  if (delay_ms < 1 || delay_ms > 60'000) {
    return Status::Invalid(config.Where("faults.delay_ms") +
                           ": faults.delay_ms must be in [1, 60000]");
  }
  o.delay_ms = static_cast<uint64_t>(delay_ms);
  ASSIGN_OR_RAISE(o.kill_points, config.GetStringList("faults.kill_points", {}));
  for (const std::string& point : o.kill_points) {
    const auto& known = KillPoints();
    if (std::find(known.begin(), known.end(), point) == known.end()) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      return Status::Invalid(config.Where("faults.kill_points") + ": unknown kill point '" + point +
                             "' (known: " + list + ")");
    }
  }
  ASSIGN_OR_RAISE(o.log, config.GetString("faults.log", ""));
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

struct FaultTransport {
  std::unique_ptr<Transport> inner;
  std::shared_ptr<FaultInjector> faults;

  void MaybeDelay(std::string_view op, std::string_view key) {
    const FaultOptions& o = faults->options();
    if (o.delay <= 0 || faults->Draw(std::string(op) + ".delay", key) >= o.delay) return;
    faults->Record("delay", key);
    const uint64_t ms = 1 + faults->Bits("delay", key) % o.delay_ms;
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
};

int Fail(refit_error_t* err, refit_status_code_t code, const std::string& message) {
  err->code = code;
  std::snprintf(err->message, sizeof(err->message), "%s", message.c_str());
  return code;
}

int FromStatus(const Status& st, refit_error_t* err) {
  if (st.ok()) return REFIT_OK;
  return Fail(err, static_cast<refit_status_code_t>(st.code()), st.message());
}

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

void FaultDestroy(void* instance) { delete static_cast<FaultTransport*>(instance); }

int FaultPut(void* instance, const char* key, const uint8_t* data, uint64_t len,
             refit_error_t* err) {
  auto& t = *static_cast<FaultTransport*>(instance);
  t.MaybeDelay("put", key);
  const FaultOptions& o = t.faults->options();
  double u = t.faults->Draw("put", key);
  if ((u -= o.drop_put) < 0) {
    t.faults->Record("drop_put", key);
    return REFIT_OK;
  }
  if ((u -= o.truncate_put) < 0) {
    t.faults->Record("truncate_put", key);
    const uint64_t keep = len == 0 ? 0 : t.faults->Bits("truncate", key) % len;
    return FromStatus(t.inner->Put(key, data, keep), err);
  }
  if ((u -= o.corrupt_put) < 0) {
    t.faults->Record("corrupt_put", key);
    std::vector<uint8_t> copy(data, data + len);
    FlipBytes(*t.faults, "corrupt_put", key, copy.data(), copy.size());
    return FromStatus(t.inner->Put(key, copy.data(), copy.size()), err);
  }
  if ((u -= o.enospc_put) < 0) {
    t.faults->Record("enospc_put", key);
    return Fail(err, REFIT_ERR_IO,
                std::string("injected fault: writing '") + key + "': " + std::strerror(ENOSPC));
  }
  if ((u -= o.eio_put) < 0) {
    t.faults->Record("eio_put", key);
    return Fail(err, REFIT_ERR_IO,
                std::string("injected fault: writing '") + key + "': " + std::strerror(EIO));
  }
  return FromStatus(t.inner->Put(key, data, len), err);
}

int FaultSize(void* instance, const char* key, uint64_t* size_p, int* found_p, refit_error_t* err) {
  auto& t = *static_cast<FaultTransport*>(instance);
  t.MaybeDelay("size", key);
  Result<std::optional<uint64_t>> size = t.inner->Size(key);
  if (!size.ok()) return FromStatus(size.status(), err);
  *found_p = size.value().has_value() ? 1 : 0;
  *size_p = size.value().value_or(0);
  return REFIT_OK;
}

int FaultGet(void* instance, const char* key, uint64_t offset, uint8_t* buf, uint64_t len,
             refit_error_t* err) {
  auto& t = *static_cast<FaultTransport*>(instance);
  t.MaybeDelay("get", key);
  const FaultOptions& o = t.faults->options();
  double u = t.faults->Draw("get", key);
  if ((u -= o.fail_get) < 0) {
    t.faults->Record("fail_get", key);
    return Fail(err, REFIT_ERR_IO,
                std::string("injected fault: reading '") + key + "': " + std::strerror(EIO));
  }
  int rc = FromStatus(t.inner->Get(key, offset, buf, len), err);
  if (rc == REFIT_OK && (u -= o.corrupt_get) < 0 && len > 0) {
    t.faults->Record("corrupt_get", key);
    FlipBytes(*t.faults, "corrupt_get", key, buf, len);
  }
  return rc;
}

int FaultList(void* instance, const char* prefix, refit_list_cb cb, void* ctx, refit_error_t* err) {
  auto& t = *static_cast<FaultTransport*>(instance);
  t.MaybeDelay("list", prefix);
  Result<std::vector<std::pair<std::string, uint64_t>>> keys = t.inner->List(prefix);
  if (!keys.ok()) return FromStatus(keys.status(), err);
  for (const auto& [key, size] : keys.value()) cb(ctx, key.c_str(), size);
  return REFIT_OK;
}

int FaultRemove(void* instance, const char* key, refit_error_t* err) {
  auto& t = *static_cast<FaultTransport*>(instance);
  t.MaybeDelay("remove", key);
  return FromStatus(t.inner->Remove(key), err);
}

const refit_transport_vtable_t kFaultVtable = {
    sizeof(refit_transport_vtable_t),
    0,
    nullptr,  // never created through a registry: WrapTransportWithFaults adopts the instance
    &FaultDestroy,
    &FaultPut,
    &FaultSize,
    &FaultGet,
    &FaultList,
    &FaultRemove};

}  // namespace

Result<std::unique_ptr<Transport>> WrapTransportWithFaults(std::unique_ptr<Transport> inner,
                                                           std::shared_ptr<FaultInjector> faults) {
  auto instance = std::make_unique<FaultTransport>();
  instance->inner = std::move(inner);
  instance->faults = std::move(faults);
  return Transport::Adopt("faults", &kFaultVtable, instance.release());
}

Result<std::unique_ptr<Transport>> CreateTransportWithFaults(const Registry& registry,
                                                             const Config& config,
                                                             refit_transport_role_t role,
                                                             const std::string& peer_id) {
  ASSIGN_OR_RAISE(std::string name, config.GetString("transport.name", "disk"));
  ASSIGN_OR_RAISE(std::unique_ptr<Transport> transport,
                  registry.CreateTransport(name, role, peer_id, &config, "transport." + name));
  ASSIGN_OR_RAISE(std::optional<FaultOptions> options, FaultOptionsFromConfig(config));
  if (!options) return transport;
  auto faults = std::make_shared<FaultInjector>(std::move(*options));
  InstallKillFaults(faults);
  return WrapTransportWithFaults(std::move(transport), std::move(faults));
}

// ---------------------------------------------------------------- robust puts and gets

Status PutVerified(Transport& transport, const std::string& key, const uint8_t* data, uint64_t len,
                   int attempts) {
  std::string last;
  for (int i = 0; i < attempts; ++i) {
    RETURN_NOT_OK(transport.Put(key, data, len));
    // Read back: a put may report success and store nothing, a prefix or other bytes.
    Result<std::optional<uint64_t>> size = transport.Size(key);
    if (!size.ok()) {
      last = size.status().message();
      continue;
    }
    if (!size.value().has_value()) {
      last = "the object is missing after the put";
      continue;
    }
    if (*size.value() != len) {
      last = "the object holds " + std::to_string(*size.value()) + " bytes after a put of " +
             std::to_string(len);
      continue;
    }
    // Compared in slices: a read-back costs 1 MiB of memory, not another payload.
    std::vector<uint8_t> stored(std::min<uint64_t>(len, 1 << 20));
    bool same = true;
    for (uint64_t at = 0; at < len && same; at += stored.size()) {
      const uint64_t n = std::min<uint64_t>(stored.size(), len - at);
      Status got = transport.Get(key, at, stored.data(), n);
      if (!got.ok()) {
        last = got.message();
        same = false;
      } else if (std::memcmp(stored.data(), data + at, n) != 0) {
        last = "the stored bytes differ from those put";
        same = false;
      }
    }
    if (same) return Status::OK();
  }
  return Status::IoError("put '" + key + "' could not be verified after " +
                         std::to_string(attempts) + " attempts: " + last);
}

Status GetVerified(Transport& transport, const std::string& key, uint64_t size, uint64_t xxh3,
                   std::vector<uint8_t>& out, int attempts) {
  out.resize(size);
  Status last;
  for (int i = 0; i < attempts; ++i) {
    last = size == 0 ? Status::OK() : transport.Get(key, 0, out.data(), size);
    if (last.ok()) {
      if (kernels::Digest64(out.data(), size) == xxh3) return Status::OK();
      last = Status::Corrupt(key + ": checksum mismatch (corrupted in transit or in storage)");
    }
  }
  return last;
}

Result<std::vector<uint8_t>> GetStable(Transport& transport, const std::string& key,
                                       uint64_t max_bytes, int attempts) {
  Status last;
  for (int i = 0; i < attempts; ++i) {
    Result<std::vector<uint8_t>> a = transport.GetAll(key, max_bytes);
    if (!a.ok()) {
      if (a.status().code() == StatusCode::kNotFound) return a.status();
      last = a.status();
      continue;
    }
    Result<std::vector<uint8_t>> b = transport.GetAll(key, max_bytes);
    if (!b.ok()) {
      if (b.status().code() == StatusCode::kNotFound) return b.status();
      last = b.status();
      continue;
    }
    if (a.value() == b.value()) return std::move(a).value();
    last = Status::Corrupt(key + ": two reads returned different bytes");
  }
  return last;
}

}  // namespace refit::internal
