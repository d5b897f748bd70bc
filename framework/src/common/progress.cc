#include "common/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace refit::internal {

namespace {

// Redraws are limited so a fast loop of Add() calls costs a clock read, not a terminal write.
constexpr std::chrono::milliseconds kRedrawInterval(100);

void WriteStderr(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

}  // namespace

bool ProgressWanted() {
  const char* forced = std::getenv("REFIT_PROGRESS");
  if (forced != nullptr && std::strcmp(forced, "1") == 0) return true;
  if (forced != nullptr && std::strcmp(forced, "0") == 0) return false;
  return ::isatty(STDERR_FILENO) == 1;
}

std::string ProgressBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  const int decimals = u == 0 || bytes >= 100 ? 0 : (bytes >= 10 ? 1 : 2);
  std::snprintf(buf, sizeof(buf), "%.*f %s", decimals, bytes, units[u]);
  return buf;
}

std::string ProgressLine(const std::string& label, uint64_t done, uint64_t total, double seconds) {
  std::string line = label + ": " + ProgressBytes(static_cast<double>(done));
  if (total > 0) {
    // 100% only when everything is done: a rounded-up 99.6% would claim it too early.
    uint64_t percent = static_cast<uint64_t>(100.0 * static_cast<double>(done) / total);
    percent = done >= total ? 100 : std::min<uint64_t>(percent, 99);
    line +=
        " of " + ProgressBytes(static_cast<double>(total)) + " (" + std::to_string(percent) + "%)";
  }
  const double rate = static_cast<double>(done) / (seconds > 1e-6 ? seconds : 1e-6);
  return line + ", " + ProgressBytes(rate) + "/s";
}

ProgressMeter::ProgressMeter(std::string label, uint64_t total_bytes, bool enabled)
    : label_(std::move(label)), enabled_(enabled), total_(total_bytes) {}

ProgressMeter::~ProgressMeter() { Finish(); }

void ProgressMeter::Add(uint64_t bytes) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  done_ += bytes;
  DrawLocked(/*force=*/false);
}

void ProgressMeter::Update(uint64_t done, uint64_t total) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  done_ = done;
  if (total > 0) total_ = total;
  DrawLocked(/*force=*/false);
}

void ProgressMeter::Erase() {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_ || drawn_chars_ == 0) return;
  WriteStderr("\r" + std::string(drawn_chars_, ' ') + "\r");
  drawn_chars_ = 0;
  last_draw_ = {};  // the next update redraws at once
}

void ProgressMeter::Finish() {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  if (started_) {
    DrawLocked(/*force=*/true);
    WriteStderr("\n");
  }
  finished_ = true;
}

std::function<void(uint64_t, uint64_t)> ProgressMeter::Callback() {
  if (!enabled_) return {};
  return [this](uint64_t done, uint64_t total) { Update(done, total); };
}

void ProgressMeter::DrawLocked(bool force) {
  if (finished_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - last_draw_ < kRedrawInterval) return;
  last_draw_ = now;
  started_ = true;
  std::string line =
      ProgressLine(label_, done_, total_, std::chrono::duration<double>(now - start_).count());
  const size_t chars = line.size();
  if (chars < drawn_chars_) line.append(drawn_chars_ - chars, ' ');
  drawn_chars_ = chars;
  WriteStderr("\r" + line);
}

}  // namespace refit::internal
