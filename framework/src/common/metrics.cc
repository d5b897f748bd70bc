// The mapping from SyncStats / ApplyStats to Prometheus metrics (refit/metrics.h), shared by
// `refit send`, `refit serve` and the Python module.
#include "refit/metrics.h"

#include <chrono>
#include <string_view>
#include <vector>

#include "common/file_util.h"
#include "common/prometheus.h"

namespace refit {

namespace {

using internal::MetricFamilySpec;
using internal::MetricLabels;
using internal::MetricType;

// Seconds per stage: one row per timing field of the stats struct. A stage the pipelines start
// timing is one more row here; the metric, its label and the docs' list follow from it.
template <typename Stats>
struct StageSeconds {
  const char* stage;
  double Stats::*seconds;
};
constexpr StageSeconds<SyncStats> kSenderStages[] = {
    {"read", &SyncStats::read_seconds},        // opening the weights (`refit send`)
    {"wait", &SyncStats::wait_seconds},        // the previous version's acks
    {"advance", &SyncStats::advance_seconds},  // the baseline advanced to it
    {"diff", &SyncStats::diff_seconds},
    {"encode", &SyncStats::encode_seconds},  // CPU seconds summed over the encoding threads
    {"put", &SyncStats::send_seconds},       // waiting on payload puts
    {"commit", &SyncStats::commit_seconds},  // manifest, commit and state
};
constexpr StageSeconds<ApplyStats> kReceiverStages[] = {
    {"fetch", &ApplyStats::fetch_seconds},
    {"decode", &ApplyStats::decode_seconds},
    {"verify", &ApplyStats::verify_seconds},
    {"log_sync", &ApplyStats::log_sync_seconds},
    {"write", &ApplyStats::write_seconds},
    {"apply", &ApplyStats::apply_seconds},    // all of the above but fetch (+ in-place decodes)
    {"commit", &ApplyStats::commit_seconds},  // state, checkpoint when due, ack
};

template <typename Stats, size_t N>
std::vector<std::pair<std::string, double>> StageList(const StageSeconds<Stats> (&rows)[N],
                                                      const Stats& s) {
  std::vector<std::pair<std::string, double>> out;
  for (const StageSeconds<Stats>& row : rows) out.emplace_back(row.stage, s.*row.seconds);
  return out;
}

constexpr StatusCode kFailureCodes[] = {
    StatusCode::kInvalidArgument, StatusCode::kNotFound,    StatusCode::kIoError,
    StatusCode::kCorrupt,         StatusCode::kUnsupported, StatusCode::kVersionMismatch,
    StatusCode::kAlreadyExists,   StatusCode::kTimeout,     StatusCode::kInternal,
};

// The status code's name as a label value: "io error" -> "io_error".
std::string FailureKind(StatusCode code) {
  std::string kind = StatusCodeName(code);
  for (char& c : kind) {
    if (c == ' ') c = '_';
  }
  return kind;
}

double WallClockSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Every stage and failure kind starts at 0, so a rate() over them never misses a series.
template <typename Stats, size_t N>
void InitLabelledCounters(internal::MetricSet& set, const std::string& prefix,
                          const StageSeconds<Stats> (&stages)[N]) {
  for (const StageSeconds<Stats>& row : stages) {
    set.Add(prefix + "_stage_seconds_total", 0, {{"stage", row.stage}});
  }
  for (StatusCode code : kFailureCodes) {
    set.Add(prefix + "_failures_total", 0, {{"kind", FailureKind(code)}});
  }
}

std::vector<MetricFamilySpec> SenderFamilies() {
  using T = MetricType;
  return {
      {"refit_sender_versions_published_total", T::kCounter, "Versions this rank published."},
      {"refit_sender_full_versions_published_total", T::kCounter,
       "Versions published as full (dense) syncs: the first one, one a receiver asked for, or "
       "every sender.full_every-th."},
      {"refit_sender_payload_bytes_total", T::kCounter, "Payload bytes put through the transport."},
      {"refit_sender_payloads_total", T::kCounter, "Payloads put through the transport."},
      {"refit_sender_records_total", T::kCounter, "Records written."},
      {"refit_sender_changed_elements_total", T::kCounter, "Elements whose bits changed."},
      {"refit_sender_elements_total", T::kCounter,
       "Elements diffed (this rank's slices, once per version); density over a window is the "
       "increase of changed_elements over the increase of this."},
      {"refit_sender_changed_bytes_total", T::kCounter, "Bytes of the changed elements."},
      {"refit_sender_model_bytes_total", T::kCounter,
       "Bytes of one dense copy of this rank's slices, once per version."},
      {"refit_sender_stage_seconds_total", T::kCounter,
       "Seconds per publish stage (encode: CPU seconds summed over the encoding threads).",
       "stage"},
      {"refit_sender_publish_seconds_total", T::kCounter, "Wall seconds of the publishes."},
      {"refit_sender_failures_total", T::kCounter, "Failed publishes by kind of error.", "kind"},
      {"refit_sender_version", T::kGauge, "The last version published."},
      {"refit_sender_last_density", T::kGauge,
       "Fraction of the elements that changed in the last version published."},
      {"refit_sender_last_publish_timestamp_seconds", T::kGauge,
       "Unix time of the last version published."},
  };
}

std::vector<MetricFamilySpec> ReceiverFamilies() {
  using T = MetricType;
  return {
      {"refit_receiver_versions_applied_total", T::kCounter, "Versions applied and committed."},
      {"refit_receiver_full_versions_applied_total", T::kCounter,
       "Versions applied that were full (dense) syncs."},
      {"refit_receiver_full_sync_requests_total", T::kCounter,
       "Times the receiver asked the senders for a full sync (need full)."},
      {"refit_receiver_payload_bytes_total", T::kCounter, "Payload bytes fetched and applied."},
      {"refit_receiver_payloads_total", T::kCounter, "Payloads applied."},
      {"refit_receiver_records_total", T::kCounter, "Records applied."},
      {"refit_receiver_changed_elements_total", T::kCounter, "Elements the applied records set."},
      {"refit_receiver_stage_seconds_total", T::kCounter,
       "Seconds per apply stage (apply: decode + apply + digest verification).", "stage"},
      {"refit_receiver_sync_seconds_total", T::kCounter,
       "Wall seconds of the polls that applied a version."},
      {"refit_receiver_failures_total", T::kCounter, "Failed polls by kind of error.", "kind"},
      {"refit_receiver_version", T::kGauge, "The committed version the receiver holds."},
      {"refit_receiver_model_elements", T::kGauge, "Elements of the receiver's model."},
      {"refit_receiver_last_density", T::kGauge,
       "Fraction of the model's elements the last applied version changed."},
      {"refit_receiver_last_apply_timestamp_seconds", T::kGauge,
       "Unix time of the last version applied."},
      {"refit_receiver_sync_in_progress", T::kGauge, "1 while a sync is being applied."},
  };
}

// `sender.metrics_file` with "{rank}" replaced; "" when unset.
Result<std::string> MetricsFilePath(const Config& config, int rank, int world) {
  const std::string key = "sender.metrics_file";
  REFIT_ASSIGN_OR_RAISE(std::string path, config.GetString(key, ""));
  const size_t at = path.find("{rank}");
  if (at != std::string::npos) {
    path.replace(at, 6, std::to_string(rank));
  } else if (!path.empty() && world > 1) {
    // Ranks writing one file would overwrite each other's counters.
    return Status::Invalid(config.Where(key) + ": '" + key +
                           "' must contain {rank} when there are several ranks (world " +
                           std::to_string(world) + ")");
  }
  return path;
}

}  // namespace

// ------------------------------------------------------------------ sender

struct SenderMetrics::Impl {
  explicit Impl(int rank) : set(SenderFamilies(), {{"rank", std::to_string(rank)}}) {
    InitLabelledCounters(set, "refit_sender", kSenderStages);
  }
  internal::MetricSet set;
  std::string path;
};

SenderMetrics::SenderMetrics() = default;
SenderMetrics::~SenderMetrics() = default;

Result<std::unique_ptr<SenderMetrics>> SenderMetrics::Make(const Config& config, int rank,
                                                           int world) {
  std::unique_ptr<SenderMetrics> metrics(new SenderMetrics());
  metrics->impl_ = std::make_unique<Impl>(rank);
  REFIT_ASSIGN_OR_RAISE(metrics->impl_->path, MetricsFilePath(config, rank, world));
  const std::string& path = metrics->impl_->path;
  if (path.empty()) return metrics;
  Result<std::string> earlier = internal::ReadSmallFile(path, 16ull << 20);
  if (!earlier.ok() && earlier.status().code() != StatusCode::kNotFound) return earlier.status();
  if (earlier.ok()) {
    Status loaded = metrics->impl_->set.Load(*earlier, path);
    if (!loaded.ok()) {
      return loaded.WithContext("sender.metrics_file (remove it to restart the counters)");
    }
  }
  return metrics;
}

Status SenderMetrics::Record(const Result<SyncStats>& publish) {
  internal::MetricSet& set = impl_->set;
  if (!publish.ok()) {
    set.Add("refit_sender_failures_total", 1, {{"kind", FailureKind(publish.status().code())}});
  } else {
    const SyncStats& s = publish.value();
    set.Add("refit_sender_versions_published_total", 1);
    set.Add("refit_sender_full_versions_published_total", s.full ? 1 : 0);
    set.Add("refit_sender_payload_bytes_total", static_cast<double>(s.payload_bytes));
    set.Add("refit_sender_payloads_total", static_cast<double>(s.payloads));
    set.Add("refit_sender_records_total", static_cast<double>(s.counters.records));
    set.Add("refit_sender_changed_elements_total",
            static_cast<double>(s.counters.changed_elements));
    set.Add("refit_sender_elements_total", static_cast<double>(s.counters.total_elements));
    set.Add("refit_sender_changed_bytes_total", static_cast<double>(s.counters.changed_bytes));
    set.Add("refit_sender_model_bytes_total", static_cast<double>(s.counters.model_bytes));
    for (const StageSeconds<SyncStats>& row : kSenderStages) {
      set.Add("refit_sender_stage_seconds_total", s.*row.seconds, {{"stage", row.stage}});
    }
    set.Add("refit_sender_publish_seconds_total", s.total_seconds);
    set.Set("refit_sender_version", static_cast<double>(s.version));
    set.Set("refit_sender_last_density", s.counters.density());
    set.Set("refit_sender_last_publish_timestamp_seconds", WallClockSeconds());
  }
  if (impl_->path.empty()) return Status::OK();
  return internal::WriteFileAtomic(impl_->path, set.Text(), /*durable=*/false);
}

std::string SenderMetrics::Text() const { return impl_->set.Text(); }
std::string SenderMetrics::file() const { return impl_->path; }

// ------------------------------------------------------------------ receiver

struct ReceiverMetrics::Impl {
  explicit Impl(const std::string& id) : set(ReceiverFamilies(), {{"receiver", id}}) {
    InitLabelledCounters(set, "refit_receiver", kReceiverStages);
    set.Set("refit_receiver_sync_in_progress", 0);
  }
  internal::MetricSet set;
  uint64_t model_elements = 0;
  bool full_requested = false;  // a run of need-full answers counts as one request
};

ReceiverMetrics::ReceiverMetrics(const std::string& receiver_id)
    : impl_(std::make_unique<Impl>(receiver_id)) {}
ReceiverMetrics::~ReceiverMetrics() = default;
ReceiverMetrics::ReceiverMetrics(ReceiverMetrics&&) noexcept = default;
ReceiverMetrics& ReceiverMetrics::operator=(ReceiverMetrics&&) noexcept = default;

void ReceiverMetrics::RecordApplied(const ApplyStats& s) {
  internal::MetricSet& set = impl_->set;
  impl_->full_requested = false;
  set.Add("refit_receiver_versions_applied_total", 1);
  set.Add("refit_receiver_full_versions_applied_total", s.full ? 1 : 0);
  set.Add("refit_receiver_payload_bytes_total", static_cast<double>(s.payload_bytes));
  set.Add("refit_receiver_payloads_total", static_cast<double>(s.payloads));
  set.Add("refit_receiver_records_total", static_cast<double>(s.counters.records));
  set.Add("refit_receiver_changed_elements_total",
          static_cast<double>(s.counters.changed_elements));
  for (const StageSeconds<ApplyStats>& row : kReceiverStages) {
    set.Add("refit_receiver_stage_seconds_total", s.*row.seconds, {{"stage", row.stage}});
  }
  set.Add("refit_receiver_sync_seconds_total", s.total_seconds);
  set.Set("refit_receiver_version", static_cast<double>(s.version));
  set.Set("refit_receiver_last_apply_timestamp_seconds", WallClockSeconds());
  if (impl_->model_elements != 0) {
    set.Set("refit_receiver_last_density", static_cast<double>(s.counters.changed_elements) /
                                               static_cast<double>(impl_->model_elements));
  }
}

void ReceiverMetrics::RecordFailure(const Status& status) {
  if (status.ok()) return;
  impl_->set.Add("refit_receiver_failures_total", 1, {{"kind", FailureKind(status.code())}});
  if (status.code() == StatusCode::kVersionMismatch && !impl_->full_requested) {
    impl_->set.Add("refit_receiver_full_sync_requests_total", 1);
    impl_->full_requested = true;
  }
}

void ReceiverMetrics::SetVersion(uint64_t committed_version) {
  impl_->set.Set("refit_receiver_version", static_cast<double>(committed_version));
}

void ReceiverMetrics::SetModelElements(uint64_t elements) {
  impl_->model_elements = elements;
  if (elements != 0) impl_->set.Set("refit_receiver_model_elements", static_cast<double>(elements));
}

void ReceiverMetrics::SetSyncInProgress(bool in_progress) {
  impl_->set.Set("refit_receiver_sync_in_progress", in_progress ? 1 : 0);
}

std::string ReceiverMetrics::Text() const { return impl_->set.Text(); }
double ReceiverMetrics::Total(const std::string& family) const { return impl_->set.Sum(family); }

std::vector<std::pair<std::string, double>> SenderStageSeconds(const SyncStats& stats) {
  return StageList(kSenderStages, stats);
}

std::vector<std::pair<std::string, double>> ReceiverStageSeconds(const ApplyStats& stats) {
  return StageList(kReceiverStages, stats);
}

}  // namespace refit
