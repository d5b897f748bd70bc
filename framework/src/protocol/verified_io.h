// The protocol's reads and writes of a transport, made robust to a transport that lies: puts are
// read back, payloads checked against their digests, control objects read until two reads agree.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "format/wire.h"
#include "refit/registry.h"
#include "refit/status.h"

namespace refit::internal {

// Bound on control objects read from a transport (manifests, commit markers, acks).
constexpr uint64_t kMaxControlBytes = 64ull << 20;

// Puts `data` and reads it back (size and bytes) until the stored object equals it, up to
// `attempts` puts: a put that reported success but stored nothing, a prefix or flipped bytes is
// redone. A put error is returned at once (naming the key): the caller decides whether to retry.
Status PutVerified(Transport& transport, const std::string& key, const uint8_t* data, uint64_t len,
                   int attempts = 4);
// Reads a whole object whose size and xxh3 are known, retrying a read that fails or returns other
// bytes up to `attempts` times; the last error names the key.
Status GetVerified(Transport& transport, const std::string& key, uint64_t size, uint64_t xxh3,
                   std::vector<uint8_t>& out, int attempts = 4);
// Reads a whole control object twice (up to `attempts` pairs) until two reads agree: a read
// corrupted on the way is never mistaken for the object. NotFound is returned at once.
Result<std::vector<uint8_t>> GetStable(Transport& transport, const std::string& key,
                                       uint64_t max_bytes, int attempts = 4);
// The versions above `after` whose COMMIT is stored, newest first (listing the transport; the
// commits are not read).
Result<std::vector<uint64_t>> ListCommits(Transport& transport, uint64_t after);
// The ack of `version` by `receiver`, if one is stored (read until two reads agree) that parses
// and names that receiver and version, and, when both are known, the commit `commit_sha256`: a
// damaged or misplaced ack object, or one of another commit at that version, is no answer.
std::optional<Ack> ReadValidAck(Transport& transport, const std::string& receiver, uint64_t version,
                                const std::string& commit_sha256);

}  // namespace refit::internal
