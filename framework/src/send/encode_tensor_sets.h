#pragma once

#include <cstdint>
#include <vector>

#include "format/wire.h"
#include "refit/config.h"
#include "refit/delta.h"
#include "refit/registry.h"

namespace refit::internal {

// One payload taking `base` to `next` (whole tensors matched by name; new, retyped or reshaped
// tensors go dense) with the given payload metadata: EncodeDelta and `refit diff` share it.
Result<std::vector<uint8_t>> EncodeTensorSets(const std::vector<TensorView>& base,
                                              const std::vector<TensorView>& next,
                                              const DeltaOptions& options, Metadata metadata,
                                              const Registry& registry, const Config* config,
                                              DeltaEncodeStats* stats);

}  // namespace refit::internal
