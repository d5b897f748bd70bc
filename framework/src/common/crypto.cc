#include "common/crypto.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

namespace refit::internal {

namespace {

std::string Hex(const unsigned char* bytes, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return out;
}

}  // namespace

std::string Sha256Hex(const uint8_t* data, uint64_t size) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  unsigned int len = 0;
  // EVP picks the SHA extensions where the CPU has them.
  EVP_Digest(data, size, digest, &len, EVP_sha256(), nullptr);
  return Hex(digest, len);
}

std::string HmacSha256Hex(const std::string& key, const std::string& text) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(text.data()), text.size(), mac, &len);
  return Hex(mac, len);
}

bool ConstantTimeEqual(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace refit::internal
