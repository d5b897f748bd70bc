// The conformance suite of one kind run against one plugin library: what the CMake package's
// refit_add_conformance_tests() builds for a third-party plugin. Compiled with
//
//   REFIT_CONFORMANCE_PLUGIN   path of the plugin .so (loaded next to refit's builtins)
//   REFIT_CONFORMANCE_KIND_ENCODING, _TRANSPORT or _LAYOUT   which suite
//   REFIT_CONFORMANCE_NAMES    optional, "a,b": the components to test (default: every component
//                              of the kind the library registers)
//   REFIT_CONFORMANCE_CONFIG   optional TOML file the components are created from. Transports: its
//                              [transport.<name>] section, with @SCRATCH@ standing for an empty
//                              directory each test owns. Layouts: the [layout.<name>] section, with
//                              @MODEL@ standing for the model keys and @SHAPES_FROM@ for a
//                              safetensors file of the canonical checkpoint (default:
//                              "[layout.<name>]\n@MODEL@").
//   REFIT_CONFORMANCE_WORLD    layouts: the number of ranks (default 1)
//   REFIT_CONFORMANCE_MODELS   layouts: "dense,gqa,...", labels of StandardLayoutModels() (default
//                              dense,gqa,tied_bias_qknorm)
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "refit/conformance/common.h"
#include "refit/registry.h"

#if defined(REFIT_CONFORMANCE_KIND_ENCODING)
#include "refit/conformance/encoding_suite.h"
#elif defined(REFIT_CONFORMANCE_KIND_TRANSPORT)
#include "refit/conformance/transport_suite.h"
#elif defined(REFIT_CONFORMANCE_KIND_LAYOUT)
#include "refit/conformance/layout_suite.h"
#else
#error "define one of REFIT_CONFORMANCE_KIND_ENCODING, _TRANSPORT, _LAYOUT"
#endif

#ifndef REFIT_CONFORMANCE_PLUGIN
#error "REFIT_CONFORMANCE_PLUGIN must name the plugin .so under test"
#endif
#ifndef REFIT_CONFORMANCE_NAMES
#define REFIT_CONFORMANCE_NAMES ""
#endif
#ifndef REFIT_CONFORMANCE_CONFIG
#define REFIT_CONFORMANCE_CONFIG ""
#endif

namespace refit::conformance {

Result<std::shared_ptr<Registry>> LoadConformanceRegistry() {
  // With the builtins, as a real program has them: a name clash with one is a failure here too.
  REFIT_ASSIGN_OR_RAISE(std::shared_ptr<Registry> registry, Registry::WithBuiltins());
  REFIT_RETURN_NOT_OK(registry->LoadLibrary(REFIT_CONFORMANCE_PLUGIN));
  return registry;
}

namespace {

std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// The names to test: REFIT_CONFORMANCE_NAMES, or every component of kind the plugin registers.
// Never empty: a plugin without such components fails rather than passing with no tests.
std::vector<std::string> NamesUnderTest(refit_component_kind_t kind) {
  std::vector<std::string> names = SplitCommas(REFIT_CONFORMANCE_NAMES);
  if (!names.empty()) return names;
  Result<std::shared_ptr<Registry>> registry = LoadConformanceRegistry();
  if (!registry.ok()) return {"registry_failed_to_load"};
  for (const ComponentInfo* info : registry.value()->List()) {
    if (info->kind == kind && info->origin != "builtin") names.push_back(info->name);
  }
  if (names.empty()) names.push_back(std::string("no_") + KindName(kind) + "_in_plugin");
  return names;
}

[[maybe_unused]] std::string ConfigText() {
  const std::string path = REFIT_CONFORMANCE_CONFIG;
  if (path.empty()) return "";
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) ADD_FAILURE() << "cannot read " << path;
  return text.str();
}

#if defined(REFIT_CONFORMANCE_KIND_ENCODING)

INSTANTIATE_TEST_SUITE_P(
    Plugin, EncodingConformanceTest,
    ::testing::Combine(::testing::ValuesIn(NamesUnderTest(REFIT_KIND_ENCODING)),
                       ::testing::ValuesIn(AllDTypeValues())),
    EncodingParamName);

#elif defined(REFIT_CONFORMANCE_KIND_TRANSPORT)

std::vector<std::string> TransportsWithSetups() {
  std::vector<std::string> names = NamesUnderTest(REFIT_KIND_TRANSPORT);
  const std::string text = ConfigText();
  for (const std::string& name : names) {
    RegisterTransportSetup(name, {[text](const fs::path& scratch) {
                                    Result<Config> config = Config::FromString(
                                        ReplaceAll(text, "@SCRATCH@", scratch.string()),
                                        REFIT_CONFORMANCE_CONFIG);
                                    EXPECT_TRUE(config.ok()) << config.status().ToString();
                                    return config.ok() ? std::move(config).value() : Config();
                                  },
                                  "", ""});
  }
  return names;
}

INSTANTIATE_TEST_SUITE_P(Plugin, TransportConformanceTest,
                         ::testing::ValuesIn(TransportsWithSetups()), TransportParamName);

#elif defined(REFIT_CONFORMANCE_KIND_LAYOUT)

#ifndef REFIT_CONFORMANCE_WORLD
#define REFIT_CONFORMANCE_WORLD 1
#endif
#ifndef REFIT_CONFORMANCE_MODELS
#define REFIT_CONFORMANCE_MODELS "dense,gqa,tied_bias_qknorm"
#endif

std::vector<LayoutCase> LayoutCases() {
  std::vector<LayoutCase> cases;
  const std::string text = ConfigText();
  for (const std::string& name : NamesUnderTest(REFIT_KIND_LAYOUT)) {
    for (const std::string& label : SplitCommas(REFIT_CONFORMANCE_MODELS)) {
      bool found = false;
      for (const auto& [model_label, model] : StandardLayoutModels()) {
        if (model_label != label) continue;
        found = true;
        cases.push_back({name, label + "_world" + std::to_string(REFIT_CONFORMANCE_WORLD),
                         REFIT_CONFORMANCE_WORLD, model,
                         text.empty() ? "[layout." + name + "]\n@MODEL@" : text});
      }
      if (!found) ADD_FAILURE() << "REFIT_CONFORMANCE_MODELS: no standard model '" << label << "'";
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Plugin, LayoutConformanceTest, ::testing::ValuesIn(LayoutCases()),
                         LayoutParamName);

#endif

}  // namespace
}  // namespace refit::conformance
