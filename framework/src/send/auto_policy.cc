#include "send/auto_policy.h"

#include <algorithm>

#include "plugins/encoding_cache.h"

namespace refit::internal {

const std::vector<std::string>& AutoPreferredOrder() {
  // Cheapest to apply first: a plain scatter, a bitmask walk, gap decoding, then the entropy
  // coded ones. "fastest" mode takes the first of these within the size budget.
  static const std::vector<std::string> order = {"indices",     "bitmask", "deltas",
                                                 "deltas_zstd", "xor",     "ctx"};
  return order;
}

std::vector<ConfigKeySpec> AutoConfigSpecs() {
  return {
      {"candidates", REFIT_CFG_STRING_LIST, "(every encoding but dense)",
       "encodings tried per record (default: every registered encoding but dense, cheapest to "
       "apply first: indices, bitmask, deltas, deltas_zstd, xor, ctx, then the rest by name)"},
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
    std::vector<std::string> rest;
    for (const ComponentInfo* c : registry_.List()) {
      if (c->kind != REFIT_KIND_ENCODING || c->name == "dense" || c->name == kAutoEncoding) {
        continue;
      }
      const auto& order = AutoPreferredOrder();
      if (std::find(order.begin(), order.end(), c->name) == order.end()) rest.push_back(c->name);
    }
    for (const std::string& name : AutoPreferredOrder()) {
      if (registry_.Find(REFIT_KIND_ENCODING, name) != nullptr) names.push_back(name);
    }
    std::sort(rest.begin(), rest.end());
    names.insert(names.end(), rest.begin(), rest.end());
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
