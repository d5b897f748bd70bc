// The encoding conformance suite: every encoding x every dtype must pass these checks of the
// contract in plugin_abi.h. Instantiate EncodingConformanceTest over (encoding name, dtype) pairs,
// e.g. Combine(ValuesIn(ComponentNames(REFIT_KIND_ENCODING)), ValuesIn(AllDTypeValues())), with
// EncodingParamName; see common.h for how a binary provides the registry.
//
// Data is adversarial on purpose: NaNs with payloads (quiet and signalling), +-0, +-inf,
// subnormals, extremes and random bits, and the changes include the ones a float compare would
// miss (+0 -> -0, one NaN payload -> another).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "refit/conformance/common.h"
#include "refit/dtype.h"
#include "refit/kernels/diff.h"
#include "refit/plugin_abi.h"
#include "refit/registry.h"

namespace refit::conformance {

inline constexpr double kDensities[] = {0.0, 1e-4, 0.01, 0.5, 1.0};
inline constexpr uint64_t kSizes[] = {0, 1, 7, 4099, 200003};
// Truncation and corruption try every byte of payloads up to this size, a sample beyond it.
inline constexpr uint64_t kExhaustiveBytes = 2048;
inline constexpr uint64_t kSampledBytes = 256;
inline constexpr size_t kGuardBytes = 512;
inline constexpr uint8_t kGuardByte = 0xA5;

inline std::vector<DType> AllDTypeValues() {
  size_t count = 0;
  const DTypeInfo* table = AllDTypes(&count);
  std::vector<DType> out;
  for (size_t i = 0; i < count; ++i) out.push_back(table[i].dtype);
  return out;
}

// Bit patterns that break value-based comparisons, per dtype (little-endian integers of the
// element's width). The generic integer extremes are added for every dtype.
inline std::vector<uint64_t> SpecialPatterns(DType dtype) {
  std::vector<uint64_t> p;
  switch (dtype) {
    case DType::kF32:
      p = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0x7fc00001, 0xffc00000,
           0x7f800001, 0x7fbfffff, 0x00000001, 0x807fffff, 0x00800000, 0x7f7fffff, 0xff7fffff};
      break;
    case DType::kF64:
      p = {0x0000000000000000, 0x8000000000000000, 0x7ff0000000000000, 0xfff0000000000000,
           0x7ff8000000000000, 0x7ff8000000000001, 0xfff8000000000000, 0x7ff0000000000001,
           0x7ff7ffffffffffff, 0x0000000000000001, 0x800fffffffffffff, 0x0010000000000000,
           0x7fefffffffffffff, 0xffefffffffffffff};
      break;
    case DType::kF16:
      p = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x7e01, 0xfe00,
           0x7c01, 0x7dff, 0x0001, 0x83ff, 0x0400, 0x7bff, 0xfbff};
      break;
    case DType::kBF16:
      p = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x7fc1, 0xffc0,
           0x7f81, 0x7fbf, 0x0001, 0x807f, 0x0080, 0x7f7f, 0xff7f};
      break;
    case DType::kF8E4M3:  // no infinities; S.1111.111 is NaN
      p = {0x00, 0x80, 0x7f, 0xff, 0x01, 0x81, 0x07, 0x08, 0x7e, 0xfe};
      break;
    case DType::kF8E5M2:
      p = {0x00, 0x80, 0x7c, 0xfc, 0x7e, 0x7f, 0x7d, 0xfe, 0x01, 0x83, 0x04, 0x7b, 0xfb};
      break;
    case DType::kBool:
      p = {0x00, 0x01};
      break;
    default:
      break;
  }
  const uint32_t bits = SizeOf(dtype) * 8;
  const uint64_t all_ones = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
  const uint64_t sign = uint64_t{1} << (bits - 1);
  for (uint64_t v : {uint64_t{0}, uint64_t{1}, all_ones, sign, sign - 1}) p.push_back(v);
  return p;
}

// Changes a float compare would not see, per dtype: +0 -> -0 and a NaN -> another NaN.
inline std::vector<std::pair<uint64_t, uint64_t>> PinnedChanges(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return {{0x00000000, 0x80000000}, {0x7fc00000, 0x7fc00001}};
    case DType::kF64:
      return {{0x0000000000000000, 0x8000000000000000}, {0x7ff8000000000000, 0x7ff8000000000001}};
    case DType::kF16:
      return {{0x0000, 0x8000}, {0x7e00, 0x7e01}};
    case DType::kBF16:
      return {{0x0000, 0x8000}, {0x7fc0, 0x7fc1}};
    case DType::kF8E4M3:
      return {{0x00, 0x80}, {0x7f, 0xff}};  // its only NaNs
    case DType::kF8E5M2:
      return {{0x00, 0x80}, {0x7e, 0x7f}};
    default:
      return {};
  }
}

// One element's bits as a little-endian integer of its width.
inline uint64_t GetElem(const std::vector<uint8_t>& bits, uint64_t i, uint32_t elem_size) {
  uint64_t v = 0;
  for (uint32_t b = 0; b < elem_size; ++b) v |= uint64_t{bits[i * elem_size + b]} << (8 * b);
  return v;
}
inline void SetElem(std::vector<uint8_t>* bits, uint64_t i, uint32_t elem_size, uint64_t v) {
  for (uint32_t b = 0; b < elem_size; ++b) {
    (*bits)[i * elem_size + b] = static_cast<uint8_t>(v >> (8 * b));
  }
}

struct TensorPair {
  std::vector<uint8_t> old_bits;
  std::vector<uint8_t> new_bits;
  uint64_t changed = 0;  // how many elements differ
};

// old: mostly special patterns, a quarter random bits. new: old with round(density * n) random
// positions (at least one when density > 0) changed to a different pattern: the sign bit flipped
// (+0 -> -0, NaN -> negative NaN), the lowest bit flipped (NaN payloads), another special, or
// random bits; the first changes are the dtype's PinnedChanges.
inline TensorPair MakePair(DType dtype, uint64_t n, double density, uint64_t seed) {
  const uint32_t es = SizeOf(dtype);
  const uint32_t bits = es * 8;
  const uint64_t width_mask = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
  const std::vector<uint64_t> special = SpecialPatterns(dtype);
  std::mt19937_64 rng(seed);
  auto random_pattern = [&] {
    return (rng() % 4 == 0) ? (rng() & width_mask) : special[rng() % special.size()];
  };

  TensorPair pair;
  pair.old_bits.resize(n * es);
  for (uint64_t i = 0; i < n; ++i) SetElem(&pair.old_bits, i, es, random_pattern());
  pair.new_bits = pair.old_bits;

  uint64_t k = 0;
  if (density > 0 && n > 0) {
    k = std::clamp<uint64_t>(static_cast<uint64_t>(density * static_cast<double>(n) + 0.5), 1, n);
  }
  std::vector<uint64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  order.resize(k);

  const uint64_t sign = uint64_t{1} << (bits - 1);
  const std::vector<std::pair<uint64_t, uint64_t>> pinned = PinnedChanges(dtype);
  for (uint64_t j = 0; j < k; ++j) {
    const uint64_t i = order[j];
    uint64_t old_value = GetElem(pair.old_bits, i, es);
    uint64_t new_value = 0;
    if (j < pinned.size()) {
      old_value = pinned[j].first;
      new_value = pinned[j].second;
      SetElem(&pair.old_bits, i, es, old_value);
    } else {
      switch (rng() % 4) {
        case 0:
          new_value = old_value ^ sign;
          break;
        case 1:
          new_value = old_value ^ 1;
          break;
        default:
          new_value = random_pattern();
          break;
      }
      if (new_value == old_value) new_value = old_value ^ 1;
    }
    SetElem(&pair.new_bits, i, es, new_value & width_mask);
  }
  pair.changed = k;
  return pair;
}

// A decode target with guard bytes on both sides, to catch writes outside [bits, bits + bytes).
class GuardedTarget {
 public:
  GuardedTarget(const uint8_t* init, uint64_t bytes)
      : bytes_(bytes), storage_(bytes + 2 * kGuardBytes, kGuardByte) {
    if (bytes > 0) std::memcpy(bits(), init, bytes);
  }
  uint8_t* bits() { return storage_.data() + kGuardBytes; }
  bool GuardsIntact() const {
    static const std::vector<uint8_t> kGuard(kGuardBytes, kGuardByte);
    return std::memcmp(storage_.data(), kGuard.data(), kGuardBytes) == 0 &&
           std::memcmp(storage_.data() + kGuardBytes + bytes_, kGuard.data(), kGuardBytes) == 0;
  }
  bool Equals(const std::vector<uint8_t>& want) {
    return want.size() == bytes_ && (bytes_ == 0 || std::memcmp(bits(), want.data(), bytes_) == 0);
  }
  refit_decode_target_t Target(DType dtype, uint64_t n) {
    refit_decode_target_t t{};
    t.struct_size = sizeof(t);
    t.dtype = static_cast<int32_t>(dtype);
    t.elem_size = SizeOf(dtype);
    t.n_elems = n;
    t.bits = bits();
    return t;
  }

 private:
  uint64_t bytes_;
  std::vector<uint8_t> storage_;
};

inline std::string Describe(DType dtype, uint64_t n, double density) {
  return std::string(NameOf(dtype)) + " n=" + std::to_string(n) +
         " density=" + std::to_string(density);
}

class EncodingConformanceTest : public ::testing::TestWithParam<std::tuple<std::string, DType>> {
 protected:
  void SetUp() override {
    auto registry = LoadConformanceRegistry();
    ASSERT_TRUE(registry.ok()) << registry.status().ToString();
    registry_ = std::move(registry).value();
    auto encoding = registry_->CreateEncoding(std::get<0>(GetParam()));
    ASSERT_TRUE(encoding.ok()) << encoding.status().ToString();
    encoding_ = std::move(encoding).value();
    dtype_ = std::get<1>(GetParam());
    es_ = SizeOf(dtype_);
  }

  // A delta input for pair (positions computed by the diff kernel into positions_).
  refit_encode_input_t DeltaInput(const TensorPair& pair, uint64_t n) {
    positions_.clear();
    const uint64_t changed =
        kernels::DiffPositions(pair.old_bits.data(), pair.new_bits.data(), n, es_, &positions_);
    refit_encode_input_t in{};
    in.struct_size = sizeof(in);
    in.dtype = static_cast<int32_t>(dtype_);
    in.elem_size = es_;
    in.n_elems = n;
    in.old_bits = pair.old_bits.data();
    in.new_bits = pair.new_bits.data();
    in.positions = positions_.data();
    in.n_changed = changed;
    return in;
  }

  refit_encode_input_t FullInput(const TensorPair& pair, uint64_t n) {
    refit_encode_input_t in{};
    in.struct_size = sizeof(in);
    in.dtype = static_cast<int32_t>(dtype_);
    in.elem_size = es_;
    in.n_elems = n;
    in.new_bits = pair.new_bits.data();
    in.n_changed = n;
    return in;
  }

  // Encodes in, checking the size contract; an empty vector + failure on error.
  std::vector<uint8_t> EncodeOk(const refit_encode_input_t& in, const std::string& what) {
    Result<uint64_t> bound = encoding_->MaxEncodedSize(in);
    EXPECT_TRUE(bound.ok()) << what << ": " << bound.status().ToString();
    const uint64_t max = bound.ok() ? *bound : 0;
    EXPECT_GT(max, 0u) << what << ": MaxEncodedSize is 0 (cannot encode)";
    std::vector<uint8_t> out(std::max<uint64_t>(max, 1));
    Result<uint64_t> written = encoding_->Encode(in, out.data(), max);
    EXPECT_TRUE(written.ok()) << what << ": " << written.status().ToString();
    if (!written.ok()) return {};
    EXPECT_LE(*written, max) << what;
    out.resize(*written);
    return out;
  }

  // decode_changes of `payload` against `old` (n elements), listed into positions / values
  // (room for `room` changes; the vectors may be longer, as guards).
  Status ListChanges(const std::vector<uint8_t>& payload, const std::vector<uint8_t>& old,
                     uint64_t n, uint64_t room, std::vector<uint64_t>* positions,
                     std::vector<uint8_t>* values, uint64_t* count) {
    refit_decode_target_t t{};
    t.struct_size = sizeof(t);
    t.dtype = static_cast<int32_t>(dtype_);
    t.elem_size = es_;
    t.n_elems = n;
    t.bits = const_cast<uint8_t*>(old.data());
    refit_decoded_changes_t listed{};
    listed.struct_size = sizeof(listed);
    listed.capacity = room;
    listed.positions = positions->data();
    listed.values = values->data();
    Status st = encoding_->DecodeChanges(payload.data(), payload.size(), t, &listed);
    *count = listed.count;
    return st;
  }

  std::shared_ptr<Registry> registry_;
  std::unique_ptr<Encoding> encoding_;
  DType dtype_ = DType::kU8;
  uint32_t es_ = 1;
  std::vector<uint64_t> positions_;
};

TEST_P(EncodingConformanceTest, DeltaRoundTripsBitExact) {
  uint64_t seed = 1;
  for (uint64_t n : kSizes) {
    for (double density : kDensities) {
      const std::string what = Describe(dtype_, n, density);
      const TensorPair pair = MakePair(dtype_, n, density, seed++);
      const refit_encode_input_t in = DeltaInput(pair, n);
      ASSERT_EQ(in.n_changed, pair.changed) << what << ": the generator's changes are all bitwise";

      const std::vector<uint8_t> payload = EncodeOk(in, what);
      if (HasFailure()) return;
      const std::vector<uint8_t> again = EncodeOk(in, what);
      EXPECT_EQ(payload, again) << what << ": encoding the same input twice differs";

      GuardedTarget target(pair.old_bits.data(), pair.old_bits.size());
      Status st = encoding_->Decode(payload.data(), payload.size(), target.Target(dtype_, n));
      ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();
      EXPECT_TRUE(target.GuardsIntact()) << what << ": decode wrote outside the target";
      ASSERT_TRUE(target.Equals(pair.new_bits)) << what << ": decoded bits differ from new bits";

      if (encoding_->op() == REFIT_OP_OVERWRITE) {
        st = encoding_->Decode(payload.data(), payload.size(), target.Target(dtype_, n));
        ASSERT_TRUE(st.ok()) << what << ": second decode: " << st.ToString();
        EXPECT_TRUE(target.Equals(pair.new_bits)) << what << ": overwrite is not idempotent";
      }
    }
  }
}

// ABI 1.2: the host may hand the changed elements' bits packed (old_values / new_values). The
// payload must not depend on whether it did, nor on an ABI 1.0 sized input (no such fields).
TEST_P(EncodingConformanceTest, PackedValuesGiveTheSamePayload) {
  uint64_t seed = 300;
  for (uint64_t n : kSizes) {
    for (double density : kDensities) {
      const std::string what = Describe(dtype_, n, density);
      const TensorPair pair = MakePair(dtype_, n, density, seed++);
      refit_encode_input_t in = DeltaInput(pair, n);
      const std::vector<uint8_t> plain = EncodeOk(in, what);
      if (HasFailure()) return;
      std::vector<uint8_t> old_values(in.n_changed * es_ + 1);
      std::vector<uint8_t> new_values(in.n_changed * es_ + 1);
      for (uint64_t j = 0; j < in.n_changed; ++j) {
        std::memcpy(old_values.data() + j * es_, pair.old_bits.data() + in.positions[j] * es_, es_);
        std::memcpy(new_values.data() + j * es_, pair.new_bits.data() + in.positions[j] * es_, es_);
      }
      in.old_values = old_values.data();
      in.new_values = new_values.data();
      EXPECT_EQ(EncodeOk(in, what + ", packed values"), plain) << what;
      in.old_values = nullptr;
      EXPECT_EQ(EncodeOk(in, what + ", packed new values only"), plain) << what;
      in.new_values = new_values.data();
      in.struct_size = offsetof(refit_encode_input_t, old_values);  // an ABI 1.0 host
      EXPECT_EQ(EncodeOk(in, what + ", ABI 1.0 input"), plain) << what;
    }
  }
}

TEST_P(EncodingConformanceTest, FullSyncIntoGarbage) {
  const bool full_sync = (encoding_->capabilities() & REFIT_ENC_CAP_FULL_SYNC) != 0;
  uint64_t seed = 100;
  for (uint64_t n : kSizes) {
    const std::string what = Describe(dtype_, n, 1.0) + " full sync";
    const TensorPair pair = MakePair(dtype_, n, 1.0, seed++);
    const refit_encode_input_t in = FullInput(pair, n);
    if (!full_sync) {
      // Without the capability the host never asks; if asked anyway it must refuse, not crash.
      // (An empty run is the same as an empty delta.)
      if (n == 0) continue;
      std::vector<uint8_t> out(n * es_ * 2 + 64);
      EXPECT_FALSE(encoding_->Encode(in, out.data(), out.size()).ok())
          << what << ": encoding without REFIT_ENC_CAP_FULL_SYNC accepted old_bits == NULL";
      continue;
    }
    const std::vector<uint8_t> payload = EncodeOk(in, what);
    if (HasFailure()) return;
    std::vector<uint8_t> garbage(n * es_);
    std::mt19937_64 rng(seed);
    for (auto& byte : garbage) byte = static_cast<uint8_t>(rng());
    GuardedTarget target(garbage.data(), garbage.size());
    Status st = encoding_->Decode(payload.data(), payload.size(), target.Target(dtype_, n));
    ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();
    EXPECT_TRUE(target.GuardsIntact()) << what;
    EXPECT_TRUE(target.Equals(pair.new_bits)) << what << ": decoded bits differ from new bits";
  }
}

TEST_P(EncodingConformanceTest, EncodeIntoTooSmallBufferFailsCleanly) {
  uint64_t seed = 200;
  for (uint64_t n : {uint64_t{1}, uint64_t{7}, uint64_t{4099}}) {
    for (double density : {0.01, 1.0}) {
      const std::string what = Describe(dtype_, n, density);
      const TensorPair pair = MakePair(dtype_, n, density, seed++);
      const refit_encode_input_t in = DeltaInput(pair, n);
      const std::vector<uint8_t> payload = EncodeOk(in, what);
      if (HasFailure()) return;
      for (uint64_t cap : {uint64_t{0}, payload.size() / 2, payload.size() - 1}) {
        if (payload.empty() || cap >= payload.size()) continue;
        std::vector<uint8_t> out(cap + kGuardBytes, kGuardByte);
        Result<uint64_t> written = encoding_->Encode(in, out.data(), cap);
        EXPECT_FALSE(written.ok()) << what << ": encode into " << cap << " bytes (needs "
                                   << payload.size() << ") succeeded";
        EXPECT_TRUE(std::all_of(out.begin() + static_cast<ptrdiff_t>(cap), out.end(),
                                [](uint8_t b) { return b == kGuardByte; }))
            << what << ": encode wrote past cap " << cap;
      }
    }
  }
}

// Byte offsets to try on a payload of len bytes: all of them when small, else the first and last
// bytes plus a random sample.
inline std::vector<uint64_t> OffsetsToTry(uint64_t len, std::mt19937_64* rng) {
  std::vector<uint64_t> out;
  if (len <= kExhaustiveBytes) {
    for (uint64_t i = 0; i < len; ++i) out.push_back(i);
    return out;
  }
  for (uint64_t i = 0; i < 64; ++i) out.push_back(i);
  for (uint64_t i = len - 64; i < len; ++i) out.push_back(i);
  for (uint64_t i = 0; i < kSampledBytes; ++i) out.push_back((*rng)() % len);
  return out;
}

// A truncated record is corruption: it must be refused (a prefix that decodes would leave the
// target half-updated) and must never write outside the target.
TEST_P(EncodingConformanceTest, TruncatedPayloadIsRefused) {
  uint64_t seed = 300;
  std::mt19937_64 rng(seed);
  for (uint64_t n : {uint64_t{1}, uint64_t{7}, uint64_t{4099}}) {
    for (double density : {0.01, 0.5, 1.0}) {
      const std::string what = Describe(dtype_, n, density);
      const TensorPair pair = MakePair(dtype_, n, density, seed++);
      const std::vector<uint8_t> payload = EncodeOk(DeltaInput(pair, n), what);
      if (HasFailure()) return;
      for (uint64_t len : OffsetsToTry(payload.size(), &rng)) {
        // Exactly len bytes, so a sanitizer build also catches reads past the end.
        std::vector<uint8_t> prefix(payload.begin(), payload.begin() + static_cast<ptrdiff_t>(len));
        GuardedTarget target(pair.old_bits.data(), pair.old_bits.size());
        Status st = encoding_->Decode(prefix.data(), len, target.Target(dtype_, n));
        EXPECT_FALSE(st.ok()) << what << ": a " << len << "-byte prefix of a " << payload.size()
                              << "-byte payload decoded";
        ASSERT_TRUE(target.GuardsIntact()) << what << ": prefix " << len << " wrote outside";
      }
    }
  }
}

// Any single corrupted byte may decode to other bits (the record digest catches that) or be
// refused, but never crash or write outside the target.
TEST_P(EncodingConformanceTest, CorruptedPayloadNeverWritesOutside) {
  uint64_t seed = 400;
  std::mt19937_64 rng(seed);
  for (uint64_t n : {uint64_t{1}, uint64_t{7}, uint64_t{4099}}) {
    for (double density : {0.01, 0.5, 1.0}) {
      const std::string what = Describe(dtype_, n, density);
      const TensorPair pair = MakePair(dtype_, n, density, seed++);
      std::vector<uint8_t> payload = EncodeOk(DeltaInput(pair, n), what);
      if (HasFailure()) return;
      for (uint64_t offset : OffsetsToTry(payload.size(), &rng)) {
        const uint8_t original = payload[offset];
        for (uint8_t replacement :
             {uint8_t(original ^ 0x01), uint8_t(original ^ 0x80), uint8_t{0x00}, uint8_t{0xff}}) {
          if (replacement == original) continue;
          payload[offset] = replacement;
          GuardedTarget target(pair.old_bits.data(), pair.old_bits.size());
          (void)encoding_->Decode(payload.data(), payload.size(), target.Target(dtype_, n));
          ASSERT_TRUE(target.GuardsIntact())
              << what << ": byte " << offset << " set to " << int{replacement}
              << " made decode write outside the target";
        }
        payload[offset] = original;
      }
    }
  }
}

// A valid payload applied to a run of another length (a host bug or a mixed-up record) may be
// refused or not, but stays inside the target it was given.
TEST_P(EncodingConformanceTest, PayloadForAnotherSizeStaysInsideTarget) {
  uint64_t seed = 500;
  for (uint64_t n : {uint64_t{7}, uint64_t{4099}}) {
    for (double density : {0.01, 1.0}) {
      const std::string what = Describe(dtype_, n, density);
      const TensorPair pair = MakePair(dtype_, n, density, seed++);
      const std::vector<uint8_t> payload = EncodeOk(DeltaInput(pair, n), what);
      if (HasFailure()) return;
      for (uint64_t other : {uint64_t{0}, n / 2, n - 1, n + 1, 2 * n}) {
        std::vector<uint8_t> base(other * es_, 0x3c);
        GuardedTarget target(base.data(), base.size());
        (void)encoding_->Decode(payload.data(), payload.size(), target.Target(dtype_, other));
        EXPECT_TRUE(target.GuardsIntact())
            << what << ": payload decoded into " << other << " elements wrote outside";
      }
    }
  }
}

// ABI 1.4 decode_changes, where an encoding offers it: the listed changes of a delta are exactly
// its changed elements (ascending) with their new bits; the old bits are only read; a room of
// one change fewer is refused without a write past it.
TEST_P(EncodingConformanceTest, ListedChangesAreTheDelta) {
  if (!encoding_->can_decode_changes()) GTEST_SKIP() << "no decode_changes";
  uint64_t seed = 600;
  for (uint64_t n : kSizes) {
    for (double density : kDensities) {
      const std::string what = Describe(dtype_, n, density);
      const TensorPair pair = MakePair(dtype_, n, density, seed++);
      const refit_encode_input_t in = DeltaInput(pair, n);
      const std::vector<uint8_t> payload = EncodeOk(in, what);
      if (HasFailure()) return;
      for (uint64_t room : {in.n_changed, in.n_changed + 3, in.n_changed - 1}) {
        if (room > n + 3) continue;  // n_changed - 1 of 0 wrapped
        std::vector<uint64_t> positions(room + kGuardBytes, ~uint64_t{0});
        std::vector<uint8_t> values((room + kGuardBytes) * es_, kGuardByte);
        const std::vector<uint8_t> old = pair.old_bits;
        uint64_t count = 0;
        Status st = ListChanges(payload, old, n, room, &positions, &values, &count);
        EXPECT_TRUE(old == pair.old_bits) << what << ": decode_changes wrote the old bits";
        for (uint64_t g = room; g < room + kGuardBytes; ++g) {
          ASSERT_EQ(positions[g], ~uint64_t{0}) << what << ": a position written past the room";
        }
        for (uint64_t b = room * es_; b < values.size(); ++b) {
          ASSERT_EQ(values[b], kGuardByte) << what << ": a value written past the room";
        }
        if (room < in.n_changed) {
          EXPECT_FALSE(st.ok()) << what << ": " << in.n_changed << " changes listed in room for "
                                << room;
          continue;
        }
        ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();
        ASSERT_EQ(count, in.n_changed) << what;
        for (uint64_t j = 0; j < count; ++j) {
          ASSERT_EQ(positions[j], in.positions[j]) << what << ": change " << j;
          ASSERT_EQ(std::memcmp(values.data() + j * es_,
                                pair.new_bits.data() + in.positions[j] * es_, es_),
                    0)
              << what << ": value of change " << j;
        }
      }
    }
  }
}

// A corrupted payload may be listed or refused, but a listing stays inside its room, in order
// and inside the record, and never writes the old bits.
TEST_P(EncodingConformanceTest, CorruptedPayloadListsInsideItsRoom) {
  if (!encoding_->can_decode_changes()) GTEST_SKIP() << "no decode_changes";
  uint64_t seed = 700;
  std::mt19937_64 rng(seed);
  for (uint64_t n : {uint64_t{7}, uint64_t{4099}}) {
    for (double density : {0.01, 0.5}) {
      const std::string what = Describe(dtype_, n, density);
      const TensorPair pair = MakePair(dtype_, n, density, seed++);
      const refit_encode_input_t in = DeltaInput(pair, n);
      std::vector<uint8_t> payload = EncodeOk(in, what);
      if (HasFailure()) return;
      const uint64_t room = in.n_changed;
      for (uint64_t offset : OffsetsToTry(payload.size(), &rng)) {
        const uint8_t original = payload[offset];
        payload[offset] = static_cast<uint8_t>(original ^ 0x21);
        std::vector<uint64_t> positions(room + 1, ~uint64_t{0});
        std::vector<uint8_t> values((room + 1) * es_, kGuardByte);
        const std::vector<uint8_t> old = pair.old_bits;
        uint64_t count = 0;
        Status st = ListChanges(payload, old, n, room, &positions, &values, &count);
        payload[offset] = original;
        ASSERT_TRUE(old == pair.old_bits) << what << ": byte " << offset << ": old bits written";
        ASSERT_EQ(positions[room], ~uint64_t{0}) << what << ": byte " << offset;
        for (uint64_t b = room * es_; b < values.size(); ++b) ASSERT_EQ(values[b], kGuardByte);
        if (!st.ok()) continue;
        for (uint64_t j = 0; j < count; ++j) {
          ASSERT_LT(positions[j], n) << what << ": byte " << offset;
          if (j > 0) {
            ASSERT_GT(positions[j], positions[j - 1]) << what << ": byte " << offset;
          }
        }
      }
    }
  }
}

inline std::string EncodingParamName(
    const ::testing::TestParamInfo<std::tuple<std::string, DType>>& info) {
  return SanitizeTestName(std::get<0>(info.param) + "_" +
                          std::string(NameOf(std::get<1>(info.param))));
}

}  // namespace refit::conformance
