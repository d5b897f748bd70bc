// Offline deltas between checkpoint files (`refit diff` / `refit apply`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "refit/config.h"
#include "refit/delta_counters.h"
#include "refit/export.h"
#include "refit/receiver.h"
#include "refit/registry.h"
#include "refit/sender.h"  // ProgressFn
#include "refit/status.h"
#include "refit/tensor.h"

namespace refit {

struct DiffStats {
  uint64_t tensors = 0;
  DeltaCounters counters;
  uint64_t delta_bytes = 0;  // the delta file's size
};

// Writes a delta taking base_path to new_path. encoding applies to changed tensors; tensors that
// are new or changed dtype/shape are sent dense. The delta names its base by a digest of the
// base's tensors. `progress` (optional) is called as tensors are handed to the diff: bytes of the
// new checkpoint's tensors done of all of them.
REFIT_API Result<DiffStats> DiffFiles(const std::string& base_path, const std::string& new_path,
                                      const std::string& out_path, const std::string& encoding,
                                      const Registry& registry, const Config* config,
                                      const ProgressFn& progress = {});

// Applies a delta onto base_path and writes out_path atomically (tmp + fsync + rename): out has
// exactly the new file's tensors, dtypes, shapes and bytes. Wrong base -> kVersionMismatch.
// `progress` (optional) is called as records are applied: bytes of the delta's records done of
// all of them.
REFIT_API Result<ApplyStats> ApplyFile(const std::string& base_path, const std::string& delta_path,
                                       const std::string& out_path, const Registry& registry,
                                       const Config* config, const ProgressFn& progress = {});

// Digest of a set of tensors (names, dtypes, shapes and bits), order-independent.
REFIT_API uint64_t ModelDigest(const std::vector<TensorView>& tensors);

}  // namespace refit
