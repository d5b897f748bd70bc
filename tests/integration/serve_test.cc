// `refit serve` end to end: a real server process on a loopback port, real `refit send` processes
// publishing over the disk transport, HTTP and the strict Prometheus checks from serve_probe.py
// (urllib + prometheus_client under the interpreter the build found).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "sync_fixture.h"

namespace refit::testing {
namespace {

const std::string kProbe = std::string(REFIT_SOURCE_DIR) + "/tests/integration/serve_probe.py";
const std::string kToken = "s3cr3t-t0ken-that-never-shows-in-logs";

struct HttpReply {
  int status = 0;
  std::string content_type;
  nlohmann::json body;  // null when the body is not JSON
};

class ServeTest : public SyncFixture {
 protected:
  // Starts `refit serve` on a free loopback port and waits (bounded) for its "listening" line.
  void StartServe(const std::vector<std::string>& env = {},
                  const std::string& config = "refit.toml") {
    server_prefix_ = dir_ / ("serve" + std::to_string(counter_++));
    server_ = std::make_unique<RefitProcess>(
        std::vector<std::string>{"serve", "--config", dir_ / config, "--listen", "127.0.0.1:0"},
        server_prefix_, env);
    const std::regex listening("listening on (http://127\\.0\\.0\\.1:[0-9]+)");
    for (int i = 0; i < kBoundSeconds * 50 && url_.empty(); ++i) {
      std::smatch m;
      const std::string out = ReadAll(server_prefix_ + ".out");
      if (std::regex_search(out, m, listening)) url_ = m[1];
      if (url_.empty()) ::usleep(20 * 1000);
    }
    ASSERT_FALSE(url_.empty()) << "refit serve did not start: " << ReadAll(server_prefix_ + ".err");
  }

  // Stops the server with `signal`; its exit status and output.
  CommandResult StopServe(int signal = SIGTERM) {
    server_->Signal(signal);
    CommandResult r;
    EXPECT_TRUE(server_->WaitFor(kBoundSeconds, &r)) << "refit serve did not exit";
    server_.reset();
    return r;
  }

  RefitProcess* Probe(const std::vector<std::string>& args) {
    std::vector<std::string> full = {kProbe};
    full.insert(full.end(), args.begin(), args.end());
    probes_.push_back(std::make_unique<RefitProcess>(full,
                                                     dir_ / ("probe" + std::to_string(counter_++)),
                                                     std::vector<std::string>{}, REFIT_PYTHON3));
    return probes_.back().get();
  }
  static CommandResult Finish(RefitProcess* probe) {
    CommandResult r;
    EXPECT_TRUE(probe->WaitFor(kBoundSeconds, &r)) << "serve_probe.py ran past its bound";
    return r;
  }
  RefitProcess* StartRequest(const std::string& method, const std::string& path,
                             const std::string& token = kToken, const std::string& body = "") {
    std::vector<std::string> args = {"request", method, url_ + path};
    if (!token.empty()) args.insert(args.end(), {"--token", token});
    if (!body.empty()) args.insert(args.end(), {"--body", body});
    return Probe(args);
  }
  static HttpReply Parse(const CommandResult& r) {
    EXPECT_EQ(r.exit_code, 0) << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    if (!j.is_object()) return {};
    HttpReply reply{j["status"].get<int>(), j["content_type"].get<std::string>(), nullptr};
    reply.body = nlohmann::json::parse(j["body"].get<std::string>(), nullptr, false);
    if (reply.body.is_discarded()) reply.body = nullptr;
    return reply;
  }
  HttpReply Request(const std::string& method, const std::string& path,
                    const std::string& token = kToken, const std::string& body = "") {
    return Parse(Finish(StartRequest(method, path, token, body)));
  }
  HttpReply Sync(uint64_t version, const std::string& token = kToken) {
    return Request("POST", "/v1/sync", token, "{\"version\": " + std::to_string(version) + "}");
  }

  // The exposition at `/metrics` (or in a file), checked strictly: series -> value.
  nlohmann::json Metrics(const std::string& file = "", const std::string& token = kToken) {
    std::vector<std::string> args = {"metrics"};
    if (file.empty()) {
      args.insert(args.end(), {"--url", url_ + "/metrics"});
      if (!token.empty()) args.insert(args.end(), {"--token", token});
    } else {
      args.insert(args.end(), {"--file", file});
    }
    CommandResult r = Finish(Probe(args));
    EXPECT_EQ(r.exit_code, 0) << "the exposition failed the strict checks: " << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    return j.is_object() ? j["series"] : nlohmann::json::object();
  }

  std::unique_ptr<RefitProcess> server_;
  std::string server_prefix_;
  std::string url_;
  std::vector<std::unique_ptr<RefitProcess>> probes_;
};

double Series(const nlohmann::json& series, const std::string& key) {
  EXPECT_TRUE(series.contains(key)) << "no series " << key << " in " << series.dump();
  return series.contains(key) ? series[key].get<double>() : -1;
}

TEST_F(ServeTest, PushedVersionsAreAppliedBitExactAndCounted) {
  WriteConfig({.sender_extra = "metrics_file = \"" + dir_ / "sender-{rank}.prom" + "\"\n"});
  StartServe({"REFIT_SERVE_TOKEN=" + kToken});
  HttpReply status = Request("GET", "/v1/status");
  ASSERT_EQ(status.status, 200);
  EXPECT_EQ(status.body["version"], 0);
  EXPECT_EQ(status.body["sync"]["in_progress"], false);

  for (int v = 1; v <= 3; ++v) {
    ASSERT_EQ(Send(v).exit_code, 0) << "send of version " << v;
    HttpReply synced = Sync(v);
    ASSERT_EQ(synced.status, 200) << synced.body.dump();
    EXPECT_EQ(synced.body["version"], v);
    EXPECT_EQ(synced.body["reached"], true);
    EXPECT_EQ(synced.body["applied"], nlohmann::json::array({v}));
    ExpectModelAt(v, "after the push of version " + std::to_string(v));
  }
  // A version already held answers at once; one not committed is 409; a bad body 400.
  HttpReply again = Sync(3);
  EXPECT_EQ(again.status, 200);
  EXPECT_EQ(again.body["applied"], nlohmann::json::array());
  HttpReply ahead = Sync(7);
  EXPECT_EQ(ahead.status, 409);
  EXPECT_EQ(ahead.body["reached"], false);
  EXPECT_EQ(ahead.body["version"], 3);
  EXPECT_EQ(Request("POST", "/v1/sync", kToken, "{\"version\": -1}").status, 400);
  EXPECT_EQ(Request("POST", "/v1/sync", kToken, "not json").status, 400);

  status = Request("GET", "/v1/status");
  EXPECT_EQ(status.body["version"], 3);
  EXPECT_EQ(status.body["last_applied"]["version"], 3);
  EXPECT_EQ(status.body["counters"]["versions_applied"], 3);
  EXPECT_EQ(status.body["counters"]["full_versions_applied"], 1);
  EXPECT_TRUE(status.body["last_error"].is_null());

  const nlohmann::json received = Metrics();
  const nlohmann::json sent = Metrics(dir_ / "sender-0.prom");
  const std::string r0 = "{receiver=\"r0\"}";
  const std::string rank0 = "{rank=\"0\"}";
  EXPECT_EQ(Series(received, "refit_receiver_versions_applied_total" + r0), 3);
  EXPECT_EQ(Series(received, "refit_receiver_full_versions_applied_total" + r0), 1);
  EXPECT_EQ(Series(received, "refit_receiver_version" + r0), 3);
  EXPECT_EQ(Series(received, "refit_receiver_failures_total{kind=\"io_error\",receiver=\"r0\"}"),
            0);
  EXPECT_GE(Series(received, "refit_receiver_stage_seconds_total{receiver=\"r0\",stage=\"fetch\"}"),
            0);
  // The sender's file continued its counters over three `refit send` processes.
  EXPECT_EQ(Series(sent, "refit_sender_versions_published_total" + rank0), 3);
  EXPECT_EQ(Series(sent, "refit_sender_full_versions_published_total" + rank0), 1);
  EXPECT_EQ(Series(sent, "refit_sender_version" + rank0), 3);
  EXPECT_GT(Series(sent, "refit_sender_payload_bytes_total" + rank0), 0);
  EXPECT_EQ(Series(received, "refit_receiver_payload_bytes_total" + r0),
            Series(sent, "refit_sender_payload_bytes_total" + rank0));
  EXPECT_EQ(Series(received, "refit_receiver_records_total" + r0),
            Series(sent, "refit_sender_records_total" + rank0));

  CommandResult stopped = StopServe();
  EXPECT_EQ(stopped.exit_code, 0) << stopped.err;
  EXPECT_NE(stopped.out.find("stopped at version 3"), std::string::npos) << stopped.out;
  EXPECT_EQ((stopped.out + stopped.err + all_output_).find(kToken), std::string::npos);
}

TEST_F(ServeTest, WrongOrMissingTokenIs401OnEveryEndpoint) {
  WriteAll(dir_ / "token", kToken + "\n");  // the trailing newline is not part of the token
  WriteConfig({.tail = "\n[serve]\ntoken_file = \"" + dir_ / "token" + "\"\n"});
  StartServe();
  ASSERT_EQ(Send(1).exit_code, 0);
  for (const std::string& token : {std::string(), std::string("wrong"), kToken + "x"}) {
    EXPECT_EQ(Sync(1, token).status, 401) << "token '" << token << "'";
    EXPECT_EQ(Request("GET", "/v1/status", token).status, 401);
    EXPECT_EQ(Request("GET", "/metrics", token).status, 401);
  }
  EXPECT_EQ(Request("GET", "/v1/status").body["version"], 0) << "an unauthorized push applied";
  EXPECT_EQ(Sync(1).status, 200);
  ExpectModelAt(1, "after the authorized push");
}

TEST_F(ServeTest, ConcurrentPushesOfOneVersionApplyItOnce) {
  StartServe({"REFIT_SERVE_TOKEN=" + kToken});
  ASSERT_EQ(Send(1).exit_code, 0);
  const std::string body = "{\"version\": 1}";
  RefitProcess* a = StartRequest("POST", "/v1/sync", kToken, body);
  RefitProcess* b = StartRequest("POST", "/v1/sync", kToken, body);
  HttpReply ra = Parse(Finish(a));
  HttpReply rb = Parse(Finish(b));
  EXPECT_EQ(ra.status, 200);
  EXPECT_EQ(rb.status, 200);
  nlohmann::json applied = ra.body["applied"];
  for (const auto& v : rb.body["applied"]) applied.push_back(v);
  EXPECT_EQ(applied, nlohmann::json::array({1})) << "applied by both pushes: " << applied.dump();
  EXPECT_EQ(Series(Metrics(), "refit_receiver_versions_applied_total{receiver=\"r0\"}"), 1);
  ExpectModelAt(1, "after two pushes");
}

TEST_F(ServeTest, PollingOptionAppliesWithoutAPushAndNeedsNoToken) {
  WriteConfig({.tail = "\n[serve]\npoll_interval_ms = 20\n"});
  StartServe();
  ASSERT_EQ(Send(1).exit_code, 0);
  uint64_t version = 0;
  for (int i = 0; i < 200 && version != 1; ++i) {  // bounded: 200 requests, each bounded
    version = Request("GET", "/v1/status", "").body.value("version", uint64_t{0});
  }
  EXPECT_EQ(version, 1u);
  ExpectModelAt(1, "after polling");
  EXPECT_EQ(Series(Metrics("", ""), "refit_receiver_versions_applied_total{receiver=\"r0\"}"), 1);
  EXPECT_EQ(StopServe(SIGINT).exit_code, 0);
}

TEST_F(ServeTest, SigtermFinishesTheApplyInProgressThenExitsZero) {
  // The server's transport sleeps before every operation, so its apply takes seconds.
  WriteConfig({.tail = "\n[faults]\nseed = 1\ndelay = 1.0\ndelay_ms = 300\n"}, "slow.toml");
  StartServe({"REFIT_SERVE_TOKEN=" + kToken}, "slow.toml");
  ASSERT_EQ(Send(1).exit_code, 0);
  RefitProcess* push = StartRequest("POST", "/v1/sync", kToken, "{\"version\": 1}");
  bool in_progress = false;
  for (int i = 0; i < 500 && !in_progress; ++i) {  // bounded: at most 500 status requests
    in_progress = Request("GET", "/v1/status").body["sync"].value("in_progress", false);
  }
  ASSERT_TRUE(in_progress) << "never saw the sync in progress";
  server_->Signal(SIGTERM);
  HttpReply pushed = Parse(Finish(push));
  EXPECT_EQ(pushed.status, 200) << pushed.body.dump();
  EXPECT_EQ(pushed.body["applied"], nlohmann::json::array({1}));
  CommandResult stopped = StopServe();
  EXPECT_EQ(stopped.exit_code, 0) << stopped.err;
  ExpectModelAt(1, "after SIGTERM during the apply");
}

TEST_F(ServeTest, NonLoopbackWithoutTokenWarns) {
  // 192.0.2.1 (TEST-NET-1) is no address of this host: the warning comes before the bind fails,
  // and nothing ever listens off loopback.
  CommandResult open = Run({"serve", "--config", dir_ / "refit.toml", "--listen", "192.0.2.1:0"});
  EXPECT_EQ(open.exit_code, 1);
  EXPECT_NE(open.err.find("warning: serving on 192.0.2.1:0, not a loopback address, without a "
                          "token"),
            std::string::npos)
      << open.err;
  EXPECT_NE(open.err.find("cannot listen on 192.0.2.1:0"), std::string::npos) << open.err;

  CommandResult with_token =
      Run({"serve", "--config", dir_ / "refit.toml", "--listen", "192.0.2.1:0"},
          {"REFIT_SERVE_TOKEN=" + kToken});
  EXPECT_EQ(with_token.exit_code, 1);
  EXPECT_EQ(with_token.err.find("warning"), std::string::npos) << with_token.err;
  EXPECT_EQ(with_token.err.find(kToken), std::string::npos);
}

TEST_F(ServeTest, BadServeSettingsAreOneLineUsageErrors) {
  WriteAll(dir_ / "token", kToken + "\n");
  WriteAll(dir_ / "empty-token", "\n");
  WriteConfig({.tail = "\n[serve]\ntoken_file = \"" + dir_ / "token" + "\"\n"}, "file.toml");
  WriteConfig({.tail = "\n[serve]\ntoken_file = \"" + dir_ / "empty-token" + "\"\n"}, "empty.toml");
  WriteConfig({.tail = "\n[serve]\nlisten = \"127.0.0.1\"\n"}, "noport.toml");
  WriteConfig({.tail = "\n[serve]\npoll_interval_ms = -1\n"}, "negative.toml");
  WriteConfig({.tail = "\n[serve]\ntokn_file = \"x\"\n"}, "typo.toml");
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"file.toml", {"REFIT_SERVE_TOKEN=" + kToken}},  // two token sources
      {"empty.toml", {}},
      {"noport.toml", {}},
      {"negative.toml", {}},
      {"typo.toml", {}},
  };
  for (const auto& [config, env] : cases) {
    CommandResult r = Run({"serve", "--config", dir_ / config}, env);
    EXPECT_EQ(r.exit_code, 2) << config << ": " << r.err;
    EXPECT_EQ(LineCount(r.err), 1) << config << ": " << r.err;
    EXPECT_EQ(r.err.rfind("refit: error: ", 0), 0u) << r.err;
    EXPECT_EQ(r.err.find(kToken), std::string::npos) << config;
  }
}

}  // namespace
}  // namespace refit::testing
