#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
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

}  // namespace refit::internal
