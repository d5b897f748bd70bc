// How errors name a registered component: "encoding 'ctx'".
#pragma once

#include <string>

#include "refit/registry.h"

namespace refit::internal {

inline std::string Describe(const ComponentInfo& info) {
  return std::string(KindName(info.kind)) + " '" + info.name + "'";
}

}  // namespace refit::internal
