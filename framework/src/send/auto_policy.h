// The framework-level `auto` encoding's policy.
#pragma once

#include <string>
#include <vector>

#include "refit/config.h"
#include "refit/registry.h"

namespace refit::internal {

// The framework-level `auto` encoding (docs/config.md [encoding.auto]). It is not a plugin: a
// plugin cannot call other plugins, so the writer runs every candidate and keeps one per record.
constexpr const char* kAutoEncoding = "auto";

struct AutoPolicy {
  std::vector<const Encoding*> candidates;  // cheapest to apply first
  bool fastest = false;                     // mode "fastest" (else "smallest")
  double budget = 1.1;                      // "fastest": max size / smallest size
};

// The [encoding.auto] keys, for validation and `refit plugins` (names relative to the section).
std::vector<ConfigKeySpec> AutoConfigSpecs();

// Default candidates of `auto`: the registered encodings without REFIT_ENC_CAP_NOT_AUTO, in
// increasing declared apply cost (undeclared last), equal costs by name.
std::vector<std::string> AutoDefaultCandidates(const Registry& registry);

}  // namespace refit::internal
