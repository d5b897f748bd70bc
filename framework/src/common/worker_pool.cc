#include "common/worker_pool.h"

#include <algorithm>

namespace refit::internal {

unsigned ResolveThreadCount(int64_t configured) {
  if (configured > 0) return static_cast<unsigned>(std::min<int64_t>(configured, 256));
  return std::clamp(std::thread::hardware_concurrency(), 1u, 256u);
}

WorkerPool::WorkerPool(unsigned threads) {
  for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::Submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (head_ == queue_.size()) {  // drained: reuse the storage
      queue_.clear();
      head_ = 0;
    }
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void WorkerPool::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return head_ < queue_.size() || stop_; });
    if (head_ == queue_.size()) return;  // stop_ and nothing queued
    std::function<void()> task = std::move(queue_[head_++]);
    lock.unlock();
    task();
    lock.lock();
  }
}

}  // namespace refit::internal
