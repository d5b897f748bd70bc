// The Prometheus text writer (common/prometheus.h) and the stats -> metrics mapping
// (refit/metrics.h).
#include "refit/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "common/file_util.h"
#include "common/prometheus.h"
#include "temp_dir_util.h"

namespace refit::internal {
namespace {

MetricSet TwoFamilies() {
  return MetricSet({{"x_requests_total", MetricType::kCounter, "Requests.\nSecond \\ line."},
                    {"x_errors_total", MetricType::kCounter, "Errors by kind.", "kind"},
                    {"x_version", MetricType::kGauge, "Version."}},
                   {{"rank", "3"}});
}

TEST(PrometheusText, EscapesLabelValuesAndHelp) {
  EXPECT_EQ(EscapeLabelValue("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  EXPECT_EQ(EscapeHelp("a\\b\"c\nd"), "a\\\\b\"c\\nd");  // quotes stay in HELP
}

TEST(PrometheusText, ValuesReadBackExactly) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(123456789012), "123456789012");
  EXPECT_EQ(FormatMetricValue(0.1), "0.1");
  EXPECT_EQ(FormatMetricValue(std::nan("")), "NaN");
  EXPECT_EQ(FormatMetricValue(HUGE_VAL), "+Inf");
  EXPECT_EQ(FormatMetricValue(-HUGE_VAL), "-Inf");
}

TEST(PrometheusText, RendersHelpTypeAndSamplesInOrder) {
  MetricSet set = TwoFamilies();
  set.Add("x_requests_total", 2);
  set.Add("x_errors_total", 1, {{"kind", "io \"error\""}});
  set.Set("x_version", 7);
  EXPECT_EQ(set.Text(),
            "# HELP x_requests_total Requests.\\nSecond \\\\ line.\n"
            "# TYPE x_requests_total counter\n"
            "x_requests_total{rank=\"3\"} 2\n"
            "# HELP x_errors_total Errors by kind.\n"
            "# TYPE x_errors_total counter\n"
            "x_errors_total{rank=\"3\",kind=\"io \\\"error\\\"\"} 1\n"
            "# HELP x_version Version.\n"
            "# TYPE x_version gauge\n"
            "x_version{rank=\"3\"} 7\n");
}

TEST(PrometheusText, LoadContinuesFromItsOwnRendering) {
  MetricSet first = TwoFamilies();
  first.Add("x_requests_total", 5);
  first.Add("x_errors_total", 2, {{"kind", "a\\b\n\"c\""}});
  MetricSet second = TwoFamilies();
  ASSERT_TRUE(second.Load(first.Text(), "m.prom").ok());
  second.Add("x_requests_total", 1);
  EXPECT_EQ(second.Get("x_requests_total"), 6);
  EXPECT_EQ(second.Get("x_errors_total", {{"kind", "a\\b\n\"c\""}}), 2);
  EXPECT_EQ(second.Sum("x_errors_total"), 2);
}

TEST(PrometheusText, LoadRefusesMalformedLinesAndOtherWriters) {
  MetricSet set = TwoFamilies();
  Status bad = set.Load("# TYPE x counter\nx_requests_total{rank=\"3\" 1\n", "m.prom");
  EXPECT_EQ(bad.code(), StatusCode::kCorrupt);
  EXPECT_NE(bad.message().find("m.prom:2"), std::string::npos) << bad.message();
  EXPECT_EQ(set.Load("x_requests_total{rank=\"4\"} 1\n", "m.prom").code(), StatusCode::kCorrupt);
  EXPECT_EQ(set.Load("x_requests_total{rank=\"3\"} one\n", "m.prom").code(), StatusCode::kCorrupt);
  EXPECT_TRUE(set.Load("other_total 9\n", "m.prom").ok());  // not ours: skipped
}

TEST(SenderMetrics, FileCountersContinueAcrossInstances) {
  refit::testing::ScopedTempDir dir("refit-metrics");
  const std::string path = dir.path().string() + "/sender-{rank}.prom";
  Config config = Config::FromString("[sender]\nmetrics_file = \"" + path + "\"\n", "t").value();
  SyncStats stats;
  stats.version = 1;
  stats.full = true;
  stats.payload_bytes = 1000;
  for (int run = 0; run < 2; ++run) {
    auto metrics = SenderMetrics::Make(config, 1, 2);
    ASSERT_TRUE(metrics.ok()) << metrics.status().message();
    ASSERT_TRUE(metrics.value()->Record(stats).ok());
    ASSERT_TRUE(metrics.value()->Record(Status::Timeout("acks")).ok());
  }
  const std::string text = ReadSmallFile(dir.path().string() + "/sender-1.prom", 1 << 20).value();
  EXPECT_NE(text.find("refit_sender_versions_published_total{rank=\"1\"} 2\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("refit_sender_payload_bytes_total{rank=\"1\"} 2000\n"), std::string::npos);
  EXPECT_NE(text.find("refit_sender_failures_total{rank=\"1\",kind=\"timeout\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("refit_sender_stage_seconds_total{rank=\"1\",stage=\"encode\"} 0\n"),
            std::string::npos);
}

TEST(SenderMetrics, SeveralRanksNeedRankInTheFileName) {
  Config config = Config::FromString("[sender]\nmetrics_file = \"/tmp/s.prom\"\n", "t").value();
  auto metrics = SenderMetrics::Make(config, 0, 2);
  ASSERT_FALSE(metrics.ok());
  EXPECT_NE(metrics.status().message().find("{rank}"), std::string::npos);
}

TEST(ReceiverMetrics, ARunOfNeedFullAnswersIsOneRequest) {
  ReceiverMetrics metrics("r0");
  metrics.RecordFailure(Status::VersionMismatch("need full"));
  metrics.RecordFailure(Status::VersionMismatch("need full"));
  ApplyStats full;
  full.version = 4;
  full.full = true;
  full.counters.changed_elements = 10;
  metrics.SetModelElements(40);
  metrics.RecordApplied(full);
  metrics.RecordFailure(Status::VersionMismatch("need full"));
  EXPECT_EQ(metrics.Total("refit_receiver_full_sync_requests_total"), 2);
  EXPECT_EQ(metrics.Total("refit_receiver_failures_total"), 3);
  EXPECT_EQ(metrics.Total("refit_receiver_full_versions_applied_total"), 1);
  EXPECT_NE(metrics.Text().find("refit_receiver_last_density{receiver=\"r0\"} 0.25\n"),
            std::string::npos)
      << metrics.Text();
}

}  // namespace
}  // namespace refit::internal
