#include "send/cost_model.h"

#include <cctype>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace refit::internal {

namespace {

using json = nlohmann::ordered_json;

constexpr int kCostModelVersion = 1;
// Larger numbers are a unit mix-up (e.g. seconds written as nanoseconds of a 1 TB record), not a
// machine: refused rather than silently dominating every choice.
constexpr double kMaxCoefficient = 1e12;

Status Bad(const std::string& origin, const std::string& where, const std::string& what) {
  return Status::Invalid(origin + ": " + where + ": " + what);
}

Result<LinearCost> ParseLinear(const json& v, const std::string& origin, const std::string& where) {
  if (!v.is_array() || v.size() != 3) {
    return Bad(origin, where, "expected [per record, per element, per change]");
  }
  double c[3];
  for (size_t i = 0; i < 3; ++i) {
    if (!v[i].is_number()) return Bad(origin, where, "expected numbers");
    c[i] = v[i].get<double>();
    if (!std::isfinite(c[i]) || c[i] < 0 || c[i] > kMaxCoefficient) {
      return Bad(origin, where, "each number must be finite, >= 0 and <= 1e12");
    }
  }
  return LinearCost{c[0], c[1], c[2]};
}

// Names are printed in errors: only what a dtype or encoding name can be.
bool PlainName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) {
      return false;
    }
  }
  return true;
}

Result<EncodingCost> ParseEncoding(const json& v, const std::string& origin,
                                   const std::string& where) {
  if (!v.is_object()) return Bad(origin, where, "expected an object");
  EncodingCost cost;
  bool seen[3] = {false, false, false};
  for (const auto& [key, value] : v.items()) {
    // An unknown member's name may be anything (a newline): only a plain one is shown.
    const std::string at = where + "." + (PlainName(key) ? key : "<member>");
    if (key == "encode_ns") {
      REFIT_ASSIGN_OR_RAISE(cost.encode_ns, ParseLinear(value, origin, at));
      seen[0] = true;
    } else if (key == "decode_ns") {
      REFIT_ASSIGN_OR_RAISE(cost.decode_ns, ParseLinear(value, origin, at));
      seen[1] = true;
    } else if (key == "bytes") {
      REFIT_ASSIGN_OR_RAISE(cost.bytes, ParseLinear(value, origin, at));
      seen[2] = true;
    } else {
      return Bad(origin, at, "unknown member (encode_ns, decode_ns, bytes)");
    }
  }
  if (!seen[0] || !seen[1] || !seen[2]) {
    return Bad(origin, where, "needs encode_ns, decode_ns and bytes");
  }
  return cost;
}

Result<CostModelFile> ParseModelObject(const json& m, const std::string& origin) {
  if (!m.is_object()) return Bad(origin, "link_model", "expected an object");
  auto version = m.find("version");
  if (version == m.end() || !version->is_number_integer() ||
      version->get<int64_t>() != kCostModelVersion) {
    return Bad(origin, "link_model.version", "expected 1");
  }
  auto dtypes = m.find("dtypes");
  if (dtypes == m.end() || !dtypes->is_object()) {
    return Bad(origin, "link_model.dtypes", "expected an object of dtypes");
  }
  for (const auto& [key, value] : m.items()) {
    if (key != "version" && key != "dtypes") {
      return Bad(origin, "link_model", "unknown member (version, dtypes)");
    }
  }
  CostModelFile file;
  for (const auto& [dtype, encodings] : dtypes->items()) {
    if (!PlainName(dtype)) return Bad(origin, "link_model.dtypes", "a dtype name is not plain");
    const std::string where = "link_model.dtypes." + dtype;
    if (!encodings.is_object()) return Bad(origin, where, "expected an object of encodings");
    auto& out = file[dtype];
    for (const auto& [name, value] : encodings.items()) {
      if (!PlainName(name)) return Bad(origin, where, "an encoding name is not plain");
      REFIT_ASSIGN_OR_RAISE(out[name], ParseEncoding(value, origin, where + "." + name));
    }
  }
  return file;
}

json LinearToJson(const LinearCost& c) { return json::array({c.record, c.elem, c.change}); }

}  // namespace

double PredictSeconds(const EncodingCost& cost, uint64_t n, uint64_t k, double bytes_per_second) {
  double seconds = (cost.encode_ns.At(n, k) + cost.decode_ns.At(n, k)) * 1e-9;
  if (bytes_per_second > 0) seconds += cost.bytes.At(n, k) / bytes_per_second;
  return seconds;
}

size_t CheapestEncoding(const std::vector<EncodingCost>& costs, uint64_t n, uint64_t k,
                        double bytes_per_second) {
  size_t best = 0;
  double best_seconds = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < costs.size(); ++i) {
    const double s = PredictSeconds(costs[i], n, k, bytes_per_second);
    if (s < best_seconds) {
      best = i;
      best_seconds = s;
    }
  }
  return best;
}

Result<CostModelFile> ParseCostModel(std::string_view text, const std::string& origin) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Invalid(origin + ": not a JSON object");
  auto inner = j.find("link_model");
  if (inner != j.end()) return ParseModelObject(*inner, origin);
  return ParseModelObject(j, origin);
}

std::string SerializeCostModel(const CostModelFile& model) {
  json dtypes = json::object();
  for (const auto& [dtype, encodings] : model) {
    json per = json::object();
    for (const auto& [name, cost] : encodings) {
      per[name] = {{"encode_ns", LinearToJson(cost.encode_ns)},
                   {"decode_ns", LinearToJson(cost.decode_ns)},
                   {"bytes", LinearToJson(cost.bytes)}};
    }
    dtypes[dtype] = std::move(per);
  }
  return json{{"version", kCostModelVersion}, {"dtypes", std::move(dtypes)}}.dump();
}

}  // namespace refit::internal
