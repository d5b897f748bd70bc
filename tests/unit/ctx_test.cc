// Codec-level tests of the `ctx` encoding (plugins/encodings/ctx/ctx_codec.cc is compiled into
// this binary). The encoding conformance suite covers the plugin contract on every dtype; these
// check what is specific to ctx: the size target on a realistic delta, the step model on every
// bf16 pattern, the literal fallback, the checksum and header checks, and thread safety of the
// per-thread scratch.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "ctx_bound.h"
#include "ctx_codec.h"
#include "ctx_test_util.h"
#include "refit/kernels/diff.h"
#include "refit/kernels/dispatch.h"
#include "refit/sdk/encoding_util.hpp"
#include "synthetic/synthetic.h"

namespace refit {
namespace {

using Delta = testing::CtxDelta;

std::vector<uint8_t> EncodeOrDie(Delta& d) {
  const refit_encode_input_t in = d.Input();
  std::vector<uint8_t> out(ctx::MaxEncodedSize(in));
  Result<uint64_t> size = ctx::Encode(in, out.data(), out.size());
  EXPECT_TRUE(size.ok()) << size.status().ToString();
  out.resize(size.ok() ? *size : 0);
  return out;
}

// Decodes onto a copy of the old bits; true when that gives exactly the new bits.
bool RoundTrips(Delta& d, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> bits = d.old_bits;
  Status st = ctx::Decode(payload.data(), payload.size(), d.Target(&bits));
  EXPECT_TRUE(st.ok()) << st.ToString();
  return st.ok() && bits == d.new_bits;
}

// One step of the project's synthetic trajectory at lr 1e-6, all tensors back to back.
Delta MakeSyntheticDelta() {
  SyntheticModelSpec spec;
  spec.hidden = 256;
  spec.layers = 4;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.ffn = 688;
  spec.vocab = 4096;
  SyntheticModel model(spec);
  model.Step(1e-6);
  Delta d;
  for (const TensorView& v : model.bf16()) {
    d.old_bits.insert(d.old_bits.end(), v.bytes(), v.bytes() + v.nbytes());
  }
  model.Step(1e-6);
  for (const TensorView& v : model.bf16()) {
    d.new_bits.insert(d.new_bits.end(), v.bytes(), v.bytes() + v.nbytes());
  }
  return d;
}

// Made once (the model steps ~2M weights); each test gets its own copy.
Delta SyntheticDelta() {
  static const Delta kDelta = MakeSyntheticDelta();
  return kDelta;
}

TEST(CtxCodec, SyntheticDeltaIsWellBelowTheOrder0Bound) {
  Delta d = SyntheticDelta();
  const std::vector<uint8_t> payload = EncodeOrDie(d);
  ASSERT_TRUE(RoundTrips(d, payload));
  const double density = static_cast<double>(d.positions.size()) / static_cast<double>(d.n());
  EXPECT_GT(density, 0.005);
  EXPECT_LT(density, 0.03);
  const ctx::Order0Bound bound = ctx::ComputeOrder0Bound(
      d.old_bits.data(), d.new_bits.data(), 2, d.n(), d.positions.data(), d.positions.size());
  // ctx's target (plugins/encodings/ctx/README.md) is <= 0.75x the bound; this run measures ~0.66x.
  EXPECT_LT(static_cast<double>(payload.size()), 0.75 * bound.total_bytes())
      << payload.size() << " bytes vs bound " << bound.total_bytes();
}

// The table form (what records of 2^12 changes or more get) on the same delta: bit-exact and as
// far below the bound (most of its slot tables are geometric here: a few bytes each).
TEST(CtxCodec, TableFormOfTheSyntheticDeltaRoundTripsBelowTheBound) {
  Delta d = SyntheticDelta();
  const refit_encode_input_t in = d.Input();
  std::vector<uint8_t> payload(ctx::MaxEncodedSize(in));
  Result<uint64_t> size = ctx::EncodeAt(kernels::ActiveSimdLevel(), in, payload.data(),
                                        payload.size(), ctx::CodedForm::kTables);
  ASSERT_TRUE(size.ok()) << size.status().ToString();
  payload.resize(*size);
  ASSERT_EQ(payload[5], 2) << "expected the table form";
  ASSERT_TRUE(RoundTrips(d, payload));
  const ctx::Order0Bound bound = ctx::ComputeOrder0Bound(
      d.old_bits.data(), d.new_bits.data(), 2, d.n(), d.positions.data(), d.positions.size());
  EXPECT_LT(static_cast<double>(payload.size()), 0.75 * bound.total_bytes())
      << payload.size() << " bytes vs bound " << bound.total_bytes();
}

std::vector<uint8_t> EncodeTablesOrDie(Delta& d, kernels::SimdLevel level) {
  const refit_encode_input_t in = d.Input();
  std::vector<uint8_t> out(ctx::MaxEncodedSize(in));
  Result<uint64_t> size = ctx::EncodeAt(level, in, out.data(), out.size(), ctx::CodedForm::kTables);
  EXPECT_TRUE(size.ok()) << size.status().ToString();
  out.resize(size.ok() ? *size : 0);
  EXPECT_EQ(out.size() > 5 ? out[5] : 0, 2) << "expected the table form";
  return out;
}

// Where a table-form payload's slot list starts: after version, checksum, mode, dtype, the
// class range and the varints n and k.
size_t SlotListOffset(const std::vector<uint8_t>& payload) {
  size_t at = 9;
  for (int varint = 0; varint < 2; ++varint) {
    while (payload[at] & 0x80) ++at;
    ++at;
  }
  return at;
}

// The (first, last) classes of each slot of a table-form payload.
std::vector<std::pair<int, int>> SlotsOf(const std::vector<uint8_t>& payload) {
  size_t at = SlotListOffset(payload);
  std::vector<std::pair<int, int>> slots(payload[at] + 1u);
  for (auto& slot : slots) {
    slot = {payload[at + 1], payload[at + 2]};
    at += 2;
  }
  return slots;
}

// A bf16 delta whose change rate does not depend on the old value's exponent (12 exponents,
// 1% of the elements move by one ULP), like `refit bench codec --density`.
Delta UniformRateDelta(uint64_t n) {
  std::mt19937_64 rng(11);
  Delta d;
  d.old_bits.resize(2 * n);
  d.new_bits.resize(2 * n);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t r = rng();
    const auto bits =
        static_cast<uint16_t>(((r >> 8) & 0x8000) | ((113 + r % 12) << 7) | ((r >> 16) & 0x7f));
    const uint16_t moved = (r >> 32) % 100 == 0 ? static_cast<uint16_t>(bits + 1) : bits;
    std::memcpy(d.old_bits.data() + 2 * i, &bits, 2);
    std::memcpy(d.new_bits.data() + 2 * i, &moved, 2);
  }
  return d;
}

// No exponent structure: per-class runs would code nothing better than plain distances, so the
// encoder codes one slot of every class (the decoder then reads no class at all).
TEST(CtxCodec, UniformChangeRatesShareOneSlotOfEveryClass) {
  Delta d = UniformRateDelta(1 << 20);
  const std::vector<uint8_t> payload = EncodeTablesOrDie(d, kernels::ActiveSimdLevel());
  EXPECT_EQ(SlotsOf(payload), (std::vector<std::pair<int, int>>{{0, 255}}));
  ASSERT_TRUE(RoundTrips(d, payload));
  for (kernels::SimdLevel level : {kernels::SimdLevel::kScalar, kernels::SimdLevel::kAvx512}) {
    EXPECT_EQ(EncodeTablesOrDie(d, level), payload);
    std::vector<uint8_t> bits = d.old_bits;
    ASSERT_TRUE(ctx::DecodeAt(level, payload.data(), payload.size(), d.Target(&bits)).ok());
    EXPECT_TRUE(bits == d.new_bits);
  }
}

// The realistic delta's rate halves per exponent step: the classes keep separate slots (merged
// only where that costs next to nothing), ascending and not overlapping.
TEST(CtxCodec, ExponentDependentRatesKeepSeparateSlots) {
  Delta d = SyntheticDelta();
  const std::vector<uint8_t> payload = EncodeTablesOrDie(d, kernels::ActiveSimdLevel());
  const std::vector<std::pair<int, int>> slots = SlotsOf(payload);
  EXPECT_GE(slots.size(), 8u);
  for (size_t s = 0; s < slots.size(); ++s) {
    EXPECT_LE(slots[s].first, slots[s].second);
    if (s > 0) {
      EXPECT_GT(slots[s].first, slots[s - 1].second);
    }
  }
  EXPECT_EQ(slots.front().first, payload[7]);  // the header's class range
  EXPECT_EQ(slots.back().second, payload[8]);
  ASSERT_TRUE(RoundTrips(d, payload));
}

// Slot lists that are out of order, overlap, leave the header's class range or are cut short are
// refused before any write, at every level.
TEST(CtxCodec, ForgedSlotListsAreRefusedBeforeAnyWrite) {
  Delta d = SyntheticDelta();
  d.old_bits.resize(400000);
  d.new_bits.resize(400000);
  const std::vector<uint8_t> payload = EncodeTablesOrDie(d, kernels::ActiveSimdLevel());
  const size_t at = SlotListOffset(payload);
  ASSERT_GE(payload[at], 2) << "the test needs three slots or more";
  const auto forge = [&](const std::function<void(std::vector<uint8_t>&)>& edit) {
    std::vector<uint8_t> bad = payload;
    edit(bad);
    const uint64_t digest = kernels::Digest64(bad.data() + 5, bad.size() - 5);
    sdk::StoreLE<uint32_t>(bad.data() + 1, static_cast<uint32_t>(digest));
    return bad;
  };
  const std::vector<std::vector<uint8_t>> forged = {
      forge([&](auto& b) { std::swap(b[at + 1], b[at + 2]); }),             // first > last
      forge([&](auto& b) { b[at + 3] = b[at + 2]; }),                       // overlaps the previous
      forge([&](auto& b) { b[at + 1] = static_cast<uint8_t>(b[7] + 1); }),  // not the range's start
      forge([&](auto& b) { b[8] = static_cast<uint8_t>(b[8] + 1); }),       // range's end elsewhere
      forge([&](auto& b) { b[at] = 255; }),                                 // more slots than bytes
      forge([&](auto& b) { b.resize(at + 3); }),                            // cut in the list
  };
  for (size_t f = 0; f < forged.size(); ++f) {
    for (kernels::SimdLevel level : {kernels::SimdLevel::kScalar, kernels::SimdLevel::kAvx512}) {
      std::vector<uint8_t> bits = d.old_bits;
      const Status st = ctx::DecodeAt(level, forged[f].data(), forged[f].size(), d.Target(&bits));
      EXPECT_EQ(st.code(), StatusCode::kCorrupt) << "forgery " << f << ": " << st.ToString();
      EXPECT_TRUE(bits == d.old_bits) << "forgery " << f;
    }
  }
}

size_t SkipVarint(const std::vector<uint8_t>& payload, size_t at) {
  while (payload[at] & 0x80) ++at;
  return at + 1;
}

uint64_t ReadVarint(const std::vector<uint8_t>& payload, size_t* at) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const uint8_t b = payload[(*at)++];
    v |= uint64_t{b & 0x7fu} << shift;
    if (!(b & 0x80)) return v;
  }
}

// Where each slot's table of a table-form payload starts (after the slot list, the first runs
// and the counts) and where the step table starts (the last entry).
std::vector<size_t> TableOffsets(const std::vector<uint8_t>& payload) {
  size_t at = SlotListOffset(payload);
  const size_t slots = payload[at] + 1u;
  at += 1 + 2 * slots;
  for (size_t v = 0; v < 2 * slots; ++v) at = SkipVarint(payload, at);
  std::vector<size_t> offsets;
  for (size_t slot = 0; slot < slots; ++slot) {
    offsets.push_back(at);
    if (payload[at++] == 1) {  // geometric: rate, share
      at = SkipVarint(payload, SkipVarint(payload, at));
      continue;
    }
    const uint64_t m = ReadVarint(payload, &at);  // explicit: m, first, m frequencies
    if (m != 0) at = SkipVarint(payload, at) + m;
  }
  offsets.push_back(at);
  return offsets;
}

std::vector<uint8_t> EncodeFormOrDie(Delta& d, ctx::CodedForm form) {
  const refit_encode_input_t in = d.Input();
  std::vector<uint8_t> out(ctx::MaxEncodedSize(in));
  Result<uint64_t> size =
      ctx::EncodeAt(kernels::ActiveSimdLevel(), in, out.data(), out.size(), form);
  EXPECT_TRUE(size.ok()) << size.status().ToString();
  out.resize(size.ok() ? *size : 0);
  EXPECT_EQ(out.size() > 5 ? out[5] : 0, 2) << "expected the table form";
  return out;
}

// Geometric tables (format 4): the synthetic delta's per-class runs are close to geometric, so
// most slots take the few-byte table and the record shrinks; it decodes bit-exactly at every
// level (tests/unit/ctx_levels_test.cc runs every form on every dtype).
TEST(CtxCodec, GeometricTablesShrinkTheTableForm) {
  Delta d = SyntheticDelta();
  const std::vector<uint8_t> geometric = EncodeFormOrDie(d, ctx::CodedForm::kTables);
  const std::vector<uint8_t> explicit_only = EncodeFormOrDie(d, ctx::CodedForm::kTablesExplicit);
  EXPECT_LT(geometric.size(), explicit_only.size());
  size_t geometric_slots = 0;
  const std::vector<size_t> tables = TableOffsets(geometric);
  for (size_t t = 0; t + 1 < tables.size(); ++t) geometric_slots += geometric[tables[t]] == 1;
  EXPECT_GE(geometric_slots, 4u);
  const std::vector<size_t> explicit_tables = TableOffsets(explicit_only);
  for (size_t t = 0; t + 1 < explicit_tables.size(); ++t) {
    EXPECT_EQ(explicit_only[explicit_tables[t]], 0);
  }
  for (kernels::SimdLevel level :
       {kernels::SimdLevel::kScalar, kernels::SimdLevel::kAvx2, kernels::SimdLevel::kAvx512}) {
    for (const auto* payload : {&geometric, &explicit_only}) {
      std::vector<uint8_t> bits = d.old_bits;
      ASSERT_TRUE(ctx::DecodeAt(level, payload->data(), payload->size(), d.Target(&bits)).ok());
      EXPECT_TRUE(bits == d.new_bits);
    }
  }
}

// A geometric table of an unknown kind, a rate of 0 or above 1, a share above the total, or cut
// short is refused before any write, at every level.
TEST(CtxCodec, ForgedGeometricTablesAreRefusedBeforeAnyWrite) {
  Delta d = SyntheticDelta();
  d.old_bits.resize(400000);
  d.new_bits.resize(400000);
  const std::vector<uint8_t> payload = EncodeFormOrDie(d, ctx::CodedForm::kTables);
  const std::vector<size_t> tables = TableOffsets(payload);
  size_t at = 0;
  for (size_t t = 0; t + 1 < tables.size() && at == 0; ++t)
    at = payload[tables[t]] == 1 ? tables[t] : 0;
  ASSERT_NE(at, 0u) << "the test needs a geometric table";
  const size_t end = SkipVarint(payload, SkipVarint(payload, at + 1));
  // The payload with the table's bytes [at, end) replaced.
  const auto forge = [&](std::vector<uint8_t> table) {
    std::vector<uint8_t> bad(payload.begin(), payload.begin() + static_cast<ptrdiff_t>(at));
    bad.insert(bad.end(), table.begin(), table.end());
    bad.insert(bad.end(), payload.begin() + static_cast<ptrdiff_t>(end), payload.end());
    const uint64_t digest = kernels::Digest64(bad.data() + 5, bad.size() - 5);
    sdk::StoreLE<uint32_t>(bad.data() + 1, static_cast<uint32_t>(digest));
    return bad;
  };
  std::vector<std::vector<uint8_t>> forged = {
      forge({2, 0x80, 0x80, 0x01, 0x80, 0x10}),        // unknown kind
      forge({1, 0x00, 0x80, 0x10}),                    // rate 0
      forge({1, 0x81, 0x80, 0x80, 0x08, 0x80, 0x10}),  // rate 2^24 + 1
      forge({1, 0x80, 0x80, 0x01, 0x81, 0x20}),        // share 4097
  };
  forged.push_back(forged[1]);  // cut inside the rate's varint
  forged.back().resize(at + 2);
  forged.back()[at + 1] = 0x80;
  const uint64_t digest = kernels::Digest64(forged.back().data() + 5, forged.back().size() - 5);
  sdk::StoreLE<uint32_t>(forged.back().data() + 1, static_cast<uint32_t>(digest));
  for (size_t f = 0; f < forged.size(); ++f) {
    for (kernels::SimdLevel level :
         {kernels::SimdLevel::kScalar, kernels::SimdLevel::kAvx2, kernels::SimdLevel::kAvx512}) {
      std::vector<uint8_t> bits = d.old_bits;
      const Status st = ctx::DecodeAt(level, forged[f].data(), forged[f].size(), d.Target(&bits));
      EXPECT_EQ(st.code(), StatusCode::kCorrupt) << "forgery " << f << ": " << st.ToString();
      EXPECT_TRUE(bits == d.old_bits) << "forgery " << f;
    }
  }
  // Sanity: a valid rewrite of the same table (rate 1/2, no big steps) is accepted as a table
  // (the record then decodes to other bits or is refused later, but not for its table).
  std::vector<uint8_t> bits = d.old_bits;
  const std::vector<uint8_t> other = forge({1, 0x80, 0x80, 0x80, 0x04, 0x00});
  const Status st = ctx::Decode(other.data(), other.size(), d.Target(&bits));
  EXPECT_EQ(st.ToString().find("frequency table"), std::string::npos) << st.ToString();
}

// Every bf16 pattern as an old value, each moved by a step from a mix of one ULP, a few ULPs and
// random bits: crosses +-0, subnormals, inf and NaN payloads in the ordered representation.
TEST(CtxCodec, EveryBf16PatternSteppedRoundTrips) {
  std::mt19937_64 rng(7);
  Delta d;
  d.old_bits.resize(65536 * 2);
  d.new_bits.resize(65536 * 2);
  for (uint32_t v = 0; v < 65536; ++v) {
    uint16_t next = static_cast<uint16_t>(v);
    switch (rng() % 4) {
      case 0:
        next = static_cast<uint16_t>(v + 1);
        break;
      case 1:
        next = static_cast<uint16_t>(v - 1);
        break;
      case 2:
        next = static_cast<uint16_t>(v ^ 0x8000);  // sign flip (+0 <-> -0, NaN <-> -NaN)
        break;
      default:
        next = static_cast<uint16_t>(rng());
        break;
    }
    sdk::StoreLE<uint16_t>(d.old_bits.data() + 2 * v, static_cast<uint16_t>(v));
    sdk::StoreLE<uint16_t>(d.new_bits.data() + 2 * v, next);
  }
  EXPECT_TRUE(RoundTrips(d, EncodeOrDie(d)));
}

// One-ULP steps on wide and narrow float types, including across the sign (f64 also exercises
// the clamped exponent classes) and integer wrap-around.
TEST(CtxCodec, StepsRoundTripOnEveryWidth) {
  struct Case {
    int32_t dtype;
    uint32_t size;
  };
  for (Case c : {Case{REFIT_DTYPE_F64, 8}, Case{REFIT_DTYPE_F32, 4}, Case{REFIT_DTYPE_I64, 8},
                 Case{REFIT_DTYPE_I16, 2}, Case{REFIT_DTYPE_F8_E4M3, 1}, Case{REFIT_DTYPE_BOOL, 1},
                 Case{REFIT_DTYPE_F16, 2}}) {
    std::mt19937_64 rng(static_cast<uint64_t>(c.dtype));
    Delta d;
    d.dtype = c.dtype;
    d.elem_size = c.size;
    const uint64_t n = 20000;
    d.old_bits.resize(n * c.size);
    for (auto& b : d.old_bits) b = static_cast<uint8_t>(rng());
    d.new_bits = d.old_bits;
    for (uint64_t i = 0; i < n; i += 1 + rng() % 50) {
      uint64_t v = 0;
      std::memcpy(&v, d.old_bits.data() + i * c.size, c.size);
      v += (rng() & 1) ? 1 : ~uint64_t{0};  // +-1 on the raw pattern
      if (rng() % 10 == 0) v = rng();
      std::memcpy(d.new_bits.data() + i * c.size, &v, c.size);
    }
    EXPECT_TRUE(RoundTrips(d, EncodeOrDie(d))) << "dtype " << c.dtype;
  }
}

TEST(CtxCodec, DenseRandomChangesFallBackToLiteralNoLargerThanTheBits) {
  std::mt19937_64 rng(3);
  Delta d;
  d.old_bits.resize(2 * 5000);
  d.new_bits.resize(2 * 5000);
  for (auto& b : d.old_bits) b = static_cast<uint8_t>(rng());
  for (auto& b : d.new_bits) b = static_cast<uint8_t>(rng());
  const std::vector<uint8_t> payload = EncodeOrDie(d);
  ASSERT_TRUE(RoundTrips(d, payload));
  EXPECT_LE(payload.size(), d.new_bits.size() + 16);
  EXPECT_EQ(payload[5], 1) << "expected the literal mode";
}

TEST(CtxCodec, DamagedPayloadsAreRefusedBeforeAnyWrite) {
  Delta d = SyntheticDelta();
  d.old_bits.resize(200000);
  d.new_bits.resize(200000);
  std::vector<uint8_t> payload = EncodeOrDie(d);
  ASSERT_TRUE(RoundTrips(d, payload));
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<uint8_t> bad = payload;
    if (trial % 2 == 0) {
      bad.resize(rng() % payload.size());  // truncated
    } else {
      bad[rng() % bad.size()] ^= static_cast<uint8_t>(1 + rng() % 255);  // one byte damaged
    }
    std::vector<uint8_t> bits = d.old_bits;
    EXPECT_FALSE(ctx::Decode(bad.data(), bad.size(), d.Target(&bits)).ok()) << trial;
    EXPECT_EQ(bits, d.old_bits) << "trial " << trial << " wrote before refusing";
  }
}

TEST(CtxCodec, HeaderMustMatchTheTarget) {
  Delta d = SyntheticDelta();
  d.old_bits.resize(100000);
  d.new_bits.resize(100000);
  const std::vector<uint8_t> payload = EncodeOrDie(d);
  std::vector<uint8_t> bits = d.old_bits;
  refit_decode_target_t t = d.Target(&bits);
  t.n_elems -= 1;
  EXPECT_EQ(ctx::Decode(payload.data(), payload.size(), t).code(), StatusCode::kCorrupt);
  t = d.Target(&bits);
  t.dtype = REFIT_DTYPE_F16;  // same width, other classes
  EXPECT_EQ(ctx::Decode(payload.data(), payload.size(), t).code(), StatusCode::kCorrupt);
  std::vector<uint8_t> future = payload;
  future[0] = static_cast<uint8_t>(payload[0] + 1);
  EXPECT_EQ(ctx::Decode(future.data(), future.size(), d.Target(&bits)).code(),
            StatusCode::kUnsupported);
  EXPECT_EQ(bits, d.old_bits);
}

// A body with a valid checksum but arbitrary bits (what the checksum cannot catch) must still
// be handled: refused or decoded, never a write outside the target.
TEST(CtxCodec, ForgedBodiesStayInsideTheTarget) {
  std::mt19937_64 rng(5);
  Delta d = SyntheticDelta();
  d.old_bits.resize(8000);
  d.new_bits.resize(8000);
  const std::vector<uint8_t> payload = EncodeOrDie(d);
  constexpr size_t kGuard = 64;
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<uint8_t> bad = payload;
    const size_t from = 9 + rng() % (bad.size() - 9);
    for (size_t i = from; i < bad.size(); ++i) {
      if (rng() % 3 == 0) bad[i] = static_cast<uint8_t>(rng());
    }
    if (trial % 5 == 0) bad.resize(from);
    const uint64_t digest = kernels::Digest64(bad.data() + 5, bad.size() - 5);
    sdk::StoreLE<uint32_t>(bad.data() + 1, static_cast<uint32_t>(digest));
    std::vector<uint8_t> guarded(d.old_bits.size() + 2 * kGuard, 0xA5);
    std::memcpy(guarded.data() + kGuard, d.old_bits.data(), d.old_bits.size());
    refit_decode_target_t t = d.Target(&guarded);
    t.bits = guarded.data() + kGuard;
    (void)ctx::Decode(bad.data(), bad.size(), t);
    for (size_t i = 0; i < kGuard; ++i) {
      ASSERT_EQ(guarded[i], 0xA5) << trial;
      ASSERT_EQ(guarded[kGuard + d.old_bits.size() + i], 0xA5) << trial;
    }
  }
}

TEST(CtxCodec, ConcurrentEncodesMatchSerialOnes) {
  Delta a = SyntheticDelta();
  Delta b = a;
  b.old_bits.resize(300000);
  b.new_bits.resize(300000);
  const std::vector<uint8_t> want_a = EncodeOrDie(a);
  const std::vector<uint8_t> want_b = EncodeOrDie(b);
  std::vector<uint8_t> got_a;
  std::vector<uint8_t> got_b;
  std::thread ta([&] {
    for (int i = 0; i < 3; ++i) got_a = EncodeOrDie(a);
  });
  std::thread tb([&] {
    for (int i = 0; i < 3; ++i) got_b = EncodeOrDie(b);
  });
  ta.join();
  tb.join();
  EXPECT_EQ(got_a, want_a);
  EXPECT_EQ(got_b, want_b);
}

}  // namespace
}  // namespace refit
