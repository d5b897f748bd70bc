#include "send/retention.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/crypto.h"
#include "faults/faults.h"
#include "format/wire.h"
#include "protocol/chain_bridge.h"
#include "protocol/verified_io.h"
#include "refit/log.h"

namespace refit::internal {

namespace {

// A receiver's acknowledgements, by version, and the newest of them.
struct ReceiverAcks {
  uint64_t latest = 0;
  std::vector<std::pair<uint64_t, std::string>> keys;
};

// Every receiver that acknowledged something (acks/<id>/v<N>), configured or not. Acks above
// `newest` name versions never published (planted): they are left alone and count for nothing.
Result<std::map<std::string, ReceiverAcks>> ListAcks(Transport& transport, uint64_t newest) {
  REFIT_ASSIGN_OR_RAISE(auto keys, transport.List("acks/"));
  std::map<std::string, ReceiverAcks> out;
  for (const auto& entry : keys) {
    const std::string& key = entry.first;
    const size_t slash = key.find('/', 5);
    if (slash == std::string::npos || slash == 5) continue;
    const std::string id = key.substr(5, slash - 5);
    const std::string name = key.substr(slash + 1);
    std::optional<uint64_t> v = VersionOfKey(name);
    if (!v || name != VersionDir(*v) || *v > newest) continue;  // need-full, or not an ack
    ReceiverAcks& acks = out[id];
    acks.latest = std::max(acks.latest, *v);
    acks.keys.emplace_back(*v, key);
  }
  return out;
}

// The objects of every version <= last, by version: only keys inside "v<8+ digits>/" whose
// number reads back as that directory (nothing else under the transport is ours to delete).
Result<std::map<uint64_t, std::vector<std::string>>> ExpiredVersions(Transport& transport,
                                                                     uint64_t last) {
  REFIT_ASSIGN_OR_RAISE(auto keys, transport.List("v"));
  std::map<uint64_t, std::vector<std::string>> out;
  for (const auto& entry : keys) {
    std::optional<uint64_t> v = VersionOfKey(entry.first);
    if (!v || *v > last || entry.first.rfind(VersionDir(*v) + "/", 0) != 0) continue;
    out[*v].push_back(entry.first);
  }
  return out;
}

// A stored commit and the SHA-256 of its bytes (the chain's link), read once per pass.
struct StoredCommit {
  std::string prev;
  std::string sha256;
};

class CommitReader {
 public:
  explicit CommitReader(Transport& transport) : transport_(transport) {}

  Result<std::optional<StoredCommit>> Read(uint64_t v) {
    auto cached = cache_.find(v);
    if (cached != cache_.end()) return cached->second;
    std::optional<StoredCommit> found;
    auto bytes = GetStable(transport_, CommitKey(v), kMaxControlBytes);
    if (bytes.ok()) {
      auto commit = ParseCommit(bytes.value().data(), bytes.value().size(), CommitKey(v));
      if (commit.ok() && commit->version == v) {
        found = StoredCommit{commit->prev, Sha256Hex(bytes.value().data(), bytes.value().size())};
      }
    } else if (bytes.status().code() != StatusCode::kNotFound) {
      return bytes.status();
    }
    cache_[v] = found;
    return found;
  }

 private:
  Transport& transport_;
  std::map<uint64_t, std::optional<StoredCommit>> cache_;
};

void WarnNoBridge(const std::string& id, uint64_t latest, const std::string& why) {
  Log(LogLevel::kWarn, "sender",
      "retention: no chain bridge for receiver '" + id + "' (latest ack: version " +
          std::to_string(latest) + "): " + why +
          "; it needs a fresh state_dir to take a full sync");
}

// Makes chain/<id> span the commits latest+1..last (extending the one there), walking them
// before they are deleted. Returns whether it wrote one. A commit missing or off the chain (the
// store was tampered with, or the commits went before this receiver first acked) leaves the
// receiver without a bridge: a warning, and the deletion goes on (the store stays bounded).
Result<bool> EnsureBridge(Transport& transport, CommitReader& commits, const std::string& id,
                          uint64_t latest, uint64_t last) {
  const std::string key = ChainBridgeKey(id);
  std::optional<ChainBridge> have;
  auto stored = GetStable(transport, key, 1 << 16);
  if (stored.ok()) {
    auto parsed = ParseChainBridge(stored.value().data(), stored.value().size(), key);
    if (parsed.ok() && parsed->receiver == id && parsed->from == latest) have = *parsed;
  } else if (stored.status().code() != StatusCode::kNotFound) {
    return stored.status();
  }
  if (have && have->to >= last) return false;
  ChainBridge bridge{id, latest, "", last, ""};
  uint64_t v = latest + 1;
  if (have) {
    bridge.from_sha256 = have->from_sha256;
    bridge.to_sha256 = have->to_sha256;
    v = have->to + 1;
  } else {
    REFIT_ASSIGN_OR_RAISE(std::optional<StoredCommit> first, commits.Read(v));
    if (!first || first->prev.empty()) {
      WarnNoBridge(id, latest, CommitKey(v) + " is gone or names no previous commit");
      return false;
    }
    bridge.from_sha256 = bridge.to_sha256 = first->prev;
  }
  for (; v <= last; ++v) {
    REFIT_ASSIGN_OR_RAISE(std::optional<StoredCommit> c, commits.Read(v));
    if (!c || c->prev != bridge.to_sha256) {
      WarnNoBridge(id, latest, CommitKey(v) + " is gone or does not extend the chain");
      return false;
    }
    bridge.to_sha256 = c->sha256;
  }
  const std::string text = SerializeChainBridge(bridge);
  REFIT_RETURN_NOT_OK(
      PutVerified(transport, key, reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  return true;
}

// Bridges for the receivers whose chain head lies below `last`; a bridge whose receiver acked
// `last` or later is no longer needed and goes.
Status BridgeLaggingReceivers(Transport& transport, const std::map<std::string, ReceiverAcks>& acks,
                              uint64_t last, RetentionStats* stats) {
  CommitReader commits(transport);
  for (const auto& [id, receiver] : acks) {
    if (receiver.latest >= last) {
      REFIT_RETURN_NOT_OK(transport.Remove(ChainBridgeKey(id)));
      continue;
    }
    REFIT_ASSIGN_OR_RAISE(bool written,
                          EnsureBridge(transport, commits, id, receiver.latest, last));
    stats->bridges_written += written ? 1 : 0;
  }
  return Status::OK();
}

// The COMMIT first: from then on the directory is not a version for any receiver, so a kill
// before the rest is gone leaves only leftovers, which the next pass removes.
Status RemoveVersion(Transport& transport, uint64_t v, const std::vector<std::string>& keys,
                     const std::function<void()>& between, RetentionStats* stats) {
  const std::string commit = CommitKey(v);
  if (std::find(keys.begin(), keys.end(), commit) != keys.end()) {
    REFIT_RETURN_NOT_OK(transport.Remove(commit));
    ++stats->objects_removed;
    MaybeKillAt("sender.retention");
  }
  for (const std::string& key : keys) {
    if (key == commit) continue;
    REFIT_RETURN_NOT_OK(transport.Remove(key));
    ++stats->objects_removed;
    if (between) between();
  }
  ++stats->versions_removed;
  return Status::OK();
}

}  // namespace

Result<RetentionStats> ApplyRetention(Transport& transport, uint64_t newest, uint64_t keep_versions,
                                      const std::function<void()>& between) {
  RetentionStats stats;
  if (keep_versions == 0 || newest <= keep_versions) return stats;
  const uint64_t last = newest - keep_versions;  // versions <= last go
  REFIT_ASSIGN_OR_RAISE(auto expired, ExpiredVersions(transport, last));
  REFIT_ASSIGN_OR_RAISE(auto acks, ListAcks(transport, newest));
  bool commits_expire = false;
  for (const auto& [v, keys] : expired) {
    commits_expire |= std::find(keys.begin(), keys.end(), CommitKey(v)) != keys.end();
  }
  // Bridges are written before any commit they span is deleted.
  if (commits_expire) REFIT_RETURN_NOT_OK(BridgeLaggingReceivers(transport, acks, last, &stats));
  for (const auto& [v, keys] : expired) {
    REFIT_RETURN_NOT_OK(RemoveVersion(transport, v, keys, between, &stats));
  }
  // Acks of deleted versions, except each receiver's latest (a receiver restarted on it checks
  // that it acknowledged; the sender never reads acks below its newest version).
  for (const auto& [id, receiver] : acks) {
    for (const auto& [v, key] : receiver.keys) {
      if (v >= receiver.latest || v > last) continue;
      REFIT_RETURN_NOT_OK(transport.Remove(key));
      ++stats.acks_removed;
    }
  }
  return stats;
}

}  // namespace refit::internal
