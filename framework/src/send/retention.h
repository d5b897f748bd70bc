// Retention: the sender keeps the newest `keep_versions` committed versions on the transport and
// deletes older ones, so a long run fills no disk or bucket (docs/reliability.md, "Retention").
// Works over any transport through list/remove; run by rank 0 only, once the newest version
// was answered by every receiver in sender.receivers.
#pragma once

#include <cstdint>
#include <functional>

#include "refit/registry.h"
#include "refit/status.h"

namespace refit::internal {

struct RetentionStats {
  uint64_t versions_removed = 0;  // version directories (or prefixes) emptied
  uint64_t objects_removed = 0;   // their objects: commits, manifests, payloads, leftovers
  uint64_t acks_removed = 0;      // acknowledgements older than their receiver's latest
  uint64_t bridges_written = 0;   // chain bridges written or extended for lagging receivers
};

// Deletes every version <= newest - keep_versions (nothing when keep_versions is 0). Per version
// the COMMIT goes first: a kill later leaves objects without a commit, which no receiver takes for
// a version and the next call removes. Before a commit goes, every receiver whose latest ack lies
// below it gets a chain bridge (protocol/chain_bridge.h) spanning the deleted commits, so it can
// still take a newer full sync. Old acks go too (the latest per receiver stays). Idempotent.
// `between` (may be empty) runs after each removal: the sender puts a waiting payload there.
Result<RetentionStats> ApplyRetention(Transport& transport, uint64_t newest, uint64_t keep_versions,
                                      const std::function<void()>& between = {});

}  // namespace refit::internal
