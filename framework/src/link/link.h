// Link emulation (docs/transports.md "Link emulation", docs/config.md [transport] bandwidth): a
// token bucket per transport instance (one process's instance is one "connection") that holds
// the bytes put and got to a configured rate, so any transport can stand in for a cross-datacenter
// link; and counters of the bytes every configured transport of this process moved.
//
// The limit lives here, around the transport calls, not inside each plugin: disk, s3 and ucx get
// it alike, and the bench counts a sender's bytes out in one place.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "refit/config.h"
#include "refit/registry.h"
#include "refit/status.h"

namespace refit::internal {

// Bytes per second of the link and the bytes it may carry at once before the rate applies.
struct LinkOptions {
  uint64_t bytes_per_second = 0;  // 0: unlimited
  uint64_t burst_bytes = 0;
};

// The burst of a link of `bytes_per_second`: 10 ms of its rate, at least 64 KiB (a control object
// such as a commit or an ack never waits; a payload pays for its bytes).
uint64_t DefaultBurstBytes(uint64_t bytes_per_second);

// [transport] bandwidth (a size: bytes per second; 0 or absent: unlimited). An error names the
// file, line and key.
Result<LinkOptions> LinkOptionsFromConfig(const Config& config);

// A token bucket: it refills at `bytes_per_second` up to `burst_bytes` and starts full. Take(n)
// debits n bytes and, when that leaves the bucket in debt, sleeps until the debt is repaid: a
// transfer larger than the burst waits for its whole size at the rate, and concurrent callers
// queue behind each other's debt (each sleeps outside the lock). The clock and the sleeper are
// injectable so tests account for bytes and sleeps without wall time.
class TokenBucket {
 public:
  using Clock = std::function<double()>;        // seconds on a monotonic clock
  using Sleeper = std::function<void(double)>;  // sleeps that many seconds

  TokenBucket(uint64_t bytes_per_second, uint64_t burst_bytes, Clock clock = nullptr,
              Sleeper sleep = nullptr);

  // Debits `bytes`; returns the seconds it asked the sleeper for (0 when the burst covered them).
  double Take(uint64_t bytes);

  uint64_t bytes_per_second() const { return bytes_per_second_; }
  uint64_t burst_bytes() const { return burst_bytes_; }

 private:
  const uint64_t bytes_per_second_;
  const uint64_t burst_bytes_;
  const Clock clock_;
  const Sleeper sleep_;
  std::mutex mu_;
  double tokens_;       // bytes; negative while callers wait for the link
  double refilled_at_;  // clock reading of the last refill
};

// What the transports of one role moved in this process, since it started.
struct LinkTraffic {
  std::atomic<uint64_t> put_bytes{0};
  std::atomic<uint64_t> get_bytes{0};
  std::atomic<uint64_t> puts{0};
  std::atomic<uint64_t> gets{0};
  std::atomic<uint64_t> throttled_ns{0};  // time the bucket made callers sleep
};

// The counters of every transport CreateConfiguredTransport made for `role` in this process (the
// sender's bytes out are ProcessLinkTraffic(REFIT_ROLE_SENDER).put_bytes).
LinkTraffic& ProcessLinkTraffic(refit_transport_role_t role);

// Whether a transport instance's gets cross its link. A sender that reads what it put from a
// local copy (REFIT_TRANSPORT_CAP_LOCAL_SENDER_READS, the ucx spool) does not.
enum class LinkGets { kCross, kLocal };

// Wraps `inner`: puts take their bytes from `bucket` before the object is written (it appears once
// its bytes crossed), gets (those that cross, `gets`) after they were read; `bucket` may be null
// (unlimited). Every put and get is counted in `traffic` (may be null). The result keeps inner's
// name.
Result<std::unique_ptr<Transport>> WrapTransportWithLink(std::unique_ptr<Transport> inner,
                                                         std::shared_ptr<TokenBucket> bucket,
                                                         LinkTraffic* traffic,
                                                         LinkGets gets = LinkGets::kCross);

// [transport.<name>] link_bandwidth of the configured transport: the plugin's own pacing of each
// push (ucx: a payload crosses each link of its tree once); 0 when unset.
Result<uint64_t> PluginLinkBandwidth(const Config& config);

// How many times [transport] bandwidth charges a payload between the sender's put and a receiver
// holding it, one after the other: the put, the sender's read-back (sender.verify_puts) unless
// the transport reads its own copy (REFIT_TRANSPORT_CAP_LOCAL_SENDER_READS: ucx), the receiver's
// get.
Result<uint32_t> MeteredCrossings(const Config& config, const Registry& registry);

// Creates the transport of `config` ([transport] name and its section) for `role`: the plugin's
// instance behind its own link ([transport] bandwidth, counted in ProcessLinkTraffic(role); a
// sender's gets are free when the plugin declares REFIT_TRANSPORT_CAP_LOCAL_SENDER_READS),
// behind the [faults] layer when that is enabled (which also arms this process's kill points).
Result<std::unique_ptr<Transport>> CreateConfiguredTransport(const Registry& registry,
                                                             const Config& config,
                                                             refit_transport_role_t role,
                                                             const std::string& peer_id);

}  // namespace refit::internal
