// What every conformance suite shares: the registry its plugins come from and the names of the
// components of one kind it is instantiated over.
//
// The suites (encoding_suite.h, transport_suite.h, layout_suite.h) define parameterized tests but
// never instantiate them: a binary includes a suite, defines LoadConformanceRegistry() once, and
// instantiates the suite for the plugin names it wants tested. The refit tree does so for the
// plugins it ships; an installed copy does so for a third-party plugin (refit_add_conformance_tests
// in the CMake package).
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <memory>
#include <string>
#include <vector>

#include "refit/plugin_abi.h"
#include "refit/registry.h"
#include "refit/status.h"

namespace refit::conformance {

// Defined once by every conformance binary: the registry that holds the plugins under test. Called
// at test registration (to list names) and again by every test (a fresh registry per test).
Result<std::shared_ptr<Registry>> LoadConformanceRegistry();

// The names of the components of `kind` in the conformance registry, sorted; only those loaded from
// the library `origin` when it is not empty. A load failure becomes one name that fails every test,
// because an empty list would silently test nothing.
inline std::vector<std::string> ComponentNames(refit_component_kind_t kind,
                                               const std::string& origin = "") {
  Result<std::shared_ptr<Registry>> registry = LoadConformanceRegistry();
  if (!registry.ok()) return {"registry_failed_to_load"};
  std::vector<std::string> names;
  for (const ComponentInfo* info : registry.value()->List()) {
    if (info->kind == kind && (origin.empty() || info->origin == origin)) {
      names.push_back(info->name);
    }
  }
  return names;
}

// A plugin name as a gtest parameter name (letters, digits and '_').
inline std::string SanitizeTestName(std::string name) {
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

// text with every occurrence of `from` replaced by `to` (config templates).
inline std::string ReplaceAll(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

}  // namespace refit::conformance
