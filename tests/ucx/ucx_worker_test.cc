// The ucx transport's worker (ucx_worker.h) between two workers in this process, compiled from
// the plugin's sources. Found by looping the relay suites over posix,tcp: a relay connects to a
// child and forwards it what it holds at once; UCX 1.13 failed some of those sends ("Invalid
// parameter") when they were posted before the new endpoint was wired up, the child was dropped
// and read the version from the sender instead (RelaySync: "reads missed the inbox", ~2 runs in
// 12). The same happened to a receiver's hello, retried by its connector.
#include "ucx_worker.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace refit::ucx {
namespace {

class Collector : public EventHandler {
 public:
  void OnEvent(Event event) override {
    std::lock_guard<std::mutex> lk(mu_);
    if (event.kind == Event::Kind::kPeerDown) {
      downs_.push_back(event.why);
    } else {
      ++messages_;
      bytes_ += event.data.size();
    }
    cv_.notify_all();
  }
  // Until `messages` arrived or a peer went down; bounded (a hang guard, not a timing check).
  bool WaitFor(uint64_t messages) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, std::chrono::seconds(60),
                        [&] { return messages_ >= messages || !downs_.empty(); });
  }
  uint64_t messages() {
    std::lock_guard<std::mutex> lk(mu_);
    return messages_;
  }
  uint64_t bytes() {
    std::lock_guard<std::mutex> lk(mu_);
    return bytes_;
  }
  std::vector<std::string> downs() {
    std::lock_guard<std::mutex> lk(mu_);
    return downs_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t messages_ = 0;
  uint64_t bytes_ = 0;
  std::vector<std::string> downs_;
};

struct Failures {
  std::mutex mu;
  std::vector<std::string> why;
};

class UcxWorkerTest : public ::testing::TestWithParam<std::string> {};

constexpr int kRounds = 24;
constexpr int kConnections = 10;
// Eager ones below and above the am_short limit of shared memory (100 bytes), and rendezvous.
const std::vector<uint64_t> kSizes = {100, 1500, 9000, 70000, 2 << 20};

// Connects `connections` times to `to` and posts an eager and a rendezvous send on each new
// connection at once; the number of sends that failed (a child process's exit status).
int ConnectAndSend(const std::string& tls, const HostPort& to, int connections) {
  WorkerOptions options;
  options.tls = tls;
  Collector events;
  auto client = Worker::Start(options, &events);
  if (!client.ok()) return 100;
  auto failures = std::make_shared<Failures>();
  for (int i = 0; i < connections; ++i) {
    auto conn = client.value()->Connect(to);
    if (!conn.ok()) return 101;
    for (uint64_t size : kSizes) {
      MsgHeader h;
      h.type = MsgType::kPush;
      h.key = "k" + std::to_string(i);
      auto data = std::make_shared<const Buffer>(size, uint8_t(i));
      Status st = client.value()->Send(*conn, h, data, [failures](const Status& done) {
        if (done.ok()) return;
        std::lock_guard<std::mutex> lk(failures->mu);
        failures->why.push_back(done.message());
      });
      if (!st.ok()) return 102;
    }
  }
  if (!client.value()->Flush(std::chrono::seconds(60))) return 103;
  std::lock_guard<std::mutex> lk(failures->mu);
  for (const std::string& why : failures->why)
    std::fprintf(stderr, "send failed: %s\n", why.c_str());
  return static_cast<int>(std::min<size_t>(failures->why.size(), 99));
}

// Every send posted right after Connect (before the endpoint is wired up) is delivered, from
// other processes (as a relay forwards to its child): rounds of fresh processes, each making
// fresh connections (the failures came mostly on a process's first connections).
TEST_P(UcxWorkerTest, SendsPostedRightAfterConnectAllArrive) {
  std::vector<std::pair<pid_t, int>> children;  // pid, the pipe its port comes on
  for (int i = 0; i < kRounds; ++i) {
    int port_pipe[2];
    ASSERT_EQ(::pipe(port_pipe), 0);
    const pid_t child = ::fork();  // before this process starts UCX
    ASSERT_GE(child, 0);
    if (child == 0) {
      uint16_t port = 0;
      if (::read(port_pipe[0], &port, sizeof port) != sizeof port) ::_exit(104);
      ::_exit(ConnectAndSend(GetParam(), HostPort{"127.0.0.1", port}, kConnections));
    }
    ::close(port_pipe[0]);
    children.emplace_back(child, port_pipe[1]);
  }
  WorkerOptions options;
  options.tls = GetParam();
  Collector events;
  auto server = Worker::Start(options, &events);
  ASSERT_TRUE(server.ok()) << server.status().message();
  auto bound = server.value()->Listen(HostPort{"0.0.0.0", 0});
  ASSERT_TRUE(bound.ok()) << bound.status().message();
  uint64_t expected = 0;
  for (auto [child, port_pipe] : children) {  // one after the other
    ASSERT_EQ(::write(port_pipe, &bound.value().port, sizeof(uint16_t)), sizeof(uint16_t));
    ::close(port_pipe);
    expected += kConnections * kSizes.size();
    events.WaitFor(expected);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status)) << "the connecting process crashed (its stderr)";
    EXPECT_EQ(WEXITSTATUS(status), 0) << "sends failed in the connecting process (its stderr)";
    EXPECT_EQ(events.messages(), expected);
  }
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxWorkerTest, ::testing::Values("tcp", "posix,tcp"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "tcp" ? std::string("tcp")
                                                      : std::string("posix_tcp");
                         });

}  // namespace
}  // namespace refit::ucx
