#pragma once

#include <cstdint>
#include <vector>

#include "format/wire.h"
#include "refit/config.h"
#include "refit/delta.h"
#include "refit/registry.h"
#include "refit/sender.h"  // ProgressFn

namespace refit::internal {

// One payload taking `base` to `next` (whole tensors matched by name; new, retyped or reshaped
// tensors go dense) with the given payload metadata: EncodeDelta and `refit diff` share it.
// `progress`: bytes of `next` handed to the writer, of all of them.
Result<std::vector<uint8_t>> EncodeTensorSets(const std::vector<TensorView>& base,
                                              const std::vector<TensorView>& next,
                                              const DeltaOptions& options, Metadata metadata,
                                              const Registry& registry, const Config* config,
                                              DeltaEncodeStats* stats,
                                              const ProgressFn& progress = {});

}  // namespace refit::internal
