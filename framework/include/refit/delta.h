// In-memory deltas between two sets of tensors, for tests, benchmarks and bindings: the same
// chunking, encodings (`auto` included), worker threads and wire format as the sender's payloads,
// without a transport or files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "refit/config.h"
#include "refit/delta_counters.h"
#include "refit/export.h"
#include "refit/receiver.h"
#include "refit/registry.h"
#include "refit/status.h"
#include "refit/tensor.h"

namespace refit {

struct DeltaOptions {
  std::string encoding = "auto";       // a registered encoding or "auto"
  unsigned threads = 0;                // 0: hardware concurrency, 1: inline on the caller
  uint64_t chunk_bytes = 16ull << 20;  // records cover at most this many dense bytes
};

struct DeltaEncodeStats {
  DeltaCounters counters;
  double seconds = 0;  // wall time of diff + encode + digest
};

// One payload (wire format v1) taking `base` to `next`, tensors matched by name. A tensor of
// `next` absent from `base`, or with another dtype or shape, is sent dense. The payload bytes do
// not depend on options.threads. `config` (may be null) supplies [encoding.*] sections.
REFIT_API Result<std::vector<uint8_t>> EncodeDelta(const std::vector<TensorView>& base,
                                                   const std::vector<TensorView>& next,
                                                   const DeltaOptions& options,
                                                   const Registry& registry, const Config* config,
                                                   DeltaEncodeStats* stats = nullptr);

// Applies a payload from EncodeDelta to `tensors` in place (matched by name, dtype and shape),
// checking every record's digest. On error the tensors may be partly updated.
REFIT_API Result<ApplyStats> ApplyDelta(const std::vector<uint8_t>& payload,
                                        const std::vector<TensorView>& tensors,
                                        const Registry& registry, const Config* config);

}  // namespace refit
