// SHA-256 and HMAC-SHA256 from OpenSSL, a reference independent of the code under test: the unit
// tests check the core's own implementation against it, the integration tests check the digests
// and MACs refit writes (and forge valid ones) with it. Only test binaries link libcrypto.
#pragma once

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstddef>
#include <string>

namespace refit::testing {

inline std::string ReferenceHex(const unsigned char* bytes, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += kDigits[bytes[i] >> 4];
    out += kDigits[bytes[i] & 15];
  }
  return out;
}

// Lowercase hex SHA-256 of `data`.
inline std::string ReferenceSha256Hex(const std::string& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr);
  return ReferenceHex(digest, len);
}

// Lowercase hex HMAC-SHA256(key, text).
inline std::string ReferenceHmacSha256Hex(const std::string& key, const std::string& text) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(text.data()), text.size(), mac, &len);
  return ReferenceHex(mac, len);
}

}  // namespace refit::testing
