#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "refit/status.h"

namespace refit::internal {

// Puts payloads on a background thread: at most one being written while the next one is built.
class AsyncPutter {
 public:
  using PutFn = std::function<Status(const std::string& key, const std::vector<uint8_t>& bytes)>;
  explicit AsyncPutter(PutFn put);
  ~AsyncPutter();
  // Blocks until the writer is idle, then hands over the payload. Returns an earlier put's error.
  Status Submit(std::string key, std::vector<uint8_t>&& payload);
  // Runs `job` on the writer's thread before the payloads submitted after it: transport calls
  // that need not hold up the diff (retention's deletes) and must not overlap the puts (the
  // core calls a transport instance from one thread at a time). A payload may be handed over
  // while the job runs; a job that calls PutWaiting between its steps lets it go first. Its
  // error is returned as a put's is.
  void RunFirst(std::function<Status()> job);
  // From a RunFirst job, on the writer's thread: puts the payload handed over meanwhile, if any,
  // so that a long job (deleting a full sync's objects) neither delays the pushes nor blocks
  // the next Submit.
  void PutWaiting();
  // Waits for the last put (and job); returns the first error.
  Status Drain();
  // The buffer of a payload already put (emptied, its capacity kept), or an empty vector: one is
  // kept for the next payload to be built in.
  std::vector<uint8_t> TakeSpare();
  double wait_seconds() const { return wait_seconds_; }

 private:
  void Run();
  // Puts the handed-over payload (mu_ held by `lock`, released during the put).
  void PutSlot(std::unique_lock<std::mutex>& lock);
  PutFn put_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string slot_key_;
  std::vector<uint8_t> slot_;
  std::vector<uint8_t> spare_;
  bool has_work_ = false;
  bool busy_ = false;  // a put is running
  std::function<Status()> job_;
  bool job_running_ = false;
  bool stop_ = false;
  Status error_;
  double wait_seconds_ = 0;
  std::thread thread_;
};

}  // namespace refit::internal
