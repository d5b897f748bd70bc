// ApplyDelta with apply threads, for the codec bench (the public ApplyDelta is single-threaded),
// and records cut as a configured sender cuts them.
#pragma once

#include <cstdint>
#include <vector>

#include "refit/config.h"
#include "refit/delta.h"

namespace refit::internal {

// ApplyDelta's contract; the payload's records are applied by `threads` threads (the caller and
// threads - 1 workers, as a receiver with `receiver.threads`).
Result<ApplyStats> ApplyDeltaOnThreads(const std::vector<uint8_t>& payload,
                                       const std::vector<TensorView>& tensors,
                                       const Registry& registry, const Config* config,
                                       unsigned threads);

// The bytes of tensor data per record a sender with `config` cuts: sender.chunk_bytes (16 MiB by
// default), at most sender.bucket_bytes (an unset chunk_bytes shrinks to a smaller bucket; a set
// one larger than the bucket is refused by the config's check). The benches cut theirs alike.
Result<uint64_t> SenderChunkBytes(const Config& config);

}  // namespace refit::internal
