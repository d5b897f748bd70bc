// How the ranks of one nccl channel find each other: small files in the control directory,
// through the disk transport's engine (atomic puts, confined to the directory).
//
//   session      the sender's: nonce, receiver count, bucket size, the ncclUniqueId (hex)
//   join/<peer>  a receiver's: the nonce of the session it joins
//   ranks        the sender's, once every receiver joined: nonce and "<peer> <rank>" lines
//
// A sender instance is one session (a fresh nonce); receivers follow from session to session.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "common/disk_transport.h"
#include "nccl_runtime.h"
#include "refit/status.h"

namespace refit::nccl {

struct Session {
  std::string nonce;
  int receivers = 0;
  uint64_t bucket_bytes = 0;
  ncclUniqueId id{};
};

// Written by the sender: removes a stale `ranks`, then publishes the session.
Status PublishSession(disk::DiskTransport& control, const Session& session);
// nullopt while there is none (or it is half-readable: a torn read is retried by the caller).
Result<std::optional<Session>> ReadSession(disk::DiskTransport& control);

Status Join(disk::DiskTransport& control, const std::string& peer, const std::string& nonce);
// The peers whose join file names `nonce`, in key order.
Result<std::vector<std::string>> JoinedPeers(disk::DiskTransport& control,
                                             const std::string& nonce);

// Ranks 1..N by peer order; rank 0 is the sender.
Status PublishRanks(disk::DiskTransport& control, const std::string& nonce,
                    const std::vector<std::string>& peers);
// This peer's rank in the session `nonce`, nullopt until the sender published it; NotFound when
// the published assignment leaves the peer out.
Result<std::optional<int>> ReadRank(disk::DiskTransport& control, const std::string& nonce,
                                    const std::string& peer);

std::string NewNonce();

}  // namespace refit::nccl
