// Whole-model safetensors files: a receiver's model, a sender's baseline.
#pragma once

#include <string>
#include <vector>

#include "format/safetensors.h"
#include "format/wire.h"

namespace refit::internal {

// Writes a new safetensors file laid out for `specs`, each tensor's bytes copied from `source`
// when it holds a tensor of the same name, dtype and shape, else zero, and synced. Not atomic:
// callers write to a temporary name and move it into place with ReplaceFile (file_util.h).
Status CreateModelFile(const std::string& path, const std::vector<TensorSpec>& specs,
                       const SafetensorsFile* source, Metadata metadata);

// The metadata key of the version a full copy (a receiver's model, a sender's pending baseline)
// or a payload holds.
inline constexpr char kVersionMetadataKey[] = "refit.version";
// Whether `file` says it holds `version`: how a process killed between renaming a full copy into
// place and saving its state learns which copy it has.
bool HoldsVersion(const SafetensorsFile& file, uint64_t version);

std::vector<TensorSpec> SpecsOf(const std::vector<TensorView>& tensors);

}  // namespace refit::internal
