// Portable bitwise diff kernels and the xxh3 digest.
//
// The diff walks blocks of 64 elements. Each block becomes one 64-bit "differs" mask (bit i set iff
// element i differs); a zero mask (the common case at ~1% density and below) costs only the
// compare, and a non-zero mask is turned into positions with ctz. The mask comes from SSE2
// compare + movemask on x86-64 (SSE2 is the x86-64 baseline: no -march flag needed) and from a
// plain loop the compiler vectorizes elsewhere.
//
// Runtime dispatch to AVX2 / AVX-512 plugs in at BlockMask(): a wider kernel only has to produce
// the same 64-bit mask per block (e.g. _mm512_cmpneq_epi16_mask gives it in one instruction), with
// the choice made once per process from cpuid.
#include "refit/kernels/diff.h"

#include <bit>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace refit::kernels {
namespace {

constexpr uint64_t kBlock = 64;

template <typename U>
inline U Load(const uint8_t* p) {
  U v;
  std::memcpy(&v, p, sizeof(U));
  return v;
}

// Bit i set iff element i of the first `count` elements differs (scalar; tails and the fallback).
template <typename U>
inline uint64_t ScalarMask(const uint8_t* a, const uint8_t* b, uint64_t count) {
  uint64_t mask = 0;
  for (uint64_t i = 0; i < count; ++i) {
    mask |= static_cast<uint64_t>(Load<U>(a + i * sizeof(U)) != Load<U>(b + i * sizeof(U))) << i;
  }
  return mask;
}

#if defined(__SSE2__)

inline __m128i Load128(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

inline uint64_t MoveMask(__m128i bytes) { return static_cast<uint32_t>(_mm_movemask_epi8(bytes)); }

// Each specialization compares 64 elements into 16 "equal" bytes at a time (packing wider lanes
// down with signed saturation, which keeps 0 / -1 intact) and collects their sign bits.
template <typename U>
uint64_t EqualMask(const uint8_t* a, const uint8_t* b);

template <>
inline uint64_t EqualMask<uint8_t>(const uint8_t* a, const uint8_t* b) {
  uint64_t eq = 0;
  for (int c = 0; c < 4; ++c) {
    __m128i e = _mm_cmpeq_epi8(Load128(a + 16 * c), Load128(b + 16 * c));
    eq |= MoveMask(e) << (16 * c);
  }
  return eq;
}

template <>
inline uint64_t EqualMask<uint16_t>(const uint8_t* a, const uint8_t* b) {
  uint64_t eq = 0;
  for (int c = 0; c < 4; ++c) {
    const uint8_t* pa = a + 32 * c;
    const uint8_t* pb = b + 32 * c;
    __m128i e0 = _mm_cmpeq_epi16(Load128(pa), Load128(pb));
    __m128i e1 = _mm_cmpeq_epi16(Load128(pa + 16), Load128(pb + 16));
    eq |= MoveMask(_mm_packs_epi16(e0, e1)) << (16 * c);
  }
  return eq;
}

template <>
inline uint64_t EqualMask<uint32_t>(const uint8_t* a, const uint8_t* b) {
  uint64_t eq = 0;
  for (int c = 0; c < 4; ++c) {
    const uint8_t* pa = a + 64 * c;
    const uint8_t* pb = b + 64 * c;
    __m128i e0 = _mm_cmpeq_epi32(Load128(pa), Load128(pb));
    __m128i e1 = _mm_cmpeq_epi32(Load128(pa + 16), Load128(pb + 16));
    __m128i e2 = _mm_cmpeq_epi32(Load128(pa + 32), Load128(pb + 32));
    __m128i e3 = _mm_cmpeq_epi32(Load128(pa + 48), Load128(pb + 48));
    __m128i packed = _mm_packs_epi16(_mm_packs_epi32(e0, e1), _mm_packs_epi32(e2, e3));
    eq |= MoveMask(packed) << (16 * c);
  }
  return eq;
}

// SSE2 has no 64-bit compare: compare 32-bit halves, then an element is equal iff both its halves
// are (shufps gathers the low halves and the high halves of two registers).
inline __m128i Equal64x4(const uint8_t* a, const uint8_t* b) {
  __m128 lo = _mm_castsi128_ps(_mm_cmpeq_epi32(Load128(a), Load128(b)));
  __m128 hi = _mm_castsi128_ps(_mm_cmpeq_epi32(Load128(a + 16), Load128(b + 16)));
  __m128 low_halves = _mm_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0));
  __m128 high_halves = _mm_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));
  return _mm_castps_si128(_mm_and_ps(low_halves, high_halves));
}

template <>
inline uint64_t EqualMask<uint64_t>(const uint8_t* a, const uint8_t* b) {
  uint64_t eq = 0;
  for (int c = 0; c < 4; ++c) {
    const uint8_t* pa = a + 128 * c;
    const uint8_t* pb = b + 128 * c;
    __m128i e0 = Equal64x4(pa, pb);
    __m128i e1 = Equal64x4(pa + 32, pb + 32);
    __m128i e2 = Equal64x4(pa + 64, pb + 64);
    __m128i e3 = Equal64x4(pa + 96, pb + 96);
    __m128i packed = _mm_packs_epi16(_mm_packs_epi32(e0, e1), _mm_packs_epi32(e2, e3));
    eq |= MoveMask(packed) << (16 * c);
  }
  return eq;
}

template <typename U>
inline uint64_t BlockMask(const uint8_t* a, const uint8_t* b) {
  return ~EqualMask<U>(a, b);
}

#else  // portable fallback: a fixed-trip-count loop the compiler can vectorize

template <typename U>
inline uint64_t BlockMask(const uint8_t* a, const uint8_t* b) {
  uint8_t differs[kBlock];
  for (uint64_t i = 0; i < kBlock; ++i) {
    differs[i] = static_cast<uint8_t>(Load<U>(a + i * sizeof(U)) != Load<U>(b + i * sizeof(U)));
  }
  // Eight 0/1 bytes -> eight bits with one multiply: byte j (at bit 8j) lands at bit 56 + j.
  uint64_t mask = 0;
  for (uint64_t g = 0; g < kBlock / 8; ++g) {
    mask |= ((Load<uint64_t>(differs + g * 8) * 0x0102040810204080ULL) >> 56) << (g * 8);
  }
  return mask;
}

#endif

// std::popcount is a libgcc call at the x86-64 baseline (no POPCNT); this is a few instructions.
inline uint64_t Popcount64(uint64_t x) {
  x = x - ((x >> 1) & 0x5555555555555555ULL);
  x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
  x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0FULL;
  return (x * 0x0101010101010101ULL) >> 56;
}

// Writes base + index of every set bit of mask to dst (room for 64), returns how many. The first
// four are extracted without branches, so a block with a few changes (the typical non-zero block)
// costs no misprediction.
inline uint64_t ExtractPositions(uint64_t mask, uint64_t base, uint64_t* dst) {
  constexpr uint64_t kTopBit = uint64_t{1} << 63;
  uint64_t k = 0;
  for (int j = 0; j < 4; ++j) {
    dst[k] = base + static_cast<uint64_t>(std::countr_zero(mask | kTopBit));
    k += static_cast<uint64_t>(mask != 0);
    mask &= mask - 1;
  }
  while (mask != 0) {
    dst[k++] = base + static_cast<uint64_t>(std::countr_zero(mask));
    mask &= mask - 1;
  }
  return k;
}

template <typename U>
uint64_t DiffPositionsT(const uint8_t* a, const uint8_t* b, uint64_t n,
                        std::vector<uint64_t>* positions) {
  const size_t before = positions->size();
  size_t out = before;
  // Positions are written through a raw pointer into slack kept at the end of the vector (grown
  // geometrically, trimmed at the end): no per-position capacity check.
  auto ensure_room = [&] {
    if (positions->size() - out < kBlock) positions->resize(out + kBlock + (out - before));
  };
  const uint64_t full_blocks = n / kBlock;
  for (uint64_t blk = 0; blk < full_blocks; ++blk) {
    const uint64_t offset = blk * kBlock * sizeof(U);
    const uint64_t mask = BlockMask<U>(a + offset, b + offset);
    if (mask == 0) continue;
    ensure_room();
    out += ExtractPositions(mask, blk * kBlock, positions->data() + out);
  }
  const uint64_t done = full_blocks * kBlock;
  if (done < n) {
    const uint64_t mask = ScalarMask<U>(a + done * sizeof(U), b + done * sizeof(U), n - done);
    if (mask != 0) {
      ensure_room();
      out += ExtractPositions(mask, done, positions->data() + out);
    }
  }
  positions->resize(out);
  return out - before;
}

template <typename U>
uint64_t CountDiffT(const uint8_t* a, const uint8_t* b, uint64_t n) {
  uint64_t count = 0;
  const uint64_t full_blocks = n / kBlock;
  for (uint64_t blk = 0; blk < full_blocks; ++blk) {
    const uint64_t offset = blk * kBlock * sizeof(U);
    count += Popcount64(BlockMask<U>(a + offset, b + offset));  // no data-dependent branch
  }
  const uint64_t done = full_blocks * kBlock;
  if (done < n) {
    count += Popcount64(ScalarMask<U>(a + done * sizeof(U), b + done * sizeof(U), n - done));
  }
  return count;
}

}  // namespace

uint64_t DiffPositions(const void* old_bits, const void* new_bits, uint64_t n, uint32_t elem_size,
                       std::vector<uint64_t>* positions) {
  const auto* a = static_cast<const uint8_t*>(old_bits);
  const auto* b = static_cast<const uint8_t*>(new_bits);
  switch (elem_size) {
    case 1:
      return DiffPositionsT<uint8_t>(a, b, n, positions);
    case 2:
      return DiffPositionsT<uint16_t>(a, b, n, positions);
    case 4:
      return DiffPositionsT<uint32_t>(a, b, n, positions);
    case 8:
      return DiffPositionsT<uint64_t>(a, b, n, positions);
    default:
      return 0;  // contract: elem_size is 1, 2, 4 or 8
  }
}

uint64_t CountDiff(const void* old_bits, const void* new_bits, uint64_t n, uint32_t elem_size) {
  const auto* a = static_cast<const uint8_t*>(old_bits);
  const auto* b = static_cast<const uint8_t*>(new_bits);
  switch (elem_size) {
    case 1:
      return CountDiffT<uint8_t>(a, b, n);
    case 2:
      return CountDiffT<uint16_t>(a, b, n);
    case 4:
      return CountDiffT<uint32_t>(a, b, n);
    case 8:
      return CountDiffT<uint64_t>(a, b, n);
    default:
      return 0;
  }
}

uint64_t Digest64(const void* data, uint64_t len) {
  return XXH3_64bits(data, static_cast<size_t>(len));
}

DigestStream::DigestStream() : state_(XXH3_createState()) {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

DigestStream::~DigestStream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void DigestStream::Update(const void* data, uint64_t len) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, static_cast<size_t>(len));
}

uint64_t DigestStream::Final() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

}  // namespace refit::kernels
