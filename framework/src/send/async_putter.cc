#include "send/async_putter.h"

#include "common/stopwatch.h"

namespace refit::internal {

AsyncPutter::AsyncPutter(PutFn put) : put_(std::move(put)), thread_([this] { Run(); }) {}

AsyncPutter::~AsyncPutter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Status AsyncPutter::Submit(std::string key, std::vector<uint8_t>&& payload) {
  Stopwatch clock;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !has_work_ && !busy_; });
  wait_seconds_ += clock.Seconds();
  if (!error_.ok()) return error_;
  slot_key_ = std::move(key);
  slot_ = std::move(payload);
  has_work_ = true;
  cv_.notify_all();
  return Status::OK();
}

void AsyncPutter::RunFirst(std::function<Status()> job) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !has_work_ && !busy_ && !job_ && !job_running_; });
  job_ = std::move(job);
  cv_.notify_all();
}

Status AsyncPutter::Drain() {
  Stopwatch clock;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !has_work_ && !busy_ && !job_ && !job_running_; });
  wait_seconds_ += clock.Seconds();
  return error_;
}

std::vector<uint8_t> AsyncPutter::TakeSpare() {
  std::vector<uint8_t> spare;
  std::lock_guard<std::mutex> lock(mu_);
  spare.swap(spare_);
  return spare;
}

void AsyncPutter::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return job_ || has_work_ || stop_; });
    if (job_) {
      std::function<Status()> job = std::move(job_);
      job_ = nullptr;
      job_running_ = true;
      lock.unlock();
      Status st = job();
      lock.lock();
      if (!st.ok() && error_.ok()) error_ = st;
      job_running_ = false;
      cv_.notify_all();
      continue;
    }
    if (!has_work_ && stop_) return;
    PutSlot(lock);
  }
}

void AsyncPutter::PutWaiting() {
  std::unique_lock<std::mutex> lock(mu_);
  if (has_work_) PutSlot(lock);
}

void AsyncPutter::PutSlot(std::unique_lock<std::mutex>& lock) {
  std::vector<uint8_t> payload = std::move(slot_);
  std::string key = std::move(slot_key_);
  has_work_ = false;
  busy_ = true;
  const bool failed_before = !error_.ok();
  lock.unlock();
  Status st = failed_before ? Status::OK() : put_(key, payload);
  payload.clear();
  lock.lock();
  if (spare_.capacity() < payload.capacity()) std::swap(spare_, payload);
  if (!st.ok() && error_.ok()) error_ = st;
  busy_ = false;
  cv_.notify_all();
}

}  // namespace refit::internal
