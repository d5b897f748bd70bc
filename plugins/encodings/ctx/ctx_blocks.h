// Block primitives of the `ctx` codec's SIMD paths: the class bytes of 64 consecutive elements
// (from their OLD bits) in one vector, the 64-bit mask of the members of one slot (a range of
// classes), popcount and select. One struct per instruction set; every function carries its own
// target attribute, so this compiles into a portable binary and runs only where ctx_codec.cc's
// dispatch found the features. The codec's scalar paths (walking every element) are the reference
// these are tested against (tests/unit/ctx_test.cc compares payloads and decoded bits across
// levels).
//
// The class functions are ctx_codec.cc's: ExponentClass ((bits >> shift) & mask, for 1, 2 and 4
// byte elements) and F64Class (8 byte elements, class bytes computed per element). For 1-byte
// elements the 16-bit shift is exact because mask < 2^(8 - shift) for every such dtype (the bits
// shifted in from the neighbouring byte are masked off).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace refit::ctx {

constexpr uint32_t kBlockElems = 64;

// A position class slot: the elements whose class byte is in [first, first + width]. One
// unsigned compare of (class - first) against width tests membership.
struct SlotRange {
  uint8_t first = 0;
  uint8_t width = 0;
};

// Chunks of the table form's walk: this many blocks of kBlockElems elements.
constexpr uint32_t kChunkBlocks = 256;

// The last block b of a chunk with before[b] <= rank, where before[b] (ascending, kChunkBlocks
// entries, UINT16_MAX past the chunk's last block) counts a slot's members in the blocks before b:
// the block that holds the slot's member of that rank. A binary search without branches.
inline uint32_t BlockOfBySearch(const uint16_t* before, uint32_t rank) {
  uint32_t b = 0;
#pragma GCC unroll 8
  for (uint32_t half = kChunkBlocks / 2; half > 0; half /= 2) {
    b += static_cast<uint32_t>(before[b + half] <= rank) * half;
  }
  return b;
}

#define CTX_TARGET_AVX2 __attribute__((target("avx2,popcnt")))
#define CTX_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,popcnt,bmi2")))
#define CTX_TARGET_VBMI2 __attribute__((target("avx512f,avx512bw,avx512vbmi2,popcnt,bmi2")))

// Class bytes of 64 elements the slow way, for dtypes without a vector class function.
template <typename T, typename ClassFn>
inline void ClassBytesScalar(const uint8_t* p, ClassFn cls, uint8_t* out) {
  for (uint32_t i = 0; i < kBlockElems; ++i) {
    T bits;
    std::memcpy(&bits, p + i * sizeof(T), sizeof(T));
    out[i] = static_cast<uint8_t>(cls(bits));
  }
}

struct Avx2Ops {
  static constexpr bool kMemberLists = false;
  struct Classes {
    __m256i lo;  // elements 0..31
    __m256i hi;  // elements 32..63
  };

  // The class bytes of the 64 elements at p (64 * sizeof(T) readable bytes). Written through a
  // pointer: callers without the target attribute may not return vectors. (No lambdas here: a
  // lambda would not inherit the target attribute.)
  template <typename T, typename ClassFn>
  CTX_TARGET_AVX2 static void Load(const uint8_t* p, ClassFn cls, Classes* out) {
    if constexpr (sizeof(T) == 8) {
      alignas(32) uint8_t bytes[kBlockElems];
      ClassBytesScalar<T>(p, cls, bytes);
      *out = {_mm256_load_si256(reinterpret_cast<const __m256i*>(bytes)),
              _mm256_load_si256(reinterpret_cast<const __m256i*>(bytes + 32))};
    } else {
      const __m128i shift = _mm_cvtsi32_si128(static_cast<int>(cls.shift));
      if constexpr (sizeof(T) == 1) {
        const __m256i mask = _mm256_set1_epi8(static_cast<char>(cls.mask));
        *out = {_mm256_and_si256(_mm256_srl_epi16(At(p, 0), shift), mask),
                _mm256_and_si256(_mm256_srl_epi16(At(p, 1), shift), mask)};
      } else if constexpr (sizeof(T) == 2) {
        const __m256i mask = _mm256_set1_epi16(static_cast<short>(cls.mask));
        *out = {Words(p, shift, mask), Words(p + 64, shift, mask)};
      } else {
        const __m256i mask = _mm256_set1_epi32(static_cast<int>(cls.mask));
        *out = {Dwords(p, shift, mask), Dwords(p + 128, shift, mask)};
      }
    }
  }
  // Bit i set when element i is in slot s.
  CTX_TARGET_AVX2 static uint64_t Mask(const Classes& v, SlotRange s) {
    const __m256i first = _mm256_set1_epi8(static_cast<char>(s.first));
    const __m256i width = _mm256_set1_epi8(static_cast<char>(s.width));
    const uint32_t lo = static_cast<uint32_t>(_mm256_movemask_epi8(In(v.lo, first, width)));
    const uint32_t hi = static_cast<uint32_t>(_mm256_movemask_epi8(In(v.hi, first, width)));
    return (uint64_t{hi} << 32) | lo;
  }
  CTX_TARGET_AVX2 static uint32_t Pop(uint64_t m) {
    return static_cast<uint32_t>(__builtin_popcountll(m));
  }
  // The position of m's set bit of rank r (r < Pop(m)). No pdep: it is microcoded on some AMD
  // cores that have AVX2.
  CTX_TARGET_AVX2 static uint32_t Select(uint64_t m, uint64_t r) {
    for (; r > 0; --r) m &= m - 1;
    return static_cast<uint32_t>(__builtin_ctzll(m));
  }
  static uint32_t BlockOf(const uint16_t* before, uint32_t rank) {
    return BlockOfBySearch(before, rank);
  }

 private:
  // 0xff where first <= x <= first + width (unsigned, wrapping): no unsigned compare in AVX2, so
  // min(x - first, width) == x - first.
  CTX_TARGET_AVX2 static __m256i In(__m256i x, __m256i first, __m256i width) {
    const __m256i d = _mm256_sub_epi8(x, first);
    return _mm256_cmpeq_epi8(_mm256_min_epu8(d, width), d);
  }
  CTX_TARGET_AVX2 static __m256i At(const uint8_t* p, int i) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * i));
  }
  // Class bytes of the 32 2-byte elements at p. packus interleaves the 128-bit lanes; the
  // permute restores element order.
  CTX_TARGET_AVX2 static __m256i Words(const uint8_t* p, __m128i shift, __m256i mask) {
    const __m256i a = _mm256_and_si256(_mm256_srl_epi16(At(p, 0), shift), mask);
    const __m256i b = _mm256_and_si256(_mm256_srl_epi16(At(p, 1), shift), mask);
    return _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xD8);
  }
  // Class bytes of the 32 4-byte elements at p (two packs, then one lane permute).
  CTX_TARGET_AVX2 static __m256i Dwords(const uint8_t* p, __m128i shift, __m256i mask) {
    const __m256i a = _mm256_and_si256(_mm256_srl_epi32(At(p, 0), shift), mask);
    const __m256i b = _mm256_and_si256(_mm256_srl_epi32(At(p, 1), shift), mask);
    const __m256i c = _mm256_and_si256(_mm256_srl_epi32(At(p, 2), shift), mask);
    const __m256i d = _mm256_and_si256(_mm256_srl_epi32(At(p, 3), shift), mask);
    const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(a, b), _mm256_packus_epi32(c, d));
    return _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  }
};

struct Avx512Ops {
  using Classes = __m512i;
  static constexpr bool kMemberLists = false;

  template <typename T, typename ClassFn>
  CTX_TARGET_AVX512 static void Load(const uint8_t* p, ClassFn cls, Classes* out) {
    if constexpr (sizeof(T) == 8) {
      alignas(64) uint8_t bytes[kBlockElems];
      ClassBytesScalar<T>(p, cls, bytes);
      *out = _mm512_load_si512(bytes);
    } else {
      const __m128i shift = _mm_cvtsi32_si128(static_cast<int>(cls.shift));
      const __m512i mask = _mm512_set1_epi8(static_cast<char>(cls.mask));
      // The truncating narrows keep the low byte of each shifted element; the mask does the rest.
      // (The maskz forms with every lane selected are the plain instructions; the plain
      // intrinsics start from an "undefined" vector that GCC 12 reports as uninitialized.)
      if constexpr (sizeof(T) == 1) {
        *out = _mm512_and_si512(Shift16(p, shift), mask);
      } else if constexpr (sizeof(T) == 2) {
        const __m256i a = _mm512_maskz_cvtepi16_epi8(kAll32, Shift16(p, shift));
        const __m256i b = _mm512_maskz_cvtepi16_epi8(kAll32, Shift16(p + 64, shift));
        *out = _mm512_and_si512(_mm512_maskz_inserti64x4(kAll8, _mm512_castsi256_si512(a), b, 1),
                                mask);
      } else {
        __m512i v = _mm512_castsi128_si512(Narrow32(p, shift));
        v = _mm512_maskz_inserti32x4(kAll16, v, Narrow32(p + 64, shift), 1);
        v = _mm512_maskz_inserti32x4(kAll16, v, Narrow32(p + 128, shift), 2);
        v = _mm512_maskz_inserti32x4(kAll16, v, Narrow32(p + 192, shift), 3);
        *out = _mm512_and_si512(v, mask);
      }
    }
  }
  CTX_TARGET_AVX512 static uint64_t Mask(const Classes& v, SlotRange s) {
    return _mm512_cmple_epu8_mask(_mm512_sub_epi8(v, _mm512_set1_epi8(static_cast<char>(s.first))),
                                  _mm512_set1_epi8(static_cast<char>(s.width)));
  }
  CTX_TARGET_AVX512 static uint32_t Pop(uint64_t m) {
    return static_cast<uint32_t>(__builtin_popcountll(m));
  }
  CTX_TARGET_AVX512 static uint32_t Select(uint64_t m, uint64_t r) {
    return static_cast<uint32_t>(__builtin_ctzll(_pdep_u64(uint64_t{1} << r, m)));
  }
  // BlockOfBySearch by counting the entries <= rank (before is 64-byte aligned): eight compares
  // that do not wait on each other, where the search's eight loads each wait on the last.
  CTX_TARGET_AVX512 static uint32_t BlockOf(const uint16_t* before, uint32_t rank) {
    const __m512i r = _mm512_set1_epi16(static_cast<short>(rank));
    uint32_t count = 0;
#pragma GCC unroll 8
    for (uint32_t i = 0; i < kChunkBlocks; i += 32) {
      count += static_cast<uint32_t>(
          __builtin_popcount(_mm512_cmple_epu16_mask(_mm512_load_si512(before + i), r)));
    }
    return count - 1;
  }

 private:
  static constexpr __mmask8 kAll8 = 0xff;
  static constexpr __mmask16 kAll16 = 0xffff;
  static constexpr __mmask32 kAll32 = 0xffffffffu;
  CTX_TARGET_AVX512 static __m512i Shift16(const uint8_t* p, __m128i shift) {
    return _mm512_maskz_srl_epi16(kAll32, _mm512_loadu_si512(p), shift);
  }
  CTX_TARGET_AVX512 static __m128i Narrow32(const uint8_t* p, __m128i shift) {
    return _mm512_maskz_cvtepi32_epi8(kAll16,
                                      _mm512_maskz_srl_epi32(kAll16, _mm512_loadu_si512(p), shift));
  }
};

// AVX-512 with VBMI2 (word compress): a slot's members of a whole chunk listed in order, so that
// the table form's walk finds each change by one load instead of a countdown per block.
struct Vbmi2Ops : Avx512Ops {
  static constexpr bool kMemberLists = true;
  // Appends to list[*count ...] the chunk offsets (base + i) of m's set bits (m: the members of the
  // block at chunk offset base < 2^16). list needs 64 writable entries past the count.
  CTX_TARGET_VBMI2 static void Members(uint64_t m, uint32_t base, uint16_t* list, uint32_t* count) {
    const __m512i index = _mm512_add_epi16(
        _mm512_set1_epi16(static_cast<short>(base)),
        _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13,
                         12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0));
    const auto lo = static_cast<__mmask32>(m);
    const auto hi = static_cast<__mmask32>(m >> 32);
    _mm512_storeu_si512(list + *count, _mm512_maskz_compress_epi16(lo, index));
    *count += static_cast<uint32_t>(__builtin_popcount(lo));
    const __m512i upper = _mm512_add_epi16(index, _mm512_set1_epi16(32));
    _mm512_storeu_si512(list + *count, _mm512_maskz_compress_epi16(hi, upper));
    *count += static_cast<uint32_t>(__builtin_popcount(hi));
  }
};

}  // namespace refit::ctx
