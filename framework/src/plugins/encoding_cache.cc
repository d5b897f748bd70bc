#include "plugins/encoding_cache.h"

#include "send/auto_policy.h"

namespace refit::internal {

EncodingCache::EncodingCache(const Registry& registry, const Config* config)
    : registry_(registry), config_(config) {}
EncodingCache::~EncodingCache() = default;

Result<const Encoding*> EncodingCache::Get(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = encodings_.find(name);
  if (it != encodings_.end()) return it->second.get();
  std::string section = "encoding." + name;
  bool has_section = config_ != nullptr && !config_->KeysUnder(section).empty();
  REFIT_ASSIGN_OR_RAISE(
      std::unique_ptr<Encoding> enc,
      registry_.CreateEncoding(name, has_section ? config_ : nullptr, has_section ? section : ""));
  const Encoding* raw = enc.get();
  encodings_[name] = std::move(enc);
  return raw;
}

}  // namespace refit::internal
