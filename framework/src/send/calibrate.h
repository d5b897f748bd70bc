// Measures the link-aware `auto` mode's cost model on this machine (docs/config.md
// [encoding.auto] calibration).
#pragma once

#include <string>
#include <vector>

#include "refit/dtype.h"
#include "refit/registry.h"
#include "send/cost_model.h"

namespace refit::internal {

// Encodes and decodes (as a receiver does, receive/apply.cc) a synthetic delta of `dtype` (1 Mi
// elements at 0.2% and 3% density, and 64 Ki at 3%: a few MB, tens of ms) with each candidate on
// the calling thread and fits every candidate's single-thread encode and decode time and its size
// to LinearCost (fastest of three runs). The values of float dtypes cluster at small exponents
// like weights, and 90% of the changes are one step of the ordered integer representation, as in
// a refit. A decode that does not reproduce the new bits is an error.
Result<std::vector<EncodingCost>> Calibrate(const std::vector<const Encoding*>& candidates,
                                            DType dtype);

// Calibrate, once per process for each (key, dtype): every record a process encodes is chosen
// with the same numbers, whatever the thread count or the order records arrive in, so payloads
// do not depend on sender.threads. `key` names the candidates and their config.
Result<const std::vector<EncodingCost>*> CalibratedOnce(
    const std::vector<const Encoding*>& candidates, DType dtype, const std::string& key);

}  // namespace refit::internal
