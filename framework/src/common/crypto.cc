#include "common/crypto.h"

#include <algorithm>

namespace refit::internal {

// RFC 2104: H((K ^ opad) || H((K ^ ipad) || text)), a key longer than a block hashed first.
std::string HmacSha256Hex(const std::string& key, const std::string& text) {
  uint8_t block[Sha256::kBlockBytes] = {};
  if (key.size() > sizeof(block)) {
    Sha256 sha;
    sha.Update(key.data(), key.size());
    sha.Final(block);
  } else {
    std::copy(key.begin(), key.end(), block);
  }
  uint8_t pad[Sha256::kBlockBytes];
  uint8_t inner[Sha256::kDigestBytes];
  for (size_t i = 0; i < sizeof(pad); ++i) pad[i] = block[i] ^ 0x36;
  Sha256 inner_sha;
  inner_sha.Update(pad, sizeof(pad));
  inner_sha.Update(text.data(), text.size());
  inner_sha.Final(inner);
  for (size_t i = 0; i < sizeof(pad); ++i) pad[i] = block[i] ^ 0x5c;
  Sha256 outer_sha;
  outer_sha.Update(pad, sizeof(pad));
  outer_sha.Update(inner, sizeof(inner));
  uint8_t mac[Sha256::kDigestBytes];
  outer_sha.Final(mac);
  return LowerHex(mac, sizeof(mac));
}

bool ConstantTimeEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  // Every byte is compared; volatile keeps the compiler from ending the loop at a difference.
  volatile uint8_t difference = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    difference = difference | static_cast<uint8_t>(a[i] ^ b[i]);
  }
  return difference == 0;
}

}  // namespace refit::internal
