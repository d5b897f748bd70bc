// refit serve: the receiver as an HTTP service (docs/serve.md). The only translation unit that
// includes httplib.h; the receiver side of it lives in serve_service.{h,cc}. It is linked into
// `refit-serve` alone (serve_main.cc), which `refit serve` execs (serve_cli.cc): cpp-httplib and
// the TLS libraries it pulls in cost every other refit process ~2.5 ms of loading.
#include <arpa/inet.h>
#include <httplib.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "commands.h"
#include "common/crypto.h"
#include "common/file_util.h"
#include "serve_service.h"

namespace refit::cli {

namespace {

constexpr const char* kJson = "application/json";

struct ListenAddress {
  std::string host;  // as bound: IPv6 without brackets
  int port = 0;
};

// "HOST:PORT" or "[IPv6]:PORT"; `where` names the flag or config key at fault.
Result<ListenAddress> ParseListen(const std::string& text, const std::string& where) {
  const size_t colon = text.rfind(':');
  auto bad = [&](const std::string& why) {
    return Status::Invalid(where + ": '" + text + "' " + why + " (expected HOST:PORT, e.g. " +
                           "127.0.0.1:8470)");
  };
  if (colon == std::string::npos) return bad("has no port");
  if (colon == 0) return bad("names no host");
  ListenAddress address;
  address.host = text.substr(0, colon);
  if (address.host.front() == '[' && address.host.back() == ']') {
    address.host = address.host.substr(1, address.host.size() - 2);
  } else if (address.host.find(':') != std::string::npos) {
    return bad("has an IPv6 address without brackets");
  }
  if (address.host.empty()) return bad("names no host");
  const std::string port = text.substr(colon + 1);
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) > 65535) {
    return bad("has no port number in 0..65535");
  }
  address.port = std::stoi(port);
  return address;
}

bool IsLoopback(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return ::inet_pton(AF_INET6, host.c_str(), &v6) == 1 &&
         std::memcmp(&v6, &in6addr_loopback, sizeof(v6)) == 0;
}

// The bearer token: [serve] token_file or REFIT_SERVE_TOKEN (not both); "" when neither is set.
// Never printed: errors name the file or the variable only.
Result<std::string> LoadToken(const Config& config) {
  REFIT_ASSIGN_OR_RAISE(std::string path, config.GetString("serve.token_file", ""));
  const char* env = std::getenv("REFIT_SERVE_TOKEN");
  const bool from_env = env != nullptr && *env != '\0';
  if (!path.empty() && from_env) {
    return Status::Invalid(config.Where("serve.token_file") +
                           ": both serve.token_file and REFIT_SERVE_TOKEN are set; set one");
  }
  std::string token;
  std::string origin = "REFIT_SERVE_TOKEN";
  if (from_env) {
    token = env;
  } else if (!path.empty()) {
    Result<std::string> text = internal::ReadSmallFile(path, 4096);
    if (!text.ok()) {
      return Status::Invalid(config.Where("serve.token_file") + ": " + text.status().message());
    }
    token = std::move(text).value();
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
    origin = "serve.token_file " + path;
    if (token.empty()) return Status::Invalid(origin + " is empty");
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return Status::Invalid(origin + ": the token must be printable ASCII without spaces");
    }
  }
  return token;
}

// "Bearer <token>", compared through SHA-256 digests in constant time: neither the token's bytes
// nor its length show in the time a wrong guess takes.
bool Authorized(const std::string& header, const std::string& token_sha256) {
  const std::string scheme = "bearer ";
  if (header.size() < scheme.size()) return false;
  for (size_t i = 0; i < scheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(header[i])) != scheme[i]) return false;
  }
  return internal::ConstantTimeEqual(internal::Sha256Hex(header.substr(scheme.size())),
                                     token_sha256);
}

void Reply(httplib::Response& res, const ServiceReply& reply) {
  res.status = reply.http_status;
  res.set_content(reply.body.dump() + "\n", kJson);
}

void ReplyError(httplib::Response& res, int http_status, const std::string& message) {
  Reply(res, {http_status, {{"error", {{"code", "http"}, {"message", message}}}}});
}

void AddRoutes(httplib::Server& server, SyncService& service, const std::string& token) {
  const std::string token_sha256 = token.empty() ? "" : internal::Sha256Hex(token);
  // Every endpoint, /metrics included, needs the token when one is configured.
  server.set_pre_routing_handler([token_sha256](const httplib::Request& req,
                                                httplib::Response& res) {
    if (token_sha256.empty() || Authorized(req.get_header_value("Authorization"), token_sha256)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    res.set_header("WWW-Authenticate", "Bearer realm=\"refit\"");
    ReplyError(res, 401, "missing or wrong bearer token");
    return httplib::Server::HandlerResponse::Handled;
  });
  server.Post("/v1/sync", [&service](const httplib::Request& req, httplib::Response& res) {
    Reply(res, service.HandleSync(req.body));
  });
  server.Get("/v1/status", [&service](const httplib::Request&, httplib::Response& res) {
    Reply(res, {200, service.StatusJson()});
  });
  server.Get("/metrics", [&service](const httplib::Request&, httplib::Response& res) {
    res.set_content(service.MetricsText(), kPrometheusContentType);
  });
  // Unknown paths and methods: a JSON body like every other answer (bodies already set stay).
  // (Spelled as HandlerWithResponse: 0.11's overload for plain handlers would also take it.)
  server.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        ReplyError(res, res.status, "no endpoint " + req.method + " " + req.path);
        return httplib::Server::HandlerResponse::Handled;
      }));
}

sigset_t ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

// Waits for SIGINT/SIGTERM (blocked in every thread, so only this one takes them), then stops
// new applies and the server; listen() returns once the requests in flight, an apply among
// them, are answered. Ends when `done` is set.
void WatchSignals(SyncService& service, httplib::Server& server, const std::atomic<bool>& done) {
  const sigset_t set = ShutdownSignals();
  const timespec tick{0, 100'000'000};
  bool stopping = false;
  bool stopped = false;
  while (!done) {
    const int signal = ::sigtimedwait(&set, nullptr, &tick);
    if (signal > 0 && !stopping) {
      std::fprintf(stderr, "refit serve: %s: finishing the sync in progress, then exiting\n",
                   signal == SIGINT ? "SIGINT" : "SIGTERM");
      std::fflush(stderr);
      service.BeginShutdown();
      stopping = true;
    }
    // A stop before listen() started would be lost: wait until the server runs.
    if (stopping && !stopped && server.is_running()) {
      server.stop();
      stopped = true;
    }
  }
}

// serve.poll_interval_ms > 0: polls in the background, through the same one-sync-at-a-time path,
// every interval and whenever the transport wakes the loop (ucx: as the commit lands).
void PollLoop(SyncService& service, int64_t interval_ms, const std::atomic<bool>& done) {
  using namespace std::chrono;
  auto next = steady_clock::now() + milliseconds(interval_ms);
  while (!done) {
    const auto now = steady_clock::now();
    // At most 50 ms at a time, so that a shutdown is noticed soon.
    const int64_t wait_ms =
        std::clamp<int64_t>(duration_cast<milliseconds>(next - now).count(), 0, 50);
    const bool woke = wait_ms > 0 && service.WaitForArrival(static_cast<uint32_t>(wait_ms));
    if (!woke && steady_clock::now() < next) continue;
    service.PollPending();
    next = steady_clock::now() + milliseconds(interval_ms);
  }
}

struct ServeSettings {
  ListenAddress listen;
  std::string token;
  int64_t poll_interval_ms = 0;
};

Result<ServeSettings> ReadServeSettings(const Config& config, const ServeOptions& o) {
  ServeSettings s;
  REFIT_ASSIGN_OR_RAISE(std::string listen, config.GetString("serve.listen", "127.0.0.1:8470"));
  const bool from_flag = !o.listen.empty();
  REFIT_ASSIGN_OR_RAISE(s.listen,
                        ParseListen(from_flag ? o.listen : listen,
                                    from_flag ? "--listen" : config.Where("serve.listen")));
  REFIT_ASSIGN_OR_RAISE(s.token, LoadToken(config));
  REFIT_ASSIGN_OR_RAISE(s.poll_interval_ms, config.GetInt("serve.poll_interval_ms", 0));
  return s;
}

Status Bind(httplib::Server& server, const ServeSettings& s, int* port) {
  const std::string where = s.listen.host + ":" + std::to_string(s.listen.port);
  if (!IsLoopback(s.listen.host) && s.token.empty()) {
    std::fprintf(stderr,
                 "refit: warning: serving on %s, not a loopback address, without a token: anyone "
                 "who reaches it can trigger syncs and read the receiver's status (set [serve] "
                 "token_file or REFIT_SERVE_TOKEN)\n",
                 where.c_str());
    std::fflush(stderr);
  }
  *port = s.listen.port;
  bool bound = false;
  if (s.listen.port == 0) {
    *port = server.bind_to_any_port(s.listen.host);
    bound = *port > 0;
  } else {
    bound = server.bind_to_port(s.listen.host, s.listen.port);
  }
  if (!bound) {
    return Status::IoError("cannot listen on " + where +
                           " (the address is in use or not one of this host's)");
  }
  return Status::OK();
}

}  // namespace

Status RunServe(const ServeOptions& o) {
  // Before any thread starts (the receiver's workers, the server's pool): they all inherit the
  // mask, so the signals reach only WatchSignals.
  const sigset_t signals = ShutdownSignals();
  ::pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  REFIT_ASSIGN_OR_RAISE(Config config, LoadConfigFile(o.config_path));
  // The receiver validates the whole config (a mistyped [serve] key included) first.
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<SyncService> service, SyncService::Make(config));
  REFIT_ASSIGN_OR_RAISE(ServeSettings settings, ReadServeSettings(config, o));
  httplib::Server server;
  server.set_keep_alive_timeout(2);  // idle connections must not hold a shutdown up for long
  server.set_payload_max_length(64 * 1024);
  AddRoutes(server, *service, settings.token);
  int port = 0;
  REFIT_RETURN_NOT_OK(Bind(server, settings, &port));
  const bool ipv6 = settings.listen.host.find(':') != std::string::npos;
  std::printf("refit serve: receiver %s at version %" PRIu64
              ", listening on http://%s%s%s:%d (%s)\n",
              service->receiver_id().c_str(), service->version(), ipv6 ? "[" : "",
              settings.listen.host.c_str(), ipv6 ? "]" : "", port,
              settings.token.empty() ? "no token" : "bearer token required");
  std::fflush(stdout);
  std::atomic<bool> done{false};
  std::thread watcher(WatchSignals, std::ref(*service), std::ref(server), std::cref(done));
  std::thread poller;
  if (settings.poll_interval_ms > 0) {
    poller = std::thread(PollLoop, std::ref(*service), settings.poll_interval_ms, std::cref(done));
  }
  const bool listened = server.listen_after_bind();
  done = true;
  watcher.join();
  if (poller.joinable()) poller.join();
  if (!listened) return Status::IoError("the server on port " + std::to_string(port) + " failed");
  std::printf("refit serve: stopped at version %" PRIu64 "\n", service->version());
  return Status::OK();
}

}  // namespace refit::cli
