#include "send/auto_policy.h"

#include <algorithm>
#include <limits>

#include "plugins/encoding_cache.h"

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

std::vector<ConfigKeySpec> AutoConfigSpecs() {
  return {
      {"candidates", REFIT_CFG_STRING_LIST, "(every encoding but dense)",
       "encodings tried per record (default: every registered encoding that does not opt out, in "
       "increasing declared apply cost, then the rest by name: indices, bitmask, deltas, "
       "deltas_zstd, xor, ctx for the shipped ones)"},
      {"mode", REFIT_CFG_STRING, "\"smallest\"",
       "\"smallest\": the smallest record; \"fastest\": the first candidate within budget"},
      {"budget", REFIT_CFG_DOUBLE, "1.1",
       "mode fastest: largest accepted size as a multiple of the smallest candidate's"},
  };
}

Result<const AutoPolicy*> EncodingCache::Auto() {
  std::lock_guard<std::mutex> lock(auto_mu_);
  if (auto_) return auto_.get();
  const std::string section = std::string("encoding.") + kAutoEncoding;
  auto policy = std::make_unique<AutoPolicy>();
  std::vector<std::string> names;
  const std::string cand_key = section + ".candidates";
  auto where = [&](const std::string& key) {
    return config_ != nullptr ? config_->Where(key) + ": " : std::string();
  };
  if (config_ != nullptr && config_->Has(cand_key)) {
    REFIT_ASSIGN_OR_RAISE(names, config_->GetStringList(cand_key, {}));
    if (names.empty()) return Status::Invalid(where(cand_key) + cand_key + " is empty");
    for (const std::string& name : names) {
      if (name == kAutoEncoding) {
        return Status::Invalid(where(cand_key) + cand_key + ": 'auto' cannot be its own candidate");
      }
      if (registry_.Find(REFIT_KIND_ENCODING, name) == nullptr) {
        std::string known;
        for (const ComponentInfo* c : registry_.List()) {
          if (c->kind == REFIT_KIND_ENCODING) known += (known.empty() ? "" : ", ") + c->name;
        }
        return Status::Invalid(where(cand_key) + cand_key + ": unknown encoding '" + name +
                               "' (known: " + known + ")");
      }
    }
  } else {
    names = AutoDefaultCandidates(registry_);
  }
  // xor/step encodings (xor, ctx) are candidates like any other: receivers journal their
  // records, so each is applied exactly once even across a crash (journal.h).
  for (const std::string& name : names) {
    REFIT_ASSIGN_OR_RAISE(const Encoding* enc, Get(name));
    policy->candidates.push_back(enc);
  }
  if (config_ != nullptr) {
    const std::string mode_key = section + ".mode";
    REFIT_ASSIGN_OR_RAISE(std::string mode, config_->GetString(mode_key, "smallest"));
    if (mode != "smallest" && mode != "fastest") {
      return Status::Invalid(where(mode_key) + mode_key + ": unknown mode '" + mode +
                             "' (smallest or fastest)");
    }
    policy->fastest = mode == "fastest";
    const std::string budget_key = section + ".budget";
    REFIT_ASSIGN_OR_RAISE(policy->budget, config_->GetDouble(budget_key, 1.1));
    if (!(policy->budget >= 1.0) || policy->budget > 1e6) {
      return Status::Invalid(where(budget_key) + budget_key + " must be >= 1.0");
    }
  }
  auto_ = std::move(policy);
  return auto_.get();
}

}  // namespace refit::internal
