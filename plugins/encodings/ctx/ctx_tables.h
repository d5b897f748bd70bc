// The `ctx` codec's table-coded form (mode 2, large records): static per-record frequency tables
// decoded by table-driven rANS (two interleaved states for instruction-level parallelism), the
// low bits of every value in a separate raw bit stream. One table lookup, one multiply and one
// conditional 16-bit read per symbol, where the adaptive range coder takes ~5 binary decisions
// and a division per change. Integer arithmetic only: encoder and decoder derive the same tables
// from the same header bytes on any machine. See README.md for the layout.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

#include "refit/sdk/encoding_util.hpp"

namespace refit::ctx::tables {

// A little-endian load as one instruction: GCC -O2 leaves sdk::LoadLE's byte loop as a loop in
// the decoders' hot paths (8 dependent iterations per raw-bit read, ~half the entropy stage).
template <typename T>
inline __attribute__((always_inline)) T LoadLE(const uint8_t* p) {
  if constexpr (std::endian::native == std::endian::little) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
  } else {
    return sdk::LoadLE<T>(p);
  }
}

// Symbols are coded at this precision: the frequencies of a table sum to kTotal.
constexpr uint32_t kPrecision = 12;
constexpr uint32_t kTotal = 1u << kPrecision;
// rANS state interval [kStateLow, 2^32), renormalized 16 bits at a time.
constexpr uint32_t kStateLow = 1u << 16;

// ------------------------------------------------------------------ buckets
//
// A value u >= 1 is coded as its bucket (a symbol) plus raw low bits: u in 1..3 exactly; up to
// 33 bits, the bit length and the two bits below the leading one (4 buckets per octave), the
// remaining bit length - 3 bits raw; longer values (only huge records or wild steps) the escape
// bucket, then 6 raw bits of bit length - 34 and all bits below the leading one raw.
constexpr uint32_t kBuckets = 128;
constexpr uint32_t kEscapeBucket = kBuckets - 1;
constexpr int kMaxDirectLength = 33;  // bit lengths above this take the escape bucket
constexpr int kEscapeLengthBits = 6;

struct BucketTable {
  uint64_t base[kBuckets];  // smallest u of the bucket
  uint8_t extra[kBuckets];  // raw low bits
  constexpr BucketTable() : base(), extra() {
    for (uint32_t b = 0; b < 3; ++b) base[b] = b + 1;
    for (uint32_t b = 3; b < kEscapeBucket; ++b) {
      const uint32_t length = (b - 3) / 4 + 3;
      base[b] = uint64_t{4 | ((b - 3) & 3)} << (length - 3);
      extra[b] = static_cast<uint8_t>(length - 3);
    }
  }
};
inline constexpr BucketTable kBucketTable;

struct Bucketed {
  uint32_t bucket;
  int extra;     // raw bits below the bucket (not for the escape bucket)
  uint64_t low;  // their value
};
inline Bucketed BucketOf(uint64_t u) {  // u >= 1
  const int length = std::bit_width(u);
  if (length <= 2) return {static_cast<uint32_t>(u - 1), 0, 0};
  if (length > kMaxDirectLength) return {kEscapeBucket, 0, 0};
  const int extra = length - 3;
  return {static_cast<uint32_t>(3 + extra * 4 + ((u >> extra) & 3)), extra,
          u & ((uint64_t{1} << extra) - 1)};
}

// ------------------------------------------------------------------ frequencies

// Frequencies travel as one byte each: below 32 exactly, above it the bit length and the 4 bits
// below the leading one (~3% steps, a negligible cost in coded size). 0: absent.
constexpr uint32_t kMaxQuantized = 32 + 7 * 16 + 15;
inline uint8_t QuantizeFrequency(uint32_t f) {  // f in [0, kTotal]
  if (f < 32) return static_cast<uint8_t>(f);
  const int length = std::bit_width(f);  // 6..13
  return static_cast<uint8_t>(32 + (length - 6) * 16 + ((f >> (length - 5)) & 15));
}
inline uint32_t DequantizeFrequency(uint32_t q) {  // q <= kMaxQuantized
  if (q < 32) return q;
  const uint32_t length = (q - 32) / 16 + 6;
  return (16 + ((q - 32) & 15)) << (length - 5);
}

// Scales weights (zero: absent symbol) to frequencies summing to exactly kTotal, every present
// symbol at least 1. Deterministic integer arithmetic; at least one weight must be nonzero.
inline void NormalizeFrequencies(const uint64_t* weights, uint32_t n, uint32_t* freq) {
  uint64_t total = 0;
  for (uint32_t s = 0; s < n; ++s) total += weights[s];
  int64_t sum = 0;
  for (uint32_t s = 0; s < n; ++s) {
    if (weights[s] == 0) {
      freq[s] = 0;
      continue;
    }
    __extension__ typedef unsigned __int128 Wide;  // (a GCC/Clang extension)
    const auto f = static_cast<uint64_t>(Wide{weights[s]} * kTotal / total);
    freq[s] = static_cast<uint32_t>(f == 0 ? 1 : f);
    sum += freq[s];
  }
  auto largest = [&] {
    uint32_t best = 0;
    for (uint32_t s = 1; s < n; ++s) best = freq[s] > freq[best] ? s : best;
    return best;
  };
  if (sum < kTotal) freq[largest()] += static_cast<uint32_t>(kTotal - sum);
  while (sum > kTotal) {  // symbols raised to 1: take the excess from the largest ones
    const uint32_t s = largest();
    const uint32_t take = static_cast<uint32_t>(std::min<int64_t>(sum - kTotal, freq[s] - 1));
    freq[s] -= take;
    sum -= take;
  }
}

// What both sides code with, from the quantized bytes (absent symbols 0).
inline void FrequenciesFromQuantized(const uint8_t* q, uint32_t n, uint32_t* freq) {
  uint64_t weights[256];
  for (uint32_t s = 0; s < n; ++s) weights[s] = DequantizeFrequency(q[s]);
  NormalizeFrequencies(weights, n, freq);
}

// ------------------------------------------------------------------ geometric tables
//
// A slot's joint table (bucket of run + 1, step other than one) from two numbers: runs geometric
// with change rate p (kRateBits fixed point) and steps other than one at share `big` of kTotal,
// independent of the run. A few bytes where the explicit table costs 60-80, so that records of
// a few thousand changes can take the table form. Integer arithmetic only (both sides derive the
// same frequencies on any machine).
constexpr uint32_t kRateBits = 24;
constexpr uint32_t kMaxRate = 1u << kRateBits;  // p = 1: every member changes
constexpr int kGeometricCutoffBits = 20;        // symbols below 2^-20 of the mass are absent

// weights[2 * kBuckets] for rate in [1, kMaxRate] and big in [0, kTotal].
inline void GeometricWeights(uint32_t rate, uint32_t big, uint64_t* weights) {
  // q = 1 - p in Q32 and q^(2^e) by squaring (each < 2^32: products fit in 64 bits).
  uint64_t q_pow[kMaxDirectLength];
  q_pow[0] = (uint64_t{1} << 32) - (uint64_t{rate} << (32 - kRateBits));
  for (int e = 1; e < kMaxDirectLength; ++e) q_pow[e] = (q_pow[e - 1] * q_pow[e - 1]) >> 32;
  uint64_t survive = uint64_t{1} << 32;  // P(u >= the bucket's base) = q^(base - 1), Q32
  uint64_t total = 0;
  for (uint32_t b = 0; b < kEscapeBucket; ++b) {
    const uint64_t next = (survive * q_pow[kBucketTable.extra[b]]) >> 32;
    const uint64_t w = survive - next;  // P(bucket b) in Q32
    survive = next;
    weights[2 * b] = w * (kTotal - big);
    weights[2 * b + 1] = w * big;
    total += w * kTotal;
  }
  weights[2 * kEscapeBucket] = weights[2 * kEscapeBucket + 1] = 0;
  // The far tail would take a frequency of 1 each (a few percent of the table for nothing).
  for (uint32_t s = 0; s < 2 * kBuckets; ++s) {
    if (weights[s] < (total >> kGeometricCutoffBits)) weights[s] = 0;
  }
}

// Decode table entry for slot x & (kTotal - 1): symbol (8 bits), frequency - 1 (12 bits) and the
// slot's offset within its symbol's range (12 bits).
inline void BuildDecodeTable(const uint32_t* freq, uint32_t n, uint32_t* table) {
  uint32_t slot = 0;
  for (uint32_t s = 0; s < n; ++s) {
    for (uint32_t i = 0; i < freq[s]; ++i, ++slot) {
      table[slot] = s | ((freq[s] - 1) << 8) | (i << 20);
    }
  }
}

// ------------------------------------------------------------------ rANS

// Encoder: symbols are pushed in REVERSE decode order; words come out in reverse read order.
struct EncSymbol {
  uint32_t freq;
  uint32_t start;
};
inline void RansPut(uint32_t* x, EncSymbol s, std::vector<uint16_t>* words) {
  // ((kStateLow >> kPrecision) << 16) * freq, 2^32 for a symbol that has the whole table.
  const uint64_t limit = uint64_t{s.freq} << (32 - kPrecision);
  if (*x >= limit) {
    words->push_back(static_cast<uint16_t>(*x));
    *x >>= 16;
  }
  *x = ((*x / s.freq) << kPrecision) + (*x % s.freq) + s.start;
}

// ------------------------------------------------------------------ raw bits (LSB first)

class BitWriter {
 public:
  explicit BitWriter(std::vector<uint8_t>* out) : out_(out) {}
  void Put(uint64_t v, int nbits) {  // nbits <= 32
    acc_ |= v << fill_;
    fill_ += nbits;
    if (fill_ >= 32) {
      uint8_t b[4];
      sdk::StoreLE<uint32_t>(b, static_cast<uint32_t>(acc_));
      out_->insert(out_->end(), b, b + 4);
      acc_ >>= 32;
      fill_ -= 32;
    }
  }
  // u (>= 2) with bit length `length` in 34..64 for an escape: the length, then the bits below
  // the leading one.
  void PutEscaped(uint64_t u) {
    const int length = std::bit_width(u);
    Put(static_cast<uint64_t>(length - (kMaxDirectLength + 1)), kEscapeLengthBits);
    const int rest = length - 1;
    const int first = rest < 32 ? rest : 32;
    Put(u & ((uint64_t{1} << first) - 1), first);
    Put((u >> first) & ((uint64_t{1} << (rest - first)) - 1), rest - first);
  }
  void Finish() {
    while (fill_ > 0) {
      out_->push_back(static_cast<uint8_t>(acc_));
      acc_ >>= 8;
      fill_ = fill_ > 8 ? fill_ - 8 : 0;
    }
  }

 private:
  std::vector<uint8_t>* out_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

// Reads at a bit position: an unaligned 8-byte load where 8 bytes remain, byte by byte (zeros
// past the end) in the last 8. Reading past the end is detected at the end (position > length).
class BitReader {
 public:
  BitReader() = default;
  BitReader(const uint8_t* p, uint64_t len) : p_(p), len_(len) {}
  inline __attribute__((always_inline)) uint64_t Get(int nbits) {  // nbits <= 32
    const uint64_t byte = pos_ >> 3;
    uint64_t w;
    if (__builtin_expect(byte + 8 <= len_, 1)) {
      w = LoadLE<uint64_t>(p_ + byte);
    } else {
      w = Tail(byte);
    }
    const uint64_t v = (w >> (pos_ & 7)) & ((uint64_t{1} << nbits) - 1);
    pos_ += static_cast<uint64_t>(nbits);
    return v;
  }
  // The escape's length and bits (see BitWriter::PutEscaped); 0 when the length is out of range.
  uint64_t GetEscaped() {
    const int length = static_cast<int>(Get(kEscapeLengthBits)) + kMaxDirectLength + 1;
    if (length > 64) return 0;
    const int rest = length - 1;
    const int first = rest < 32 ? rest : 32;
    const uint64_t lo = Get(first);
    const uint64_t hi = Get(rest - first);
    return (uint64_t{1} << rest) | (hi << first) | lo;
  }
  // A valid stream ends in its last byte with zero padding bits.
  bool ConsumedExactly() const {
    if ((pos_ + 7) / 8 != len_) return false;
    if ((pos_ & 7) == 0) return true;
    return (p_[len_ - 1] >> (pos_ & 7)) == 0;
  }

 private:
  uint64_t Tail(uint64_t byte) const {
    uint64_t w = 0;
    for (uint64_t i = 0; i < 8 && byte + i < len_; ++i) w |= uint64_t{p_[byte + i]} << (8 * i);
    return w;
  }
  const uint8_t* p_ = nullptr;
  uint64_t len_ = 0;
  uint64_t pos_ = 0;
};

}  // namespace refit::ctx::tables
