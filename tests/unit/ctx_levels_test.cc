// The `ctx` codec's kernel levels agree (plugins/encodings/ctx/ctx_codec.cc is compiled into this
// binary): the scalar path (every element's class counted one by one) is the reference, the
// AVX2 and AVX-512 block paths (ctx_blocks.h) must produce the same payload byte for byte and
// decode every payload, valid or forged, to the same bits with the same verdict. Levels the CPU
// lacks run the best supported one, so on such a machine some comparisons are with itself.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ctx_codec.h"
#include "ctx_test_util.h"
#include "refit/kernels/diff.h"
#include "refit/kernels/dispatch.h"
#include "refit/sdk/encoding_util.hpp"

namespace refit {
namespace {

using kernels::SimdLevel;

constexpr SimdLevel kLevels[] = {SimdLevel::kScalar, SimdLevel::kSse2, SimdLevel::kAvx2,
                                 SimdLevel::kAvx512};
constexpr uint32_t kElemSizes[12] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8, 1, 1};

using Case = testing::CtxDelta;

uint64_t Load(const std::vector<uint8_t>& v, uint64_t i, uint32_t size) {
  uint64_t x = 0;
  std::memcpy(&x, v.data() + i * size, size);
  return x;
}
void Store(std::vector<uint8_t>& v, uint64_t i, uint32_t size, uint64_t x) {
  std::memcpy(v.data() + i * size, &x, size);
}

// Old bits: mostly "weights" (a narrow band of exponents, so the block paths run), some special
// patterns (+-0, +-inf, NaNs, subnormals, all ones) and some random ones. Changes at `density`:
// one-step moves of the low bits, a few random bit patterns and sign flips.
Case MakeCase(int32_t dtype, uint64_t n, double density, uint64_t seed, bool wide_exponents) {
  Case c;
  c.dtype = dtype;
  c.elem_size = kElemSizes[dtype - REFIT_DTYPE_BOOL];
  const uint32_t size = c.elem_size;
  const uint64_t top = uint64_t{1} << (size * 8 - 1);
  std::mt19937_64 rng(seed);
  c.old_bits.resize(n * size);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t r = rng();
    uint64_t x = 0;
    switch (r % 16) {
      case 0:
        x = 0;  // +0
        break;
      case 1:
        x = top;  // -0
        break;
      case 2:
        x = ~uint64_t{0};  // all ones (a NaN for floats)
        break;
      case 3:
        x = (top - 1) >> (r % 7);  // NaN / inf / large exponents
        break;
      case 4:
        x = rng() & 0xff;  // subnormals, small integers
        break;
      case 5:
        x = rng();  // anything
        break;
      default:
        // Weights: the top 5 bits fixed, so exponents stay in a band of at most 16 classes.
        x = wide_exponents ? rng() : (top >> 2) ^ (rng() & ((uint64_t{1} << (size * 8 - 5)) - 1));
        if (r & 1) x |= top;
        break;
    }
    Store(c.old_bits, i, size, x);
  }
  c.new_bits = c.old_bits;
  std::uniform_real_distribution<double> u(0, 1);
  for (uint64_t i = 0; i < n; ++i) {
    if (u(rng) >= density) continue;
    const uint64_t x = Load(c.old_bits, i, size);
    const uint64_t r = rng() % 10;
    uint64_t y = r < 7 ? x + (r & 1 ? 1 : ~uint64_t{0}) : r == 7 ? x ^ top : rng();
    if (y == x) y = x ^ 1;
    Store(c.new_bits, i, size, y);
  }
  return c;
}

std::string Name(SimdLevel level) { return kernels::SimdLevelName(level); }

// Each progress report (done, listed) of an accepted listing never goes back, and every listed
// change below `done` is among the first `listed`, which were stored by then.
void ExpectProgressHolds(const std::vector<std::pair<uint64_t, uint64_t>>& reports,
                         const std::vector<uint64_t>& positions, uint64_t count,
                         const std::string& what) {
  uint64_t below = 0;  // listed changes below the report's `done`
  for (size_t i = 0; i < reports.size(); ++i) {
    const auto [done, listed] = reports[i];
    if (i > 0) {
      ASSERT_GE(done, reports[i - 1].first) << what;
      ASSERT_GE(listed, reports[i - 1].second) << what;
    }
    ASSERT_LE(listed, positions.size()) << what;
    if (count == 0) continue;
    while (below < count && positions[below] < done) ++below;
    ASSERT_LE(below, listed) << what << ": progress reported done " << done << " with " << listed
                             << " listed, but " << below << " changes lie below it";
  }
}

// DecodeChangesAt at `level` lists what DecodeAt did in place: the same verdict (decoded_status)
// and, when accepted, strictly ascending positions whose values patched into the old bits give
// decoded_bits; the old bits are only read.
void ExpectListedChangesMatch(SimdLevel level, const Case& c, const std::vector<uint8_t>& payload,
                              const Status& decoded_status,
                              const std::vector<uint8_t>& decoded_bits, const std::string& what) {
  const std::vector<uint8_t> old = c.old_bits;
  refit_decode_target_t t{};
  t.struct_size = sizeof(t);
  t.dtype = c.dtype;
  t.elem_size = c.elem_size;
  t.n_elems = c.n();
  t.bits = const_cast<uint8_t*>(old.data());
  std::vector<uint64_t> positions(c.n());
  std::vector<uint8_t> values(c.n() * c.elem_size);
  std::vector<std::pair<uint64_t, uint64_t>> reports;  // (done, listed) per progress call
  refit_decoded_changes_t hook{};
  hook.struct_size = sizeof(hook);
  hook.progress = [](void* user, uint64_t done, uint64_t listed) {
    static_cast<std::vector<std::pair<uint64_t, uint64_t>>*>(user)->emplace_back(done, listed);
  };
  hook.progress_user = &reports;
  Result<uint64_t> count =
      ctx::DecodeChangesAt(level, payload.data(), payload.size(), t, positions.data(),
                           values.data(), c.n(), sdk::ListProgress::Of(hook));
  ExpectProgressHolds(reports, positions, count.ok() ? *count : 0, what + " " + Name(level));
  ASSERT_TRUE(old == c.old_bits) << what << ": " << Name(level) << " listing wrote the old bits";
  ASSERT_EQ(count.status().ToString(), decoded_status.ToString())
      << what << ": " << Name(level) << " listing and in-place decode disagree";
  if (!count.ok()) return;
  std::vector<uint8_t> patched = old;
  for (uint64_t j = 0; j < *count; ++j) {
    ASSERT_LT(positions[j], c.n()) << what;
    if (j > 0) {
      ASSERT_GT(positions[j], positions[j - 1]) << what << ": not ascending at " << j;
    }
    std::memcpy(patched.data() + positions[j] * c.elem_size, values.data() + j * c.elem_size,
                c.elem_size);
  }
  ASSERT_TRUE(patched == decoded_bits)
      << what << ": " << Name(level) << " listed changes differ from the in-place decode";
  if (*count == 0) return;
  // Room for one change fewer: refused, nothing written past it.
  Result<uint64_t> short_room = ctx::DecodeChangesAt(level, payload.data(), payload.size(), t,
                                                     positions.data(), values.data(), *count - 1);
  ASSERT_FALSE(short_room.ok()) << what << ": " << Name(level) << " overran its room";
}

// Every level's payload equals the scalar one, and every level decodes it to the new bits.
void ExpectLevelsAgree(Case& c, const std::string& what,
                       ctx::CodedForm form = ctx::CodedForm::kAuto) {
  const refit_encode_input_t in = c.Input();
  std::vector<uint8_t> reference;
  for (SimdLevel level : kLevels) {
    std::vector<uint8_t> out(ctx::MaxEncodedSize(in));
    Result<uint64_t> size = ctx::EncodeAt(level, in, out.data(), out.size(), form);
    ASSERT_TRUE(size.ok()) << what << " at " << Name(level) << ": " << size.status().ToString();
    out.resize(*size);
    if (level == SimdLevel::kScalar) {
      reference = out;
    } else {
      ASSERT_EQ(out, reference) << what << ": the " << Name(level)
                                << " payload differs from the scalar one";
    }
  }
  for (SimdLevel level : kLevels) {
    std::vector<uint8_t> bits = c.old_bits;
    Status st = ctx::DecodeAt(level, reference.data(), reference.size(), c.Target(&bits));
    ASSERT_TRUE(st.ok()) << what << " at " << Name(level) << ": " << st.ToString();
    ASSERT_TRUE(bits == c.new_bits) << what << ": " << Name(level) << " decode is not bit-exact";
    ExpectListedChangesMatch(level, c, reference, st, bits, what);
  }
}

// Decodes `payload` onto c's old bits at every level inside guard bytes: every level must give
// the scalar level's verdict and bits, and none may write outside the target.
void ExpectSameDecodeAtEveryLevel(const Case& c, const std::vector<uint8_t>& payload,
                                  const std::string& what) {
  constexpr size_t kGuard = 64;
  constexpr uint8_t kGuardByte = 0xA5;
  std::vector<uint8_t> reference_bits;
  Status reference;
  for (SimdLevel level : kLevels) {
    std::vector<uint8_t> buf(c.old_bits.size() + 2 * kGuard, kGuardByte);
    std::memcpy(buf.data() + kGuard, c.old_bits.data(), c.old_bits.size());
    refit_decode_target_t t{};
    t.struct_size = sizeof(t);
    t.dtype = c.dtype;
    t.elem_size = c.elem_size;
    t.n_elems = c.n();
    t.bits = buf.data() + kGuard;
    Status st = ctx::DecodeAt(level, payload.data(), payload.size(), t);
    for (size_t g = 0; g < kGuard; ++g) {
      ASSERT_EQ(buf[g], kGuardByte) << what << ": " << Name(level) << " wrote before the target";
      ASSERT_EQ(buf[kGuard + c.old_bits.size() + g], kGuardByte)
          << what << ": " << Name(level) << " wrote after the target";
    }
    std::vector<uint8_t> bits(buf.begin() + kGuard, buf.end() - kGuard);
    ExpectListedChangesMatch(level, c, payload, st, bits, what);
    if (level == SimdLevel::kScalar) {
      reference = st;
      reference_bits = bits;
    } else {
      ASSERT_EQ(st.ToString(), reference.ToString()) << what << " at " << Name(level);
      ASSERT_TRUE(bits == reference_bits)
          << what << ": " << Name(level) << " decoded other bits than scalar";
    }
  }
}

// Both coded forms (the adaptive range coder, and the table form that large records get) on
// every dtype.
TEST(CtxLevels, PayloadsAndBitsAgreeOnEveryDtype) {
  // Sizes around the 64-element blocks (partial last block, exactly one block, one more).
  const uint64_t sizes[] = {1, 2, 63, 64, 65, 97, 128, 1000, 4096 + 13};
  const double densities[] = {0.002, 0.03, 0.4, 1.0};
  uint64_t seed = 1;
  for (ctx::CodedForm form : {ctx::CodedForm::kAdaptive, ctx::CodedForm::kTables,
                              ctx::CodedForm::kTablesPerClass, ctx::CodedForm::kTablesExplicit}) {
    const std::string form_name = form == ctx::CodedForm::kAdaptive         ? "adaptive"
                                  : form == ctx::CodedForm::kTables         ? "tables"
                                  : form == ctx::CodedForm::kTablesPerClass ? "tables per class"
                                                                            : "explicit tables";
    for (int32_t dtype = REFIT_DTYPE_BOOL; dtype <= REFIT_DTYPE_F8_E5M2; ++dtype) {
      for (uint64_t n : sizes) {
        for (double density : densities) {
          for (bool wide : {false, true}) {
            Case c = MakeCase(dtype, n, density, seed++, wide);
            ExpectLevelsAgree(c,
                              form_name + ", dtype " + std::to_string(dtype) + ", n " +
                                  std::to_string(n) + ", density " + std::to_string(density) +
                                  (wide ? ", wide exponents" : ""),
                              form);
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

// A record large enough for the automatic choice to take the table form, with wild steps and
// long runs (escapes) mixed in.
TEST(CtxLevels, LargeRecordsTakeTheTableFormAtEveryLevel) {
  for (int32_t dtype : {REFIT_DTYPE_BF16, REFIT_DTYPE_F32, REFIT_DTYPE_F64}) {
    Case c = MakeCase(dtype, 400000, 0.2, 77 + static_cast<uint64_t>(dtype), false);
    const refit_encode_input_t in = c.Input();
    ASSERT_GE(in.n_changed, uint64_t{1} << 16);
    std::vector<uint8_t> out(ctx::MaxEncodedSize(in));
    Result<uint64_t> size = ctx::Encode(in, out.data(), out.size());
    ASSERT_TRUE(size.ok()) << size.status().ToString();
    EXPECT_EQ(out[5], 2) << "expected the table form";
    ExpectLevelsAgree(c, "large, dtype " + std::to_string(dtype));
    // The table form's walks report their progress as they go (per chunk of elements, or per
    // batch of changes where one slot holds every class), so the host verifies in cache.
    refit_decoded_changes_t hook{};
    hook.struct_size = sizeof(hook);
    uint64_t reports = 0;
    hook.progress = [](void* user, uint64_t, uint64_t) { ++*static_cast<uint64_t*>(user); };
    hook.progress_user = &reports;
    std::vector<uint64_t> positions(c.n());
    std::vector<uint8_t> values(c.n() * c.elem_size);
    std::vector<uint8_t> old = c.old_bits;
    ASSERT_TRUE(ctx::DecodeChanges(out.data(), *size, c.Target(&old), positions.data(),
                                   values.data(), c.n(), sdk::ListProgress::Of(hook))
                    .ok());
    EXPECT_GE(reports, 4u) << "dtype " << dtype;
    if (HasFatalFailure()) return;
  }
}

TEST(CtxLevels, ChangesAtTheEdgesAndInRuns) {
  for (int32_t dtype :
       {REFIT_DTYPE_BF16, REFIT_DTYPE_F32, REFIT_DTYPE_F8_E4M3, REFIT_DTYPE_F64, REFIT_DTYPE_I32}) {
    Case c = MakeCase(dtype, 3 * 64 + 5, 0, 7, false);
    const uint32_t size = c.elem_size;
    // First and last element, a whole block, and several changes of one class in one block.
    for (uint64_t i : {uint64_t{0}, c.n() - 1})
      Store(c.new_bits, i, size, Load(c.old_bits, i, size) + 1);
    for (uint64_t i = 64; i < 128; ++i) Store(c.new_bits, i, size, Load(c.old_bits, i, size) ^ 1);
    for (uint64_t i = 130; i < 190; i += 3) {
      Store(c.new_bits, i, size, Load(c.old_bits, i, size) - 1);
    }
    ExpectLevelsAgree(c, "edges, dtype " + std::to_string(dtype));
    if (HasFatalFailure()) return;
  }
}

// Forged payloads (valid checksum, mutated body): every level gives the same verdict, the same
// message and the same bits, and none writes outside the target.
TEST(CtxLevels, ForgedPayloadsDecodeIdenticallyAtEveryLevel) {
  constexpr size_t kGuard = 64;
  constexpr uint8_t kGuardByte = 0xA5;
  std::mt19937_64 rng(99);
  for (ctx::CodedForm form : {ctx::CodedForm::kAdaptive, ctx::CodedForm::kTables,
                              ctx::CodedForm::kTablesPerClass, ctx::CodedForm::kTablesExplicit}) {
    for (int32_t dtype : {REFIT_DTYPE_BF16, REFIT_DTYPE_F16, REFIT_DTYPE_F32, REFIT_DTYPE_F64,
                          REFIT_DTYPE_F8_E5M2, REFIT_DTYPE_U8}) {
      // (Explicit tables, one per class, outweigh a 200-element literal: a larger record.)
      const uint64_t n =
          form == ctx::CodedForm::kTablesPerClass || form == ctx::CodedForm::kTablesExplicit ? 4000
                                                                                             : 200;
      Case c = MakeCase(dtype, n, 0.05, 1000 + static_cast<uint64_t>(dtype), false);
      const refit_encode_input_t in = c.Input();
      std::vector<uint8_t> valid(ctx::MaxEncodedSize(in));
      Result<uint64_t> size =
          ctx::EncodeAt(SimdLevel::kScalar, in, valid.data(), valid.size(), form);
      ASSERT_TRUE(size.ok());
      valid.resize(*size);
      ASSERT_EQ(valid[5], form == ctx::CodedForm::kAdaptive ? 0 : 2) << "expected a coded payload";
      for (int trial = 0; trial < 300; ++trial) {
        std::vector<uint8_t> forged = valid;
        const int edits = 1 + static_cast<int>(rng() % 4);
        for (int e = 0; e < edits; ++e) {
          const size_t at =
              7 + rng() % (forged.size() - 7);  // after version, checksum, mode, dtype
          forged[at] = static_cast<uint8_t>(rng());
        }
        if (trial % 5 == 0) forged.resize(forged.size() - 1 - rng() % 3);
        const uint64_t digest = kernels::Digest64(forged.data() + 5, forged.size() - 5);
        sdk::StoreLE<uint32_t>(forged.data() + 1, static_cast<uint32_t>(digest));

        std::vector<uint8_t> reference_bits;
        Status reference;
        for (SimdLevel level : kLevels) {
          std::vector<uint8_t> buf(c.old_bits.size() + 2 * kGuard, kGuardByte);
          std::memcpy(buf.data() + kGuard, c.old_bits.data(), c.old_bits.size());
          refit_decode_target_t t{};
          t.struct_size = sizeof(t);
          t.dtype = c.dtype;
          t.elem_size = c.elem_size;
          t.n_elems = c.n();
          t.bits = buf.data() + kGuard;
          Status st = ctx::DecodeAt(level, forged.data(), forged.size(), t);
          for (size_t g = 0; g < kGuard; ++g) {
            ASSERT_EQ(buf[g], kGuardByte) << Name(level) << " wrote before the target";
            ASSERT_EQ(buf[kGuard + c.old_bits.size() + g], kGuardByte)
                << Name(level) << " wrote after the target";
          }
          std::vector<uint8_t> bits(buf.begin() + kGuard, buf.end() - kGuard);
          if (level == SimdLevel::kScalar) {
            reference = st;
            reference_bits = bits;
          } else {
            ASSERT_EQ(st.ToString(), reference.ToString())
                << "dtype " << dtype << " trial " << trial << " at " << Name(level);
            ASSERT_TRUE(bits == reference_bits) << "dtype " << dtype << " trial " << trial << ": "
                                                << Name(level) << " decoded other bits than scalar";
          }
        }
      }
    }
  }
}

// The table form's walk over several chunks (16384 elements each), where dense slots switch to
// member lists (AVX-512 VBMI2) after a chunk with many changes: forged first runs and change
// counts (the bytes right after the slot list) move every slot's positions; every level must
// give the same verdict and bits, and write nothing outside the target.
TEST(CtxLevels, ForgedRunsOverManyChunksDecodeIdenticallyAtEveryLevel) {
  std::mt19937_64 rng(7);
  for (int32_t dtype : {REFIT_DTYPE_BF16, REFIT_DTYPE_F32}) {
    Case c = MakeCase(dtype, 5 * 16384 + 77, 0.25, 2000 + static_cast<uint64_t>(dtype), false);
    const refit_encode_input_t in = c.Input();
    std::vector<uint8_t> valid(ctx::MaxEncodedSize(in));
    Result<uint64_t> size = ctx::EncodeAt(SimdLevel::kScalar, in, valid.data(), valid.size(),
                                          ctx::CodedForm::kTablesPerClass);
    ASSERT_TRUE(size.ok());
    valid.resize(*size);
    ASSERT_EQ(valid[5], 2) << "expected the table form";
    // Body: after version, checksum, mode, dtype, class range and the two varints.
    uint64_t at = 9;
    for (int v = 0; v < 2; ++v) {
      while (valid[at] & 0x80) ++at;
      ++at;
    }
    const uint64_t slots = uint64_t{valid[at]} + 1;
    const uint64_t runs = at + 1 + 2 * slots;  // first runs, then change counts
    for (int trial = 0; trial < 60; ++trial) {
      std::vector<uint8_t> forged = valid;
      const int edits = 1 + static_cast<int>(rng() % 3);
      for (int e = 0; e < edits; ++e) {
        const uint64_t i = runs + rng() % (3 * slots);
        forged[i] = trial % 2 == 0 ? static_cast<uint8_t>(rng()) : forged[i] ^ 1;
      }
      const uint64_t digest = kernels::Digest64(forged.data() + 5, forged.size() - 5);
      sdk::StoreLE<uint32_t>(forged.data() + 1, static_cast<uint32_t>(digest));
      ExpectSameDecodeAtEveryLevel(
          c, forged, "dtype " + std::to_string(dtype) + " trial " + std::to_string(trial));
      if (HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace refit
