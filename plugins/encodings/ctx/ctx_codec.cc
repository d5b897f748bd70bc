// The `ctx` codec (see ctx_codec.h and README.md for the payload format).
//
// Positions: every element belongs to a class derived from its OLD bits (the binary exponent for
// float dtypes, one class for integers and bool), which both sides know. Within a class the
// changed elements are a sparse subsequence; the payload codes, per class, the run of unchanged
// class members before each change. Because change probability roughly halves per exponent step,
// per-class runs cost far less than position gaps over all elements. The encoder emits runs one
// change ahead (the run to the class's next change follows each change), so the decoder can walk
// the elements in order, counting each class down, with no lookahead of its own. With AVX2 or
// AVX-512 both sides count 64 elements per class at a time (ctx_blocks.h); the scalar path,
// element by element, is the reference they are tested against (same payload, same bits).
//
// Values: the step new - old in the dtype's ordered integer representation (floats: negative
// patterns flipped so that integer order is value order), as sign + magnitude. A one-ULP step
// costs about a bit and a half; larger steps cost their bit length plus raw bits.
//
// Two coded forms: small records go through an adaptive binary range coder in position order
// (mode 0); records of 2^12 changes or more through static per-record tables (explicit, or
// geometric from two numbers where that codes fewer bits), rANS and a raw bit
// stream in slot-major order (mode 2, ctx_tables.h), which the decoder decodes in full before a
// slot-by-slot chunk walk applies it. A slot is a range of classes that shares one run count:
// the table form's encoder merges classes whose change rates are alike (ChooseSlots), down to
// one slot of every class when the rate does not depend on the class at all.
#include "ctx_codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "ctx_blocks.h"
#include "ctx_tables.h"
#include "refit/kernels/diff.h"
#include "refit/kernels/dispatch.h"
#include "refit/sdk/encoding_util.hpp"

namespace refit::ctx {
namespace {

using sdk::LoadLE;
using sdk::StoreLE;

constexpr uint8_t kFormatVersion = 4;
constexpr uint8_t kModeCoded = 0;  // adaptive range coder
constexpr uint8_t kModeLiteral = 1;
constexpr uint8_t kModeTables = 2;  // static tables + rANS + raw bits (large records)
// The table form decodes several times cheaper per change; with geometric tables (a few bytes
// per slot, format 4) it also codes about the same bits as the adaptive form from this many
// changes on (below, the adaptive coder's fewer header bytes win).
constexpr uint64_t kTableMinChanges = uint64_t{1} << 12;
// version, checksum (u32), mode, dtype.
constexpr uint64_t kFixedHeaderBytes = 7;
constexpr uint64_t kChecksumOffset = 1;
constexpr uint64_t kChecked = 5;  // the checksum covers payload[kChecked, len)
constexpr uint64_t kMaxVarintBytes = 10;
constexpr uint32_t kNumClasses = 256;
// Runs and counts are coded as run + 1 in 64 bits.
constexpr uint64_t kMaxElements = uint64_t{1} << 62;

// ------------------------------------------------------------------ dtypes

struct DTypeSpec {
  uint32_t size = 0;
  bool is_float = false;
  uint32_t exp_shift = 0;  // class = (bits >> exp_shift) & exp_mask
  uint32_t exp_mask = 0;   // 0: one class (integers, bool)
};

// nullptr for an unknown dtype value.
const DTypeSpec* FindSpec(int32_t dtype) {
  static const DTypeSpec kSpecs[] = {
      {1, false, 0, 0},      // bool
      {1, false, 0, 0},      // u8
      {1, false, 0, 0},      // i8
      {2, false, 0, 0},      // i16
      {4, false, 0, 0},      // i32
      {8, false, 0, 0},      // i64
      {2, true, 10, 0x1f},   // f16
      {2, true, 7, 0xff},    // bf16
      {4, true, 23, 0xff},   // f32
      {8, true, 52, 0x7ff},  // f64 (clamped to 256 classes below)
      {1, true, 3, 0xf},     // f8 e4m3
      {1, true, 2, 0x1f},    // f8 e5m2
  };
  if (dtype < REFIT_DTYPE_BOOL || dtype > REFIT_DTYPE_F8_E5M2) return nullptr;
  return &kSpecs[dtype - REFIT_DTYPE_BOOL];
}

// The class of an element from its old bits.
struct ExponentClass {
  static constexpr bool kSingle = false;
  uint32_t shift;
  uint32_t mask;
  template <typename T>
  uint32_t operator()(T bits) const {
    return static_cast<uint32_t>(bits >> shift) & mask;
  }
  uint32_t Max() const { return mask; }
};
// f64: exponents 896..1151 (2^-127 .. 2^128) get their own class, the rest share the end ones.
struct F64Class {
  static constexpr bool kSingle = false;
  uint32_t operator()(uint64_t bits) const {
    const uint32_t e = static_cast<uint32_t>(bits >> 52) & 0x7ff;
    return e <= 896 ? 0 : std::min<uint32_t>(e - 896, kNumClasses - 1);
  }
  uint32_t Max() const { return kNumClasses - 1; }
};
struct SingleClass {
  static constexpr bool kSingle = true;
  template <typename T>
  uint32_t operator()(T /*bits*/) const {
    return 0;
  }
  uint32_t Max() const { return 0; }
};

// The position classes a record codes in: slot s holds the elements whose class is in
// range[s] (slots ascend and do not overlap; an element outside every slot never changes). The
// adaptive form has one slot per class of [lo, hi]; the table form's encoder merges classes whose
// change rates are alike (ChooseSlots), down to one slot of every class, whose runs are then
// plain distances and whose walk reads no class at all.
constexpr uint16_t kNoSlot = kNumClasses;
struct Slots {
  uint32_t count = 0;
  SlotRange range[kNumClasses];
  uint16_t of[kNumClasses];  // class -> slot, kNoSlot outside every slot
  bool everything = false;   // one slot holding every class

  static Slots Identity(uint32_t lo, uint32_t hi) {
    Slots s;
    for (uint32_t c = lo; c <= hi; ++c) s.range[s.count++] = {static_cast<uint8_t>(c), 0};
    return s;
  }
  uint32_t Last(uint32_t slot) const { return uint32_t{range[slot].first} + range[slot].width; }
  // Fills `of` and `everything` once `range` and `count` are set.
  void Index(uint32_t max_class) {
    std::fill(std::begin(of), std::end(of), kNoSlot);
    for (uint32_t slot = 0; slot < count; ++slot) {
      for (uint32_t c = range[slot].first; c <= Last(slot); ++c)
        of[c] = static_cast<uint16_t>(slot);
    }
    everything = count == 1 && range[0].first == 0 && Last(0) >= max_class;
  }
};

// Order-preserving bijection of float bit patterns onto unsigned integers (integers: identity):
// negative patterns are inverted, positive ones get the sign bit. Written as XOR masks: the sign
// is a coin flip per change, a branch on it would be mispredicted half the time.
template <typename T>
inline T SignMask(T bits) {  // all ones when the top bit is set
  return static_cast<T>(T{0} - static_cast<T>(bits >> (sizeof(T) * 8 - 1)));
}
template <typename T>
inline T ToOrdered(T bits, bool is_float) {
  constexpr T kSign = T{1} << (sizeof(T) * 8 - 1);
  if (!is_float) return bits;
  return static_cast<T>(bits ^ (SignMask(bits) | kSign));
}
template <typename T>
inline T FromOrdered(T ord, bool is_float) {
  constexpr T kSign = T{1} << (sizeof(T) * 8 - 1);
  if (!is_float) return ord;
  return static_cast<T>(ord ^ static_cast<T>(~SignMask(ord) | kSign));
}

template <typename T>
inline T LoadElem(const uint8_t* base, uint64_t i) {
  T v;
  std::memcpy(&v, base + i * sizeof(T), sizeof(T));
  return v;
}
template <typename T>
inline void StoreElem(uint8_t* base, uint64_t i, T v) {
  std::memcpy(base + i * sizeof(T), &v, sizeof(T));
}

// ------------------------------------------------------------------ varints (LEB128)

uint64_t VarintSize(uint64_t v) {
  uint64_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}
uint8_t* PutVarint(uint8_t* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}
// Reads a varint at *pos (advanced); false when truncated, over 64 bits or not minimal.
bool GetVarint(const uint8_t* p, uint64_t len, uint64_t* pos, uint64_t* value) {
  uint64_t v = 0;
  for (uint32_t i = 0; i < kMaxVarintBytes; ++i) {
    if (*pos >= len) return false;
    const uint8_t byte = p[(*pos)++];
    const uint64_t bits = byte & 0x7f;
    if (i == 9 && bits > 1) return false;
    v |= bits << (7 * i);
    if ((byte & 0x80) == 0) {
      if (i > 0 && bits == 0) return false;  // not minimal: one payload, one encoding
      *value = v;
      return true;
    }
  }
  return false;
}

// ------------------------------------------------------------------ adaptive binary range coder
//
// LZMA's carry-propagating range coder with 15-bit probabilities and an adaptation rate that
// starts fast (first observations move the estimate a lot) and settles at 1/128.

// The coder's hot paths must inline into the record loops so its state stays in registers.
#define CTX_INLINE inline __attribute__((always_inline))
#define CTX_NOINLINE __attribute__((noinline))
#define CTX_INLINE_LAMBDA __attribute__((always_inline))

constexpr int kProbBits = 15;
constexpr uint32_t kProbOne = 1u << kProbBits;
constexpr uint32_t kTop = 1u << 24;
// Probabilities stay in [kProbMin, kProbOne - kProbMin]: no symbol ever costs more than ~10 bits.
constexpr int32_t kProbMin = 31;
constexpr uint8_t kSettledCount = 63;
// Raw bits go through the coder at most this many at a time (range stays >= 2^8).
constexpr int kDirectChunk = 16;

struct Bit {
  uint16_t p0 = kProbOne / 2;  // probability of a 0, in 1/kProbOne
  uint8_t seen = 0;            // observations so far, saturating at kSettledCount
};

// Adaptation shift by observations seen: 1, 2, 2, 3 x4, 4 x8, ... up to 7, i.e. roughly
// 1/(seen+2) early and 1/128 once settled.
struct ShiftTable {
  uint8_t shift[kSettledCount + 1];
  constexpr ShiftTable() : shift() {
    for (uint32_t i = 0; i <= kSettledCount; ++i) {
      shift[i] = i >= kSettledCount ? 7 : static_cast<uint8_t>(std::bit_width(i + 1));
    }
  }
};
constexpr ShiftTable kShifts;

// Branch-free: coded bits are unpredictable, so the update must not branch on them.
CTX_INLINE void Adapt(Bit& b, uint32_t bit) {
  const int shift = kShifts.shift[b.seen];
  b.seen = static_cast<uint8_t>(b.seen + (b.seen < kSettledCount ? 1 : 0));
  const int32_t target = bit ? kProbMin : static_cast<int32_t>(kProbOne) - kProbMin;
  const int32_t p = b.p0;
  b.p0 = static_cast<uint16_t>(p + ((target - p) >> shift));
}

class RangeEncoder {
 public:
  // Writes at most cap bytes to out; size() keeps counting past it (overflowed() then).
  RangeEncoder(uint8_t* out, uint64_t cap) : out_(out), cap_(cap) {}

  CTX_INLINE void Encode(Bit& b, uint32_t bit) {
    const uint32_t bound = (range_ >> kProbBits) * b.p0;
    const uint32_t mask = 0u - bit;
    low_ += bound & mask;
    range_ = bit ? range_ - bound : bound;
    Adapt(b, bit);
    Normalize();
  }
  // The low nbits of value, most significant first, at exactly one bit each.
  CTX_INLINE void EncodeDirect(uint64_t value, int nbits) {
    while (nbits > 0) {
      const int n = std::min(nbits, kDirectChunk);
      nbits -= n;
      range_ >>= n;
      low_ += static_cast<uint64_t>((value >> nbits) & ((1u << n) - 1)) * range_;
      Normalize();
    }
  }
  CTX_INLINE void Finish() {
    for (int i = 0; i < 5; ++i) ShiftLow();
  }
  uint64_t size() const { return pos_; }
  bool overflowed() const { return pos_ > cap_; }

 private:
  CTX_INLINE void Normalize() {
    while (range_ < kTop) {
      range_ <<= 8;
      ShiftLow();
    }
  }
  CTX_INLINE void ShiftLow() {
    if (static_cast<uint32_t>(low_) < 0xFF000000u || (low_ >> 32) != 0) {
      const uint8_t carry = static_cast<uint8_t>(low_ >> 32);
      uint8_t pending = cache_;
      do {
        Put(static_cast<uint8_t>(pending + carry));
        pending = 0xFF;
      } while (--cache_size_ != 0);
      cache_ = static_cast<uint8_t>(low_ >> 24);
    }
    ++cache_size_;
    low_ = (low_ & 0x00FFFFFFu) << 8;
  }
  CTX_INLINE void Put(uint8_t byte) {
    // The coder's first byte is always 0 (the interval starts inside [0, 2^32)): not stored.
    if (skip_first_) {
      skip_first_ = false;
      return;
    }
    if (pos_ < cap_) out_[pos_] = byte;
    ++pos_;
  }

  uint8_t* out_;
  uint64_t cap_;
  uint64_t pos_ = 0;
  uint64_t low_ = 0;
  uint32_t range_ = 0xFFFFFFFFu;
  uint8_t cache_ = 0;
  uint64_t cache_size_ = 1;
  bool skip_first_ = true;
};

class RangeDecoder {
 public:
  RangeDecoder(const uint8_t* in, uint64_t len) : in_(in), len_(len) {
    for (int i = 0; i < 4; ++i) code_ = (code_ << 8) | Next();
  }
  CTX_INLINE uint32_t Decode(Bit& b) {
    const uint32_t bound = (range_ >> kProbBits) * b.p0;
    const uint32_t bit = code_ >= bound ? 1 : 0;
    code_ -= bound & (0u - bit);
    range_ = bit ? range_ - bound : bound;
    Adapt(b, bit);
    Normalize();
    return bit;
  }
  CTX_INLINE uint64_t DecodeDirect(int nbits) {
    uint64_t v = 0;
    while (nbits > 0) {
      const int n = std::min(nbits, kDirectChunk);
      nbits -= n;
      range_ >>= n;
      uint32_t chunk = code_ / range_;
      if (chunk >= (1u << n)) {  // only a damaged stream gets here
        chunk = (1u << n) - 1;
        damaged_ = true;
      }
      code_ -= chunk * range_;
      v = (v << n) | chunk;
      Normalize();
    }
    return v;
  }
  // A valid stream is consumed exactly: the decoder reads what the encoder wrote.
  bool ConsumedExactly() const { return !damaged_ && overrun_ == 0 && pos_ == len_; }

 private:
  CTX_INLINE void Normalize() {
    while (range_ < kTop) {
      range_ <<= 8;
      code_ = (code_ << 8) | Next();
    }
  }
  CTX_INLINE uint8_t Next() {
    if (pos_ < len_) return in_[pos_++];
    ++overrun_;
    return 0;
  }
  const uint8_t* in_;
  uint64_t len_;
  uint64_t pos_ = 0;
  uint64_t overrun_ = 0;
  uint32_t code_ = 0;
  uint32_t range_ = 0xFFFFFFFFu;
  bool damaged_ = false;
};

// ------------------------------------------------------------------ number models

// A positive integer v: its bit length (a 6-bit binary tree), the two bits below the leading one
// under the bit length's context, the rest raw. Near-optimal for the geometric-like runs and
// steps seen here, and bounded for any 64-bit value.
struct NumberModel {
  Bit length[64];
  Bit top[65][4];
};

CTX_INLINE void EncodeNumber(RangeEncoder& rc, NumberModel& m, uint64_t v) {
  const int nb = std::bit_width(v);  // 1..64
  const uint32_t sym = static_cast<uint32_t>(nb - 1);
  uint32_t node = 1;
  for (int i = 5; i >= 0; --i) {
    const uint32_t bit = (sym >> i) & 1;
    rc.Encode(m.length[node], bit);
    node = node * 2 + bit;
  }
  int rest = nb - 1;
  const int modeled = std::min(rest, 2);
  node = 1;
  for (int i = 0; i < modeled; ++i) {
    --rest;
    const uint32_t bit = static_cast<uint32_t>(v >> rest) & 1;
    rc.Encode(m.top[nb][node], bit);
    node = node * 2 + bit;
  }
  if (rest > 0) rc.EncodeDirect(v, rest);
}

CTX_INLINE uint64_t DecodeNumber(RangeDecoder& rc, NumberModel& m) {
  uint32_t node = 1;
  for (int i = 0; i < 6; ++i) node = node * 2 + rc.Decode(m.length[node]);
  const int nb = static_cast<int>(node - 64) + 1;
  uint64_t v = 1;
  int rest = nb - 1;
  const int modeled = std::min(rest, 2);
  node = 1;
  for (int i = 0; i < modeled; ++i) {
    const uint32_t bit = rc.Decode(m.top[nb][node]);
    node = node * 2 + bit;
    v = (v << 1) | bit;
    --rest;
  }
  if (rest > 0) v = (v << rest) | rc.DecodeDirect(rest);
  return v;
}

// The run of unchanged class members before a class's next change: adaptive Golomb-Rice with
// an arithmetic-coded quotient. The Rice shift follows the class's running mean run (both sides
// update it identically), the quotient (small, geometric) is coded in unary with one adaptive
// context per step, the low bits raw: about three coder operations per run where a bit-length
// tree would take nine, for a few hundredths of a bit more.
constexpr uint32_t kUnarySteps = 24;
constexpr uint32_t kRunStatsLimit = 256;  // halve the running sums here: follow drift

__extension__ typedef unsigned __int128 Uint128;  // (a GCC/Clang extension)

struct RunReciprocals {
  uint64_t of[kRunStatsLimit];
  constexpr RunReciprocals() : of() {
    for (uint32_t d = 1; d < kRunStatsLimit; ++d) of[d] = ~uint64_t{0} / d;
  }
};
constexpr RunReciprocals kRunReciprocals;

struct RunModel {
  Bit unary[kUnarySteps];  // "quotient > i"
  uint64_t sum = 0;        // runs seen (halved with count)
  uint64_t count = 0;
  // Smallest shift with 2^(shift+1) >= mean run (the quotient then averages ~1.5); 3 before the
  // first run. Kept up to date by Observe() so that the division is off the coder's critical
  // path (the next run of the class is usually many changes later).
  int shift = 3;

  void Observe(uint64_t run) {
    sum += std::min<uint64_t>(run, uint64_t{1} << 56);  // terminal runs must not swamp the mean
    if (++count == kRunStatsLimit) {
      sum >>= 1;
      count >>= 1;
    }
    const uint64_t mean = Mean();
    shift = mean <= 2 ? 0 : std::min(static_cast<int>(std::bit_width(mean - 1)) - 1, 56);
  }

 private:
  // sum / count (count < kRunStatsLimit) without a 64-bit division: a multiply by the
  // reciprocal floor((2^64 - 1) / count) is low by at most 2 (sum < 2^64), then corrected.
  uint64_t Mean() const {
    uint64_t q =
        static_cast<uint64_t>((static_cast<Uint128>(sum) * kRunReciprocals.of[count]) >> 64);
    // Two corrections, without a branch (a data-dependent loop here costs mispredictions).
    q += sum - q * count >= count ? 1 : 0;
    q += sum - q * count >= count ? 1 : 0;
    return q;
  }
};

// `escape` codes quotient - kUnarySteps + 1 when the unary part runs out (rare: shared by all
// classes, as is the model of each class's first run). `sign` (the step's, a fair coin) rides
// along with the raw low bits: one coder operation for both.
CTX_INLINE void EncodeRun(RangeEncoder& rc, RunModel& m, NumberModel& escape, uint64_t run,
                          uint32_t sign) {
  const int shift = m.shift;
  const uint64_t quotient = run >> shift;
  const uint64_t unary = std::min<uint64_t>(quotient, kUnarySteps);
  for (uint64_t i = 0; i < unary; ++i) rc.Encode(m.unary[i], 1);
  if (quotient < kUnarySteps) {
    rc.Encode(m.unary[quotient], 0);
  } else {
    EncodeNumber(rc, escape, quotient - kUnarySteps + 1);
  }
  const uint64_t low = shift > 0 ? run & ((uint64_t{1} << shift) - 1) : 0;
  rc.EncodeDirect((uint64_t{sign} << shift) | low, shift + 1);
  m.Observe(run);
}

CTX_INLINE uint64_t DecodeRun(RangeDecoder& rc, RunModel& m, NumberModel& escape, uint32_t* sign) {
  const int shift = m.shift;
  uint64_t quotient = 0;
  while (quotient < kUnarySteps && rc.Decode(m.unary[quotient]) != 0) ++quotient;
  if (quotient == kUnarySteps) quotient += DecodeNumber(rc, escape) - 1;  // wraps only if damaged
  const uint64_t direct = rc.DecodeDirect(shift + 1);
  *sign = static_cast<uint32_t>(direct >> shift);
  const uint64_t run = (quotient << shift) | (direct & ((uint64_t{1} << shift) - 1));
  m.Observe(run);
  return run;
}

// Every adaptive context of one record: runs per class, values (the one-step flag per class).
struct Models {
  explicit Models(uint32_t classes) : runs(classes), one_step(classes) {}
  std::vector<RunModel> runs;
  NumberModel first_run;  // each class's first run (from the start of the record)
  NumberModel long_run;   // the escape of runs whose quotient exceeds the unary part
  std::vector<Bit> one_step;
  NumberModel big_step;  // magnitude - 1 of steps other than one
};

// A step new - old in the ordered representation, as sign (bit kBits-1) and magnitude in
// [1, 2^(kBits-1)].
template <typename T>
CTX_INLINE void SplitStep(T old_bits, T new_bits, bool is_float, uint32_t* negative,
                          uint64_t* magnitude) {
  constexpr int kBits = sizeof(T) * 8;
  const T step = static_cast<T>(ToOrdered(new_bits, is_float) - ToOrdered(old_bits, is_float));
  *negative = static_cast<uint32_t>(step >> (kBits - 1));
  *magnitude = *negative ? static_cast<T>(T{0} - step) : step;
}

CTX_INLINE void EncodeMagnitude(RangeEncoder& rc, Models& m, uint32_t slot, uint64_t magnitude) {
  const uint32_t one = magnitude == 1 ? 1 : 0;
  rc.Encode(m.one_step[slot], one ^ 1);
  if (!one) EncodeNumber(rc, m.big_step, magnitude - 1);
}

// 0 when the coded magnitude exceeds 2^(kBits-1) (a damaged payload).
template <typename T>
CTX_INLINE uint64_t DecodeMagnitude(RangeDecoder& rc, Models& m, uint32_t slot) {
  constexpr int kBits = sizeof(T) * 8;
  if (rc.Decode(m.one_step[slot]) == 0) return 1;
  const uint64_t coded = DecodeNumber(rc, m.big_step);
  return coded >= (uint64_t{1} << (kBits - 1)) ? 0 : coded + 1;
}

// old_bits moved by `step` in the ordered representation (two's complement in the dtype's width).
template <typename T>
CTX_INLINE T AddOrderedStep(T old_bits, T step, bool is_float) {
  return FromOrdered(static_cast<T>(ToOrdered(old_bits, is_float) + step), is_float);
}

template <typename T>
CTX_INLINE T ApplyStep(T old_bits, uint32_t negative, uint64_t magnitude, bool is_float) {
  const T flip = static_cast<T>(T{0} - static_cast<T>(negative));  // negate without a branch
  return AddOrderedStep<T>(old_bits, static_cast<T>((static_cast<T>(magnitude) ^ flip) - flip),
                           is_float);
}

// ------------------------------------------------------------------ class counting (scalar)

// counts[s] += number of elements of slot s in old[from, to) (counts[kNoSlot]: of no slot). Four
// interleaved tables keep consecutive increments of one slot from waiting on each other.
template <typename T, typename ClassFn>
void CountSlots(const uint8_t* old, uint64_t from, uint64_t to, ClassFn cls, const Slots& slots,
                uint64_t (*counts)[kNumClasses + 1]) {
  uint64_t i = from;
  for (; i + 4 <= to; i += 4) {
    ++counts[0][slots.of[cls(LoadElem<T>(old, i))]];
    ++counts[1][slots.of[cls(LoadElem<T>(old, i + 1))]];
    ++counts[2][slots.of[cls(LoadElem<T>(old, i + 2))]];
    ++counts[3][slots.of[cls(LoadElem<T>(old, i + 3))]];
  }
  for (; i < to; ++i) ++counts[0][slots.of[cls(LoadElem<T>(old, i))]];
}

// ------------------------------------------------------------------ paths

// How the elements are walked. The scalar path counts every element's class one by one and is
// the reference; the block paths take 64 elements at a time (their class bytes in one vector, a
// compare and a popcount per class of the record's range, see ctx_blocks.h). Every path produces
// the same payload and the same bits.
enum class Path { kScalar, kAvx2, kAvx512 };

// Block paths count the slots one compare each: beyond this many, scalar.
constexpr uint32_t kMaxBlockSlots = 64;

Path PathFor(kernels::SimdLevel level) {
#if defined(__x86_64__)
  // The block paths also use popcnt (and pdep with AVX-512), which dispatch.h does not check.
  static const bool kPopcnt = __builtin_cpu_supports("popcnt");
  static const bool kBmi2 = __builtin_cpu_supports("bmi2");
  if (level >= kernels::SimdLevel::kAvx512 &&
      kernels::SimdLevelSupported(kernels::SimdLevel::kAvx512) && kPopcnt && kBmi2) {
    return Path::kAvx512;
  }
  if (level >= kernels::SimdLevel::kAvx2 &&
      kernels::SimdLevelSupported(kernels::SimdLevel::kAvx2) && kPopcnt) {
    return Path::kAvx2;
  }
#else
  (void)level;
#endif
  return Path::kScalar;
}

// ------------------------------------------------------------------ encode / decode bodies

struct Header {
  uint8_t mode = kModeCoded;
  int32_t dtype = 0;
  uint32_t class_lo = 0;
  uint32_t class_hi = 0;
  uint64_t n = 0;
  uint64_t k = 0;
};

// Per-thread encoder scratch, reused across calls: a fresh multi-MB allocation per record costs
// more in page faults than the coding itself.
template <typename T>
struct EncodeScratch {
  std::vector<uint8_t> classes;  // of each change's old value, then its slot
  std::vector<uint64_t> runs;    // slot members before each change since the previous one
  std::vector<T> olds;           // the changed elements' old and new bits
  std::vector<T> news;

  void Reserve(uint64_t k) {
    if (classes.size() < k) {
      classes.resize(k);
      runs.resize(k);
      olds.resize(k);
      news.resize(k);
    }
  }
  // Keeps a small record's scratch, not a huge one's.
  void Trim() {
    constexpr uint64_t kRetainedScratchChanges = uint64_t{1} << 20;
    if (classes.size() > kRetainedScratchChanges) *this = EncodeScratch();
  }
};

// The run of unchanged slot members before every change since the slot's previous one (the
// scalar path: looks up every element's slot). s.classes holds each change's slot. counts[s]
// ends as the population of slot s.
template <typename T, typename ClassFn>
void RankScalar(const refit_encode_input_t& in, ClassFn cls, const Slots& slots,
                EncodeScratch<T>& s, uint64_t* counts) {
  const auto* old = static_cast<const uint8_t*>(in.old_bits);
  const uint64_t* pos = in.positions;
  auto table = std::make_unique<uint64_t[][kNumClasses + 1]>(4);  // zeroed
  uint64_t next_rank[kNumClasses] = {};
  uint64_t next = 0;
  for (uint64_t j = 0; j < in.n_changed; ++j) {
    const uint64_t p = pos[j];
    CountSlots<T>(old, next, p, cls, slots, table.get());
    const uint32_t slot = s.classes[j];
    const uint64_t rank = table[0][slot] + table[1][slot] + table[2][slot] + table[3][slot];
    s.runs[j] = rank - next_rank[slot];
    next_rank[slot] = rank + 1;
    ++table[0][slot];
    next = p + 1;
  }
  CountSlots<T>(old, next, in.n_elems, cls, slots, table.get());
  for (uint32_t slot = 0; slot < slots.count; ++slot) {
    counts[slot] = table[0][slot] + table[1][slot] + table[2][slot] + table[3][slot];
  }
}

#if defined(__x86_64__)
// Classes of the 64-element block at `base` of bits[0, n) into *v; returns the mask of elements
// that exist (the last, partial block is read from a zero-padded copy in `tail`).
template <typename T, typename Ops, typename ClassFn>
CTX_INLINE uint64_t LoadBlock(const uint8_t* bits, uint64_t base, uint64_t n, ClassFn cls,
                              uint8_t* tail, typename Ops::Classes* v) {
  const uint8_t* src = bits + base * sizeof(T);
  uint64_t valid = ~uint64_t{0};
  if (n - base < kBlockElems) {
    std::memcpy(tail, src, (n - base) * sizeof(T));
    src = tail;
    valid = (uint64_t{1} << (n - base)) - 1;
  }
  Ops::template Load<T>(src, cls, v);
  return valid;
}

// The block path of RankScalar: counts the slots per block of 64 elements and ranks each change
// within its block by a popcount below it.
template <typename T, typename ClassFn, typename Ops>
CTX_INLINE void RankBlocks(const refit_encode_input_t& in, ClassFn cls, const Slots& slots,
                           EncodeScratch<T>& s, uint64_t* counts) {
  const auto* old = static_cast<const uint8_t*>(in.old_bits);
  const uint64_t n = in.n_elems;
  const uint64_t k = in.n_changed;
  const uint64_t* pos = in.positions;
  uint64_t count[kMaxBlockSlots] = {};
  uint64_t next_rank[kMaxBlockSlots] = {};
  uint64_t j = 0;
  alignas(64) uint8_t tail[kBlockElems * sizeof(T)] = {};
  for (uint64_t base = 0; base < n; base += kBlockElems) {
    typename Ops::Classes v;
    const uint64_t valid = LoadBlock<T, Ops>(old, base, n, cls, tail, &v);
    for (; j < k && pos[j] - base < kBlockElems; ++j) {
      const uint32_t slot = s.classes[j];
      const uint64_t below = (uint64_t{1} << (pos[j] - base)) - 1;
      const uint64_t rank = count[slot] + Ops::Pop(Ops::Mask(v, slots.range[slot]) & below);
      s.runs[j] = rank - next_rank[slot];
      next_rank[slot] = rank + 1;
    }
    for (uint32_t slot = 0; slot < slots.count; ++slot) {
      count[slot] += Ops::Pop(Ops::Mask(v, slots.range[slot]) & valid);
    }
  }
  for (uint32_t slot = 0; slot < slots.count; ++slot) counts[slot] = count[slot];
}

template <typename T, typename ClassFn>
CTX_TARGET_AVX2 __attribute__((flatten)) void RankBlocksAvx2(const refit_encode_input_t& in,
                                                             ClassFn cls, const Slots& slots,
                                                             EncodeScratch<T>& s,
                                                             uint64_t* counts) {
  RankBlocks<T, ClassFn, Avx2Ops>(in, cls, slots, s, counts);
}
template <typename T, typename ClassFn>
CTX_TARGET_AVX512 __attribute__((flatten)) void RankBlocksAvx512(const refit_encode_input_t& in,
                                                                 ClassFn cls, const Slots& slots,
                                                                 EncodeScratch<T>& s,
                                                                 uint64_t* counts) {
  RankBlocks<T, ClassFn, Avx512Ops>(in, cls, slots, s, counts);
}
#endif

// The adaptive form (mode 0, one slot per class of [lo, hi]): every slot's first run, then per
// change its step and the run to its slot's next change, all through the adaptive binary range
// coder. s.runs holds each change's run to its slot's next change.
template <typename T>
uint64_t EncodeAdaptive(const DTypeSpec& spec, const Slots& slots, EncodeScratch<T>& s, uint64_t k,
                        const uint64_t* first_runs, uint8_t* out, uint64_t cap) {
  Models models(slots.count);
  RangeEncoder rc(out, cap);
  for (uint32_t slot = 0; slot < slots.count; ++slot) {
    EncodeNumber(rc, models.first_run, first_runs[slot] + 1);
  }
  for (uint64_t j = 0; j < k; ++j) {
    const uint32_t slot = s.classes[j];
    uint32_t negative;
    uint64_t magnitude;
    SplitStep<T>(s.olds[j], s.news[j], spec.is_float, &negative, &magnitude);
    EncodeMagnitude(rc, models, slot, magnitude);
    EncodeRun(rc, models.runs[slot], models.long_run, s.runs[j], negative);
  }
  rc.Finish();
  return rc.size();
}

// ------------------------------------------------------------------ table-coded form (mode 2)
//
// Changes in class-major order (every change of the lowest class in position order, then the
// next class, ...), so that the decoder can decode them all before walking the elements. Per
// change one symbol from its class's table: the bucket of run + 1 (ctx_tables.h) and whether the
// step is other than one (2 x 128 symbols); such a step then has a symbol from the shared table
// of step buckets (bucket of magnitude - 1). The raw stream holds, per change, the big step's
// low bits (if any), then the step's sign and the run's low bits.

constexpr uint32_t kJointSymbols = 2 * tables::kBuckets;
constexpr uint32_t kBigSymbols = tables::kBuckets;

// Writes one table (varint m, 0 for an empty table; else varint first symbol, then the m
// quantized frequencies of symbols first .. first + m - 1, the first and last nonzero) and sets
// freq to the frequencies both sides code with.
void PutTable(const uint64_t* counts, uint32_t n, std::vector<uint8_t>* out, uint32_t* freq) {
  uint32_t first = n;
  uint32_t last = 0;
  for (uint32_t s = 0; s < n; ++s) {
    if (counts[s] == 0) continue;
    first = std::min(first, s);
    last = s;
  }
  uint8_t varint[kMaxVarintBytes];
  if (first == n) {
    out->push_back(0);
    std::fill(freq, freq + n, 0);
    return;
  }
  uint32_t normalized[kJointSymbols];
  tables::NormalizeFrequencies(counts, n, normalized);
  uint8_t quantized[kJointSymbols] = {};
  for (uint32_t s = first; s <= last; ++s) quantized[s] = tables::QuantizeFrequency(normalized[s]);
  out->insert(out->end(), varint, PutVarint(varint, last - first + 1));
  out->insert(out->end(), varint, PutVarint(varint, first));
  out->insert(out->end(), quantized + first, quantized + last + 1);
  tables::FrequenciesFromQuantized(quantized, n, freq);
}

// Reads one table written by PutTable into freq[0, n); false when malformed. An empty table
// decodes symbol 0 at no cost (a valid payload never reads it).
bool GetTable(const uint8_t* p, uint64_t len, uint64_t* pos, uint32_t n, uint32_t* freq) {
  uint64_t m = 0;
  uint64_t first = 0;
  if (!GetVarint(p, len, pos, &m)) return false;
  std::fill(freq, freq + n, 0);
  if (m == 0) {
    freq[0] = tables::kTotal;
    return true;
  }
  if (!GetVarint(p, len, pos, &first) || first >= n || m > n - first || len - *pos < m) {
    return false;
  }
  uint8_t quantized[kJointSymbols] = {};
  for (uint64_t i = 0; i < m; ++i) {
    const uint8_t q = p[*pos + i];
    if (q > tables::kMaxQuantized) return false;
    quantized[first + i] = q;
  }
  *pos += m;
  if (quantized[first] == 0 || quantized[first + m - 1] == 0) return false;
  tables::FrequenciesFromQuantized(quantized, n, freq);
  return true;
}

// Bits of coding `counts` with `freq` (infinite when a counted symbol has no frequency).
double CodedBits(const uint64_t* counts, const uint32_t* freq, uint32_t n) {
  double bits = 0;
  for (uint32_t s = 0; s < n; ++s) {
    if (counts[s] == 0) continue;
    if (freq[s] == 0) return std::numeric_limits<double>::infinity();
    bits += static_cast<double>(counts[s]) * (tables::kPrecision - std::log2(freq[s]));
  }
  return bits;
}

constexpr uint8_t kTableExplicit = 0;
constexpr uint8_t kTableGeometric = 1;

// A slot's joint table (format 4): a kind byte, then the explicit table (PutTable) or the
// geometric one's rate and share of big steps (tables::GeometricWeights), whichever codes the
// slot's symbols in fewer bits, table included. `changes` / `run_sum` / `big` are the slot's
// change count, sum of runs and steps other than one. Sets freq like PutTable.
void PutSlotTable(const uint64_t* counts, uint64_t changes, uint64_t run_sum, uint64_t big,
                  bool explicit_only, std::vector<uint8_t>* out, uint32_t* freq) {
  const size_t start = out->size();
  out->push_back(kTableExplicit);
  PutTable(counts, kJointSymbols, out, freq);
  if (explicit_only || changes == 0) return;
  // Maximum likelihood: p = changes / (changes + runs), big share = big / changes; rounded,
  // clamped so that a present kind of step keeps a nonzero share.
  __extension__ typedef unsigned __int128 Wide;
  const auto rate = static_cast<uint32_t>(std::clamp<uint64_t>(
      static_cast<uint64_t>((Wide{changes} << tables::kRateBits) / (changes + run_sum)), 1,
      tables::kMaxRate));
  const auto share = static_cast<uint32_t>(
      std::clamp<uint64_t>((big * tables::kTotal + changes / 2) / changes, big > 0 ? 1 : 0,
                           big < changes ? tables::kTotal - 1 : tables::kTotal));
  uint64_t weights[kJointSymbols];
  uint32_t geometric[kJointSymbols];
  tables::GeometricWeights(rate, share, weights);
  tables::NormalizeFrequencies(weights, kJointSymbols, geometric);
  uint8_t header[1 + 2 * kMaxVarintBytes];
  header[0] = kTableGeometric;
  const uint64_t header_bytes =
      static_cast<uint64_t>(PutVarint(PutVarint(header + 1, rate), share) - header);
  const double explicit_bits =
      CodedBits(counts, freq, kJointSymbols) + 8.0 * static_cast<double>(out->size() - start);
  const double geometric_bits =
      CodedBits(counts, geometric, kJointSymbols) + 8.0 * static_cast<double>(header_bytes);
  if (geometric_bits < explicit_bits) {
    out->resize(start);
    out->insert(out->end(), header, header + header_bytes);
    std::copy(geometric, geometric + kJointSymbols, freq);
  }
}

// Reads a table written by PutSlotTable into freq[0, kJointSymbols); false when malformed.
bool GetSlotTable(const uint8_t* p, uint64_t len, uint64_t* pos, uint32_t* freq) {
  if (*pos >= len) return false;
  const uint8_t kind = p[(*pos)++];
  if (kind == kTableExplicit) return GetTable(p, len, pos, kJointSymbols, freq);
  uint64_t rate = 0;
  uint64_t share = 0;
  if (kind != kTableGeometric || !GetVarint(p, len, pos, &rate) ||
      !GetVarint(p, len, pos, &share) || rate == 0 || rate > tables::kMaxRate ||
      share > tables::kTotal) {
    return false;
  }
  uint64_t weights[kJointSymbols];
  tables::GeometricWeights(static_cast<uint32_t>(rate), static_cast<uint32_t>(share), weights);
  tables::NormalizeFrequencies(weights, kJointSymbols, freq);
  return true;
}

struct TableEncodeScratch {
  std::vector<uint64_t> order;   // the changes in class-major order
  std::vector<uint8_t> joint;    // each change's joint symbol (class-major)
  std::vector<uint8_t> big;      // each change's step bucket (when its step is not one)
  std::vector<uint64_t> counts;  // per class slot kJointSymbols, then the step buckets
  std::vector<uint32_t> freq;    // the same layout: what is coded with
  std::vector<uint16_t> words;   // rANS output, in reverse read order
  std::vector<uint8_t> raw;      // raw bit stream
  std::vector<uint8_t> header;   // first runs and tables

  void Trim() {
    constexpr uint64_t kRetainedScratchChanges = uint64_t{1} << 20;
    if (order.size() > kRetainedScratchChanges) *this = TableEncodeScratch();
  }
};

// This thread's scratch of type S, returned from a function that is not inlined: the caller
// holds a plain pointer. A thread_local named in the hot code of a shared library costs a
// __tls_get_addr call per use (GCC rematerializes the address even through a reference: 53 calls
// in EncodeTables, 2-4% of a send's CPU in perf).
template <typename S>
[[gnu::noinline]] S& ThreadScratch() {
  thread_local S scratch;
  return scratch;
}

template <typename T>
uint64_t EncodeTables(const DTypeSpec& spec, const Slots& slot_ranges, EncodeScratch<T>& s,
                      uint64_t k, const uint64_t* first_runs, bool explicit_only, uint8_t* out,
                      uint64_t cap) {
  TableEncodeScratch& t = ThreadScratch<TableEncodeScratch>();
  const uint32_t slots = slot_ranges.count;
  t.order.resize(k);
  t.joint.resize(k);
  t.big.resize(k);
  t.counts.assign(uint64_t{slots + 1} * kJointSymbols, 0);
  t.freq.assign(uint64_t{slots + 1} * kJointSymbols, 0);
  t.words.clear();
  t.raw.clear();
  t.header.clear();
  // Slot-major order (a counting sort of the changes by slot, stable).
  std::vector<uint64_t> per_slot(slots + 1, 0);
  for (uint64_t j = 0; j < k; ++j) ++per_slot[s.classes[j] + 1];
  for (uint32_t slot = 0; slot < slots; ++slot) per_slot[slot + 1] += per_slot[slot];
  {
    std::vector<uint64_t> fill(per_slot.begin(), per_slot.end() - 1);
    for (uint64_t j = 0; j < k; ++j) t.order[fill[s.classes[j]]++] = j;
  }
  uint64_t* big_counts = t.counts.data() + uint64_t{slots} * kJointSymbols;
  uint64_t big_steps = 0;
  uint64_t run_sums[kNumClasses] = {};  // per slot (for its geometric table)
  uint64_t slot_bigs[kNumClasses] = {};
  {
    tables::BitWriter raw(&t.raw);
    for (uint64_t o = 0; o < k; ++o) {
      const uint64_t j = t.order[o];
      const uint32_t slot = s.classes[j];
      uint32_t negative;
      uint64_t magnitude;
      SplitStep<T>(s.olds[j], s.news[j], spec.is_float, &negative, &magnitude);
      const uint32_t big = magnitude != 1 ? 1 : 0;
      if (big) {
        const tables::Bucketed b = tables::BucketOf(magnitude - 1);
        t.big[o] = static_cast<uint8_t>(b.bucket);
        ++big_counts[b.bucket];
        ++big_steps;
        ++slot_bigs[slot];
        if (b.bucket == tables::kEscapeBucket) {
          raw.PutEscaped(magnitude - 1);
        } else {
          raw.Put(b.low, b.extra);
        }
      }
      const uint64_t u = s.runs[j] + 1;
      run_sums[slot] += s.runs[j];
      const tables::Bucketed r = tables::BucketOf(u);
      const uint32_t sym = r.bucket * 2 + big;
      t.joint[o] = static_cast<uint8_t>(sym);
      ++t.counts[uint64_t{slot} * kJointSymbols + sym];
      if (r.bucket == tables::kEscapeBucket) {
        raw.Put(negative, 1);
        raw.PutEscaped(u);
      } else {
        raw.Put(negative | (r.low << 1), r.extra + 1);
      }
    }
    raw.Finish();
  }

  // The slots (count - 1, then each one's first and last class), then per slot its first run.
  t.header.push_back(static_cast<uint8_t>(slots - 1));
  for (uint32_t slot = 0; slot < slots; ++slot) {
    t.header.push_back(slot_ranges.range[slot].first);
    t.header.push_back(static_cast<uint8_t>(slot_ranges.Last(slot)));
  }
  uint8_t varint[kMaxVarintBytes];
  for (uint32_t slot = 0; slot < slots; ++slot) {
    t.header.insert(t.header.end(), varint, PutVarint(varint, first_runs[slot]));
  }
  for (uint32_t slot = 0; slot < slots; ++slot) {
    t.header.insert(t.header.end(), varint, PutVarint(varint, per_slot[slot + 1] - per_slot[slot]));
  }
  for (uint32_t slot = 0; slot < slots; ++slot) {
    PutSlotTable(t.counts.data() + uint64_t{slot} * kJointSymbols,
                 per_slot[slot + 1] - per_slot[slot], run_sums[slot], slot_bigs[slot],
                 explicit_only, &t.header, t.freq.data() + uint64_t{slot} * kJointSymbols);
  }
  uint32_t* big_freq = t.freq.data() + uint64_t{slots} * kJointSymbols;
  PutTable(big_counts, kBigSymbols, &t.header, big_freq);

  // Cumulative starts, in place of the counts (no longer needed).
  std::vector<tables::EncSymbol> enc(uint64_t{slots + 1} * kJointSymbols);
  for (uint64_t table = 0; table <= slots; ++table) {
    uint32_t start = 0;
    for (uint32_t sym = 0; sym < kJointSymbols; ++sym) {
      const uint32_t f = t.freq[table * kJointSymbols + sym];
      enc[table * kJointSymbols + sym] = {f, start};
      start += f;
    }
  }
  // Symbols in reverse decode order; symbol number i (in decode order) uses state i & 1.
  uint32_t state[2] = {tables::kStateLow, tables::kStateLow};
  uint64_t index = k + big_steps;
  const tables::EncSymbol* enc_big = enc.data() + uint64_t{slots} * kJointSymbols;
  for (uint64_t o = k; o-- > 0;) {
    const uint32_t sym = t.joint[o];
    if (sym & 1) {
      --index;
      tables::RansPut(&state[index & 1], enc_big[t.big[o]], &t.words);
    }
    --index;
    const uint64_t slot = s.classes[t.order[o]];
    tables::RansPut(&state[index & 1], enc[slot * kJointSymbols + sym], &t.words);
  }

  const uint64_t rans_bytes = 8 + 2 * uint64_t{t.words.size()};
  const uint64_t size =
      t.header.size() + VarintSize(rans_bytes) + rans_bytes + uint64_t{t.raw.size()};
  if (size <= cap) {
    uint8_t* p = out;
    std::memcpy(p, t.header.data(), t.header.size());
    p = PutVarint(p + t.header.size(), rans_bytes);
    StoreLE<uint32_t>(p, state[0]);
    StoreLE<uint32_t>(p + 4, state[1]);
    p += 8;
    for (uint64_t w = t.words.size(); w-- > 0; p += 2) StoreLE<uint16_t>(p, t.words[w]);
    if (!t.raw.empty()) std::memcpy(p, t.raw.data(), t.raw.size());
  }
  t.Trim();
  return size;
}

[[gnu::noinline]] Status BadPosition(uint64_t j, uint64_t p) {
  return Status::Invalid("position " + std::to_string(j) + " (" + std::to_string(p) +
                         ") is out of range or not strictly increasing");
}

// ------------------------------------------------------------------ slot choice (table form)
//
// Per-class runs pay off when the classes' change rates differ (real deltas: the rate about
// halves per exponent step, and so does the size of a step in ULPs); every slot with changes
// costs the decoder a counting pass over the record and the payload a table. The encoder starts
// from one slot per class with changes and merges where that costs little: one slot of every
// class (no counting at all, runs are plain distances) when that is within kMergeBudget of the
// per-class estimate, else adjacent slots, cheapest first, while the total stays within it.
// Sizes are estimated as the positions' entropy (class populations sampled every
// kSampleStride-th block) plus the entropy of the steps' bit lengths; the choice only moves size
// and speed, never what is decoded.

constexpr double kMergeBudget = 0.003;  // of the per-class estimate
constexpr double kSlotBits = 8.0 * 24;  // a slot's typical header: range, counts, table
constexpr uint64_t kSampleStride = 64;  // blocks of kBlockElems
constexpr uint32_t kStepLengths = 16;   // bit lengths of step magnitudes, the last one "or more"

// Per class, how many changes have each step length (this thread's, reused).
struct StepLengths {
  uint32_t counts[kNumClasses][kStepLengths];
};

// A change's step length symbol for ChooseSlots.
template <typename T>
CTX_INLINE uint32_t StepLength(T old_bits, T new_bits, bool is_float) {
  uint32_t negative;
  uint64_t magnitude;
  SplitStep<T>(old_bits, new_bits, is_float, &negative, &magnitude);
  return std::min<uint32_t>(static_cast<uint32_t>(std::bit_width(magnitude)), kStepLengths - 1);
}

// The empirical entropy, in bits, of a histogram.
double HistogramBits(const uint32_t* counts, uint32_t n) {
  double total = 0;
  for (uint32_t i = 0; i < n; ++i) total += counts[i];
  double bits = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (counts[i] > 0) bits += counts[i] * std::log2(total / counts[i]);
  }
  return bits;
}

// log2 C(n, k) by its entropy approximation n H(k / n).
double PositionBits(double n, double k) {
  if (k <= 0 || k >= n) return 0;
  const double p = k / n;
  return -n * (p * std::log2(p) + (1 - p) * std::log2(1 - p));
}

// changes[c]: the changes of class c; lengths[c]: their step lengths' histogram; lo / hi: the
// classes of the lowest and highest change.
template <typename T, typename ClassFn>
Slots ChooseSlots(const uint8_t* old, uint64_t n, ClassFn cls, const uint64_t* changes,
                  const uint32_t (*lengths)[kStepLengths], uint32_t lo, uint32_t hi) {
  Slots slots;
  uint64_t sampled[kNumClasses] = {};
  uint64_t taken = 0;
  constexpr uint64_t kStep = kSampleStride * kBlockElems;
  constexpr uint64_t kPrefetchAhead = 4 * kStep;  // the samples miss every cache
  for (uint64_t base = 0; base < n; base += kStep) {
    if (base + kPrefetchAhead < n) {
      __builtin_prefetch(old + (base + kPrefetchAhead) * sizeof(T));
      __builtin_prefetch(old + (base + kPrefetchAhead) * sizeof(T) + 64);
    }
    const uint64_t end = std::min(n, base + kBlockElems);
    for (uint64_t i = base; i < end; ++i) ++sampled[cls(LoadElem<T>(old, i))];
    taken += end - base;
  }
  // members_below[c]: estimated members of the classes below c.
  double members_below[kNumClasses + 1] = {};
  for (uint32_t c = 0; c < kNumClasses; ++c) {
    const double estimate = static_cast<double>(sampled[c]) * static_cast<double>(n) /
                            static_cast<double>(std::max<uint64_t>(taken, 1));
    members_below[c + 1] = members_below[c] + std::max(estimate, static_cast<double>(changes[c]));
  }
  struct Group {
    uint32_t first, last;
    uint64_t changes;
    uint32_t lengths[kStepLengths];
    double bits;
  };
  auto make = [&](uint32_t first, uint32_t last) {
    Group g{first, last, 0, {}, kSlotBits};
    for (uint32_t c = first; c <= last; ++c) {
      g.changes += changes[c];
      for (uint32_t b = 0; b < kStepLengths; ++b) g.lengths[b] += lengths[c][b];
    }
    const double members = members_below[last + 1] - members_below[first];
    g.bits += PositionBits(members, static_cast<double>(g.changes)) +
              HistogramBits(g.lengths, kStepLengths);
    return g;
  };
  std::vector<Group> groups;
  double bits = 0;
  for (uint32_t c = lo; c <= hi; ++c) {
    if (changes[c] == 0) continue;
    groups.push_back(make(c, c));
    bits += groups.back().bits;
  }
  const double budget = kMergeBudget * bits;
  const Group all = make(lo, hi);
  const double everything = PositionBits(static_cast<double>(n), static_cast<double>(all.changes)) +
                            HistogramBits(all.lengths, kStepLengths) + kSlotBits;
  if (everything <= bits + budget) {
    slots.count = 1;
    slots.range[0] = {0, static_cast<uint8_t>(cls.Max())};
    return slots;
  }
  double spent = 0;
  while (groups.size() > 1) {
    size_t best = 0;
    double best_loss = 0;
    Group best_merged{};
    for (size_t g = 0; g + 1 < groups.size(); ++g) {
      const Group merged = make(groups[g].first, groups[g + 1].last);
      const double loss = merged.bits - groups[g].bits - groups[g + 1].bits;
      if (g == 0 || loss < best_loss) {
        best = g;
        best_loss = loss;
        best_merged = merged;
      }
    }
    if (spent + best_loss > budget) break;
    spent += best_loss;
    groups[best] = best_merged;
    groups.erase(groups.begin() + static_cast<ptrdiff_t>(best) + 1);
  }
  for (const Group& g : groups) {
    slots.range[slots.count++] = {static_cast<uint8_t>(g.first),
                                  static_cast<uint8_t>(g.last - g.first)};
  }
  return slots;
}

// Codes the coded-mode body into out[0, cap); returns its size (> cap when it did not fit).
// Sets the covered class range and the mode (adaptive or tables) in *h.
template <typename T, typename ClassFn>
Result<uint64_t> EncodeBody(Path path, CodedForm form, const refit_encode_input_t& in,
                            const DTypeSpec& spec, ClassFn cls, Header* h, uint8_t* out,
                            uint64_t cap) {
  const uint64_t n = in.n_elems;
  const uint64_t k = in.n_changed;
  const uint64_t* pos = in.positions;
  if (k == 0) {
    h->class_lo = h->class_hi = 0;
    return uint64_t{0};
  }
  EncodeScratch<T>& s = ThreadScratch<EncodeScratch<T>>();
  s.Reserve(k);
  // The changes first: their old and new bits and classes (which give the slots).
  const auto* old = static_cast<const uint8_t*>(in.old_bits);
  const auto* neu = static_cast<const uint8_t*>(in.new_bits);
  const bool per_class = form == CodedForm::kTablesPerClass;
  const bool explicit_only = form == CodedForm::kTablesExplicit;
  const bool use_tables = form == CodedForm::kTables || per_class || explicit_only ||
                          (form == CodedForm::kAuto && k >= kTableMinChanges);
  uint64_t class_changes[kNumClasses] = {};
  auto& step_lengths = ThreadScratch<StepLengths>().counts;  // table form only
  if (use_tables) std::memset(step_lengths, 0, sizeof(step_lengths));
  uint32_t lo = kNumClasses - 1;
  uint32_t hi = 0;
  constexpr uint64_t kPrefetchAhead = 64;
  // The host's packed copies when it gave them (ABI 1.2): no cache miss per change.
  const uint8_t* old_values = sdk::PackedOldValues(in);
  const uint8_t* new_values = sdk::PackedNewValues(in);
  const bool packed = old_values != nullptr && new_values != nullptr;
  for (uint64_t j = 0; j < k; ++j) {
    const uint64_t p = pos[j];
    if (p >= n || (j > 0 && p <= pos[j - 1])) return BadPosition(j, p);
    if (!packed && j + kPrefetchAhead < k) {
      __builtin_prefetch(old + pos[j + kPrefetchAhead] * sizeof(T));
      __builtin_prefetch(neu + pos[j + kPrefetchAhead] * sizeof(T));
    }
    const T old_bits = packed ? LoadElem<T>(old_values, j) : LoadElem<T>(old, p);
    const T new_bits = packed ? LoadElem<T>(new_values, j) : LoadElem<T>(neu, p);
    s.olds[j] = old_bits;
    s.news[j] = new_bits;
    const uint32_t c = cls(old_bits);
    s.classes[j] = static_cast<uint8_t>(c);
    ++class_changes[c];
    if (use_tables) ++step_lengths[c][StepLength(old_bits, new_bits, spec.is_float)];
    lo = std::min(lo, c);
    hi = std::max(hi, c);
  }
  Slots slots = use_tables && !per_class
                    ? ChooseSlots<T>(old, n, cls, class_changes, step_lengths, lo, hi)
                    : Slots::Identity(lo, hi);
  slots.Index(cls.Max());
  for (uint64_t j = 0; j < k; ++j) s.classes[j] = static_cast<uint8_t>(slots.of[s.classes[j]]);

  // Then the runs of each slot's members between its changes.
  uint64_t counts[kNumClasses] = {};  // each slot's population
  if (slots.everything) {
    for (uint64_t j = 0; j < k; ++j) s.runs[j] = pos[j] - (j == 0 ? 0 : pos[j - 1] + 1);
    counts[0] = n;
  } else if (path != Path::kScalar && slots.count <= kMaxBlockSlots) {
#if defined(__x86_64__)
    // (Single-class dtypes always have one slot of everything.)
    if constexpr (!ClassFn::kSingle) {
      if (path == Path::kAvx512) {
        RankBlocksAvx512<T>(in, cls, slots, s, counts);
      } else {
        RankBlocksAvx2<T>(in, cls, slots, s, counts);
      }
    }
#endif
  } else {
    RankScalar<T>(in, cls, slots, s, counts);
  }
  h->class_lo = slots.range[0].first;
  h->class_hi = slots.Last(slots.count - 1);

  // Backward: each change carries the run to its slot's next change; the run after a slot's
  // last change reaches past the end (never hit); pending ends as each first run.
  uint64_t pending[kNumClasses] = {};
  uint64_t next_rank[kNumClasses] = {};
  for (uint64_t j = 0; j < k; ++j) next_rank[s.classes[j]] += s.runs[j] + 1;
  for (uint32_t slot = 0; slot < slots.count; ++slot)
    pending[slot] = counts[slot] - next_rank[slot];
  for (uint64_t j = k; j-- > 0;) {
    const uint64_t run = s.runs[j];
    s.runs[j] = pending[s.classes[j]];
    pending[s.classes[j]] = run;
  }

  h->mode = use_tables ? kModeTables : kModeCoded;
  uint64_t size;
  if (use_tables) {
    size = EncodeTables<T>(spec, slots, s, k, pending, explicit_only, out, cap);
  } else {
    size = EncodeAdaptive<T>(spec, slots, s, k, pending, out, cap);
  }
  s.Trim();
  return size;
}

[[gnu::noinline]] Status StepTooLarge(uint64_t i) {
  return Status::Corrupt(
      "ctx payload codes a step larger than the dtype (or a malformed value) at "
      "element " +
      std::to_string(i));
}

// ------------------------------------------------------------------ decoders
//
// The walks below are shared by both coded forms: a Coder decodes one change of a class slot,
// Next<T>(slot, &negative, &magnitude) -> the run of class members to the class's next change,
// with magnitude 0 for an impossible step (nothing is applied then).

// The adaptive form: the range coder and its models.
struct AdaptiveCoder {
  RangeDecoder rc;
  Models* models;

  template <typename T>
  CTX_INLINE uint64_t Next(uint32_t slot, uint32_t* negative, uint64_t* magnitude) {
    *magnitude = DecodeMagnitude<T>(rc, *models, slot);
    if (*magnitude == 0) return 0;
    return DecodeRun(rc, models->runs[slot], models->long_run, negative);
  }
  bool ConsumedExactly() const { return rc.ConsumedExactly(); }
};

// The table form's streams: two interleaved rANS states over one word stream, decode tables per
// class slot (kTotal entries each) and the shared step-bucket table, and the raw bit stream
// (DecodeClassChanges reads them).
// Its symbols are in class-major order (all changes of the lowest class, then the next, ...), so
// the whole record is decoded up front, one class table at a time (in L1), into arrays that the
// walk then consumes: no coder on the walk's critical path.
struct TableStreams {
  const uint8_t* words;
  uint64_t words_len;
  uint64_t word_pos;
  uint32_t x0;  // the state of the next symbol
  uint32_t x1;
  tables::BitReader raw;

  bool ConsumedExactly() const {
    return word_pos == words_len && x0 == tables::kStateLow && x1 == tables::kStateLow &&
           raw.ConsumedExactly();
  }
};

// A decoded change of the table form: the run to its class's next change and its step in the
// ordered representation (two's complement in the dtype's width; 0: an impossible step).
struct DecodedChange {
  // Not zeroed: the scratch grows by resize, and every entry is decoded before it is read.
  DecodedChange() {}  // NOLINT(modernize-use-equals-default): = default would zero on resize
  uint64_t run;
  uint64_t step;
};

// The escape's bits (BitReader::GetEscaped) on a copy of the reader: GetEscaped is not inlined,
// and a reader whose address it took would live on the stack for the whole loop.
CTX_NOINLINE uint64_t GetEscapedFrom(tables::BitReader* raw) {
  tables::BitReader copy = *raw;
  const uint64_t u = copy.GetEscaped();
  *raw = copy;
  return u;
}

// Decodes the `count` changes of one class slot into runs / magnitudes / signs; false when one
// codes an impossible step or a malformed escape.
template <typename T>
bool DecodeClassChanges(TableStreams& streams, const uint32_t* table, const uint32_t* big,
                        uint64_t count, DecodedChange* out) {
  constexpr int kBits = sizeof(T) * 8;
  // The coder's state in locals, not in `streams`: the stores to `out` could alias a struct
  // reached through a reference, and a struct whose address escapes stays in memory, so every
  // symbol would wait on a store and a reload of its state.
  const uint8_t* const words = streams.words;
  const uint64_t words_len = streams.words_len;
  uint64_t word_pos = streams.word_pos;
  uint32_t x0 = streams.x0;
  uint32_t x1 = streams.x1;
  tables::BitReader raw = streams.raw;
  const auto symbol = [&](const uint32_t* t) CTX_INLINE_LAMBDA {
    const uint32_t e = t[x0 & (tables::kTotal - 1)];
    uint32_t x = (((e >> 8) & (tables::kTotal - 1)) + 1) * (x0 >> tables::kPrecision) + (e >> 20);
    // Branch-free renormalization (taken for about a quarter of the symbols, unpredictably);
    // past the end of the words it reads zeros and the position shows the overrun.
    static constexpr uint8_t kZeros[2] = {};
    const uint8_t* src = word_pos + 2 <= words_len ? words + word_pos : kZeros;
    const uint32_t w = tables::LoadLE<uint16_t>(src);
    const uint32_t renormalize = x < tables::kStateLow ? 1 : 0;
    x = (x << (renormalize * 16)) | (w & (0u - renormalize));
    word_pos += renormalize * 2;
    x0 = x1;
    x1 = x;
    return e & 0xff;
  };
  bool ok = true;
  for (uint64_t j = 0; j < count; ++j) {
    const uint32_t sym = symbol(table);
    uint64_t magnitude = 1;
    if (sym & 1) {
      const uint32_t b = symbol(big);
      const uint64_t u = b == tables::kEscapeBucket ? GetEscapedFrom(&raw)
                                                    : tables::kBucketTable.base[b] +
                                                          raw.Get(tables::kBucketTable.extra[b]);
      // u == 0: a malformed escape.
      magnitude = u == 0 || u >= (uint64_t{1} << (kBits - 1)) ? 0 : u + 1;
    }
    const uint32_t bucket = sym >> 1;
    uint64_t run;
    uint32_t negative;
    if (__builtin_expect(bucket != tables::kEscapeBucket, 1)) {
      const uint64_t v = raw.Get(tables::kBucketTable.extra[bucket] + 1);
      negative = static_cast<uint32_t>(v & 1);
      run = tables::kBucketTable.base[bucket] - 1 + (v >> 1);
    } else {
      negative = static_cast<uint32_t>(raw.Get(1));
      const uint64_t u = GetEscapedFrom(&raw);
      if (u == 0) magnitude = 0;
      run = u - 1;
    }
    ok &= magnitude != 0;
    const T flip = static_cast<T>(T{0} - static_cast<T>(negative));
    out[j].run = run;
    out[j].step = magnitude == 0 ? 0 : static_cast<T>((static_cast<T>(magnitude) ^ flip) - flip);
  }
  streams.word_pos = word_pos;
  streams.x0 = x0;
  streams.x1 = x1;
  streams.raw = raw;
  return ok;
}

// ------------------------------------------------------------------ where the changes go
//
// The walks read old bits through out.old() and hand each change's new bits to out.Put, or a
// chunk's changes (slot by slot, so not in position order) to out.PutChunk. An element's old
// bits are read before its change is put, so in place they are still the old ones.

// Decode: each change is stored into the target.
struct InPlaceOut {
  uint8_t* bits;
  const uint8_t* old() const { return bits; }
  void Progress(uint64_t /*done*/) {}
  template <typename T>
  CTX_INLINE void Put(uint64_t i, T v) {
    StoreElem<T>(bits, i, v);
  }
  template <typename T>
  CTX_INLINE void PutChunk(uint64_t /*chunk*/, const uint64_t* positions, const uint64_t* steps,
                           uint64_t pending, bool is_float) {
    for (uint64_t e = 0; e < pending; ++e) {
      const uint64_t i = positions[e];
      StoreElem<T>(bits, i,
                   AddOrderedStep<T>(LoadElem<T>(bits, i), static_cast<T>(steps[e]), is_float));
    }
  }
};

// DecodeChanges: the target is only read; each change's position and new bits are appended to
// the caller's lists in ascending position order (a count past `capacity` is kept but nothing
// stored: the caller refuses the record).
struct ListedOut {
  const uint8_t* old_bits;
  uint64_t* positions;
  uint8_t* values;
  uint64_t capacity;
  uint64_t count;
  uint64_t* chunk_seen;        // a bit per element of a chunk, all clear between chunks
  uint8_t* chunk_values;       // per element of a chunk: its new bits, where its bit is set
  sdk::ListProgress progress;  // told after each chunk: the host verifies it while it is cached
  const uint8_t* old() const { return old_bits; }
  // Every change below element `done` is listed.
  CTX_INLINE void Progress(uint64_t done) { progress(done, std::min(count, capacity)); }
  template <typename T>
  CTX_INLINE void Put(uint64_t i, T v) {
    if (count < capacity) {
      positions[count] = i;
      StoreElem<T>(values, count, v);
    }
    ++count;
  }
  // Sorts the chunk's changes by marking them in a bitmap of the chunk, their new bits computed
  // on the way into an array of the chunk's elements (its changes number up to the chunk's size:
  // a bitmap walk is cheaper than a comparison sort), then lists them in bitmap order.
  template <typename T>
  CTX_INLINE void PutChunk(uint64_t chunk, const uint64_t* pending_positions, const uint64_t* steps,
                           uint64_t pending, bool is_float) {
    uint64_t words = 0;
    for (uint64_t e = 0; e < pending; ++e) {
      const uint64_t i = pending_positions[e];
      const uint64_t at = i - chunk;
      chunk_seen[at >> 6] |= uint64_t{1} << (at & 63);
      StoreElem<T>(chunk_values, at,
                   AddOrderedStep<T>(LoadElem<T>(old_bits, i), static_cast<T>(steps[e]), is_float));
      words = std::max(words, (at >> 6) + 1);
    }
    for (uint64_t w = 0; w < words; ++w) {
      for (uint64_t m = chunk_seen[w]; m != 0; m &= m - 1) {
        const uint64_t at = w * 64 + static_cast<uint64_t>(__builtin_ctzll(m));
        Put(chunk + at, LoadElem<T>(chunk_values, at));
      }
      chunk_seen[w] = 0;
    }
    Progress(chunk + kChunkBlocks * kBlockElems);
  }
};

// Applies the change at element i (of class slot `slot`, whose old bits are old_bits) and returns
// the run of class members to its class's next change; sets *bad (and applies nothing) when the
// payload codes an impossible step. The coder is a local of the walk (in registers: the element
// stores through a byte pointer could alias it otherwise).
template <typename T, typename Coder, typename Out>
CTX_INLINE uint64_t ApplyChange(Coder& coder, uint64_t* done, const DTypeSpec& spec, uint32_t slot,
                                Out& out, uint64_t i, T old_bits, bool* bad) {
  uint32_t negative = 0;
  uint64_t magnitude;
  const uint64_t run = coder.template Next<T>(slot, &negative, &magnitude);
  if (magnitude == 0) {
    *bad = true;
    return 0;
  }
  out.Put(i, ApplyStep<T>(old_bits, negative, magnitude, spec.is_float));
  ++*done;
  return run;
}

// The scalar path: walks every element, counting each slot down to its next change.
template <typename T, typename ClassFn, typename Coder, typename Out>
Status DecodeScalar(const Header& h, const DTypeSpec& spec, ClassFn cls, const Slots& slots,
                    Coder& st_coder, uint64_t& st_done, const uint64_t* first_runs, Out& st_out) {
  Coder coder = st_coder;
  Out out = st_out;
  uint64_t done = st_done;
  // Remaining unchanged members before each slot's next change; elements of no slot never
  // change (their entry never counts down to 0).
  uint64_t remaining[kNumClasses + 1];
  std::copy(first_runs, first_runs + slots.count, remaining);
  remaining[kNoSlot] = ~uint64_t{0};
  Status status;
  for (uint64_t i = 0; i < h.n && done < h.k; ++i) {
    const T old_bits = LoadElem<T>(out.old(), i);
    const uint32_t slot = slots.of[cls(old_bits)];
    if (remaining[slot] != 0) {
      --remaining[slot];
      continue;
    }
    bool bad = false;
    remaining[slot] = ApplyChange<T>(coder, &done, spec, slot, out, i, old_bits, &bad);
    if (bad) {
      status = StepTooLarge(i);
      break;
    }
  }
  st_coder = coder;
  st_out = out;
  st_done = done;
  return status;
}

// One slot of every class (integers, bool, or classes merged): the run is the distance to the
// next change, no counting at all.
template <typename T, typename Coder, typename Out>
Status DecodeJumps(const Header& h, const DTypeSpec& spec, Coder& st_coder, uint64_t& st_done,
                   const uint64_t* first_runs, Out& st_out) {
  Coder coder = st_coder;
  Out out = st_out;
  uint64_t done = st_done;
  uint64_t i = first_runs[0];
  Status status;
  while (done < h.k && i < h.n) {
    bool bad = false;
    const uint64_t run =
        ApplyChange<T>(coder, &done, spec, 0, out, i, LoadElem<T>(out.old(), i), &bad);
    if (bad) {
      status = StepTooLarge(i);
      break;
    }
    i = run >= h.n - i ? h.n : i + 1 + run;
  }
  st_coder = coder;
  st_out = out;
  st_done = done;
  return status;
}

#if defined(__x86_64__)
// The block path: per block of 64 elements, every slot subtracts its member count from its
// countdown; a countdown that goes negative has its next change in the block, found by select on
// the slot's mask. Changes of the block are then applied in position order (a slot can change
// several times in one block). Countdowns are clamped to n: a longer one (only a forged payload
// has it) never reaches 0 within the record either.
//
// kSlots (a multiple of 8, >= the record's slots) makes the slot loop a fixed, unrolled one: the
// slots past the record's count whatever class bytes they meet but start at a countdown that no
// record can bring below 0 (n < 2^62), so they never fire.
template <typename T, typename ClassFn, typename Ops, uint32_t kSlots, typename Coder, typename Out>
CTX_INLINE Status DecodeBlockLoop(const Header& h, const DTypeSpec& spec, ClassFn cls,
                                  const Slots& slots, Coder& coder, uint64_t& done,
                                  const uint64_t* first_runs, Out& out) {
  const uint64_t n = h.n;
  int64_t remaining[kSlots];
  for (uint32_t slot = 0; slot < kSlots; ++slot) {
    remaining[slot] = slot < slots.count ? static_cast<int64_t>(std::min(first_runs[slot], n))
                                         : std::numeric_limits<int64_t>::max();
  }
  alignas(64) uint8_t tail[kBlockElems * sizeof(T)] = {};
  for (uint64_t base = 0; base < n; base += kBlockElems) {
    typename Ops::Classes v;
    const uint64_t valid = LoadBlock<T, Ops>(out.old(), base, n, cls, tail, &v);
    // Bit s: slot s reaches its next change in this block. (Collected here, not by a vector
    // compare of `remaining` afterwards: a wide load of just-stored counters cannot be forwarded
    // from the stores and stalls.)
    uint64_t fired = 0;
#pragma GCC unroll 64
    for (uint32_t slot = 0; slot < kSlots; ++slot) {
      const int64_t left = remaining[slot] - Ops::Pop(Ops::Mask(v, slots.range[slot]) & valid);
      remaining[slot] = left;
      fired |= (static_cast<uint64_t>(left) >> 63) << slot;
    }
    if (fired == 0) continue;  // no slot reaches its next change here
    uint64_t events = 0;       // the positions of the block's next changes, one per slot
    for (; fired != 0; fired &= fired - 1) {
      const uint32_t slot = static_cast<uint32_t>(__builtin_ctzll(fired));
      const uint64_t m = Ops::Mask(v, slots.range[slot]) & valid;
      const int64_t skip = remaining[slot] + Ops::Pop(m);
      events |= uint64_t{1} << Ops::Select(m, static_cast<uint64_t>(skip));
    }
    while (events != 0) {
      const uint32_t at = static_cast<uint32_t>(__builtin_ctzll(events));
      events &= events - 1;
      const uint64_t i = base + at;
      const T old_bits = LoadElem<T>(out.old(), i);
      const uint32_t slot = slots.of[cls(old_bits)];  // fired: in a slot
      bool bad = false;
      const uint64_t run = ApplyChange<T>(coder, &done, spec, slot, out, i, old_bits, &bad);
      if (bad) return StepTooLarge(i);
      if (done == h.k) return Status::OK();
      // The slot's members after `at` in this block: the next change may be among them.
      const uint64_t after = Ops::Mask(v, slots.range[slot]) & valid & ((~uint64_t{0} << at) << 1);
      const uint32_t members = Ops::Pop(after);
      if (run < members) {
        events |= uint64_t{1} << Ops::Select(after, run);
      } else {
        remaining[slot] = static_cast<int64_t>(std::min(run - members, n));
      }
    }
  }
  return Status::OK();
}

template <typename T, typename ClassFn, typename Ops, typename Coder, typename Out>
CTX_INLINE Status DecodeBlocks(const Header& h, const DTypeSpec& spec, ClassFn cls,
                               const Slots& slots, Coder& st_coder, uint64_t& st_done,
                               const uint64_t* first_runs, Out& st_out) {
  Coder coder = st_coder;
  Out out = st_out;
  uint64_t done = st_done;
  Status status;
  if (slots.count <= 8) {
    status = DecodeBlockLoop<T, ClassFn, Ops, 8>(h, spec, cls, slots, coder, done, first_runs, out);
  } else if (slots.count <= 16) {
    status =
        DecodeBlockLoop<T, ClassFn, Ops, 16>(h, spec, cls, slots, coder, done, first_runs, out);
  } else if (slots.count <= 32) {
    status =
        DecodeBlockLoop<T, ClassFn, Ops, 32>(h, spec, cls, slots, coder, done, first_runs, out);
  } else {
    status = DecodeBlockLoop<T, ClassFn, Ops, kMaxBlockSlots>(h, spec, cls, slots, coder, done,
                                                              first_runs, out);
  }
  st_coder = coder;
  st_out = out;
  st_done = done;
  return status;
}

template <typename T, typename ClassFn, typename Coder, typename Out>
CTX_TARGET_AVX2 __attribute__((flatten)) Status DecodeBlocksAvx2(
    const Header& h, const DTypeSpec& spec, ClassFn cls, const Slots& slots, Coder& coder,
    uint64_t& done, const uint64_t* first_runs, Out& out) {
  return DecodeBlocks<T, ClassFn, Avx2Ops>(h, spec, cls, slots, coder, done, first_runs, out);
}
template <typename T, typename ClassFn, typename Coder, typename Out>
CTX_TARGET_AVX512 __attribute__((flatten)) Status DecodeBlocksAvx512(
    const Header& h, const DTypeSpec& spec, ClassFn cls, const Slots& slots, Coder& coder,
    uint64_t& done, const uint64_t* first_runs, Out& out) {
  return DecodeBlocks<T, ClassFn, Avx512Ops>(h, spec, cls, slots, coder, done, first_runs, out);
}
#endif

// Walks the record with the path's walk (one slot of every class: jumps at every level), then
// requires exactly k changes and every stream consumed exactly.
template <typename T, typename ClassFn, typename Coder, typename Out>
Status Walk(Path path, const Header& h, const DTypeSpec& spec, ClassFn cls, const Slots& slots,
            Coder& coder, const uint64_t* first_runs, Out& out) {
  uint64_t done = 0;
  Status status;
  if (slots.everything) {
    status = DecodeJumps<T>(h, spec, coder, done, first_runs, out);
  } else if constexpr (ClassFn::kSingle) {
    // A forged payload whose slot misses the one class: nothing can fire.
    status = DecodeScalar<T>(h, spec, cls, slots, coder, done, first_runs, out);
  } else {
#if defined(__x86_64__)
    if (path == Path::kAvx512 && slots.count <= kMaxBlockSlots) {
      status = DecodeBlocksAvx512<T>(h, spec, cls, slots, coder, done, first_runs, out);
    } else if (path == Path::kAvx2 && slots.count <= kMaxBlockSlots) {
      status = DecodeBlocksAvx2<T>(h, spec, cls, slots, coder, done, first_runs, out);
    } else {
      status = DecodeScalar<T>(h, spec, cls, slots, coder, done, first_runs, out);
    }
#else
    status = DecodeScalar<T>(h, spec, cls, slots, coder, done, first_runs, out);
#endif
  }
  REFIT_RETURN_NOT_OK(status);
  if (done != h.k) {
    return Status::Corrupt("ctx payload promises " + std::to_string(h.k) + " changes but codes " +
                           std::to_string(done));
  }
  if (!coder.ConsumedExactly()) {
    return Status::Corrupt("ctx payload's coded stream does not end where the changes do");
  }
  return Status::OK();
}

// ------------------------------------------------------------------ the table form's walk
//
// With every change decoded up front, the walk goes slot by slot over chunks of the record: per
// chunk the class bytes of its blocks are computed once, then each slot that still has changes
// counts its members block by block with its countdown in a register, and only where the
// countdown runs out selects the change's position. A chunk's changes are applied after all its
// slots are counted (a change can move an element to another class; each element changes at
// most once). Every kernel level runs this same algorithm (ScalarOps: class bytes and masks
// element by element), so forged payloads leave the same bits at every level. A slot stops
// after its last change (its coded terminal run is not checked). One slot of every class needs
// no counting: its runs are distances (WalkDecodedJumps).

// The scalar level's block primitives (plain C++, any CPU).
struct ScalarOps {
  static constexpr bool kMemberLists = false;
  struct Classes {
    uint8_t bytes[kBlockElems];
  };
  template <typename T, typename ClassFn>
  static void Load(const uint8_t* p, ClassFn cls, Classes* out) {
    ClassBytesScalar<T>(p, cls, out->bytes);
  }
  static uint64_t Mask(const Classes& v, SlotRange s) {
    uint64_t m = 0;
    for (uint32_t i = 0; i < kBlockElems; ++i) {
      m |= uint64_t{static_cast<uint8_t>(v.bytes[i] - s.first) <= s.width} << i;
    }
    return m;
  }
  static uint32_t Pop(uint64_t m) { return static_cast<uint32_t>(std::popcount(m)); }
  static uint32_t Select(uint64_t m, uint64_t r) {
    for (; r > 0; --r) m &= m - 1;
    return static_cast<uint32_t>(std::countr_zero(m));
  }
  static uint32_t BlockOf(const uint16_t* before, uint32_t rank) {
    return BlockOfBySearch(before, rank);
  }
};

// How far ahead of a slot's next change the walks prefetch its decoded changes.
constexpr uint64_t kChangesAhead = 32;

// One slot's pass over one chunk (class bytes v and existence masks valid of its blocks): *j is
// the slot's next change in `changes` (up to `last`), *left the slot's members to pass before
// it; each change found is appended to positions / steps at *pending. Two phases, so that no
// branch waits on a block's class compare: the slot's members before each block are summed
// first (no data-dependent branch), then each change's block is found from those sums without
// a branch (Ops::BlockOf) and its element by a select in the block's stored mask. (A countdown
// block by block mispredicted its exit test once per change, and resolving it waited on the
// block's whole load-compare-popcount chain: the walk took ~1.3x as long at 1.5% density.)
template <typename Ops>
CTX_INLINE void SlotPrefix(const typename Ops::Classes* v, const uint64_t* valid, uint64_t blocks,
                           uint64_t chunk, SlotRange range, const DecodedChange* changes,
                           uint64_t last, uint64_t n, uint64_t* j, uint64_t* left,
                           uint64_t* positions, uint64_t* steps, uint64_t* pending) {
  alignas(64) uint16_t before[kChunkBlocks];  // the slot's members in blocks [0, b)
  uint64_t members[kChunkBlocks];             // the slot's members in block b
  uint32_t count = 0;
  for (uint64_t b = 0; b < blocks; ++b) {
    before[b] = static_cast<uint16_t>(count);
    members[b] = Ops::Mask(v[b], range) & valid[b];
    count += Ops::Pop(members[b]);
  }
  if (*left >= count) {  // no change of this slot in the chunk
    *left -= count;
    return;
  }
  // Past the chunk's last block: above every rank, so the search never lands there.
  for (uint64_t b = blocks; b < kChunkBlocks; ++b) before[b] = UINT16_MAX;
  uint64_t rank = *left;  // within the chunk's members of the slot
  uint64_t at = *j;
  uint64_t p = *pending;
  bool more = true;
  while (rank < count) {
    __builtin_prefetch(changes + at + kChangesAhead);  // (see SlotMembers)
    const uint32_t b = Ops::BlockOf(before, static_cast<uint32_t>(rank));
    positions[p] = chunk + uint64_t{b} * kBlockElems + Ops::Select(members[b], rank - before[b]);
    steps[p++] = changes[at].step;
    const uint64_t run = changes[at].run;
    if (++at == last) {
      more = false;
      break;
    }
    rank += 1 + std::min(run, n);  // (a run of n or more never comes back within the record)
  }
  *left = more ? rank - count : rank;
  *j = at;
  *pending = p;
}

// The same pass with the slot's members of the chunk listed first (Ops::Members): a change is
// then one load from the list, where SlotPrefix costs a block search and a select; listing
// costs more per block than summing. Same positions, same stopping rule.
template <typename Ops>
CTX_INLINE void SlotMembers(const typename Ops::Classes* v, const uint64_t* valid, uint64_t blocks,
                            uint64_t chunk, SlotRange range, const DecodedChange* changes,
                            uint64_t last, uint64_t n, uint64_t* j, uint64_t* left,
                            uint64_t* positions, uint64_t* steps, uint64_t* pending,
                            uint16_t* list) {
  uint32_t count = 0;
  for (uint64_t b = 0; b < blocks; ++b) {
    Ops::Members(Ops::Mask(v[b], range) & valid[b], static_cast<uint32_t>(b * kBlockElems), list,
                 &count);
  }
  uint64_t at = *left;
  uint64_t next = *j;
  uint64_t p = *pending;
  bool more = true;
  while (at < count) {
    // The decoded changes were written up front, megabytes ago: out of cache, and one stream of
    // a dozen (one per slot), which the hardware prefetcher does not follow.
    __builtin_prefetch(changes + next + kChangesAhead);
    positions[p] = chunk + list[at];
    steps[p++] = changes[next].step;
    const uint64_t run = changes[next].run;
    if (++next == last) {
      more = false;
      break;
    }
    at += 1 + std::min(run, n);  // (a run of n or more never comes back within the record)
  }
  *left = more ? at - count : at;
  *j = next;
  *pending = p;
}

// Changes a slot had in the previous chunk from which its next chunk lists its members (with
// Ops::kMemberLists): below, SlotPrefix's smaller per-block cost outweighs its per-change one.
constexpr uint64_t kMemberListMinChanges = kChunkBlocks / 2;

template <typename T, typename ClassFn, typename Ops, typename Out>
CTX_INLINE void WalkChunks(const Header& h, const DTypeSpec& spec, ClassFn cls, const Slots& slots,
                           const DecodedChange* changes, uint64_t* cursor, const uint64_t* end,
                           const uint64_t* first_runs, uint64_t* positions, uint64_t* steps,
                           uint16_t* members, Out& out) {
  const uint64_t n = h.n;
  uint64_t need[kNumClasses];         // slot members to pass before the slot's next change
  uint64_t recent[kNumClasses] = {};  // changes of each slot in the previous chunk
  for (uint32_t slot = 0; slot < slots.count; ++slot) need[slot] = first_runs[slot];
  alignas(64) typename Ops::Classes v[kChunkBlocks];
  uint64_t valid[kChunkBlocks];
  alignas(64) uint8_t tail[kBlockElems * sizeof(T)] = {};
  for (uint64_t chunk = 0; chunk < n; chunk += kChunkBlocks * kBlockElems) {
    const uint64_t blocks =
        std::min<uint64_t>(kChunkBlocks, (n - chunk + kBlockElems - 1) / kBlockElems);
    for (uint64_t b = 0; b < blocks; ++b) {
      valid[b] = LoadBlock<T, Ops>(out.old(), chunk + b * kBlockElems, n, cls, tail, &v[b]);
    }
    uint64_t pending = 0;
    for (uint32_t slot = 0; slot < slots.count; ++slot) {
      uint64_t j = cursor[slot];
      if (j == end[slot]) continue;  // no changes left in this slot
      const uint64_t before = pending;
      if constexpr (Ops::kMemberLists) {
        if (recent[slot] >= kMemberListMinChanges) {
          SlotMembers<Ops>(v, valid, blocks, chunk, slots.range[slot], changes, end[slot], n, &j,
                           &need[slot], positions, steps, &pending, members);
        } else {
          SlotPrefix<Ops>(v, valid, blocks, chunk, slots.range[slot], changes, end[slot], n, &j,
                          &need[slot], positions, steps, &pending);
        }
      } else {
        (void)members;
        SlotPrefix<Ops>(v, valid, blocks, chunk, slots.range[slot], changes, end[slot], n, &j,
                        &need[slot], positions, steps, &pending);
      }
      recent[slot] = pending - before;
      cursor[slot] = j;
    }
    out.template PutChunk<T>(chunk, positions, steps, pending, spec.is_float);
  }
}

#if defined(__x86_64__)
template <typename T, typename ClassFn, typename Out>
CTX_TARGET_AVX2 __attribute__((flatten)) void WalkChunksAvx2(
    const Header& h, const DTypeSpec& spec, ClassFn cls, const Slots& slots,
    const DecodedChange* changes, uint64_t* cursor, const uint64_t* end, const uint64_t* first_runs,
    uint64_t* positions, uint64_t* steps, Out& out) {
  WalkChunks<T, ClassFn, Avx2Ops>(h, spec, cls, slots, changes, cursor, end, first_runs, positions,
                                  steps, nullptr, out);
}
template <typename T, typename ClassFn, typename Out>
CTX_TARGET_AVX512 __attribute__((flatten)) void WalkChunksAvx512(
    const Header& h, const DTypeSpec& spec, ClassFn cls, const Slots& slots,
    const DecodedChange* changes, uint64_t* cursor, const uint64_t* end, const uint64_t* first_runs,
    uint64_t* positions, uint64_t* steps, Out& out) {
  WalkChunks<T, ClassFn, Avx512Ops>(h, spec, cls, slots, changes, cursor, end, first_runs,
                                    positions, steps, nullptr, out);
}
template <typename T, typename ClassFn, typename Out>
CTX_TARGET_VBMI2 __attribute__((flatten)) void WalkChunksVbmi2(
    const Header& h, const DTypeSpec& spec, ClassFn cls, const Slots& slots,
    const DecodedChange* changes, uint64_t* cursor, const uint64_t* end, const uint64_t* first_runs,
    uint64_t* positions, uint64_t* steps, uint16_t* members, Out& out) {
  WalkChunks<T, ClassFn, Vbmi2Ops>(h, spec, cls, slots, changes, cursor, end, first_runs, positions,
                                   steps, members, out);
}
#endif

// One slot of every class: the run is the distance to the next change. The positions are
// summed up first (a sequential pass), so that the apply can prefetch the elements it will
// touch: they are ~1 in 100 at 1% density, too far apart for the hardware prefetcher to cover
// the memory latency.
template <typename T, typename Out>
void WalkDecodedJumps(const Header& h, const DTypeSpec& spec, const DecodedChange* changes,
                      uint64_t* cursor, const uint64_t* end, const uint64_t* first_runs,
                      uint64_t* positions, Out& out) {
  constexpr uint64_t kBatch = kChunkBlocks * kBlockElems;  // positions' capacity
  constexpr uint64_t kPrefetchAhead = 16;
  const uint64_t n = h.n;
  const bool is_float = spec.is_float;
  uint64_t j = cursor[0];
  const uint64_t last = end[0];
  uint64_t i = first_runs[0];
  while (j < last && i < n) {
    uint64_t count = 0;
    for (; count < kBatch && j + count < last && i < n; ++count) {
      positions[count] = i;
      const uint64_t run = changes[j + count].run;
      i = run >= n - i ? n : i + 1 + run;
    }
    for (uint64_t e = 0; e < count; ++e) {
      if (e + kPrefetchAhead < count) {
        __builtin_prefetch(out.old() + positions[e + kPrefetchAhead] * sizeof(T), 1);
      }
      const uint64_t at = positions[e];
      out.Put(at, AddOrderedStep<T>(LoadElem<T>(out.old(), at), static_cast<T>(changes[j + e].step),
                                    is_float));
    }
    j += count;
    out.Progress(i);  // the next change is at i
  }
  cursor[0] = j;
}

// Per-thread scratch of the table form's decoder, reused across records.
struct TableDecodeScratch {
  std::vector<uint32_t> tables;
  std::vector<uint32_t> freq;
  std::vector<DecodedChange> changes;
  std::vector<uint64_t> positions;  // a chunk's changes (element, ordered step)
  std::vector<uint64_t> steps;
  std::vector<uint16_t> members;  // a slot's members of a chunk (the VBMI2 walk)
  void Trim() {
    constexpr uint64_t kRetainedTables = 65;
    constexpr uint64_t kRetainedChanges = uint64_t{1} << 20;
    if (tables.size() > kRetainedTables * tables::kTotal || changes.size() > kRetainedChanges) {
      *this = TableDecodeScratch();
    }
  }
};

template <typename T, typename ClassFn, typename Out>
Status DecodeTablesBody(Path path, const Header& h, const DTypeSpec& spec, ClassFn cls,
                        const uint8_t* body, uint64_t len, Out& out) {
  // The slots: ascending, not overlapping, spanning exactly the header's class range.
  Slots slot_ranges;
  uint64_t at = 0;
  if (len < 1 || len - 1 < 2 * (uint64_t{body[0]} + 1)) {
    return Status::Corrupt("ctx payload's slot list is truncated");
  }
  const uint32_t slots = uint32_t{body[0]} + 1;
  at = 1;
  for (uint32_t slot = 0; slot < slots; ++slot, at += 2) {
    const uint32_t first = body[at];
    const uint32_t last = body[at + 1];
    const bool after_previous =
        slot == 0 ? first == h.class_lo : first > slot_ranges.Last(slot - 1);
    if (first > last || !after_previous || (slot + 1 == slots && last != h.class_hi)) {
      return Status::Corrupt("ctx payload's slot " + std::to_string(slot) + " [" +
                             std::to_string(first) + ", " + std::to_string(last) +
                             "] is out of order or outside the class range [" +
                             std::to_string(h.class_lo) + ", " + std::to_string(h.class_hi) + "]");
    }
    slot_ranges.range[slot] = {static_cast<uint8_t>(first), static_cast<uint8_t>(last - first)};
  }
  slot_ranges.count = slots;
  slot_ranges.Index(cls.Max());
  uint64_t first_runs[kNumClasses];
  uint64_t cursor[kNumClasses];  // each slot's changes in the class-major arrays: [cursor, end)
  uint64_t end[kNumClasses];
  for (uint32_t slot = 0; slot < slots; ++slot) {
    if (!GetVarint(body, len, &at, &first_runs[slot])) {
      return Status::Corrupt("ctx payload's first run of slot " + std::to_string(slot) +
                             " is truncated or malformed");
    }
  }
  uint64_t total = 0;
  for (uint32_t slot = 0; slot < slots; ++slot) {
    uint64_t count = 0;
    if (!GetVarint(body, len, &at, &count) || count > h.k - total) {
      return Status::Corrupt("ctx payload's change count of slot " + std::to_string(slot) +
                             " is malformed");
    }
    cursor[slot] = total;
    total += count;
    end[slot] = total;
  }
  if (total != h.k) {
    return Status::Corrupt("ctx payload's class change counts add up to " + std::to_string(total) +
                           ", not " + std::to_string(h.k));
  }
  TableDecodeScratch& scratch = ThreadScratch<TableDecodeScratch>();
  scratch.tables.resize(uint64_t{slots + 1} * tables::kTotal);
  scratch.freq.resize(kJointSymbols);
  for (uint32_t table = 0; table <= slots; ++table) {
    const uint32_t symbols = table < slots ? kJointSymbols : kBigSymbols;
    if (table < slots ? !GetSlotTable(body, len, &at, scratch.freq.data())
                      : !GetTable(body, len, &at, symbols, scratch.freq.data())) {
      return Status::Corrupt("ctx payload's frequency table " + std::to_string(table) +
                             " is truncated or malformed");
    }
    tables::BuildDecodeTable(scratch.freq.data(), symbols,
                             scratch.tables.data() + uint64_t{table} * tables::kTotal);
  }
  uint64_t rans_bytes = 0;
  if (!GetVarint(body, len, &at, &rans_bytes) || rans_bytes < 8 || rans_bytes % 2 != 0 ||
      rans_bytes > len - at) {
    return Status::Corrupt("ctx payload's symbol stream length is malformed");
  }
  // Every change reads at least its sign from the raw bits: this bounds the scratch below by
  // the payload's own size, whatever k a forged header claims.
  if (h.k > 8 * (len - at - rans_bytes)) {
    return Status::Corrupt("ctx payload claims " + std::to_string(h.k) +
                           " changes but has too few raw bits for them");
  }
  TableStreams st{body + at + 8,
                  rans_bytes - 8,
                  0,
                  LoadLE<uint32_t>(body + at),
                  LoadLE<uint32_t>(body + at + 4),
                  tables::BitReader(body + at + rans_bytes, len - at - rans_bytes)};
  scratch.changes.resize(h.k);
  const uint32_t* big = scratch.tables.data() + uint64_t{slots} * tables::kTotal;
  bool ok = true;
  for (uint32_t slot = 0; slot < slots; ++slot) {
    const uint64_t from = cursor[slot];
    ok &= DecodeClassChanges<T>(st, scratch.tables.data() + uint64_t{slot} * tables::kTotal, big,
                                end[slot] - from, scratch.changes.data() + from);
  }
  if (!ok) {
    scratch.Trim();
    return Status::Corrupt("ctx payload codes a step larger than the dtype or a malformed value");
  }
  if (!st.ConsumedExactly()) {
    scratch.Trim();
    return Status::Corrupt("ctx payload's coded stream does not end where the changes do");
  }
  const DecodedChange* changes = scratch.changes.data();
  scratch.positions.resize(kChunkBlocks * kBlockElems);
  uint64_t* positions = scratch.positions.data();
  if (slot_ranges.everything) {
    WalkDecodedJumps<T>(h, spec, changes, cursor, end, first_runs, positions, out);
  } else {
    scratch.steps.resize(kChunkBlocks * kBlockElems);
    uint64_t* steps = scratch.steps.data();
#if defined(__x86_64__)
    static const bool kVbmi2 = __builtin_cpu_supports("avx512vbmi2");
    // (A single-class dtype gets here only from a forged slot list that misses its class.)
    if constexpr (ClassFn::kSingle) {
      (void)path;
      WalkChunks<T, ClassFn, ScalarOps>(h, spec, cls, slot_ranges, changes, cursor, end, first_runs,
                                        positions, steps, nullptr, out);
    } else if (path == Path::kAvx512 && kVbmi2) {
      scratch.members.resize(kChunkBlocks * kBlockElems + kBlockElems);
      WalkChunksVbmi2<T>(h, spec, cls, slot_ranges, changes, cursor, end, first_runs, positions,
                         steps, scratch.members.data(), out);
    } else if (path == Path::kAvx512) {
      WalkChunksAvx512<T>(h, spec, cls, slot_ranges, changes, cursor, end, first_runs, positions,
                          steps, out);
    } else if (path == Path::kAvx2) {
      WalkChunksAvx2<T>(h, spec, cls, slot_ranges, changes, cursor, end, first_runs, positions,
                        steps, out);
    } else {
      WalkChunks<T, ClassFn, ScalarOps>(h, spec, cls, slot_ranges, changes, cursor, end, first_runs,
                                        positions, steps, nullptr, out);
    }
#else
    (void)path;
    WalkChunks<T, ClassFn, ScalarOps>(h, spec, cls, slot_ranges, changes, cursor, end, first_runs,
                                      positions, steps, nullptr, out);
#endif
  }
  scratch.Trim();
  uint64_t done = 0;
  for (uint32_t slot = 0; slot < slots; ++slot)
    done += cursor[slot] - (slot == 0 ? 0 : end[slot - 1]);
  if (done != h.k) {
    return Status::Corrupt("ctx payload promises " + std::to_string(h.k) + " changes but codes " +
                           std::to_string(done));
  }
  return Status::OK();
}

template <typename T, typename ClassFn, typename Out>
Status DecodeBody(Path path, const Header& h, const DTypeSpec& spec, ClassFn cls,
                  const uint8_t* body, uint64_t len, Out& out) {
  if (h.k == 0) {
    if (h.mode != kModeCoded || len != 0) {
      return Status::Corrupt("ctx payload has bytes after an empty delta");
    }
    return Status::OK();
  }
  if (h.mode == kModeTables) return DecodeTablesBody<T>(path, h, spec, cls, body, len, out);
  Slots slots = Slots::Identity(h.class_lo, h.class_hi);
  slots.Index(cls.Max());
  Models models(slots.count);
  AdaptiveCoder coder{RangeDecoder(body, len), &models};
  uint64_t first_runs[kNumClasses];
  for (uint32_t slot = 0; slot < slots.count; ++slot) {
    first_runs[slot] = DecodeNumber(coder.rc, models.first_run) - 1;
  }
  return Walk<T>(path, h, spec, cls, slots, coder, first_runs, out);
}

// Calls fn(T{}, class_fn) with the element type and class function of a known dtype.
template <typename Fn>
auto WithDType(int32_t dtype, const DTypeSpec& spec, Fn&& fn) {
  if (dtype == REFIT_DTYPE_F64) return fn(uint64_t{}, F64Class{});
  if (spec.exp_mask == 0) {
    switch (spec.size) {
      case 1:
        return fn(uint8_t{}, SingleClass{});
      case 2:
        return fn(uint16_t{}, SingleClass{});
      case 4:
        return fn(uint32_t{}, SingleClass{});
      default:
        return fn(uint64_t{}, SingleClass{});
    }
  }
  const ExponentClass cls{spec.exp_shift, spec.exp_mask};
  switch (spec.size) {
    case 1:
      return fn(uint8_t{}, cls);
    case 2:
      return fn(uint16_t{}, cls);
    default:
      return fn(uint32_t{}, cls);
  }
}

uint64_t LiteralHeaderBytes(uint64_t n) { return kFixedHeaderBytes + VarintSize(n); }

void Seal(uint8_t* out, uint64_t size) {
  const uint64_t digest = kernels::Digest64(out + kChecked, size - kChecked);
  StoreLE<uint32_t>(out + kChecksumOffset, static_cast<uint32_t>(digest));
}

Result<const DTypeSpec*> CheckedSpec(int32_t dtype, uint32_t elem_size, const char* what) {
  const DTypeSpec* spec = FindSpec(dtype);
  if (spec == nullptr) {
    return Status::Invalid(std::string(what) + " has unknown dtype " + std::to_string(dtype));
  }
  if (spec->size != elem_size) {
    return Status::Invalid(std::string(what) + " has element size " + std::to_string(elem_size) +
                           " for dtype " + std::to_string(dtype) + " (expected " +
                           std::to_string(spec->size) + ")");
  }
  return spec;
}

}  // namespace

uint64_t MaxEncodedSize(const refit_encode_input_t& in) {
  Result<uint64_t> bytes = sdk::CheckEncodeInput(in);
  if (!bytes.ok() || sdk::IsFullSync(in) || in.n_elems >= kMaxElements) return 0;
  if (!CheckedSpec(in.dtype, in.elem_size, "encode input").ok()) return 0;
  // Never more than the literal form (the coded form is abandoned when it would be larger).
  uint64_t total = 0;
  if (!sdk::CheckedAdd(*bytes, LiteralHeaderBytes(in.n_elems), &total)) return 0;
  return total;
}

Result<uint64_t> Encode(const refit_encode_input_t& in, uint8_t* out, uint64_t cap) {
  return EncodeAt(kernels::ActiveSimdLevel(), in, out, cap);
}

Result<uint64_t> EncodeAt(kernels::SimdLevel level, const refit_encode_input_t& in, uint8_t* out,
                          uint64_t cap, CodedForm form) {
  REFIT_ASSIGN_OR_RAISE(uint64_t bytes, sdk::CheckEncodeInput(in));
  if (sdk::IsFullSync(in)) return sdk::RefuseFullSync("ctx");
  REFIT_ASSIGN_OR_RAISE(const DTypeSpec* spec, CheckedSpec(in.dtype, in.elem_size, "encode input"));
  if (in.n_elems >= kMaxElements) {
    return Status::Invalid("ctx encodes runs of fewer than 2^62 elements, got " +
                           std::to_string(in.n_elems));
  }
  uint64_t literal_size = 0;
  if (!sdk::CheckedAdd(bytes, LiteralHeaderBytes(in.n_elems), &literal_size)) {
    return Status::Invalid("ctx payload size of " + std::to_string(in.n_elems) +
                           " elements overflows 64 bits");
  }

  Header h;
  const uint64_t coded_header =
      kFixedHeaderBytes + 2 + VarintSize(in.n_elems) + VarintSize(in.n_changed);
  const uint64_t limit = std::min(cap, literal_size);
  if (coded_header < limit) {
    const uint64_t body_cap = limit - coded_header;
    REFIT_ASSIGN_OR_RAISE(uint64_t body,
                          WithDType(in.dtype, *spec, [&](auto elem, auto cls) -> Result<uint64_t> {
                            return EncodeBody<decltype(elem)>(PathFor(level), form, in, *spec, cls,
                                                              &h, out + coded_header, body_cap);
                          }));
    if (body <= body_cap && coded_header + body < literal_size) {
      out[0] = kFormatVersion;
      out[5] = h.mode;
      out[6] = static_cast<uint8_t>(in.dtype);
      out[7] = static_cast<uint8_t>(h.class_lo);
      out[8] = static_cast<uint8_t>(h.class_hi);
      uint8_t* p = PutVarint(out + 9, in.n_elems);
      PutVarint(p, in.n_changed);
      Seal(out, coded_header + body);
      return coded_header + body;
    }
  }
  // Literal: the new bits of every element (a dense delta that is still smaller than failing).
  if (literal_size > cap) return sdk::OutputTooSmall(literal_size, cap);
  out[0] = kFormatVersion;
  out[5] = kModeLiteral;
  out[6] = static_cast<uint8_t>(in.dtype);
  uint8_t* p = PutVarint(out + kFixedHeaderBytes, in.n_elems);
  if (bytes > 0) std::memcpy(p, in.new_bits, bytes);
  Seal(out, literal_size);
  return literal_size;
}

namespace {

// A payload's header, checked against the target: where the body starts and what it holds.
struct ParsedPayload {
  Header h;
  const DTypeSpec* spec = nullptr;
  uint64_t body = 0;   // offset of the body (literal: the new bits)
  uint64_t bytes = 0;  // the target's size in bytes
};

Result<ParsedPayload> ParsePayload(const uint8_t* payload, uint64_t len,
                                   const refit_decode_target_t& target) {
  ParsedPayload parsed;
  REFIT_ASSIGN_OR_RAISE(parsed.bytes, sdk::CheckDecodeTarget(target));
  REFIT_ASSIGN_OR_RAISE(parsed.spec, CheckedSpec(target.dtype, target.elem_size, "decode target"));
  Header& h = parsed.h;
  if (payload == nullptr || len < kFixedHeaderBytes) {
    return Status::Corrupt("ctx payload has " + std::to_string(len) + " bytes, shorter than its " +
                           std::to_string(kFixedHeaderBytes) + "-byte header");
  }
  if (payload[0] != kFormatVersion) {
    return Status::Unsupported("ctx payload format version " + std::to_string(payload[0]) +
                               " (this build reads version " + std::to_string(kFormatVersion) +
                               ")");
  }
  // The checksum first: a truncated or damaged payload is refused before anything is parsed.
  const uint32_t digest =
      static_cast<uint32_t>(kernels::Digest64(payload + kChecked, len - kChecked));
  if (LoadLE<uint32_t>(payload + kChecksumOffset) != digest) {
    return Status::Corrupt("ctx payload checksum mismatch (truncated or damaged)");
  }
  h.mode = payload[5];
  h.dtype = payload[6];
  if (h.dtype != target.dtype) {
    return Status::Corrupt("ctx payload is for dtype " + std::to_string(h.dtype) +
                           ", the target is dtype " + std::to_string(target.dtype));
  }
  uint64_t at = kFixedHeaderBytes;
  if (h.mode == kModeCoded || h.mode == kModeTables) {
    if (len < at + 2) return Status::Corrupt("ctx payload header is truncated");
    h.class_lo = payload[at];
    h.class_hi = payload[at + 1];
    at += 2;
  } else if (h.mode != kModeLiteral) {
    return Status::Corrupt("ctx payload mode " + std::to_string(h.mode) + " is not 0, 1 or 2");
  }
  if (!GetVarint(payload, len, &at, &h.n)) {
    return Status::Corrupt("ctx payload element count is truncated or malformed");
  }
  if (h.n != target.n_elems) {
    return Status::Corrupt("ctx payload is for " + std::to_string(h.n) +
                           " elements, the target has " + std::to_string(target.n_elems));
  }
  if (h.mode == kModeLiteral) {
    if (len - at != parsed.bytes) {
      return Status::Corrupt("ctx literal payload has " + std::to_string(len - at) +
                             " value bytes, expected " + std::to_string(parsed.bytes));
    }
    parsed.body = at;
    return parsed;
  }
  if (!GetVarint(payload, len, &at, &h.k)) {
    return Status::Corrupt("ctx payload change count is truncated or malformed");
  }
  if (h.k > h.n) {
    return Status::Corrupt("ctx payload claims " + std::to_string(h.k) + " changes in a run of " +
                           std::to_string(h.n) + " elements");
  }
  if (h.class_lo > h.class_hi || (h.k == 0 && h.class_hi != 0)) {
    return Status::Corrupt("ctx payload class range [" + std::to_string(h.class_lo) + ", " +
                           std::to_string(h.class_hi) + "] is invalid");
  }
  parsed.body = at;
  return parsed;
}

// The changes a literal payload makes: its elements that differ from the old bits.
template <typename T>
void ListLiteralChanges(const uint8_t* literal, uint64_t n, ListedOut& out) {
  for (uint64_t i = 0; i < n; ++i) {
    const T v = LoadElem<T>(literal, i);
    if (v != LoadElem<T>(out.old(), i)) out.Put(i, v);
  }
}

}  // namespace

Status Decode(const uint8_t* payload, uint64_t len, const refit_decode_target_t& target) {
  return DecodeAt(kernels::ActiveSimdLevel(), payload, len, target);
}

Status DecodeAt(kernels::SimdLevel level, const uint8_t* payload, uint64_t len,
                const refit_decode_target_t& target) {
  REFIT_ASSIGN_OR_RAISE(ParsedPayload parsed, ParsePayload(payload, len, target));
  auto* bits = static_cast<uint8_t*>(target.bits);
  if (parsed.h.mode == kModeLiteral) {
    if (parsed.bytes > 0) std::memcpy(bits, payload + parsed.body, parsed.bytes);
    return Status::OK();
  }
  InPlaceOut out{bits};
  return WithDType(target.dtype, *parsed.spec, [&](auto elem, auto cls) -> Status {
    // class_hi < kNumClasses (one byte): every class indexes the tables.
    return DecodeBody<decltype(elem)>(PathFor(level), parsed.h, *parsed.spec, cls,
                                      payload + parsed.body, len - parsed.body, out);
  });
}

namespace {

// ListedOut's chunk bitmap and values, per thread (the bitmap is left clear after use).
struct ListScratch {
  std::vector<uint64_t> chunk_seen = std::vector<uint64_t>(kChunkBlocks * kBlockElems / 64, 0);
  std::vector<uint8_t> chunk_values = std::vector<uint8_t>(kChunkBlocks * kBlockElems * 8);
};

}  // namespace

Result<uint64_t> DecodeChanges(const uint8_t* payload, uint64_t len,
                               const refit_decode_target_t& old, uint64_t* positions,
                               uint8_t* values, uint64_t capacity,
                               const sdk::ListProgress& progress) {
  return DecodeChangesAt(kernels::ActiveSimdLevel(), payload, len, old, positions, values, capacity,
                         progress);
}

Result<uint64_t> DecodeChangesAt(kernels::SimdLevel level, const uint8_t* payload, uint64_t len,
                                 const refit_decode_target_t& old, uint64_t* positions,
                                 uint8_t* values, uint64_t capacity,
                                 const sdk::ListProgress& progress) {
  REFIT_ASSIGN_OR_RAISE(ParsedPayload parsed, ParsePayload(payload, len, old));
  ListScratch& scratch = ThreadScratch<ListScratch>();
  ListedOut out{static_cast<const uint8_t*>(old.bits),
                positions,
                values,
                capacity,
                0,
                scratch.chunk_seen.data(),
                scratch.chunk_values.data(),
                progress};
  Status st;
  if (parsed.h.mode == kModeLiteral) {
    WithDType(old.dtype, *parsed.spec, [&](auto elem, auto /*cls*/) {
      ListLiteralChanges<decltype(elem)>(payload + parsed.body, parsed.h.n, out);
    });
  } else if (parsed.h.k > capacity) {
    st = sdk::MoreChangesThanDeclared("ctx payload", parsed.h.k, capacity);
  } else {
    st = WithDType(old.dtype, *parsed.spec, [&](auto elem, auto cls) -> Status {
      return DecodeBody<decltype(elem)>(PathFor(level), parsed.h, *parsed.spec, cls,
                                        payload + parsed.body, len - parsed.body, out);
    });
  }
  REFIT_RETURN_NOT_OK(st);
  if (out.count > capacity) {
    return sdk::MoreChangesThanDeclared("ctx payload", out.count, capacity);
  }
  return out.count;
}

}  // namespace refit::ctx
