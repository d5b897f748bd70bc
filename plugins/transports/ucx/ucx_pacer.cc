#include "ucx_pacer.h"

#include <algorithm>

namespace refit::ucx {

PaceClock::time_point LinkSchedule::Arrival(const std::vector<uint64_t>& conns, uint64_t bytes,
                                            PaceClock::time_point now) {
  const auto crossing = std::chrono::duration_cast<PaceClock::duration>(
      std::chrono::duration<double>(static_cast<double>(bytes) / rate_));
  PaceClock::time_point arrival = now;
  for (uint64_t conn : conns) {
    auto [it, added] = free_at_.try_emplace(conn, now);
    it->second = std::max(it->second, now) + crossing;
    arrival = std::max(arrival, it->second);
  }
  return arrival;
}

DelayedRunner::DelayedRunner() : thread_([this] { Loop(); }) {}

DelayedRunner::~DelayedRunner() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void DelayedRunner::Post(PaceClock::time_point at, std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    jobs_.emplace_back(at, std::move(job));
    ++posted_;
  }
  cv_.notify_all();
}

void DelayedRunner::Drain() {
  std::unique_lock<std::mutex> lk(mu_);
  const uint64_t target = posted_;
  cv_.wait(lk, [&] { return ran_ >= target; });
}

void DelayedRunner::Loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
    if (stop_) return;
    const PaceClock::time_point at = jobs_.front().first;
    if (PaceClock::now() < at) {
      // Woken early by a post (or stop): look again; the front stays first.
      cv_.wait_until(lk, at);
      continue;
    }
    std::function<void()> job = std::move(jobs_.front().second);
    jobs_.pop_front();
    lk.unlock();
    job();
    lk.lock();
    ++ran_;
    cv_.notify_all();  // Drain
  }
}

}  // namespace refit::ucx
