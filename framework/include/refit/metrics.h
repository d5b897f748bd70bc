// Prometheus metrics of senders and receivers: counters of the syncs done (versions, payload
// bytes, changed elements, seconds per stage, failures by kind, full syncs), rendered in the
// Prometheus text exposition format 0.0.4. docs/serve.md lists every metric.
//
// Neither class is synchronized: the owner serializes its calls (as it does a Sender's).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "refit/config.h"
#include "refit/export.h"
#include "refit/receiver.h"
#include "refit/sender.h"
#include "refit/status.h"

namespace refit {

// The content type of the text an endpoint serves: Text() of either class.
inline constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

// Seconds per stage of a publish / an apply, in pipeline order: the stage labels of the metrics
// below and the stages `refit send` / `refit recv` print.
REFIT_API std::vector<std::pair<std::string, double>> SenderStageSeconds(const SyncStats& stats);
REFIT_API std::vector<std::pair<std::string, double>> ReceiverStageSeconds(const ApplyStats& stats);

class REFIT_API SenderMetrics {
 public:
  // One rank's metrics (every sample is labelled rank="R"). With sender.metrics_file set in
  // `config` ("{rank}" in it replaced by the rank; required when world > 1), the counters continue
  // from that file when it exists (`refit send` publishes one version per process), and every
  // Record rewrites it atomically (temp file + rename: node_exporter's textfile collector never
  // reads half a file). A file that is not such an exposition is kCorrupt.
  static Result<std::unique_ptr<SenderMetrics>> Make(const Config& config, int rank = 0,
                                                     int world = 1);
  ~SenderMetrics();

  // Counts one Sender::Publish: the version it published, or the error it failed with; then
  // rewrites the metrics file (if any). An error is the file's write failing.
  Status Record(const Result<SyncStats>& publish);

  std::string Text() const;
  std::string file() const;  // "": no metrics file

 private:
  SenderMetrics();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class REFIT_API ReceiverMetrics {
 public:
  // Every sample is labelled receiver="<receiver_id>".
  explicit ReceiverMetrics(const std::string& receiver_id);
  ~ReceiverMetrics();
  ReceiverMetrics(ReceiverMetrics&&) noexcept;
  ReceiverMetrics& operator=(ReceiverMetrics&&) noexcept;

  // One Receiver::PollOnce that applied a version.
  void RecordApplied(const ApplyStats& stats);
  // One Receiver::PollOnce that failed. kVersionMismatch means the receiver asked the senders for
  // a full sync: the first of a run of those (until a version is applied) counts as one request.
  void RecordFailure(const Status& status);
  void SetVersion(uint64_t committed_version);
  // The elements of the receiver's model (0: unknown); with it the last version's density.
  void SetModelElements(uint64_t elements);
  void SetSyncInProgress(bool in_progress);

  std::string Text() const;
  // The sum of a family's samples, e.g. "refit_receiver_failures_total" over every kind; 0 for
  // a family that is not one of the receiver's.
  double Total(const std::string& family) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace refit
