#include "serve_service.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <limits>
#include <thread>

#include "commands.h"
#include "format/safetensors.h"

namespace refit::cli {

namespace {

double WallClockSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// "2026-12-01T18:11:41Z"
std::string UtcText(double unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

nlohmann::json ErrorJson(const refit::Status& status) {
  return {{"code", StatusCodeName(status.code())}, {"message", status.message()}};
}

ServiceReply BadRequest(const std::string& message) {
  return {400, {{"error", ErrorJson(refit::Status::Invalid(message))}}};
}

}  // namespace

Result<std::unique_ptr<SyncService>> SyncService::Make(const Config& config) {
  std::unique_ptr<SyncService> service(new SyncService());
  REFIT_ASSIGN_OR_RAISE(service->receiver_, Receiver::Make(config));
  REFIT_ASSIGN_OR_RAISE(service->receiver_id_, config.GetString("receiver.id", "r0"));
  REFIT_ASSIGN_OR_RAISE(service->sync_timeout_s_, config.GetDouble("serve.sync_timeout_s", 600));
  service->metrics_ = ReceiverMetrics(service->receiver_id_);
  service->version_ = service->receiver_->version();
  service->applying_ = service->receiver_->applying();
  service->model_path_ = service->receiver_->model_path();
  service->metrics_.SetVersion(service->version_);
  if (service->version_ != 0) service->metrics_.SetModelElements(service->ModelElements());
  return service;
}

// The elements of the model file (0 when it cannot be read): the denominator of the density
// gauge, since an apply counts only the elements its records set.
uint64_t SyncService::ModelElements() const {
  Result<std::unique_ptr<SafetensorsFile>> model = SafetensorsFile::Open(receiver_->model_path());
  if (!model.ok()) return 0;
  uint64_t elements = 0;
  for (const TensorView& t : model.value()->tensors()) {
    uint64_t n = 1;
    for (uint64_t d : t.shape) n *= d;
    elements += n;
  }
  return elements;
}

ServiceReply SyncService::HandleSync(const std::string& body) {
  nlohmann::json request = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded() || !request.is_object()) {
    return BadRequest("the body must be a JSON object like {\"version\": 12}");
  }
  auto it = request.find("version");
  if (it == request.end() || !it->is_number_unsigned() || it->get<uint64_t>() == 0) {
    return BadRequest("\"version\" must be a positive integer");
  }
  return SyncTo(it->get<uint64_t>());
}

ServiceReply SyncService::SyncTo(uint64_t target) {
  auto reply = [&](int http_status, const std::vector<uint64_t>& applied) {
    std::lock_guard<std::mutex> lock(state_mu_);
    return ServiceReply{http_status,
                        {{"requested", target},
                         {"version", version_},
                         {"reached", version_ >= target},
                         {"applied", applied},
                         {"error", nullptr}}};
  };
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    ++sync_requests_;
  }
  if (version() >= target) return reply(200, {});  // already held: no wait for a running apply
  if (stopping_) {
    ServiceReply r = reply(503, {});
    r.body["error"] = ErrorJson(refit::Status::Unsupported("refit serve is shutting down"));
    return r;
  }
  std::lock_guard<std::mutex> one_sync_at_a_time(apply_mu_);
  Run run = ApplyUntil(target);
  if (version() >= target) return reply(200, run.applied);
  if (!run.error.ok()) {
    ServiceReply r = reply(stopping_ ? 503 : 500, run.applied);
    r.body["error"] = ErrorJson(run.error);
    return r;
  }
  ServiceReply r = reply(409, run.applied);
  r.body["message"] = "version " + std::to_string(target) + " is not committed";
  return r;
}

void SyncService::PollPending() {
  if (stopping_) return;
  std::lock_guard<std::mutex> one_sync_at_a_time(apply_mu_);
  ApplyUntil(std::numeric_limits<uint64_t>::max());
}

bool SyncService::WaitForArrival(uint32_t timeout_ms) {
  Result<bool> woke = receiver_->WaitForArrival(timeout_ms);
  if (woke.ok()) return *woke;
  // A transport whose wait fails is polled on the interval (the next poll reports what is
  // wrong), never in a busy loop.
  std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
  return false;
}

// Under apply_mu_. Every poll that succeeds raises the version, so the loop ends once the
// committed versions run out; the timeout bounds a long run of them.
SyncService::Run SyncService::ApplyUntil(uint64_t target) {
  Run run;
  SetSyncTarget(target);
  const double deadline = SteadySeconds() + sync_timeout_s_;
  while (receiver_->version() < target) {
    if (stopping_) {
      run.error = refit::Status::Unsupported("refit serve is shutting down");
      break;
    }
    if (SteadySeconds() > deadline) {
      run.error = refit::Status::Timeout("serve.sync_timeout_s passed at version " +
                                         std::to_string(receiver_->version()));
      break;
    }
    Result<std::optional<ApplyStats>> polled = receiver_->PollOnce();
    RecordPoll(polled);
    if (!polled.ok()) {
      run.error = polled.status();
      break;
    }
    if (!polled.value()) break;  // nothing newer is committed
    run.applied.push_back(polled.value()->version);
  }
  SetSyncTarget(std::nullopt);
  return run;
}

void SyncService::SetSyncTarget(std::optional<uint64_t> target) {
  std::lock_guard<std::mutex> lock(state_mu_);
  sync_target_ = target;
  metrics_.SetSyncInProgress(target.has_value());
}

// Under apply_mu_: the state status and metrics answer from, and one line per applied version
// or per new error (a failure repeating while the poll loop retries is printed once).
void SyncService::RecordPoll(const Result<std::optional<ApplyStats>>& polled) {
  const bool full_applied = polled.ok() && polled.value() && polled.value()->full;
  const uint64_t elements = full_applied ? ModelElements() : 0;
  std::lock_guard<std::mutex> lock(state_mu_);
  version_ = receiver_->version();
  applying_ = receiver_->applying();
  metrics_.SetVersion(version_);
  if (!polled.ok()) {
    const refit::Status& error = polled.status();
    metrics_.RecordFailure(error);
    const double now = WallClockSeconds();
    last_error_ = ErrorJson(error);
    last_error_["time"] = now;
    last_error_["time_utc"] = UtcText(now);
    if (error.message() != last_printed_error_) {
      std::fprintf(stderr, "refit serve: %s\n", error.message().c_str());
      std::fflush(stderr);
      last_printed_error_ = error.message();
    }
    return;
  }
  if (!polled.value()) return;
  const ApplyStats& s = *polled.value();
  if (full_applied) metrics_.SetModelElements(elements);
  metrics_.RecordApplied(s);
  const double now = WallClockSeconds();
  last_applied_ = {{"version", s.version},
                   {"full", s.full},
                   {"payload_bytes", s.payload_bytes},
                   {"changed_elements", s.counters.changed_elements},
                   {"seconds", s.total_seconds},
                   {"time", now},
                   {"time_utc", UtcText(now)}};
  last_printed_error_.clear();
  PrintApplied(s);
}

nlohmann::json SyncService::StatusJson() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  auto total = [&](const char* family) { return static_cast<uint64_t>(metrics_.Total(family)); };
  nlohmann::json sync = {{"in_progress", sync_target_.has_value()}, {"target", nullptr}};
  if (sync_target_ && *sync_target_ != std::numeric_limits<uint64_t>::max()) {
    sync["target"] = *sync_target_;
  }
  return {{"receiver", receiver_id_},
          {"version", version_},
          {"applying", applying_ != 0 ? nlohmann::json(applying_) : nlohmann::json(nullptr)},
          {"model", model_path_},
          {"sync", sync},
          {"last_applied", last_applied_},
          {"last_error", last_error_},
          {"counters",
           {{"sync_requests", sync_requests_},
            {"versions_applied", total("refit_receiver_versions_applied_total")},
            {"full_versions_applied", total("refit_receiver_full_versions_applied_total")},
            {"full_sync_requests", total("refit_receiver_full_sync_requests_total")},
            {"payload_bytes", total("refit_receiver_payload_bytes_total")},
            {"failures", total("refit_receiver_failures_total")}}}};
}

std::string SyncService::MetricsText() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  return metrics_.Text();
}

void SyncService::BeginShutdown() { stopping_ = true; }

uint64_t SyncService::version() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  return version_;
}

}  // namespace refit::cli
