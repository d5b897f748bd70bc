// The transport conformance suite (refit/conformance/transport_suite.h) over every transport the
// conformance registry knows. A transport needs a config: a new transport adds its setup below.
#include "refit/conformance/transport_suite.h"

namespace refit::conformance {
namespace {

// Registered before main() runs the tests (gtest instantiates suites at RUN_ALL_TESTS).
[[maybe_unused]] const bool kSetupsRegistered = [] {
  RegisterTransportSetup("disk", {[](const fs::path& scratch) {
                                    Config config;
                                    config.SetString("transport.disk.dir",
                                                     (scratch / "channel").string());
                                    return config;
                                  },
                                  "", ""});
  return true;
}();

INSTANTIATE_TEST_SUITE_P(AllTransports, TransportConformanceTest,
                         ::testing::ValuesIn(ComponentNames(REFIT_KIND_TRANSPORT)),
                         TransportParamName);

}  // namespace
}  // namespace refit::conformance
