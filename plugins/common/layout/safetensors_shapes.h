// The tensor shapes of a safetensors file, read from its header alone (a layout plugin links no
// part of refit's core, so it cannot use refit::SafetensorsFile).
#pragma once

#include <map>
#include <string>

#include "layout/layout_plan.h"
#include "refit/status.h"

namespace refit::layouts {

// name -> shape. The header is untrusted: its length, JSON and every shape are validated.
Result<std::map<std::string, Shape>> ReadSafetensorsShapes(const std::string& path);

}  // namespace refit::layouts
