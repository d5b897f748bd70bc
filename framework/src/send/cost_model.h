// The per-record cost model of `auto` mode "link" (docs/config.md [encoding.auto]) and its JSON
// form (the `link_model` of `refit bench codec --json`, read by [encoding.auto] calibration).
// Pure data and parsing: no registry, no timing (send/calibrate.h measures the numbers).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "refit/status.h"

namespace refit::internal {

// record + elem * n + change * k: a cost that grows with a record's element count n and change
// count k (the two numbers the diff knows before any encoding runs).
struct LinearCost {
  double record = 0;
  double elem = 0;
  double change = 0;
  double At(uint64_t n, uint64_t k) const {
    return record + elem * static_cast<double>(n) + change * static_cast<double>(k);
  }
};

// One encoding on one dtype, on this machine: single-thread encode and decode nanoseconds (the
// diff, digest and packing every encoding shares are left out) and encoded bytes.
struct EncodingCost {
  LinearCost encode_ns;
  LinearCost decode_ns;
  LinearCost bytes;
};

// Predicted seconds of one record: encode + bytes / bandwidth + decode. A sum, not max(stage): a
// receiver applies a version only once its commit exists, so today the stages of one sync run in
// series, and a sum is what one record adds to it (docs/architecture.md, "link-aware auto").
// bytes_per_second 0: an unlimited link (bytes cost nothing).
double PredictSeconds(const EncodingCost& cost, uint64_t n, uint64_t k, double bytes_per_second);

// The index of the cheapest of `costs` for a record of n elements and k changes (ties: the
// earlier); costs must not be empty.
size_t CheapestEncoding(const std::vector<EncodingCost>& costs, uint64_t n, uint64_t k,
                        double bytes_per_second);

// dtype name ("bf16") -> encoding name -> its cost.
using CostModelFile = std::map<std::string, std::map<std::string, EncodingCost>>;

// Parses a cost model: a JSON object with a "link_model" member (a whole `refit bench codec
// --json` result) or the link_model object itself:
//   {"version": 1, "dtypes": {"bf16": {"indices": {"encode_ns": [record, elem, change],
//                                                  "decode_ns": [...], "bytes": [...]}, ...}}}
// Every number finite and >= 0; unknown members are errors. Errors are one line starting with
// `origin`.
Result<CostModelFile> ParseCostModel(std::string_view text, const std::string& origin);

// The link_model object ParseCostModel reads back (compact JSON, members sorted).
std::string SerializeCostModel(const CostModelFile& model);

}  // namespace refit::internal
