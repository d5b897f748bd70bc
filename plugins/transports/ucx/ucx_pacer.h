// link_bandwidth's emulated links (a benchmark's stand-in for a slow network, docs/transports.md).
//
// Each connection is a link that carries one object after another at a fixed rate. An object is
// handed to its links when it is pushed and is posted once it has crossed the slowest of them;
// the pushing thread does not wait for that (its in-flight window bounds what is on the way), so
// the link carries one object while the sender writes its spool or encodes the next, as a real
// network does. A link that idles banks no credit.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace refit::ucx {

using PaceClock = std::chrono::steady_clock;

// When each link (a connection, by its id) is free again.
class LinkSchedule {
 public:
  explicit LinkSchedule(double bytes_per_second) : rate_(bytes_per_second) {}
  // When `bytes` handed to the links of `conns` at `now` have crossed the slowest of them; each
  // link is busy until then.
  PaceClock::time_point Arrival(const std::vector<uint64_t>& conns, uint64_t bytes,
                                PaceClock::time_point now);
  void Forget(uint64_t conn) { free_at_.erase(conn); }

 private:
  double rate_;
  std::map<uint64_t, PaceClock::time_point> free_at_;
};

// A thread that runs jobs in the order they are posted, each not before its time (a later job
// with an earlier time waits for the ones before it: the objects of one connection keep their
// order). The destructor drops what has not run (Drain first to run it).
class DelayedRunner {
 public:
  DelayedRunner();
  ~DelayedRunner();
  DelayedRunner(const DelayedRunner&) = delete;
  DelayedRunner& operator=(const DelayedRunner&) = delete;

  void Post(PaceClock::time_point at, std::function<void()> job);
  // Until every job posted before the call ran.
  void Drain();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<PaceClock::time_point, std::function<void()>>> jobs_;
  uint64_t posted_ = 0;
  uint64_t ran_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace refit::ucx
