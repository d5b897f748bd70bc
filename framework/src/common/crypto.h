// SHA-256 and HMAC-SHA256 (common/sha256.h), for the version chain and signed versions.
#pragma once

#include <cstdint>
#include <string>

#include "common/sha256.h"

namespace refit::internal {

// Sha256Hex(const uint8_t*, uint64_t): common/sha256.h.
inline std::string Sha256Hex(const std::string& text) {
  return Sha256Hex(reinterpret_cast<const uint8_t*>(text.data()), text.size());
}
// Lowercase hex of HMAC-SHA256(key, text).
std::string HmacSha256Hex(const std::string& key, const std::string& text);
// Compares two strings in time that depends only on their lengths (MAC checks).
bool ConstantTimeEqual(const std::string& a, const std::string& b);

}  // namespace refit::internal
