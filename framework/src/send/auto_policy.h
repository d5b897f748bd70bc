// The framework-level `auto` encoding's policy.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "refit/config.h"
#include "refit/dtype.h"
#include "refit/registry.h"
#include "send/cost_model.h"

namespace refit::internal {

// The framework-level `auto` encoding (docs/config.md [encoding.auto]). It is not a plugin: a
// plugin cannot call other plugins, so the writer runs the candidates and keeps one per record.
constexpr const char* kAutoEncoding = "auto";

enum class AutoMode {
  kSmallest,  // every candidate encodes; the smallest record is kept
  kFastest,   // every candidate encodes; the first within budget of the smallest is kept
  kLink,      // only the candidate with the smallest predicted encode + bytes / link + decode
};

struct AutoPolicy {
  std::vector<const Encoding*> candidates;  // cheapest to apply first
  AutoMode mode = AutoMode::kSmallest;
  double budget = 1.1;          // kFastest: max size / smallest size
  double link_bandwidth = 0;    // kLink: bytes per second of the whole path; 0: unlimited
  std::string calibration;      // kLink: the cost model file ("": measured at start-up)
  std::string calibration_key;  // kLink: the candidates and their config (CalibratedOnce)
  // kLink, from the calibration file: dtype -> costs in candidate order.
  std::map<DType, std::vector<EncodingCost>> file_costs;

  // kLink: each candidate's cost for records of `dtype`, in candidate order: from the file, else
  // measured once per process. Safe to call from several threads.
  Result<const std::vector<EncodingCost>*> Costs(DType dtype) const;
};

// The [encoding.auto] keys, for validation and `refit plugins` (names relative to the section).
std::vector<ConfigKeySpec> AutoConfigSpecs();

// Default candidates of `auto`: the registered encodings without REFIT_ENC_CAP_NOT_AUTO, in
// increasing declared apply cost (undeclared last), equal costs by name.
std::vector<std::string> AutoDefaultCandidates(const Registry& registry);

// The transports whose senders default to mode "link" (streams, where the CPU stages are a large
// part of a sync); every other transport defaults to "smallest" (disk, s3: the payload
// dominates).
bool LinkModeIsDefaultFor(const std::string& transport);

}  // namespace refit::internal
