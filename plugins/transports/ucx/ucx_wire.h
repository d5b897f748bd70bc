// The messages of the ucx transport: one UCP active message each, a small binary header (this
// file) plus the object's bytes as the message data (eager when small, rendezvous when large).
#pragma once

#include <cstdint>
#include <string>

#include "refit/status.h"

namespace refit::ucx {

// Every message travels under this one active-message id; the header says what it is.
constexpr unsigned kAmId = 7;

enum class MsgType : uint8_t {
  kHello = 1,  // receiver -> sender: key = peer id, data = the keys it holds ("key\tsize\n"),
               // a = the port it listens on for tree pushes (0: it does not relay)
  kPush,       // sender or relay -> receiver: key's object is the data (a put, or a replay);
               // id = its tree push seq (0: a replay, sent to this receiver only)
  kDrop,       // sender -> receiver: key was removed
  kUpload,     // receiver -> sender (request): store data under key in the spool
  kRemove,     // receiver -> sender (request): remove key from the spool
  kSize,       // receiver -> sender (request): size of key
  kGet,        // receiver -> sender (request): a = offset, b = length of key
  kList,       // receiver -> sender (request): keys under prefix `key`
  kReply,      // answer to a request (id) or to kHello: a = StatusCode, b = value, key = message,
               // c = pushes posted to this connection before it
  kBye,        // receiver -> sender, or sender -> receiver: it is leaving (its connection
               // closing is no failure)
  kTree,       // sender -> receiver (relay fan-out): data = "host:port\tplaced_at" of each of
               // its children, a = its own placed_at: tree pushes up to that seq may miss it
  kReport,     // relay -> sender: its child `key` ("host:port") stopped taking data (why = data)
};

struct MsgHeader {
  MsgType type = MsgType::kReply;
  uint64_t id = 0;  // request id (requests and replies), 0 otherwise
  uint64_t a = 0;
  uint64_t b = 0;
  uint64_t c = 0;  // replies: the pushes the sender had posted to this connection
  uint64_t d = 0;  // size replies: the tree push seq of the key this receiver still awaits
  std::string key;
};

// Fixed part: type (1) + id, a, b, c, d (8 each, little endian) + key length (2); then the key.
constexpr size_t kFixedHeaderBytes = 43;
// Keys are at most 512 characters; error messages in replies are cut to this.
constexpr size_t kMaxHeaderKey = 4096;

std::string EncodeHeader(const MsgHeader& h);
// Invalid for a header that is short, of an unknown type or whose key length disagrees.
Result<MsgHeader> DecodeHeader(const void* data, size_t len);

}  // namespace refit::ucx
