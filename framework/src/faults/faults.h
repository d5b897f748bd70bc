// Fault injection (docs/reliability.md, docs/config.md [faults]): a decorator over any transport
// that drops, delays, truncates or corrupts puts, fails them with ENOSPC/EIO and fails or corrupts
// gets; and kills of the process at named protocol points (MaybeKillAt, below).
//
// Every decision is a pure function of (seed, operation, key or point, how many times this
// process saw that operation on that key): a run is reproducible from its seed even though the
// sender puts payloads from a background thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "refit/config.h"
#include "refit/export.h"
#include "refit/registry.h"
#include "refit/status.h"

namespace refit::internal {

// The named points where a process may be killed (REFIT_KILL_AT or [faults] kill).
const std::vector<std::string>& KillPoints();

struct FaultOptions {
  uint64_t seed = 0;
  // Per put (mutually exclusive, drawn once per put; their sum must be <= 1).
  double drop_put = 0;      // report success, write nothing
  double truncate_put = 0;  // write a strict prefix, report success
  double corrupt_put = 0;   // flip bytes, write, report success
  double enospc_put = 0;    // write nothing, fail with ENOSPC (an error naming the key)
  double eio_put = 0;       // write nothing, fail with EIO
  // Per get (ranged read), mutually exclusive.
  double fail_get = 0;     // fail with EIO
  double corrupt_get = 0;  // read, then flip bytes of what is returned
  // Per operation of any kind (put, get, size, list, remove): sleep 1..delay_ms.
  double delay = 0;
  uint64_t delay_ms = 20;
  // Per visit of a kill point: SIGKILL the process.
  double kill = 0;
  std::vector<std::string> kill_points;  // empty: every point of KillPoints()
  std::string log;  // file every injected fault is appended to ("kind key"), "" for none
};

// The [faults] keys (names relative to the section), for validation and docs.
std::vector<ConfigKeySpec> FaultConfigSpecs();
// nullopt when the config has no [faults] section or `faults.enabled = false`. Errors name the
// key (probability outside [0, 1], unknown kill point, ...).
Result<std::optional<FaultOptions>> FaultOptionsFromConfig(const Config& config);

class FaultInjector {
 public:
  explicit FaultInjector(FaultOptions options);

  const FaultOptions& options() const { return options_; }
  // A uniform draw in [0, 1) for the n-th `op` on `key` in this process (n counted here).
  double Draw(std::string_view op, std::string_view key);
  // 64 random bits for the n-th `op` on `key` (positions and lengths of truncations/flips).
  uint64_t Bits(std::string_view op, std::string_view key);
  // Counts an injected fault and appends it to the log.
  void Record(std::string_view kind, std::string_view key);
  // Injected faults by kind ("drop_put", "kill", ...).
  std::map<std::string, uint64_t> counts() const;
  uint64_t total() const;
  // Kill at `point` if the draw says so (called from MaybeKillAt).
  void MaybeKill(const char* point);

 private:
  uint64_t Next(std::string_view op, std::string_view key);

  FaultOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> seen_;  // "op\0key" -> draws so far
  std::map<std::string, uint64_t> counts_;
};

// Wraps `inner` so that every operation goes through `faults`. The result is a Transport like any
// other (name "faults"); errors it injects name the key.
Result<std::unique_ptr<Transport>> WrapTransportWithFaults(std::unique_ptr<Transport> inner,
                                                           std::shared_ptr<FaultInjector> faults);

// Arms the kill points of this process with `faults` (null disarms). REFIT_KILL_AT keeps working.
void InstallKillFaults(std::shared_ptr<FaultInjector> faults);

// Fault injection for crash tests: when the environment variable REFIT_KILL_AT names `point`
// ("point" or "point:N" for its N-th hit in this process), the process dies there at once
// (SIGKILL), as a crash would.
void MaybeKillAt(const char* point);

}  // namespace refit::internal
