// The `ctx` codec (see ctx_codec.h and README.md for the payload format).
//
// Positions: every element belongs to a class derived from its OLD bits (the binary exponent for
// float dtypes, one class for integers and bool), which both sides know. Within a class the
// changed elements are a sparse subsequence; the payload codes, per class, the run of unchanged
// class members before each change. Because change probability roughly halves per exponent step,
// per-class runs cost far less than position gaps over all elements. The encoder emits runs one
// change ahead (the run to the class's next change follows each change), so the decoder can walk
// the elements in order, counting each class down, with no lookahead of its own.
//
// Values: the step new - old in the dtype's ordered integer representation (floats: negative
// patterns flipped so that integer order is value order), as sign + magnitude. A one-ULP step
// costs about a bit and a half; larger steps cost their bit length plus raw bits.
#include "ctx_codec.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "refit/kernels/diff.h"
#include "refit/sdk/encoding_util.hpp"

namespace refit::ctx {
namespace {

using sdk::LoadLE;
using sdk::StoreLE;

constexpr uint8_t kFormatVersion = 1;
constexpr uint8_t kModeCoded = 0;
constexpr uint8_t kModeLiteral = 1;
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
};
// f64: exponents 896..1151 (2^-127 .. 2^128) get their own class, the rest share the end ones.
struct F64Class {
  static constexpr bool kSingle = false;
  uint32_t operator()(uint64_t bits) const {
    const uint32_t e = static_cast<uint32_t>(bits >> 52) & 0x7ff;
    return e <= 896 ? 0 : std::min<uint32_t>(e - 896, kNumClasses - 1);
  }
};
struct SingleClass {
  static constexpr bool kSingle = true;
  template <typename T>
  uint32_t operator()(T /*bits*/) const {
    return 0;
  }
};

// Order-preserving bijection of float bit patterns onto unsigned integers (integers: identity).
template <typename T>
inline T ToOrdered(T bits, bool is_float) {
  constexpr T kSign = T{1} << (sizeof(T) * 8 - 1);
  if (!is_float) return bits;
  return (bits & kSign) ? static_cast<T>(~bits) : static_cast<T>(bits | kSign);
}
template <typename T>
inline T FromOrdered(T ord, bool is_float) {
  constexpr T kSign = T{1} << (sizeof(T) * 8 - 1);
  if (!is_float) return ord;
  return (ord & kSign) ? static_cast<T>(ord & ~kSign) : static_cast<T>(~ord);
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
  void EncodeDirect(uint64_t value, int nbits) {
    while (nbits > 0) {
      const int n = std::min(nbits, kDirectChunk);
      nbits -= n;
      range_ >>= n;
      low_ += static_cast<uint64_t>((value >> nbits) & ((1u << n) - 1)) * range_;
      Normalize();
    }
  }
  void Finish() {
    for (int i = 0; i < 5; ++i) ShiftLow();
  }
  uint64_t size() const { return pos_; }
  bool overflowed() const { return pos_ > cap_; }

 private:
  void Normalize() {
    while (range_ < kTop) {
      range_ <<= 8;
      ShiftLow();
    }
  }
  void ShiftLow() {
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
  void Put(uint8_t byte) {
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
  uint64_t DecodeDirect(int nbits) {
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
  void Normalize() {
    while (range_ < kTop) {
      range_ <<= 8;
      code_ = (code_ << 8) | Next();
    }
  }
  uint8_t Next() {
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

struct RunModel {
  Bit unary[kUnarySteps];  // "quotient > i"
  uint64_t sum = 0;        // runs seen (halved with count)
  uint64_t count = 0;

  // Smallest shift with 2^(shift+1) >= mean run (the quotient then averages ~1.5).
  int Shift() const {
    if (count == 0) return 3;
    const uint64_t mean = sum / count;
    return mean <= 2 ? 0 : std::min(static_cast<int>(std::bit_width(mean - 1)) - 1, 56);
  }
  void Observe(uint64_t run) {
    sum += std::min<uint64_t>(run, uint64_t{1} << 56);  // terminal runs must not swamp the mean
    if (++count == kRunStatsLimit) {
      sum >>= 1;
      count >>= 1;
    }
  }
};

// `escape` codes quotient - kUnarySteps + 1 when the unary part runs out (rare: shared by all
// classes, as is the model of each class's first run). `sign` (the step's, a fair coin) rides
// along with the raw low bits: one coder operation for both.
CTX_INLINE void EncodeRun(RangeEncoder& rc, RunModel& m, NumberModel& escape, uint64_t run,
                          uint32_t sign) {
  const int shift = m.Shift();
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
  const int shift = m.Shift();
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

template <typename T>
CTX_INLINE T ApplyStep(T old_bits, uint32_t negative, uint64_t magnitude, bool is_float) {
  const T step =
      negative ? static_cast<T>(T{0} - static_cast<T>(magnitude)) : static_cast<T>(magnitude);
  return FromOrdered(static_cast<T>(ToOrdered(old_bits, is_float) + step), is_float);
}

// ------------------------------------------------------------------ class counting

// counts[c] += number of elements of class c in old[from, to). Four interleaved tables keep
// consecutive increments of one class from waiting on each other.
template <typename T, typename ClassFn>
void CountClasses(const uint8_t* old, uint64_t from, uint64_t to, ClassFn cls,
                  uint64_t (*counts)[kNumClasses]) {
  if constexpr (ClassFn::kSingle) {
    counts[0][0] += to - from;
  } else {
    uint64_t i = from;
    for (; i + 4 <= to; i += 4) {
      ++counts[0][cls(LoadElem<T>(old, i))];
      ++counts[1][cls(LoadElem<T>(old, i + 1))];
      ++counts[2][cls(LoadElem<T>(old, i + 2))];
      ++counts[3][cls(LoadElem<T>(old, i + 3))];
    }
    for (; i < to; ++i) ++counts[0][cls(LoadElem<T>(old, i))];
  }
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

// Codes the coded-mode body into out[0, cap); returns its size (> cap when it did not fit).
// Sets the class range in *h.
template <typename T, typename ClassFn>
Result<uint64_t> EncodeBody(const refit_encode_input_t& in, const DTypeSpec& spec, ClassFn cls,
                            Header* h, uint8_t* out, uint64_t cap) {
  const auto* old = static_cast<const uint8_t*>(in.old_bits);
  const auto* neu = static_cast<const uint8_t*>(in.new_bits);
  const uint64_t n = in.n_elems;
  const uint64_t k = in.n_changed;
  const uint64_t* pos = in.positions;

  // Pass 1: the class of every change and the run of unchanged class members before it.
  // Per-thread scratch, reused across calls: a fresh multi-MB allocation per record costs more
  // in page faults than the coding itself.
  // The changed elements' old and new bits are captured here too, while the old bits stream by:
  // reading them again at scattered positions later costs a cache miss per change.
  thread_local std::vector<uint8_t> classes;
  thread_local std::vector<uint64_t> runs;
  thread_local std::vector<T> olds;
  thread_local std::vector<T> news;
  if (classes.size() < k) {
    classes.resize(k);
    runs.resize(k);
  }
  if (olds.size() < k) {
    olds.resize(k);
    news.resize(k);
  }
  constexpr uint64_t kPrefetchAhead = 16;
  constexpr uint64_t kRetainedScratchChanges = uint64_t{1} << 20;
  auto counts = std::make_unique<uint64_t[][kNumClasses]>(4);  // zeroed
  uint64_t next_rank[kNumClasses] = {};
  uint64_t next = 0;
  for (uint64_t j = 0; j < k; ++j) {
    const uint64_t p = pos[j];
    if (p < next || p >= n) {
      return Status::Invalid("position " + std::to_string(j) + " (" + std::to_string(p) +
                             ") is out of range or not strictly increasing");
    }
    if (j + kPrefetchAhead < k) __builtin_prefetch(neu + pos[j + kPrefetchAhead] * sizeof(T));
    CountClasses<T>(old, next, p, cls, counts.get());
    const T old_bits = LoadElem<T>(old, p);
    olds[j] = old_bits;
    news[j] = LoadElem<T>(neu, p);
    const uint32_t c = cls(old_bits);
    const uint64_t rank = counts[0][c] + counts[1][c] + counts[2][c] + counts[3][c];
    classes[j] = static_cast<uint8_t>(c);
    runs[j] = rank - next_rank[c];
    next_rank[c] = rank + 1;
    ++counts[0][c];
    next = p + 1;
  }
  uint32_t lo = kNumClasses - 1;
  uint32_t hi = 0;
  for (uint64_t j = 0; j < k; ++j) {
    lo = std::min<uint32_t>(lo, classes[j]);
    hi = std::max<uint32_t>(hi, classes[j]);
  }
  if (k == 0) lo = hi = 0;
  h->class_lo = lo;
  h->class_hi = hi;
  if (k == 0) return uint64_t{0};
  CountClasses<T>(old, next, n, cls, counts.get());

  // Pass 2 (backward): each change carries the run to its class's next change; the run after a
  // class's last change reaches past the end (never hit); pending ends as each first run.
  uint64_t pending[kNumClasses] = {};
  for (uint32_t c = lo; c <= hi; ++c) {
    const uint64_t total = counts[0][c] + counts[1][c] + counts[2][c] + counts[3][c];
    pending[c] = total - next_rank[c];
  }
  for (uint64_t j = k; j-- > 0;) {
    const uint64_t run = runs[j];
    runs[j] = pending[classes[j]];
    pending[classes[j]] = run;
  }

  Models models(hi - lo + 1);
  RangeEncoder rc(out, cap);
  for (uint32_t c = lo; c <= hi; ++c) EncodeNumber(rc, models.first_run, pending[c] + 1);
  for (uint64_t j = 0; j < k; ++j) {
    const uint32_t slot = classes[j] - lo;
    uint32_t negative;
    uint64_t magnitude;
    SplitStep<T>(olds[j], news[j], spec.is_float, &negative, &magnitude);
    EncodeMagnitude(rc, models, slot, magnitude);
    EncodeRun(rc, models.runs[slot], models.long_run, runs[j], negative);
  }
  rc.Finish();
  if (classes.size() >
      kRetainedScratchChanges) {  // keep a small record's scratch, not a huge one's
    classes = {};
    runs = {};
    olds = {};
    news = {};
  }
  return rc.size();
}

template <typename T, typename ClassFn>
Status DecodeBody(const Header& h, const DTypeSpec& spec, ClassFn cls, const uint8_t* body,
                  uint64_t len, uint8_t* bits) {
  if (h.k == 0) {
    if (len != 0) return Status::Corrupt("ctx payload has bytes after an empty delta");
    return Status::OK();
  }
  const uint32_t lo = h.class_lo;
  const uint32_t hi = h.class_hi;
  Models models(hi - lo + 1);
  RangeDecoder rc(body, len);
  // Remaining unchanged members before each class's next change; classes outside [lo, hi]
  // have no changes and never count down to 0.
  uint64_t remaining[kNumClasses];
  std::fill(std::begin(remaining), std::end(remaining), ~uint64_t{0});
  for (uint32_t c = lo; c <= hi; ++c) {
    remaining[c] = DecodeNumber(rc, models.first_run) - 1;
  }
  uint64_t done = 0;
  for (uint64_t i = 0; i < h.n && done < h.k; ++i) {
    const T old_bits = LoadElem<T>(bits, i);
    const uint32_t c = cls(old_bits);
    if (remaining[c] != 0) {
      --remaining[c];
      continue;
    }
    const uint64_t magnitude = DecodeMagnitude<T>(rc, models, c - lo);
    if (magnitude == 0) {
      return Status::Corrupt("ctx payload codes a step larger than the dtype at element " +
                             std::to_string(i));
    }
    uint32_t negative;
    remaining[c] = DecodeRun(rc, models.runs[c - lo], models.long_run, &negative);
    StoreElem<T>(bits, i, ApplyStep<T>(old_bits, negative, magnitude, spec.is_float));
    ++done;
  }
  if (done != h.k) {
    return Status::Corrupt("ctx payload promises " + std::to_string(h.k) + " changes but codes " +
                           std::to_string(done));
  }
  if (!rc.ConsumedExactly()) {
    return Status::Corrupt("ctx payload's coded stream does not end where the changes do");
  }
  return Status::OK();
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
  ASSIGN_OR_RAISE(uint64_t bytes, sdk::CheckEncodeInput(in));
  if (sdk::IsFullSync(in)) return sdk::RefuseFullSync("ctx");
  ASSIGN_OR_RAISE(const DTypeSpec* spec, CheckedSpec(in.dtype, in.elem_size, "encode input"));
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
    ASSIGN_OR_RAISE(
        uint64_t body, WithDType(in.dtype, *spec, [&](auto elem, auto cls) -> Result<uint64_t> {
          return EncodeBody<decltype(elem)>(in, *spec, cls, &h, out + coded_header, body_cap);
        }));
    if (body <= body_cap && coded_header + body < literal_size) {
      out[0] = kFormatVersion;
      out[5] = kModeCoded;
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

Status Decode(const uint8_t* payload, uint64_t len, const refit_decode_target_t& target) {
  ASSIGN_OR_RAISE(uint64_t bytes, sdk::CheckDecodeTarget(target));
  ASSIGN_OR_RAISE(const DTypeSpec* spec,
                  CheckedSpec(target.dtype, target.elem_size, "decode target"));
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
  Header h;
  h.mode = payload[5];
  h.dtype = payload[6];
  if (h.dtype != target.dtype) {
    return Status::Corrupt("ctx payload is for dtype " + std::to_string(h.dtype) +
                           ", the target is dtype " + std::to_string(target.dtype));
  }
  uint64_t at = kFixedHeaderBytes;
  if (h.mode == kModeCoded) {
    if (len < at + 2) return Status::Corrupt("ctx payload header is truncated");
    h.class_lo = payload[at];
    h.class_hi = payload[at + 1];
    at += 2;
  } else if (h.mode != kModeLiteral) {
    return Status::Corrupt("ctx payload mode " + std::to_string(h.mode) + " is not 0 or 1");
  }
  if (!GetVarint(payload, len, &at, &h.n)) {
    return Status::Corrupt("ctx payload element count is truncated or malformed");
  }
  if (h.n != target.n_elems) {
    return Status::Corrupt("ctx payload is for " + std::to_string(h.n) +
                           " elements, the target has " + std::to_string(target.n_elems));
  }
  auto* bits = static_cast<uint8_t*>(target.bits);
  if (h.mode == kModeLiteral) {
    if (len - at != bytes) {
      return Status::Corrupt("ctx literal payload has " + std::to_string(len - at) +
                             " value bytes, expected " + std::to_string(bytes));
    }
    if (bytes > 0) std::memcpy(bits, payload + at, bytes);
    return Status::OK();
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
  return WithDType(target.dtype, *spec, [&](auto elem, auto cls) -> Status {
    // class_hi < kNumClasses (one byte): every class indexes the tables.
    return DecodeBody<decltype(elem)>(h, *spec, cls, payload + at, len - at, bits);
  });
}

}  // namespace refit::ctx
