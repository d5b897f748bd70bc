// ApplyDelta with apply threads, for the codec bench (the public ApplyDelta is single-threaded).
#pragma once

#include <cstdint>
#include <vector>

#include "refit/delta.h"

namespace refit::internal {

// ApplyDelta's contract; the payload's records are applied by `threads` threads (the caller and
// threads - 1 workers, as a receiver with `receiver.threads`).
Result<ApplyStats> ApplyDeltaOnThreads(const std::vector<uint8_t>& payload,
                                       const std::vector<TensorView>& tensors,
                                       const Registry& registry, const Config* config,
                                       unsigned threads);

}  // namespace refit::internal
