// The core's SHA-256 and HMAC-SHA256 against the published test vectors and, on random inputs of
// every length around the block size, against OpenSSL's (tests/common/reference_crypto.h).
#include "common/crypto.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "common/sha256.h"
#include "reference_crypto.h"

namespace refit::internal {
namespace {

using refit::testing::ReferenceHex;
using refit::testing::ReferenceHmacSha256Hex;
using refit::testing::ReferenceSha256Hex;

// Digest through Sha256 in pieces of `piece` bytes (0: one Update).
std::string Digest(const std::string& data, bool hardware, size_t piece) {
  Sha256 sha(hardware);
  if (piece == 0) piece = data.size() + 1;
  for (size_t at = 0; at < data.size(); at += piece) {
    sha.Update(data.data() + at, std::min(piece, data.size() - at));
  }
  uint8_t digest[Sha256::kDigestBytes];
  sha.Final(digest);
  return ReferenceHex(digest, sizeof(digest));
}

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

TEST(Crypto, Sha256KnownVectors) {
  for (bool hardware : {false, true}) {
    EXPECT_EQ(Digest("", hardware, 0),
              "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_EQ(Digest("abc", hardware, 0),
              "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_EQ(Digest("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", hardware, 0),
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    EXPECT_EQ(Digest(std::string(1000000, 'a'), hardware, 4096),
              "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  }
}

TEST(Crypto, Sha256MatchesOpensslAtEveryLengthAndSplit) {
  std::mt19937_64 rng(7);
  for (size_t n = 0; n <= 300; ++n) {
    const std::string data = RandomBytes(rng, n);
    const std::string expected = ReferenceSha256Hex(data);
    for (bool hardware : {false, true}) {
      for (size_t piece : {size_t{0}, size_t{1}, size_t{7}, size_t{63}, size_t{64}, size_t{65}}) {
        ASSERT_EQ(Digest(data, hardware, piece), expected)
            << n << " bytes, hardware " << hardware << ", pieces of " << piece;
      }
    }
  }
  const std::string big = RandomBytes(rng, (1 << 20) + 17);
  EXPECT_EQ(Sha256Hex(reinterpret_cast<const uint8_t*>(big.data()), big.size()),
            ReferenceSha256Hex(big));
}

TEST(Crypto, HmacMatchesRfc4231AndOpenssl) {
  // RFC 4231 test case 2 and 6 (a key longer than a block).
  EXPECT_EQ(HmacSha256Hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(HmacSha256Hex(std::string(131, '\xaa'),
                          "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  std::mt19937_64 rng(11);
  for (size_t key_bytes : {0, 1, 16, 63, 64, 65, 200}) {
    for (size_t text_bytes : {0, 1, 55, 56, 64, 1000}) {
      const std::string key = RandomBytes(rng, key_bytes);
      const std::string text = RandomBytes(rng, text_bytes);
      ASSERT_EQ(HmacSha256Hex(key, text), ReferenceHmacSha256Hex(key, text))
          << key_bytes << " " << text_bytes;
    }
  }
}

TEST(Crypto, ConstantTimeEqualComparesEveryByte) {
  EXPECT_TRUE(ConstantTimeEqual("", ""));
  EXPECT_TRUE(ConstantTimeEqual("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEqual("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEqual("xbc", "abc"));
  EXPECT_FALSE(ConstantTimeEqual("abc", "abcd"));
}

}  // namespace
}  // namespace refit::internal
