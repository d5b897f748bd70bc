// What precedes each object on the wire: every rank must know a broadcast's size before it
// starts, so the key and the length travel in a fixed-size broadcast of their own.
#pragma once

#include <cstdint>

namespace refit::nccl {

enum : uint32_t { kOpPut = 1, kOpRemove = 2, kOpEnd = 3 };

// A receiver's answer to a put or remove (NcclPipe::Confirm): the sender sees the largest.
enum : int32_t { kKept = 0, kDropped = 1 };

struct Header {
  char magic[8];
  uint32_t op;
  uint32_t key_len;
  uint64_t len;
  char key[1000];  // keys are at most 512 characters
};
static_assert(sizeof(Header) == 1024, "the header is a fixed-size broadcast");

inline constexpr char kMagic[8] = {'R', 'E', 'F', 'I', 'T', 'N', 'C', '1'};

}  // namespace refit::nccl
