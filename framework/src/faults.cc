// Named crash points for tests (engine.h: MaybeKillAt). The full fault-injection layer (drop,
// delay, truncate, corrupt, ENOSPC/EIO on any transport) builds on these names.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine.h"

namespace refit::internal {

void MaybeKillAt(const char* point) {
  static const char* const spec = std::getenv("REFIT_KILL_AT");
  if (spec == nullptr) return;
  const char* colon = std::strchr(spec, ':');
  const size_t name_len = colon != nullptr ? static_cast<size_t>(colon - spec) : std::strlen(spec);
  if (std::strlen(point) != name_len || std::strncmp(spec, point, name_len) != 0) return;
  static std::atomic<long> hits{0};
  const long wanted = colon != nullptr ? std::strtol(colon + 1, nullptr, 10) : 1;
  if (++hits == wanted) ::kill(::getpid(), SIGKILL);
}

}  // namespace refit::internal
