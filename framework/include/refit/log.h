// Where refit's log lines go. By default each line is written to stderr as
// "refit[component]: severity: message"; an embedding program (a trainer, an inference engine)
// installs a sink to route them into its own logging instead.
#pragma once

#include <functional>
#include <string_view>

#include "refit/export.h"

namespace refit {

// Values match REFIT_LOG_* of the plugin ABI.
enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Called for every line at or above the minimum level, from any thread refit runs (concurrent
// calls are possible: the sink serializes itself if it must). It must not throw and must not
// call back into refit.
using LogSink =
    std::function<void(LogLevel level, std::string_view component, std::string_view message)>;

// Installs `sink` for the whole process (an empty function restores stderr).
REFIT_API void SetLogSink(LogSink sink);
// Lines below `level` are dropped before they reach the sink. Default: kInfo, or kDebug when the
// environment variable REFIT_LOG is "debug".
REFIT_API void SetLogLevel(LogLevel level);
// Sends one line to the installed sink (or stderr). Never throws.
REFIT_API void Log(LogLevel level, std::string_view component, std::string_view message) noexcept;

}  // namespace refit
