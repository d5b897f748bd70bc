// The encoding conformance suite (refit/conformance/encoding_suite.h) over every encoding the
// conformance registry knows x every dtype: a new encoding is tested by existing, with no edit
// here.
#include "refit/conformance/encoding_suite.h"

namespace refit::conformance {
namespace {

INSTANTIATE_TEST_SUITE_P(
    AllEncodings, EncodingConformanceTest,
    ::testing::Combine(::testing::ValuesIn(ComponentNames(REFIT_KIND_ENCODING)),
                       ::testing::ValuesIn(AllDTypeValues())),
    EncodingParamName);

}  // namespace
}  // namespace refit::conformance
