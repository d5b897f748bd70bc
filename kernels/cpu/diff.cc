// Bitwise diff kernels with runtime CPU dispatch, and the xxh3 digest.
//
// The diff walks blocks of 64 elements. Each block becomes one 64-bit "differs" mask (bit i set iff
// element i differs); a zero mask (the common case at ~1% density and below) costs only the
// compare, and a non-zero mask is turned into positions with ctz. Only the block mask depends on
// the SIMD level:
//   scalar  a plain per-element loop (the reference every other level is tested against)
//   sse2    compare + pack + movemask, 16 bytes at a time (the x86-64 baseline)
//   avx2    the same, 32 bytes at a time
//   avx512  AVX-512BW compares straight into mask registers (_mm512_cmpneq_epi16_mask)
// The AVX2 / AVX-512 functions carry __attribute__((target(...))) instead of per-file -m flags, so
// no inline function or template instantiation compiled for a wider ISA can leak into (and be
// picked by the linker for) code that runs on a CPU without it. The level is chosen once per
// process from __builtin_cpu_supports (REFIT_KERNELS overrides, see dispatch.h).
#include "refit/kernels/diff.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "refit/kernels/dispatch.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define REFIT_KERNELS_X86 1
#endif

namespace refit::kernels {
namespace {

constexpr uint64_t kBlock = 64;
constexpr uint64_t kPrefetchBytes = 2048;  // how far ahead of the diff the reads are requested

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

#if defined(REFIT_KERNELS_X86)

// ---------------------------------------------------------------- sse2

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
inline uint64_t BlockMaskSse2(const uint8_t* a, const uint8_t* b) {
  return ~EqualMask<U>(a, b);
}

// ---------------------------------------------------------------- avx2

#define REFIT_TARGET_AVX2 __attribute__((target("avx2")))

REFIT_TARGET_AVX2 inline __m256i Load256(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// "Equal" masks of 64 elements, like EqualMask<U> but 32 bytes per compare.
template <typename U>
REFIT_TARGET_AVX2 inline uint64_t EqualMaskAvx2(const uint8_t* a, const uint8_t* b) {
  uint64_t eq = 0;
  if constexpr (sizeof(U) == 1) {
    for (int c = 0; c < 2; ++c) {
      const __m256i e = _mm256_cmpeq_epi8(Load256(a + 32 * c), Load256(b + 32 * c));
      eq |= uint64_t{static_cast<uint32_t>(_mm256_movemask_epi8(e))} << (32 * c);
    }
  } else if constexpr (sizeof(U) == 2) {
    for (int c = 0; c < 2; ++c) {
      const uint8_t* pa = a + 64 * c;
      const uint8_t* pb = b + 64 * c;
      const __m256i e0 = _mm256_cmpeq_epi16(Load256(pa), Load256(pb));
      const __m256i e1 = _mm256_cmpeq_epi16(Load256(pa + 32), Load256(pb + 32));
      // packs works per 128-bit lane (e0.lo, e1.lo, e0.hi, e1.hi): put the quarters back in order.
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi16(e0, e1), 0xD8);
      eq |= uint64_t{static_cast<uint32_t>(_mm256_movemask_epi8(packed))} << (32 * c);
    }
  } else if constexpr (sizeof(U) == 4) {
    for (int c = 0; c < 8; ++c) {
      const __m256i e = _mm256_cmpeq_epi32(Load256(a + 32 * c), Load256(b + 32 * c));
      eq |= uint64_t{static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(e)))} << (8 * c);
    }
  } else {
    for (int c = 0; c < 16; ++c) {
      const __m256i e = _mm256_cmpeq_epi64(Load256(a + 32 * c), Load256(b + 32 * c));
      eq |= uint64_t{static_cast<uint32_t>(_mm256_movemask_pd(_mm256_castsi256_pd(e)))} << (4 * c);
    }
  }
  return eq;
}

template <typename U>
REFIT_TARGET_AVX2 inline uint64_t BlockMaskAvx2(const uint8_t* a, const uint8_t* b) {
  return ~EqualMaskAvx2<U>(a, b);
}

// ---------------------------------------------------------------- avx512 (F + BW)

#define REFIT_TARGET_AVX512 __attribute__((target("avx512f,avx512bw")))

REFIT_TARGET_AVX512 inline __m512i Load512(const uint8_t* p) { return _mm512_loadu_si512(p); }

template <typename U>
REFIT_TARGET_AVX512 inline uint64_t BlockMaskAvx512(const uint8_t* a, const uint8_t* b) {
  if constexpr (sizeof(U) == 1) {
    return _mm512_cmpneq_epi8_mask(Load512(a), Load512(b));
  } else if constexpr (sizeof(U) == 2) {
    const uint64_t lo = _mm512_cmpneq_epi16_mask(Load512(a), Load512(b));
    const uint64_t hi = _mm512_cmpneq_epi16_mask(Load512(a + 64), Load512(b + 64));
    return lo | (hi << 32);
  } else if constexpr (sizeof(U) == 4) {
    uint64_t mask = 0;
    for (int c = 0; c < 4; ++c) {
      const uint64_t m = _mm512_cmpneq_epi32_mask(Load512(a + 64 * c), Load512(b + 64 * c));
      mask |= m << (16 * c);
    }
    return mask;
  } else {
    uint64_t mask = 0;
    for (int c = 0; c < 8; ++c) {
      const uint64_t m = _mm512_cmpneq_epi64_mask(Load512(a + 64 * c), Load512(b + 64 * c));
      mask |= m << (8 * c);
    }
    return mask;
  }
}

#endif  // REFIT_KERNELS_X86

// The reference: one element at a time.
template <typename U>
inline uint64_t BlockMaskScalar(const uint8_t* a, const uint8_t* b) {
  return ScalarMask<U>(a, b, kBlock);
}

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

// The block loops, shared by every level: Mask is the level's block-mask function. They are
// always inlined into the per-level entry points below, so a wide mask function is inlined into a
// caller compiled for its ISA.
using BlockMaskFn = uint64_t (*)(const uint8_t*, const uint8_t*);

// Writes base + the index of every differing element among the first n to out (room for
// n + kBlock: ExtractPositions may write a few entries past the last one), returns how many.
// Every block goes through ExtractPositions, changed or not: at ~1% density about half the blocks
// of 2-byte elements change, so a "skip empty blocks" branch would mispredict every other block.
template <typename U, BlockMaskFn Mask>
[[gnu::always_inline]] inline uint64_t DiffLoop(const uint8_t* a, const uint8_t* b, uint64_t n,
                                                uint64_t base, uint64_t* out) {
  uint64_t k = 0;
  const uint64_t full_blocks = n / kBlock;
  for (uint64_t blk = 0; blk < full_blocks; ++blk) {
    const uint64_t offset = blk * kBlock * sizeof(U);
    // Requests ahead of the loads: the position extraction fills the out-of-order window, which
    // would otherwise keep fewer memory reads in flight than the plain compare-scan does.
    for (uint64_t line = 0; line < kBlock * sizeof(U); line += 64) {
      __builtin_prefetch(a + offset + kPrefetchBytes + line);
      __builtin_prefetch(b + offset + kPrefetchBytes + line);
    }
    k += ExtractPositions(Mask(a + offset, b + offset), base + blk * kBlock, out + k);
  }
  const uint64_t done = full_blocks * kBlock;
  if (done < n) {
    const uint64_t mask = ScalarMask<U>(a + done * sizeof(U), b + done * sizeof(U), n - done);
    if (mask != 0) k += ExtractPositions(mask, base + done, out + k);
  }
  return k;
}

template <typename U, BlockMaskFn Mask>
[[gnu::always_inline]] inline uint64_t CountLoop(const uint8_t* a, const uint8_t* b, uint64_t n) {
  uint64_t count = 0;
  const uint64_t full_blocks = n / kBlock;
  for (uint64_t blk = 0; blk < full_blocks; ++blk) {
    const uint64_t offset = blk * kBlock * sizeof(U);
    count += Popcount64(Mask(a + offset, b + offset));  // no data-dependent branch
  }
  const uint64_t done = full_blocks * kBlock;
  if (done < n) {
    count += Popcount64(ScalarMask<U>(a + done * sizeof(U), b + done * sizeof(U), n - done));
  }
  return count;
}

using DiffFn = uint64_t (*)(const uint8_t*, const uint8_t*, uint64_t n, uint64_t base, uint64_t*);
using CountFn = uint64_t (*)(const uint8_t*, const uint8_t*, uint64_t);

// One level's entry points, indexed by log2(elem_size).
struct LevelKernels {
  DiffFn diff[4];
  CountFn count[4];
};

// Defines Diff<Name><U> / Count<Name><U> and their table for one level, with its target attribute.
#define REFIT_DEFINE_LEVEL(Name, ATTR, MASK)                                                       \
  template <typename U>                                                                            \
  ATTR uint64_t Diff##Name(const uint8_t* a, const uint8_t* b, uint64_t n, uint64_t base,          \
                           uint64_t* out) {                                                        \
    return DiffLoop<U, &MASK<U>>(a, b, n, base, out);                                              \
  }                                                                                                \
  template <typename U>                                                                            \
  ATTR uint64_t Count##Name(const uint8_t* a, const uint8_t* b, uint64_t n) {                      \
    return CountLoop<U, &MASK<U>>(a, b, n);                                                        \
  }                                                                                                \
  constexpr LevelKernels k##Name##Kernels = {                                                      \
      {&Diff##Name<uint8_t>, &Diff##Name<uint16_t>, &Diff##Name<uint32_t>, &Diff##Name<uint64_t>}, \
      {&Count##Name<uint8_t>, &Count##Name<uint16_t>, &Count##Name<uint32_t>,                      \
       &Count##Name<uint64_t>}};

#define REFIT_NO_TARGET

REFIT_DEFINE_LEVEL(Scalar, REFIT_NO_TARGET, BlockMaskScalar)
#if defined(REFIT_KERNELS_X86)
REFIT_DEFINE_LEVEL(Sse2, REFIT_NO_TARGET, BlockMaskSse2)
REFIT_DEFINE_LEVEL(Avx2, REFIT_TARGET_AVX2, BlockMaskAvx2)
REFIT_DEFINE_LEVEL(Avx512, REFIT_TARGET_AVX512, BlockMaskAvx512)
#endif

#undef REFIT_DEFINE_LEVEL

bool CpuHas(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return true;
#if defined(REFIT_KERNELS_X86)
    case SimdLevel::kSse2:
      return true;  // the x86-64 baseline
    case SimdLevel::kAvx2:
      return __builtin_cpu_supports("avx2");
    case SimdLevel::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#endif
    default:
      return false;
  }
}

SimdLevel Best() {
  for (SimdLevel level : {SimdLevel::kAvx512, SimdLevel::kAvx2, SimdLevel::kSse2}) {
    if (CpuHas(level)) return level;
  }
  return SimdLevel::kScalar;
}

// The level actually run for a request: the request if the CPU has it, else the best it has.
SimdLevel Usable(SimdLevel wanted) { return CpuHas(wanted) ? wanted : Best(); }

const LevelKernels& KernelsFor(SimdLevel level) {
  switch (Usable(level)) {
#if defined(REFIT_KERNELS_X86)
    case SimdLevel::kAvx512:
      return kAvx512Kernels;
    case SimdLevel::kAvx2:
      return kAvx2Kernels;
    case SimdLevel::kSse2:
      return kSse2Kernels;
#endif
    default:
      return kScalarKernels;
  }
}

SimdLevel ChooseActive() {
  const char* forced = std::getenv("REFIT_KERNELS");
  if (forced != nullptr) {
    const std::string_view name(forced);
    for (SimdLevel level :
         {SimdLevel::kScalar, SimdLevel::kSse2, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
      if (name == SimdLevelName(level)) return Usable(level);
    }
  }
  return Best();
}

const LevelKernels& Active() {
  static const LevelKernels& kernels = KernelsFor(ActiveSimdLevel());
  return kernels;
}

int ElemIndex(uint32_t elem_size) {
  switch (elem_size) {
    case 1:
      return 0;
    case 2:
      return 1;
    case 4:
      return 2;
    case 8:
      return 3;
    default:
      return -1;  // contract: elem_size is 1, 2, 4 or 8
  }
}

// Appends the bits at positions[0, count) of src to *values (room kept as for positions).
template <typename T>
void AppendValuesOf(const uint8_t* src, const uint64_t* positions, uint64_t count,
                    uint8_t* values) {
  for (uint64_t j = 0; j < count; ++j) {
    std::memcpy(values + j * sizeof(T), src + positions[j] * sizeof(T), sizeof(T));
  }
}
void AppendValues(const uint8_t* src, uint32_t elem_size, const uint64_t* positions, uint64_t count,
                  uint8_t* values) {
  switch (elem_size) {
    case 1:
      return AppendValuesOf<uint8_t>(src, positions, count, values);
    case 2:
      return AppendValuesOf<uint16_t>(src, positions, count, values);
    case 4:
      return AppendValuesOf<uint32_t>(src, positions, count, values);
    default:
      return AppendValuesOf<uint64_t>(src, positions, count, values);
  }
}

// Keeps room for `more` elements of `elem_size` bytes after `used` in *v (grown geometrically).
void Reserve(ValueList* v, uint64_t used, uint64_t more, uint32_t elem_size) {
  const uint64_t want = (used + more) * elem_size;
  if (v->size() < want) v->resize(want > 2 * v->size() ? want : 2 * v->size());
}

// The walk shared by DiffPositions and DiffPositionsAndDigest: blocks of kWalkBytes of new bits
// (a multiple of the 64-element mask block at every element size), each diffed into room kept at
// the end of *positions (grown geometrically, trimmed at the end: no per-position capacity check)
// and then, while still in L1, fed to the digest if there is one and copied from at its
// positions into the value lists that are wanted.
constexpr uint64_t kWalkBytes = 16384;

template <typename Vec>
uint64_t DiffInBlocks(DiffFn diff, const void* old_bits, const void* new_bits, uint64_t n,
                      uint32_t elem_size, Vec* positions, DigestStream* digest,
                      ChangedValues values = {}) {
  const auto* a = static_cast<const uint8_t*>(old_bits);
  const auto* b = static_cast<const uint8_t*>(new_bits);
  const uint64_t step = kWalkBytes / elem_size;
  const size_t before = positions->size();
  // The value lists wanted, each with its source and its own current end (in elements).
  struct Copy {
    ValueList* list;
    const uint8_t* src;
    uint64_t before;
  };
  Copy copies[2];
  int n_copies = 0;
  for (const Copy c : {Copy{values.old_values, a, 0}, Copy{values.new_values, b, 0}}) {
    if (c.list != nullptr) copies[n_copies++] = {c.list, c.src, c.list->size() / elem_size};
  }
  size_t out = before;
  for (uint64_t i = 0; i < n; i += step) {
    const uint64_t m = n - i < step ? n - i : step;
    if (positions->size() - out < m + kBlock) {
      const size_t want = out + m + kBlock;
      positions->resize(want > 2 * positions->size() ? want : 2 * positions->size());
    }
    const uint64_t found =
        diff(a + i * elem_size, b + i * elem_size, m, i, positions->data() + out);
    const uint64_t done = out - before;  // changes already appended by earlier blocks
    for (int c = 0; c < n_copies; ++c) {
      Reserve(copies[c].list, copies[c].before + done, found, elem_size);
      AppendValues(copies[c].src, elem_size, positions->data() + out, found,
                   copies[c].list->data() + (copies[c].before + done) * elem_size);
    }
    out += found;
    if (digest != nullptr) digest->Update(b + i * elem_size, m * elem_size);
  }
  positions->resize(out);
  const uint64_t changed = out - before;
  for (int c = 0; c < n_copies; ++c) {
    copies[c].list->resize((copies[c].before + changed) * elem_size);
  }
  return changed;
}

}  // namespace

const char* SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kSse2:
      return "sse2";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool SimdLevelSupported(SimdLevel level) { return CpuHas(level); }

SimdLevel BestSimdLevel() { return Best(); }

SimdLevel ActiveSimdLevel() {
  static const SimdLevel active = ChooseActive();
  return active;
}

uint64_t DiffPositionsAt(SimdLevel level, const void* old_bits, const void* new_bits, uint64_t n,
                         uint32_t elem_size, std::vector<uint64_t>* positions) {
  const int e = ElemIndex(elem_size);
  if (e < 0) return 0;
  return DiffInBlocks(KernelsFor(level).diff[e], old_bits, new_bits, n, elem_size, positions,
                      nullptr);
}

uint64_t CountDiffAt(SimdLevel level, const void* old_bits, const void* new_bits, uint64_t n,
                     uint32_t elem_size) {
  const int e = ElemIndex(elem_size);
  if (e < 0) return 0;
  return KernelsFor(level).count[e](static_cast<const uint8_t*>(old_bits),
                                    static_cast<const uint8_t*>(new_bits), n);
}

DiffDigest DiffPositionsAndDigestAt(SimdLevel level, const void* old_bits, const void* new_bits,
                                    uint64_t n, uint32_t elem_size, PositionList* positions,
                                    ChangedValues values) {
  const int e = ElemIndex(elem_size);
  if (e < 0) return {};
  DigestStream digest(level);
  DiffDigest r;
  r.changed = DiffInBlocks(KernelsFor(level).diff[e], old_bits, new_bits, n, elem_size, positions,
                           &digest, values);
  r.digest = digest.Final();
  return r;
}

namespace {

// Patches block[0, end - first) (elements first..end of the record) with the changes from *k on
// that fall before `end`; false when a position is not above the previous one.
template <uint32_t kElem>
bool PatchBlock(uint8_t* block, uint64_t first, uint64_t end, const uint64_t* positions,
                uint64_t count, const uint8_t* values, uint64_t* k, uint64_t* next_allowed) {
  uint64_t j = *k;
  uint64_t allowed = *next_allowed;
  for (; j < count && positions[j] < end; ++j) {
    const uint64_t p = positions[j];
    if (p < allowed) return false;
    allowed = p + 1;
    std::memcpy(block + (p - first) * kElem, values + j * kElem, kElem);
  }
  *k = j;
  *next_allowed = allowed;
  return true;
}

using PatchFn = bool (*)(uint8_t*, uint64_t, uint64_t, const uint64_t*, uint64_t, const uint8_t*,
                         uint64_t*, uint64_t*);

}  // namespace

PatchedDigester::PatchedDigester(const void* old_bits, uint64_t n, uint32_t elem_size,
                                 const uint64_t* positions, const void* values, uint64_t capacity)
    : old_(static_cast<const uint8_t*>(old_bits)),
      n_(n),
      elem_(elem_size),
      elem_index_(ElemIndex(elem_size)),
      positions_(positions),
      values_(static_cast<const uint8_t*>(values)),
      capacity_(capacity),
      per_block_(elem_size == 0 ? 1 : kBlockBytes / elem_size),
      valid_(elem_index_ >= 0) {}

// Digests elements [first_, first_ + m) with the changes among the first `listed` that fall in
// them patched in (copied into block_, which stays in L1 between the copy, the patches and the
// digest); an unchanged block is digested where it is.
void PatchedDigester::DigestBlock(uint64_t m, uint64_t listed) {
  constexpr PatchFn kPatch[4] = {&PatchBlock<1>, &PatchBlock<2>, &PatchBlock<4>, &PatchBlock<8>};
  const uint64_t first = first_;
  first_ += m;
  // A change below this block (listed after the block before it was digested) is out of order:
  // PatchBlock refuses it rather than patching below block_.
  next_allowed_ = std::max(next_allowed_, first);
  if (k_ == listed || positions_[k_] >= first + m) {
    digest_.Update(old_ + first * elem_, m * elem_);
    return;
  }
  std::memcpy(block_, old_ + first * elem_, m * elem_);
  valid_ = kPatch[elem_index_](block_, first, first + m, positions_, listed, values_, &k_,
                               &next_allowed_);
  if (valid_) digest_.Update(block_, m * elem_);
}

void PatchedDigester::Advance(uint64_t done, uint64_t listed) {
  listed = std::min(listed, capacity_);
  done = std::min(done, n_);
  while (valid_ && first_ < done && done - first_ >= per_block_) DigestBlock(per_block_, listed);
}

PatchedDigest PatchedDigester::Finish(uint64_t count) {
  count = std::min(count, capacity_);
  while (valid_ && first_ < n_) DigestBlock(std::min(per_block_, n_ - first_), count);
  if (!valid_) return {};
  return {digest_.Final(), k_ == count};
}

PatchedDigest DigestPatched(const void* old_bits, uint64_t n, uint32_t elem_size,
                            const uint64_t* positions, uint64_t count, const void* values) {
  PatchedDigester digester(old_bits, n, elem_size, positions, values, count);
  return digester.Finish(count);
}

uint64_t DiffPositions(const void* old_bits, const void* new_bits, uint64_t n, uint32_t elem_size,
                       std::vector<uint64_t>* positions) {
  const int e = ElemIndex(elem_size);
  if (e < 0) return 0;
  return DiffInBlocks(Active().diff[e], old_bits, new_bits, n, elem_size, positions, nullptr);
}

uint64_t CountDiff(const void* old_bits, const void* new_bits, uint64_t n, uint32_t elem_size) {
  const int e = ElemIndex(elem_size);
  if (e < 0) return 0;
  return Active().count[e](static_cast<const uint8_t*>(old_bits),
                           static_cast<const uint8_t*>(new_bits), n);
}

DiffDigest DiffPositionsAndDigest(const void* old_bits, const void* new_bits, uint64_t n,
                                  uint32_t elem_size, PositionList* positions,
                                  ChangedValues values) {
  return DiffPositionsAndDigestAt(ActiveSimdLevel(), old_bits, new_bits, n, elem_size, positions,
                                  values);
}

}  // namespace refit::kernels
