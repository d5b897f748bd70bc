#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <latch>
#include <mutex>
#include <thread>
#include <vector>

namespace refit::internal {

// A configured thread count (sender.threads, receiver.threads, ...): > 0 is taken (at most 256),
// <= 0 means the machine's hardware concurrency.
unsigned ResolveThreadCount(int64_t configured);

// A fixed set of worker threads running queued tasks in submission order of start.
class WorkerPool {
 public:
  explicit WorkerPool(unsigned threads);
  ~WorkerPool();  // finishes queued tasks, then joins
  void Submit(std::function<void()> task);

 private:
  void Run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::function<void()>> queue_;  // FIFO via head_
  size_t head_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// Runs fn(k) for k in [0, stripes): k > 0 on the pool, k = 0 on this thread; waits for all.
template <typename Fn>
void RunStripes(WorkerPool* pool, size_t stripes, Fn&& fn) {
  if (stripes <= 1 || pool == nullptr) {
    for (size_t k = 0; k < std::max<size_t>(stripes, 1); ++k) fn(k);
    return;
  }
  std::latch done(static_cast<std::ptrdiff_t>(stripes - 1));
  for (size_t k = 1; k < stripes; ++k) {
    pool->Submit([&, k] {
      fn(k);
      done.count_down();
    });
  }
  fn(0);
  done.wait();
}

}  // namespace refit::internal
