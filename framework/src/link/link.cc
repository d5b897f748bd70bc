// Link emulation: the token bucket, the transport decorator that applies it, and the one place a
// configured transport is assembled (plugin, link, faults). See link.h.
#include "link/link.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "faults/faults.h"
#include "refit/sdk/plugin.hpp"

namespace refit::internal {

uint64_t DefaultBurstBytes(uint64_t bytes_per_second) {
  return std::max<uint64_t>(64 << 10, bytes_per_second / 100);
}

Result<LinkOptions> LinkOptionsFromConfig(const Config& config) {
  LinkOptions options;
  REFIT_ASSIGN_OR_RAISE(options.bytes_per_second, config.GetSize("transport.bandwidth", 0));
  options.burst_bytes = DefaultBurstBytes(options.bytes_per_second);
  return options;
}

// ---------------------------------------------------------------- the bucket

namespace {

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void SleepSeconds(double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

}  // namespace

TokenBucket::TokenBucket(uint64_t bytes_per_second, uint64_t burst_bytes, Clock clock,
                         Sleeper sleep)
    : bytes_per_second_(bytes_per_second),
      burst_bytes_(burst_bytes),
      clock_(clock ? std::move(clock) : Clock(SteadySeconds)),
      sleep_(sleep ? std::move(sleep) : Sleeper(SleepSeconds)),
      tokens_(static_cast<double>(burst_bytes)),
      refilled_at_(clock_()) {}

double TokenBucket::Take(uint64_t bytes) {
  if (bytes_per_second_ == 0) return 0;
  const double rate = static_cast<double>(bytes_per_second_);
  double wait = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const double now = clock_();
    tokens_ = std::min(static_cast<double>(burst_bytes_),
                       tokens_ + std::max(0.0, now - refilled_at_) * rate);
    refilled_at_ = std::max(refilled_at_, now);
    tokens_ -= static_cast<double>(bytes);
    // The debt (ours and that of callers still asleep) is repaid at the rate.
    if (tokens_ < 0) wait = -tokens_ / rate;
  }
  if (wait > 0) sleep_(wait);
  return wait;
}

LinkTraffic& ProcessLinkTraffic(refit_transport_role_t role) {
  static LinkTraffic sender, receiver;
  return role == REFIT_ROLE_SENDER ? sender : receiver;
}

// ---------------------------------------------------------------- the decorator

namespace {

// Shaped as an SDK transport (sdk::TransportAdapter makes its C vtable). Only puts and gets move
// payload bytes; size, list and remove pass through unmetered.
class LinkTransport {
 public:
  LinkTransport(std::unique_ptr<Transport> inner, std::shared_ptr<TokenBucket> bucket,
                LinkTraffic* traffic, LinkGets gets)
      : inner_(std::move(inner)), bucket_(std::move(bucket)), traffic_(traffic), gets_(gets) {}

  // Never called: the decorator wraps an existing transport, WrapTransportWithLink adopts it.
  static Result<std::unique_ptr<LinkTransport>> Create(const sdk::ConfigView&,
                                                       refit_transport_role_t, const std::string&) {
    return Status::Internal("the link transport is made by [transport] bandwidth, not by name");
  }

  Status Put(const std::string& key, const uint8_t* data, uint64_t len) {
    Throttle(len);
    REFIT_RETURN_NOT_OK(inner_->Put(key, data, len));
    if (traffic_ != nullptr) {
      traffic_->put_bytes += len;
      ++traffic_->puts;
    }
    return Status::OK();
  }

  Result<std::optional<uint64_t>> Size(const std::string& key) { return inner_->Size(key); }

  Status Get(const std::string& key, uint64_t offset, uint8_t* buf, uint64_t len) {
    REFIT_RETURN_NOT_OK(inner_->Get(key, offset, buf, len));
    if (gets_ == LinkGets::kCross) Throttle(len);
    if (traffic_ != nullptr) {
      traffic_->get_bytes += len;
      ++traffic_->gets;
    }
    return Status::OK();
  }

  Result<std::vector<std::pair<std::string, uint64_t>>> List(const std::string& prefix) {
    return inner_->List(prefix);
  }

  Status Remove(const std::string& key) { return inner_->Remove(key); }
  Result<bool> Wait(uint32_t timeout_ms) { return inner_->Wait(timeout_ms); }

 private:
  void Throttle(uint64_t bytes) {
    if (bucket_ == nullptr) return;
    const double slept = bucket_->Take(bytes);
    if (traffic_ != nullptr)
      traffic_->throttled_ns += static_cast<uint64_t>(std::llround(slept * 1e9));
  }

  std::unique_ptr<Transport> inner_;
  std::shared_ptr<TokenBucket> bucket_;
  LinkTraffic* traffic_;
  const LinkGets gets_;
};

}  // namespace

Result<std::unique_ptr<Transport>> WrapTransportWithLink(std::unique_ptr<Transport> inner,
                                                         std::shared_ptr<TokenBucket> bucket,
                                                         LinkTraffic* traffic, LinkGets gets) {
  std::string name = inner->name();
  return Transport::Adopt(std::move(name), sdk::TransportAdapter<LinkTransport>::Vtable(),
                          new LinkTransport(std::move(inner), std::move(bucket), traffic, gets));
}

Result<uint64_t> PluginLinkBandwidth(const Config& config) {
  REFIT_ASSIGN_OR_RAISE(std::string transport, config.GetString("transport.name", "disk"));
  return config.GetSize("transport." + transport + ".link_bandwidth", 0);
}

Result<uint32_t> MeteredCrossings(const Config& config, const Registry& registry) {
  REFIT_ASSIGN_OR_RAISE(std::string transport, config.GetString("transport.name", "disk"));
  REFIT_ASSIGN_OR_RAISE(bool verify, config.GetBool("sender.verify_puts", true));
  const ComponentInfo* info = registry.Find(REFIT_KIND_TRANSPORT, transport);
  const bool local_reads =
      info != nullptr && (info->capabilities & REFIT_TRANSPORT_CAP_LOCAL_SENDER_READS) != 0;
  return verify && !local_reads ? 3 : 2;
}

Result<std::unique_ptr<Transport>> CreateConfiguredTransport(const Registry& registry,
                                                             const Config& config,
                                                             refit_transport_role_t role,
                                                             const std::string& peer_id) {
  REFIT_ASSIGN_OR_RAISE(std::string name, config.GetString("transport.name", "disk"));
  REFIT_ASSIGN_OR_RAISE(
      std::unique_ptr<Transport> transport,
      registry.CreateTransport(name, role, peer_id, &config, "transport." + name));
  REFIT_ASSIGN_OR_RAISE(LinkOptions link, LinkOptionsFromConfig(config));
  std::shared_ptr<TokenBucket> bucket;
  if (link.bytes_per_second > 0) {
    bucket = std::make_shared<TokenBucket>(link.bytes_per_second, link.burst_bytes);
  }
  const LinkGets gets = role == REFIT_ROLE_SENDER && (transport->capabilities() &
                                                      REFIT_TRANSPORT_CAP_LOCAL_SENDER_READS) != 0
                            ? LinkGets::kLocal
                            : LinkGets::kCross;
  REFIT_ASSIGN_OR_RAISE(transport, WrapTransportWithLink(std::move(transport), std::move(bucket),
                                                         &ProcessLinkTraffic(role), gets));
  REFIT_ASSIGN_OR_RAISE(std::optional<FaultOptions> options, FaultOptionsFromConfig(config));
  if (!options) return transport;
  auto faults = std::make_shared<FaultInjector>(std::move(*options));
  InstallKillFaults(faults);
  return WrapTransportWithFaults(std::move(transport), std::move(faults));
}

}  // namespace refit::internal
