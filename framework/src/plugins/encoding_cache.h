// Encodings by name for one config, shared by the sender, the receiver and offline deltas.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "refit/config.h"
#include "refit/registry.h"

namespace refit::internal {

struct AutoPolicy;  // send/auto_policy.h

// Encodings by name, created on first use with their [encoding.<name>] config section.
class EncodingCache {
 public:
  EncodingCache(const Registry& registry, const Config* config);
  ~EncodingCache();
  Result<const Encoding*> Get(const std::string& name);
  // The [encoding.auto] policy with its candidates resolved (errors name the key).
  Result<const AutoPolicy*> Auto();

 private:
  const Registry& registry_;
  const Config* config_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<Encoding>> encodings_;
  std::mutex auto_mu_;
  std::unique_ptr<AutoPolicy> auto_;
};

}  // namespace refit::internal
