// The chain bridge: what lets a receiver whose successor commits were deleted by retention
// still check that a newer full sync extends the chain it holds (docs/reliability.md,
// "Retention"). Rank 0 writes one per lagging receiver, before it deletes the commits it spans.
#pragma once

#include <cstdint>
#include <string>

#include "refit/status.h"

namespace refit::internal {

// "Commit `from` (SHA-256 from_sha256) is an ancestor of commit `to` (SHA-256 to_sha256)": the
// sender walked the commits from+1..to, each naming the previous one in `prev`, before deleting
// them. Without a key it is as forgeable as those commits were; with one, receivers never need
// it (a signed full sync is taken without walking the chain).
struct ChainBridge {
  std::string receiver;
  uint64_t from = 0;
  std::string from_sha256;
  uint64_t to = 0;
  std::string to_sha256;
};

// "chain/<receiver>": one object per receiver, rewritten as the window moves on.
std::string ChainBridgeKey(const std::string& receiver);
constexpr const char* kChainBridgePrefix = "chain/";
std::string SerializeChainBridge(const ChainBridge& bridge);
// Untrusted input: a bridge must be a JSON object naming `receiver`, from < to, and two SHA-256
// hex digests; anything else is Corrupt naming `label`.
Result<ChainBridge> ParseChainBridge(const uint8_t* data, uint64_t size, const std::string& label);

}  // namespace refit::internal
