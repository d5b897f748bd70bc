#include "send/auto_policy.h"

#include <algorithm>
#include <limits>

#include "common/file_util.h"
#include "link/link.h"
#include "plugins/encoding_cache.h"
#include "send/calibrate.h"

namespace refit::internal {

std::vector<std::string> AutoDefaultCandidates(const Registry& registry) {
  // Cheapest to apply first, by the cost each encoding declares ("fastest" mode takes the first
  // within the size budget); an encoding that declares none comes after those that do, and equal
  // costs go by name so the order never depends on load order.
  std::vector<const ComponentInfo*> encodings;
  for (const ComponentInfo* c : registry.List()) {
    if (c->kind != REFIT_KIND_ENCODING || c->name == kAutoEncoding ||
        (c->capabilities & REFIT_ENC_CAP_NOT_AUTO) != 0) {
      continue;
    }
    encodings.push_back(c);
  }
  auto cost = [](const ComponentInfo* c) {
    return c->apply_cost != 0 ? c->apply_cost : std::numeric_limits<uint32_t>::max();
  };
  std::stable_sort(encodings.begin(), encodings.end(),
                   [&](const ComponentInfo* a, const ComponentInfo* b) {
                     return cost(a) != cost(b) ? cost(a) < cost(b) : a->name < b->name;
                   });
  std::vector<std::string> names;
  for (const ComponentInfo* c : encodings) names.push_back(c->name);
  return names;
}

bool LinkModeIsDefaultFor(const std::string& transport) {
  return transport == "ucx" || transport == "nccl";
}

std::vector<ConfigKeySpec> AutoConfigSpecs() {
  return {
      {"candidates", REFIT_CFG_STRING_LIST, "(every encoding but dense)",
       "encodings tried per record (default: every registered encoding that does not opt out, in "
       "increasing declared apply cost, then the rest by name: indices, bitmask, deltas, "
       "deltas_zstd, xor, ctx for the shipped ones)"},
      {"mode", REFIT_CFG_STRING, "(\"link\" for ucx and nccl, else \"smallest\")",
       "\"smallest\": the smallest record; \"fastest\": the first candidate within budget; "
       "\"link\": only the candidate with the smallest predicted encode + bytes / link_bandwidth "
       "+ decode time"},
      {"budget", REFIT_CFG_DOUBLE, "1.1",
       "mode fastest: largest accepted size as a multiple of the smallest candidate's"},
      {"link_bandwidth", REFIT_CFG_SIZE, "(from [transport])",
       "mode link: bytes per second a payload crosses the whole path at, e.g. \"200MB\" (0: "
       "unlimited); default: [transport] bandwidth / (2, or 3 with sender.verify_puts), else "
       "[transport.<name>] link_bandwidth, else 0"},
      {"calibration", REFIT_CFG_STRING, "\"\"",
       "mode link: JSON file of per-encoding speeds and sizes (the link_model of `refit bench "
       "codec --json`); empty: measured once per process at start-up (tens of ms)"},
  };
}

namespace {

std::string Where(const Config* config, const std::string& key) {
  return config != nullptr ? config->Where(key) + ": " : std::string();
}

Result<std::vector<std::string>> CandidateNames(const Registry& registry, const Config* config,
                                                const std::string& section) {
  const std::string key = section + ".candidates";
  if (config == nullptr || !config->Has(key)) return AutoDefaultCandidates(registry);
  REFIT_ASSIGN_OR_RAISE(std::vector<std::string> names, config->GetStringList(key, {}));
  if (names.empty()) return Status::Invalid(Where(config, key) + key + " is empty");
  for (const std::string& name : names) {
    if (name == kAutoEncoding) {
      return Status::Invalid(Where(config, key) + key + ": 'auto' cannot be its own candidate");
    }
    if (registry.Find(REFIT_KIND_ENCODING, name) == nullptr) {
      std::string known;
      for (const ComponentInfo* c : registry.List()) {
        if (c->kind == REFIT_KIND_ENCODING) known += (known.empty() ? "" : ", ") + c->name;
      }
      return Status::Invalid(Where(config, key) + key + ": unknown encoding '" + name +
                             "' (known: " + known + ")");
    }
  }
  return names;
}

// What the payload crosses a metered link at when [encoding.auto] link_bandwidth is absent: the
// emulated link ([transport] bandwidth) charges it once per crossing, in series
// (MeteredCrossings); else the plugin's own pacing.
Result<uint64_t> DefaultLinkBandwidth(const Config& config, const Registry& registry) {
  REFIT_ASSIGN_OR_RAISE(uint64_t emulated, config.GetSize("transport.bandwidth", 0));
  if (emulated > 0) {
    REFIT_ASSIGN_OR_RAISE(uint32_t crossings, MeteredCrossings(config, registry));
    return emulated / crossings;
  }
  return PluginLinkBandwidth(config);
}

// The config a candidate's speed depends on (e.g. zstd levels): part of the calibration's key.
std::string CalibrationKey(const Config* config, const std::vector<std::string>& names) {
  std::string key;
  for (const std::string& name : names) key += name + ",";
  if (config == nullptr) return key;
  for (const auto& [name, v] : config->values()) {
    if (name.rfind("encoding.", 0) != 0 || name.rfind("encoding.auto.", 0) == 0) continue;
    key += ";" + name + "=" + v.string_value + "/" + std::to_string(v.int_value) + "/" +
           std::to_string(v.double_value) + "/" + std::to_string(v.bool_value);
    for (const std::string& item : v.list_value) key += "," + item;
  }
  return key;
}

// The calibration file's costs, in candidate order, for each dtype it lists.
Status LoadCalibration(const Config& config, const std::string& key, AutoPolicy* policy) {
  const std::string where = Where(&config, key) + key + " " + policy->calibration;
  Result<std::string> text = ReadSmallFile(policy->calibration, 16 << 20);
  if (!text.ok()) return Status::Invalid(where + ": " + text.status().message());
  REFIT_ASSIGN_OR_RAISE(CostModelFile file, ParseCostModel(*text, where));
  for (const auto& [dtype_name, encodings] : file) {
    Result<DType> dtype = DTypeFromName(dtype_name);
    if (!dtype.ok()) return Status::Invalid(where + ": unknown dtype '" + dtype_name + "'");
    std::vector<EncodingCost> costs;
    for (const Encoding* enc : policy->candidates) {
      auto it = encodings.find(enc->name());
      if (it == encodings.end()) {
        return Status::Invalid(where + ": " + dtype_name + " has no model of candidate '" +
                               enc->name() + "'");
      }
      costs.push_back(it->second);
    }
    policy->file_costs[*dtype] = std::move(costs);
  }
  return Status::OK();
}

// mode, budget, link_bandwidth and calibration.
Status ReadModeKeys(const Config& config, const Registry& registry, const std::string& section,
                    AutoPolicy* policy) {
  const std::string mode_key = section + ".mode";
  REFIT_ASSIGN_OR_RAISE(std::string transport, config.GetString("transport.name", "disk"));
  REFIT_ASSIGN_OR_RAISE(
      std::string mode,
      config.GetString(mode_key, LinkModeIsDefaultFor(transport) ? "link" : "smallest"));
  if (mode == "smallest") {
    policy->mode = AutoMode::kSmallest;
  } else if (mode == "fastest") {
    policy->mode = AutoMode::kFastest;
  } else if (mode == "link") {
    policy->mode = AutoMode::kLink;
  } else {
    return Status::Invalid(Where(&config, mode_key) + mode_key + ": unknown mode '" + mode +
                           "' (smallest, fastest or link)");
  }
  const std::string budget_key = section + ".budget";
  REFIT_ASSIGN_OR_RAISE(policy->budget, config.GetDouble(budget_key, 1.1));
  if (!(policy->budget >= 1.0) || policy->budget > 1e6) {
    return Status::Invalid(Where(&config, budget_key) + budget_key + " must be >= 1.0");
  }
  const std::string bw_key = section + ".link_bandwidth";
  const std::string cal_key = section + ".calibration";
  if (policy->mode != AutoMode::kLink) {
    // Set where nothing reads them is a mistake worth one line, not a silent no-op.
    for (const std::string& key : {bw_key, cal_key}) {
      if (config.Has(key)) {
        return Status::Invalid(Where(&config, key) + key +
                               ": only mode \"link\" reads it (mode is \"" + mode + "\")");
      }
    }
    return Status::OK();
  }
  REFIT_ASSIGN_OR_RAISE(uint64_t fallback, DefaultLinkBandwidth(config, registry));
  REFIT_ASSIGN_OR_RAISE(uint64_t bandwidth, config.GetSize(bw_key, fallback));
  policy->link_bandwidth = static_cast<double>(bandwidth);
  REFIT_ASSIGN_OR_RAISE(policy->calibration, config.GetString(cal_key, ""));
  if (!policy->calibration.empty()) REFIT_RETURN_NOT_OK(LoadCalibration(config, cal_key, policy));
  return Status::OK();
}

}  // namespace

Result<const std::vector<EncodingCost>*> AutoPolicy::Costs(DType dtype) const {
  auto it = file_costs.find(dtype);
  if (it != file_costs.end()) return &it->second;
  return CalibratedOnce(candidates, dtype, calibration_key);
}

Result<const AutoPolicy*> EncodingCache::Auto() {
  std::lock_guard<std::mutex> lock(auto_mu_);
  if (auto_) return auto_.get();
  const std::string section = std::string("encoding.") + kAutoEncoding;
  auto policy = std::make_unique<AutoPolicy>();
  REFIT_ASSIGN_OR_RAISE(std::vector<std::string> names,
                        CandidateNames(registry_, config_, section));
  // xor/step encodings (xor, ctx) are candidates like any other: receivers journal their
  // records, so each is applied exactly once even across a crash (journal.h).
  for (const std::string& name : names) {
    REFIT_ASSIGN_OR_RAISE(const Encoding* enc, Get(name));
    policy->candidates.push_back(enc);
  }
  policy->calibration_key = CalibrationKey(config_, names);
  if (config_ != nullptr)
    REFIT_RETURN_NOT_OK(ReadModeKeys(*config_, registry_, section, policy.get()));
  auto_ = std::move(policy);
  return auto_.get();
}

}  // namespace refit::internal
