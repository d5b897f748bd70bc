// Position and value coding kernels shared by the delta encodings (pure compute: no config, no
// registry, no allocation). Callers validate sizes first; every function documents what it needs.
//
// Element values are moved as raw little-endian bytes of elem_size (1, 2, 4 or 8): no arithmetic on
// values except XOR of bit patterns.
#pragma once

#include <cstdint>

namespace refit::kernels {

// ---------------------------------------------------------------- gap coding
//
// A gap stream codes k strictly increasing positions as gaps: gap_0 = p_0, gap_j = p_j - p_{j-1} -
// 1 (so consecutive positions give gap 0). Each gap is stored little-endian in `width` bytes (1, 2
// or 4). A gap >= the width's escape value (all ones: 0xFF, 0xFFFF, 0xFFFFFFFF) is stored as that
// escape followed by the gap as a little-endian u64 (kGapEscapeBytes).
constexpr uint64_t kGapEscapeBytes = 8;

// Escape value of a width (the largest gap it cannot store directly).
constexpr uint64_t GapEscape(uint32_t width) {
  return width >= 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * width)) - 1;
}

// How many gaps need an escape at each width, from one pass over the positions.
struct GapStats {
  uint64_t count = 0;        // k
  uint64_t escapes_u8 = 0;   // gaps >= 0xFF
  uint64_t escapes_u16 = 0;  // gaps >= 0xFFFF
  uint64_t escapes_u32 = 0;  // gaps >= 0xFFFFFFFF
};
GapStats ComputeGapStats(const uint64_t* positions, uint64_t k);

// Stream bytes at a width (1, 2 or 4): k * width + escapes(width) * kGapEscapeBytes.
uint64_t GapStreamBytes(const GapStats& stats, uint32_t width);

// The width giving the smallest stream (ties go to the narrower width).
uint32_t ChooseGapWidth(const GapStats& stats);

// Writes the gap stream of k strictly increasing positions at width; returns the bytes written
// (== GapStreamBytes). out has room for that many bytes.
uint64_t EncodeGaps(const uint64_t* positions, uint64_t k, uint32_t width, uint8_t* out);

enum class GapDecodeError {
  kOk = 0,
  kBadWidth,    // width not 1, 2 or 4
  kTruncated,   // the stream ends before k gaps
  kTrailing,    // bytes left after k gaps
  kOutOfRange,  // a position >= n_elems (or overflowing u64)
};

struct GapDecodeResult {
  GapDecodeError error = GapDecodeError::kOk;
  uint64_t index = 0;  // the gap at fault
};

// Decodes exactly k gaps from exactly len bytes into positions (room for k). Positions come out
// strictly increasing by construction; every one is checked < n_elems. On error positions holds
// garbage and the caller must not use it.
GapDecodeResult DecodeGaps(const uint8_t* in, uint64_t len, uint64_t k, uint32_t width,
                           uint64_t n_elems, uint64_t* positions);

const char* GapDecodeErrorText(GapDecodeError error);

// ---------------------------------------------------------------- bitmasks (LSB-first)
//
// Element i is bit (i % 8) of byte (i / 8); the bits past n in the last byte are zero.

constexpr uint64_t BitmaskBytes(uint64_t n) { return n / 8 + (n % 8 != 0 ? 1 : 0); }

// Zeroes BitmaskBytes(n) bytes of mask, then sets the bit of each position (each < n).
void BuildBitmask(const uint64_t* positions, uint64_t k, uint64_t n, uint8_t* mask);

// Set bits among the first n bits.
uint64_t BitmaskCount(const uint8_t* mask, uint64_t n);

// Whether every bit past n in the last byte is zero.
bool BitmaskTailClear(const uint8_t* mask, uint64_t n);

// Appends the index of every set bit among the first n to positions (room for BitmaskCount) in
// ascending order; returns how many.
uint64_t BitmaskToPositions(const uint8_t* mask, uint64_t n, uint64_t* positions);

// ---------------------------------------------------------------- byte planes
//
// k values of elem_size bytes <-> elem_size planes of k bytes: plane b holds byte b (little-endian
// significance) of every value, so the planes of small XORs are long runs of zeros.
void SplitBytePlanes(const uint8_t* values, uint64_t k, uint32_t elem_size, uint8_t* planes);
void MergeBytePlanes(const uint8_t* planes, uint64_t k, uint32_t elem_size, uint8_t* values);

// ---------------------------------------------------------------- gather / scatter
//
// positions are k indices < the run's length (checked by the caller); values are k packed
// elements of elem_size bytes.

// values[j] = bits[positions[j]]
void GatherValues(const void* bits, uint32_t elem_size, const uint64_t* positions, uint64_t k,
                  uint8_t* values);
// The same from `packed` (those k values already gathered, as the host's diff provides them)
// when it is not null: one copy instead of a cache miss per change.
void GatherValues(const void* bits, const uint8_t* packed, uint32_t elem_size,
                  const uint64_t* positions, uint64_t k, uint8_t* values);
// values[j] = old_bits[positions[j]] XOR new_bits[positions[j]]
void GatherXor(const void* old_bits, const void* new_bits, uint32_t elem_size,
               const uint64_t* positions, uint64_t k, uint8_t* values);
// GatherXor then SplitBytePlanes in one pass (no intermediate buffer): planes gets elem_size
// planes of k bytes, plane b holding byte b of every XOR.
void GatherXorPlanes(const void* old_bits, const void* new_bits, uint32_t elem_size,
                     const uint64_t* positions, uint64_t k, uint8_t* planes);
// GatherXorPlanes from the changed elements' bits already packed (old_values[j], new_values[j]:
// the bits at positions[j], as the host's diff provides them): a sequential pass.
void XorPlanesOfValues(const uint8_t* old_values, const uint8_t* new_values, uint32_t elem_size,
                       uint64_t k, uint8_t* planes);
// bits[positions[j]] = values[j]
void ScatterOverwrite(void* bits, uint32_t elem_size, const uint64_t* positions, uint64_t k,
                      const uint8_t* values);
// Exchanges bits[positions[j]] and values[j]: the new bits go in, the old ones come out (done
// twice, both are as they were).
void ScatterSwap(void* bits, uint32_t elem_size, const uint64_t* positions, uint64_t k,
                 uint8_t* values);
// bits[positions[j]] ^= values[j]
void ScatterXor(void* bits, uint32_t elem_size, const uint64_t* positions, uint64_t k,
                const uint8_t* values);

}  // namespace refit::kernels
