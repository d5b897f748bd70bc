// The Prometheus text exposition format 0.0.4: a fixed set of metric families with their samples,
// rendered with HELP and TYPE lines and escaped label values, and read back (counters continue
// across processes that write the same metrics file).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "refit/status.h"

namespace refit::internal {

enum class MetricType { kCounter, kGauge };

struct MetricFamilySpec {
  std::string name;  // a counter's name ends in _total
  MetricType type;
  std::string help;
  // The name of the family's one label ("": none); an unlabelled counter starts at 0.
  std::string label = "";
};

// Label names and values in the order they are rendered.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// Samples of a fixed list of families. Not synchronized: the owner serializes its calls.
class MetricSet {
 public:
  // `constant_labels` (e.g. the sender's rank) are added to every sample.
  MetricSet(std::vector<MetricFamilySpec> families, MetricLabels constant_labels);

  // Adds `delta` to a counter's sample (made at 0 on first use).
  void Add(std::string_view family, double delta, const MetricLabels& labels = {});
  // Sets a gauge's sample.
  void Set(std::string_view family, double value, const MetricLabels& labels = {});
  // The sample's value, 0 when there is none.
  double Get(std::string_view family, const MetricLabels& labels = {}) const;
  // The sum of the family's samples (0 for an unknown family).
  double Sum(std::string_view family) const;

  // Every family in its declared order: HELP, TYPE, then its samples (a family without samples
  // keeps its HELP and TYPE lines).
  std::string Text() const;

  // Takes the samples of `text`, an exposition this set's families rendered earlier (a metrics
  // file written by an earlier process), so counters continue instead of restarting at 0.
  // Unknown families are skipped; a malformed line or a sample of other constant labels is
  // kCorrupt naming `origin` and the line.
  Status Load(std::string_view text, const std::string& origin);

 private:
  struct Family {
    MetricFamilySpec spec;
    std::map<MetricLabels, double> samples;
  };
  Family* Find(std::string_view name);
  const Family* Find(std::string_view name) const;

  std::vector<Family> families_;
  MetricLabels constant_labels_;
};

// Label values escape backslash, double quote and newline; HELP text escapes backslash and newline.
std::string EscapeLabelValue(std::string_view value);
std::string EscapeHelp(std::string_view help);
// Shortest text that reads back as the same double; NaN, +Inf and -Inf as the format spells them.
std::string FormatMetricValue(double value);

// One sample line: name, labels (unescaped), value.
struct ParsedSample {
  std::string name;
  MetricLabels labels;
  double value = 0;
};
Result<ParsedSample> ParseSampleLine(std::string_view line);

}  // namespace refit::internal
