// The receiver behind `refit serve` (docs/serve.md), free of HTTP: cmd_serve.cc maps requests to
// these calls. One sync applies at a time, whoever asks for it (a push or the poll loop); status
// and metrics are answered from any thread meanwhile, without waiting for the apply.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "refit/refit.h"

namespace refit::cli {

struct ServiceReply {
  int http_status = 200;
  nlohmann::json body;
};

class SyncService {
 public:
  // A receiver made from `config` ([receiver], [transport], ...). A sync applies versions for at
  // most serve.sync_timeout_s (the apply running then still finishes).
  static Result<std::unique_ptr<SyncService>> Make(const Config& config);

  // POST /v1/sync with `body` {"version": N}: applies committed versions until N is held, nothing
  // newer is committed, an apply fails or the timeout passes. 200 when N is held (at once when it
  // already was), 409 when N is not committed, 500 when an apply failed, 503 when shutting down,
  // 400 for a body that names no version.
  ServiceReply HandleSync(const std::string& body);
  // The poll loop: applies every committed version (errors are recorded, printed once).
  void PollPending();
  // Between two PollPending calls: true once something may have arrived from the sender (ucx
  // wakes it when the commit lands), false after timeout_ms (any other transport: a sleep). Not
  // under the sync lock: a push is served while the poll loop waits.
  bool WaitForArrival(uint32_t timeout_ms);

  nlohmann::json StatusJson() const;  // GET /v1/status
  std::string MetricsText() const;    // GET /metrics

  // No apply starts after this; the one running finishes.
  void BeginShutdown();
  uint64_t version() const;
  std::string receiver_id() const { return receiver_id_; }

 private:
  SyncService() = default;
  struct Run {
    std::vector<uint64_t> applied;
    refit::Status error;
  };
  ServiceReply SyncTo(uint64_t target);
  Run ApplyUntil(uint64_t target);
  void RecordPoll(const Result<std::optional<ApplyStats>>& polled);
  void SetSyncTarget(std::optional<uint64_t> target);
  uint64_t ModelElements() const;

  std::unique_ptr<Receiver> receiver_;  // under apply_mu_, but for WaitForArrival
  std::mutex apply_mu_;                 // one sync at a time
  std::atomic<bool> stopping_{false};
  double sync_timeout_s_ = 600;
  std::string receiver_id_;

  // What status and metrics report; never held across an apply.
  mutable std::mutex state_mu_;
  uint64_t version_ = 0;
  uint64_t applying_ = 0;
  std::string model_path_;
  std::optional<uint64_t> sync_target_;
  nlohmann::json last_applied_;  // null until a version is applied
  nlohmann::json last_error_;    // null until a poll fails
  std::string last_printed_error_;
  uint64_t sync_requests_ = 0;
  ReceiverMetrics metrics_{""};
};

}  // namespace refit::cli
