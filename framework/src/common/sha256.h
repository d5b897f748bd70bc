// SHA-256 (FIPS 180-4), with the x86 SHA extensions where the CPU has them. The core's own so
// that no refit process loads libcrypto (~3 ms of every process start) for a few digests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace refit::internal {

class Sha256 {
 public:
  static constexpr size_t kDigestBytes = 32;
  static constexpr size_t kBlockBytes = 64;

  // `hardware` = false forces the portable rounds (tests compare both).
  explicit Sha256(bool hardware = true);
  void Update(const void* data, size_t size);
  void Final(uint8_t digest[kDigestBytes]);

  // Whether this CPU runs the SHA-extension rounds.
  static bool HardwareAvailable();

 private:
  void Blocks(const uint8_t* data, size_t count);

  uint32_t state_[8];
  uint8_t buffer_[kBlockBytes];
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
  bool hardware_ = false;
};

// Lowercase hex of the bytes.
std::string LowerHex(const uint8_t* bytes, size_t n);
// Lowercase hex of SHA-256(data); `data` may be null when `size` is 0.
std::string Sha256Hex(const uint8_t* data, uint64_t size);

}  // namespace refit::internal
