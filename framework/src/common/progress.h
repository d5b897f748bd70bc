// A progress line on stderr for long work (`refit diff`, `apply`, `shard`, `send`, `bench`).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace refit::internal {

// Whether progress is drawn: REFIT_PROGRESS=1 forces it on, REFIT_PROGRESS=0 off; otherwise only
// when stderr is a terminal (a log file or a pipe gets nothing extra).
bool ProgressWanted();

// "1.20 GiB", "850 MiB", "12 B": binary units, three significant digits.
std::string ProgressBytes(double bytes);

// One line: "<label>: 1.20 GiB of 4.00 GiB (30%), 850 MiB/s" (no " of ..." when total is 0).
std::string ProgressLine(const std::string& label, uint64_t done, uint64_t total, double seconds);

// Bytes done of a total, redrawn in place ("\r") at most ten times a second and ended by a newline
// on Finish(). A disabled meter writes nothing. Add/Update/Finish may be called from any thread.
class ProgressMeter {
 public:
  explicit ProgressMeter(std::string label, uint64_t total_bytes = 0,
                         bool enabled = ProgressWanted());
  ~ProgressMeter();  // Finish()
  ProgressMeter(const ProgressMeter&) = delete;
  ProgressMeter& operator=(const ProgressMeter&) = delete;

  void Add(uint64_t bytes);
  // For callers that report a running total: done of total so far (total 0 keeps the old one).
  void Update(uint64_t done, uint64_t total);
  // Blanks the line so other output can be printed; the next Add or Update draws it again.
  void Erase();
  // Draws the final line and a newline (once; later calls do nothing). Silent when nothing was
  // reported: a command that failed before its work began prints only its error.
  void Finish();
  bool enabled() const { return enabled_; }
  // A callback with the library's progress signature (done, total) that updates this meter; it
  // must not outlive the meter. Empty when disabled, so the library skips the work of reporting.
  std::function<void(uint64_t, uint64_t)> Callback();

 private:
  void DrawLocked(bool force);

  const std::string label_;
  const bool enabled_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::mutex mu_;
  uint64_t done_ = 0;
  uint64_t total_ = 0;
  std::chrono::steady_clock::time_point last_draw_{};
  size_t drawn_chars_ = 0;  // of the line on screen, to blank what a shorter line leaves
  bool started_ = false;    // drawn at least once: Finish() of a meter never updated is silent
  bool finished_ = false;
};

}  // namespace refit::internal
