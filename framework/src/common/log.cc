#include "refit/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

namespace refit {

namespace {

LogLevel DefaultLevel() {
  const char* v = std::getenv("REFIT_LOG");
  return v != nullptr && std::strcmp(v, "debug") == 0 ? LogLevel::kDebug : LogLevel::kInfo;
}

std::atomic<int>& MinLevel() {
  static std::atomic<int> level{static_cast<int>(DefaultLevel())};
  return level;
}

// The sink is swapped under a mutex and called through a shared_ptr copy, so a sink replaced
// while another thread logs stays alive until that call returns.
std::mutex& SinkMutex() {
  static std::mutex mu;
  return mu;
}
std::shared_ptr<const LogSink>& Sink() {
  static std::shared_ptr<const LogSink> sink;
  return sink;
}

const char* SeverityPrefix(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug: ";
    case LogLevel::kWarn:
      return "warning: ";
    case LogLevel::kError:
      return "error: ";
    case LogLevel::kInfo:
      break;
  }
  return "";
}

}  // namespace

void SetLogSink(LogSink sink) {
  std::shared_ptr<const LogSink> next;
  if (sink) next = std::make_shared<const LogSink>(std::move(sink));
  std::lock_guard<std::mutex> lock(SinkMutex());
  Sink() = std::move(next);
}

void SetLogLevel(LogLevel level) { MinLevel().store(static_cast<int>(level)); }

void Log(LogLevel level, std::string_view component, std::string_view message) noexcept {
  if (static_cast<int>(level) < MinLevel().load(std::memory_order_relaxed)) return;
  try {
    std::shared_ptr<const LogSink> sink;
    {
      std::lock_guard<std::mutex> lock(SinkMutex());
      sink = Sink();
    }
    if (sink) {
      (*sink)(level, component, message);
      return;
    }
    // One write per line so lines of concurrent threads do not interleave.
    std::string line = "refit[" + std::string(component) + "]: " + SeverityPrefix(level) +
                       std::string(message) + "\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
  } catch (...) {
    // Out of memory while logging, or a sink that broke its contract: drop the line.
  }
}

}  // namespace refit
