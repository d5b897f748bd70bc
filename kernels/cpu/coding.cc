// Gap coding, LSB-first bitmasks, byte planes and gather/scatter (see coding.h).
//
// Inner loops are specialized on the element size / gap width so each moves one fixed-size integer
// per element; memcpy of a constant size compiles to a single load or store.
#include "refit/kernels/coding.h"

#include <bit>
#include <cstring>
#include <initializer_list>

namespace refit::kernels {
namespace {

template <typename T>
inline T LoadLE(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // x86-64 and every target we build for are little-endian
  return v;
}
template <typename T>
inline void StoreLE(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

static_assert(std::endian::native == std::endian::little, "payloads are little-endian");

// Calls fn(U{}) with U the unsigned integer of elem_size bytes (1, 2, 4 or 8).
template <typename Fn>
inline void ByElem(uint32_t elem_size, Fn&& fn) {
  switch (elem_size) {
    case 1:
      fn(uint8_t{});
      break;
    case 2:
      fn(uint16_t{});
      break;
    case 4:
      fn(uint32_t{});
      break;
    default:
      fn(uint64_t{});
      break;
  }
}

// Runs body(j) for j in [0, k), calling prefetch(j + kPrefetchAhead) first while that index
// exists. Gathers and scatters at ~1% density touch a new cache line almost every element, in
// ascending but irregular order the hardware prefetchers do not follow: requesting lines a few
// dozen elements ahead keeps many misses in flight instead of stalling on each.
constexpr uint64_t kPrefetchAhead = 32;

template <typename Prefetch, typename Body>
inline void ForEachPrefetched(uint64_t k, Prefetch&& prefetch, Body&& body) {
  const uint64_t with_prefetch = k > kPrefetchAhead ? k - kPrefetchAhead : 0;
  uint64_t j = 0;
  for (; j < with_prefetch; ++j) {
    prefetch(j + kPrefetchAhead);
    body(j);
  }
  for (; j < k; ++j) body(j);
}

template <typename W>
uint64_t EncodeGapsT(const uint64_t* positions, uint64_t k, uint8_t* out) {
  constexpr uint64_t kEscape = GapEscape(sizeof(W));
  uint8_t* p = out;
  uint64_t next = 0;  // the position a gap of 0 would give
  for (uint64_t j = 0; j < k; ++j) {
    const uint64_t gap = positions[j] - next;
    next = positions[j] + 1;
    if (gap < kEscape) {
      StoreLE<W>(p, static_cast<W>(gap));
      p += sizeof(W);
    } else {
      StoreLE<W>(p, static_cast<W>(kEscape));
      StoreLE<uint64_t>(p + sizeof(W), gap);
      p += sizeof(W) + kGapEscapeBytes;
    }
  }
  return static_cast<uint64_t>(p - out);
}

template <typename W>
GapDecodeResult DecodeGapsT(const uint8_t* in, uint64_t len, uint64_t k, uint64_t n_elems,
                            uint64_t* positions) {
  constexpr uint64_t kEscape = GapEscape(sizeof(W));
  uint64_t at = 0;
  uint64_t next = 0;
  for (uint64_t j = 0; j < k; ++j) {
    if (len - at < sizeof(W)) return {GapDecodeError::kTruncated, j};
    uint64_t gap = LoadLE<W>(in + at);
    at += sizeof(W);
    if (gap == kEscape) {
      if (len - at < kGapEscapeBytes) return {GapDecodeError::kTruncated, j};
      gap = LoadLE<uint64_t>(in + at);
      at += kGapEscapeBytes;
    }
    // next <= n_elems holds here, so n_elems - next does not wrap.
    if (next >= n_elems || gap >= n_elems - next) return {GapDecodeError::kOutOfRange, j};
    positions[j] = next + gap;
    next = positions[j] + 1;
  }
  if (at != len) return {GapDecodeError::kTrailing, k};
  return {};
}

}  // namespace

GapStats ComputeGapStats(const uint64_t* positions, uint64_t k) {
  GapStats s;
  s.count = k;
  uint64_t next = 0;
  for (uint64_t j = 0; j < k; ++j) {
    const uint64_t gap = positions[j] - next;
    next = positions[j] + 1;
    s.escapes_u8 += gap >= GapEscape(1) ? 1 : 0;
    s.escapes_u16 += gap >= GapEscape(2) ? 1 : 0;
    s.escapes_u32 += gap >= GapEscape(4) ? 1 : 0;
  }
  return s;
}

uint64_t GapStreamBytes(const GapStats& stats, uint32_t width) {
  const uint64_t escapes = width == 1   ? stats.escapes_u8
                           : width == 2 ? stats.escapes_u16
                                        : stats.escapes_u32;
  return stats.count * width + escapes * kGapEscapeBytes;
}

uint32_t ChooseGapWidth(const GapStats& stats) {
  uint32_t best = 1;
  for (uint32_t width : {2u, 4u}) {
    if (GapStreamBytes(stats, width) < GapStreamBytes(stats, best)) best = width;
  }
  return best;
}

uint64_t EncodeGaps(const uint64_t* positions, uint64_t k, uint32_t width, uint8_t* out) {
  switch (width) {
    case 1:
      return EncodeGapsT<uint8_t>(positions, k, out);
    case 2:
      return EncodeGapsT<uint16_t>(positions, k, out);
    default:
      return EncodeGapsT<uint32_t>(positions, k, out);
  }
}

GapDecodeResult DecodeGaps(const uint8_t* in, uint64_t len, uint64_t k, uint32_t width,
                           uint64_t n_elems, uint64_t* positions) {
  switch (width) {
    case 1:
      return DecodeGapsT<uint8_t>(in, len, k, n_elems, positions);
    case 2:
      return DecodeGapsT<uint16_t>(in, len, k, n_elems, positions);
    case 4:
      return DecodeGapsT<uint32_t>(in, len, k, n_elems, positions);
    default:
      return {GapDecodeError::kBadWidth, 0};
  }
}

const char* GapDecodeErrorText(GapDecodeError error) {
  switch (error) {
    case GapDecodeError::kOk:
      return "ok";
    case GapDecodeError::kBadWidth:
      return "gap width is not 1, 2 or 4";
    case GapDecodeError::kTruncated:
      return "gap stream ends early";
    case GapDecodeError::kTrailing:
      return "gap stream has trailing bytes";
    case GapDecodeError::kOutOfRange:
      return "gap leads past the end of the run";
  }
  return "unknown gap error";
}

void BuildBitmask(const uint64_t* positions, uint64_t k, uint64_t n, uint8_t* mask) {
  std::memset(mask, 0, BitmaskBytes(n));
  for (uint64_t j = 0; j < k; ++j) {
    mask[positions[j] >> 3] |= static_cast<uint8_t>(1u << (positions[j] & 7));
  }
}

uint64_t BitmaskCount(const uint8_t* mask, uint64_t n) {
  uint64_t count = 0;
  const uint64_t words = n / 64;
  for (uint64_t w = 0; w < words; ++w) {
    count += static_cast<uint64_t>(std::popcount(LoadLE<uint64_t>(mask + 8 * w)));
  }
  for (uint64_t i = words * 64; i < n; ++i) count += (mask[i >> 3] >> (i & 7)) & 1;
  return count;
}

bool BitmaskTailClear(const uint8_t* mask, uint64_t n) {
  if (n % 8 == 0) return true;
  return (mask[n / 8] >> (n % 8)) == 0;
}

uint64_t BitmaskToPositions(const uint8_t* mask, uint64_t n, uint64_t* positions) {
  uint64_t k = 0;
  const uint64_t words = n / 64;
  for (uint64_t w = 0; w < words; ++w) {
    uint64_t bits = LoadLE<uint64_t>(mask + 8 * w);
    while (bits != 0) {
      positions[k++] = 64 * w + static_cast<uint64_t>(std::countr_zero(bits));
      bits &= bits - 1;
    }
  }
  for (uint64_t i = words * 64; i < n; ++i) {
    if ((mask[i >> 3] >> (i & 7)) & 1) positions[k++] = i;
  }
  return k;
}

void SplitBytePlanes(const uint8_t* values, uint64_t k, uint32_t elem_size, uint8_t* planes) {
  ByElem(elem_size, [&](auto tag) {
    using U = decltype(tag);
    for (uint64_t j = 0; j < k; ++j) {
      const U v = LoadLE<U>(values + j * sizeof(U));
      for (uint32_t b = 0; b < sizeof(U); ++b)
        planes[b * k + j] = static_cast<uint8_t>(v >> (8 * b));
    }
  });
}

void MergeBytePlanes(const uint8_t* planes, uint64_t k, uint32_t elem_size, uint8_t* values) {
  ByElem(elem_size, [&](auto tag) {
    using U = decltype(tag);
    for (uint64_t j = 0; j < k; ++j) {
      U v = 0;
      for (uint32_t b = 0; b < sizeof(U); ++b) v |= static_cast<U>(U{planes[b * k + j]} << (8 * b));
      StoreLE<U>(values + j * sizeof(U), v);
    }
  });
}

void GatherValues(const void* bits, uint32_t elem_size, const uint64_t* positions, uint64_t k,
                  uint8_t* values) {
  const auto* src = static_cast<const uint8_t*>(bits);
  ByElem(elem_size, [&](auto tag) {
    using U = decltype(tag);
    ForEachPrefetched(
        k, [&](uint64_t ahead) { __builtin_prefetch(src + positions[ahead] * sizeof(U)); },
        [&](uint64_t j) {
          StoreLE<U>(values + j * sizeof(U), LoadLE<U>(src + positions[j] * sizeof(U)));
        });
  });
}

void GatherValues(const void* bits, const uint8_t* packed, uint32_t elem_size,
                  const uint64_t* positions, uint64_t k, uint8_t* values) {
  if (packed == nullptr) return GatherValues(bits, elem_size, positions, k, values);
  if (k > 0) std::memcpy(values, packed, k * elem_size);
}

namespace {

// Byte b of x into plane b (k bytes each) at index j.
template <typename U>
inline void StorePlanes(U x, uint64_t j, uint64_t k, uint8_t* planes) {
  for (uint32_t byte = 0; byte < sizeof(U); ++byte) {
    planes[byte * k + j] = static_cast<uint8_t>(x >> (8 * byte));
  }
}

// Calls fn(j, old ^ new) for each position j, as U, prefetching both inputs ahead.
template <typename Fn>
void ForEachXor(const void* old_bits, const void* new_bits, uint32_t elem_size,
                const uint64_t* positions, uint64_t k, Fn&& fn) {
  const auto* a = static_cast<const uint8_t*>(old_bits);
  const auto* b = static_cast<const uint8_t*>(new_bits);
  ByElem(elem_size, [&](auto tag) {
    using U = decltype(tag);
    ForEachPrefetched(
        k,
        [&](uint64_t ahead) {
          __builtin_prefetch(a + positions[ahead] * sizeof(U));
          __builtin_prefetch(b + positions[ahead] * sizeof(U));
        },
        [&](uint64_t j) {
          const uint64_t at = positions[j] * sizeof(U);
          fn(j, static_cast<U>(LoadLE<U>(a + at) ^ LoadLE<U>(b + at)));
        });
  });
}

}  // namespace

void GatherXor(const void* old_bits, const void* new_bits, uint32_t elem_size,
               const uint64_t* positions, uint64_t k, uint8_t* values) {
  ForEachXor(old_bits, new_bits, elem_size, positions, k,
             [&](uint64_t j, auto x) { StoreLE<decltype(x)>(values + j * sizeof(x), x); });
}

void GatherXorPlanes(const void* old_bits, const void* new_bits, uint32_t elem_size,
                     const uint64_t* positions, uint64_t k, uint8_t* planes) {
  ForEachXor(old_bits, new_bits, elem_size, positions, k,
             [&](uint64_t j, auto x) { StorePlanes(x, j, k, planes); });
}

void XorPlanesOfValues(const uint8_t* old_values, const uint8_t* new_values, uint32_t elem_size,
                       uint64_t k, uint8_t* planes) {
  ByElem(elem_size, [&](auto tag) {
    using U = decltype(tag);
    for (uint64_t j = 0; j < k; ++j) {
      StorePlanes(static_cast<U>(LoadLE<U>(old_values + j * sizeof(U)) ^
                                 LoadLE<U>(new_values + j * sizeof(U))),
                  j, k, planes);
    }
  });
}

namespace {
// Calls fn(p, j, U{}) for each j < k, p the element positions[j] of `bits` and U the unsigned
// integer of elem_size bytes, prefetching the elements ahead (they are far apart).
template <typename Fn>
void ForEachScattered(void* bits, uint32_t elem_size, const uint64_t* positions, uint64_t k,
                      Fn&& fn) {
  auto* dst = static_cast<uint8_t*>(bits);
  ByElem(elem_size, [&](auto tag) {
    using U = decltype(tag);
    ForEachPrefetched(
        k, [&](uint64_t ahead) { __builtin_prefetch(dst + positions[ahead] * sizeof(U), 1); },
        [&](uint64_t j) { fn(dst + positions[j] * sizeof(U), j, tag); });
  });
}
}  // namespace

void ScatterOverwrite(void* bits, uint32_t elem_size, const uint64_t* positions, uint64_t k,
                      const uint8_t* values) {
  ForEachScattered(bits, elem_size, positions, k, [&](uint8_t* p, uint64_t j, auto tag) {
    using U = decltype(tag);
    StoreLE<U>(p, LoadLE<U>(values + j * sizeof(U)));
  });
}

void ScatterSwap(void* bits, uint32_t elem_size, const uint64_t* positions, uint64_t k,
                 uint8_t* values) {
  ForEachScattered(bits, elem_size, positions, k, [&](uint8_t* p, uint64_t j, auto tag) {
    using U = decltype(tag);
    const U old_bits = LoadLE<U>(p);
    StoreLE<U>(p, LoadLE<U>(values + j * sizeof(U)));
    StoreLE<U>(values + j * sizeof(U), old_bits);
  });
}

void ScatterXor(void* bits, uint32_t elem_size, const uint64_t* positions, uint64_t k,
                const uint8_t* values) {
  ForEachScattered(bits, elem_size, positions, k, [&](uint8_t* p, uint64_t j, auto tag) {
    using U = decltype(tag);
    StoreLE<U>(p, static_cast<U>(LoadLE<U>(p) ^ LoadLE<U>(values + j * sizeof(U))));
  });
}

}  // namespace refit::kernels
