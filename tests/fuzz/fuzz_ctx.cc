// Fuzzes the `ctx` decoder (plugins/encodings/ctx/ctx_codec.cc, compiled in with the fuzzer's
// instrumentation).
//
// Input: byte 0 picks the dtype (bits 0-6: value % 12 + 1 in refit_dtype_t order) and, with bit 7
// set, asks the harness to fix up the payload's checksum so that mutations reach the range
// decoder behind it (a random body almost never carries a valid checksum). The rest is the
// payload, decoded onto kElems elements (initial bytes i * 7) with guard bytes on both sides.
// Checks: no crash or sanitizer report, guards intact, a refusal has a one-line message, every
// kernel level decodes (and re-encodes) alike, listing the changes (decode_changes) agrees with
// decoding in place, and the bits an accepted payload produced survive
// a round trip through the encoder.
// Seeds (corpus/ctx/) come from `refit_ctx_measure seeds DIR`.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ctx_codec.h"
#include "fuzz_check.h"
#include "refit/kernels/diff.h"
#include "refit/kernels/dispatch.h"
#include "refit/sdk/encoding_util.hpp"

namespace {

constexpr uint64_t kElems = 97;
constexpr size_t kGuardBytes = 256;
constexpr uint8_t kGuardByte = 0xA5;
constexpr uint32_t kElemSizes[12] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8, 1, 1};
// Layout facts of the payload the fix-up needs: [0] version, [1, 5) checksum of [5, len).
constexpr size_t kChecksumOffset = 1;
constexpr size_t kChecked = 5;
constexpr refit::kernels::SimdLevel kLevels[] = {refit::kernels::SimdLevel::kScalar,
                                                 refit::kernels::SimdLevel::kAvx2,
                                                 refit::kernels::SimdLevel::kAvx512};

bool GuardsIntact(const std::vector<uint8_t>& buf, size_t bytes) {
  for (size_t i = 0; i < kGuardBytes; ++i) {
    if (buf[i] != kGuardByte || buf[kGuardBytes + bytes + i] != kGuardByte) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int32_t dtype = static_cast<int32_t>((data[0] & 0x7f) % 12) + 1;
  const uint32_t elem_size = kElemSizes[dtype - 1];
  const size_t bytes = kElems * elem_size;
  std::vector<uint8_t> payload(data + 1, data + size);  // exact size: overreads are caught
  if ((data[0] & 0x80) != 0 && payload.size() >= kChecked) {
    const uint64_t digest =
        refit::kernels::Digest64(payload.data() + kChecked, payload.size() - kChecked);
    refit::sdk::StoreLE<uint32_t>(payload.data() + kChecksumOffset, static_cast<uint32_t>(digest));
  }

  std::vector<uint8_t> initial(bytes);
  for (size_t i = 0; i < bytes; ++i) initial[i] = static_cast<uint8_t>(i * 7);
  std::vector<uint8_t> buf(bytes + 2 * kGuardBytes, kGuardByte);
  std::memcpy(buf.data() + kGuardBytes, initial.data(), bytes);
  refit_decode_target_t target{};
  target.struct_size = sizeof(target);
  target.dtype = dtype;
  target.elem_size = elem_size;
  target.n_elems = kElems;
  target.bits = buf.data() + kGuardBytes;

  refit::Status st = refit::ctx::Decode(payload.data(), payload.size(), target);
  FUZZ_CHECK(GuardsIntact(buf, bytes), "decode (%s) wrote outside the target",
             st.ToString().c_str());
  // Every kernel level (the scalar reference, the AVX2 and AVX-512 block paths; Decode used the
  // active one) gives the same verdict and the same bits, valid payload or not.
  for (refit::kernels::SimdLevel level : kLevels) {
    std::vector<uint8_t> other = initial;
    refit_decode_target_t other_target = target;
    other_target.bits = other.data();
    const refit::Status other_st =
        refit::ctx::DecodeAt(level, payload.data(), payload.size(), other_target);
    FUZZ_CHECK(other_st.ToString() == st.ToString(), "%s decode says '%s', active level '%s'",
               refit::kernels::SimdLevelName(level), other_st.ToString().c_str(),
               st.ToString().c_str());
    FUZZ_CHECK(std::memcmp(other.data(), buf.data() + kGuardBytes, bytes) == 0,
               "%s decode wrote other bits than the active level",
               refit::kernels::SimdLevelName(level));
    // Listing the changes instead (decode_changes) gives the same verdict and, patched into
    // the initial bits, the same bits; the initial bits are only read.
    std::vector<uint8_t> old = initial;
    refit_decode_target_t old_target = target;
    old_target.bits = old.data();
    std::vector<uint64_t> listed_positions(kElems);
    std::vector<uint8_t> listed_values(bytes);
    // The progress reports (the host's in-cache verification), checked once the listing is in.
    std::vector<std::pair<uint64_t, uint64_t>> reports;
    refit_decoded_changes_t hook{};
    hook.struct_size = sizeof(hook);
    hook.progress = [](void* user, uint64_t done, uint64_t count) {
      static_cast<std::vector<std::pair<uint64_t, uint64_t>>*>(user)->emplace_back(done, count);
    };
    hook.progress_user = &reports;
    const refit::Result<uint64_t> listed = refit::ctx::DecodeChangesAt(
        level, payload.data(), payload.size(), old_target, listed_positions.data(),
        listed_values.data(), kElems, refit::sdk::ListProgress::Of(hook));
    FUZZ_CHECK(old == initial, "%s listing wrote the old bits",
               refit::kernels::SimdLevelName(level));
    FUZZ_CHECK(listed.status().ToString() == st.ToString(), "%s listing says '%s', decode '%s'",
               refit::kernels::SimdLevelName(level), listed.status().ToString().c_str(),
               st.ToString().c_str());
    if (listed.ok()) {
      for (uint64_t j = 0; j < listed.value(); ++j) {
        FUZZ_CHECK(listed_positions[j] < kElems &&
                       (j == 0 || listed_positions[j] > listed_positions[j - 1]),
                   "listed positions out of order or range");
        std::memcpy(old.data() + listed_positions[j] * elem_size,
                    listed_values.data() + j * elem_size, elem_size);
      }
      FUZZ_CHECK(std::memcmp(old.data(), buf.data() + kGuardBytes, bytes) == 0,
                 "%s listed changes differ from the decode", refit::kernels::SimdLevelName(level));
      uint64_t below = 0;
      for (size_t r = 0; r < reports.size(); ++r) {
        const auto [done, count] = reports[r];
        FUZZ_CHECK(r == 0 || (done >= reports[r - 1].first && count >= reports[r - 1].second),
                   "progress went back");
        while (below < listed.value() && listed_positions[below] < done) ++below;
        FUZZ_CHECK(below <= count && count <= listed.value(),
                   "progress reported %llu listed below %llu, but %llu changes lie below it",
                   static_cast<unsigned long long>(count), static_cast<unsigned long long>(done),
                   static_cast<unsigned long long>(below));
      }
    }
  }
  if (!st.ok()) {
    FUZZ_CHECK(!st.message().empty(), "empty error message");
    FUZZ_CHECK(st.message().find('\n') == std::string::npos, "multi-line error: %s",
               st.message().c_str());
    return 0;
  }

  // Accepted: the decoded bits must survive encode + decode from the same initial bits.
  const std::vector<uint8_t> decoded(buf.begin() + kGuardBytes,
                                     buf.begin() + static_cast<ptrdiff_t>(kGuardBytes + bytes));
  std::vector<uint64_t> positions;
  refit_encode_input_t in{};
  in.struct_size = sizeof(in);
  in.dtype = dtype;
  in.elem_size = elem_size;
  in.n_elems = kElems;
  in.old_bits = initial.data();
  in.new_bits = decoded.data();
  in.n_changed =
      refit::kernels::DiffPositions(initial.data(), decoded.data(), kElems, elem_size, &positions);
  in.positions = positions.data();
  const uint64_t max = refit::ctx::MaxEncodedSize(in);
  FUZZ_CHECK(max > 0, "MaxEncodedSize is 0");
  // The codec's own choice, and, for an accepted table-form payload, the table form with its
  // chosen slots, with one slot per class and without geometric tables.
  std::vector<refit::ctx::CodedForm> forms = {refit::ctx::CodedForm::kAuto};
  if (payload.size() > 5 && payload[5] == 2) {
    forms.push_back(refit::ctx::CodedForm::kTables);
    forms.push_back(refit::ctx::CodedForm::kTablesPerClass);
    forms.push_back(refit::ctx::CodedForm::kTablesExplicit);
  }
  for (refit::ctx::CodedForm form : forms) {
    std::vector<uint8_t> out;
    for (refit::kernels::SimdLevel level : kLevels) {
      std::vector<uint8_t> other(max);
      refit::Result<uint64_t> other_written =
          refit::ctx::EncodeAt(level, in, other.data(), max, form);
      FUZZ_CHECK(other_written.ok(), "%s re-encode failed: %s",
                 refit::kernels::SimdLevelName(level), other_written.status().ToString().c_str());
      other.resize(*other_written);
      if (level == kLevels[0]) out = other;
      FUZZ_CHECK(other == out, "%s payload differs from the scalar level's",
                 refit::kernels::SimdLevelName(level));
    }
    std::vector<uint8_t> again = initial;
    target.bits = again.data();
    st = refit::ctx::Decode(out.data(), out.size(), target);
    FUZZ_CHECK(st.ok(), "decode of its own payload failed: %s", st.ToString().c_str());
    FUZZ_CHECK(again == decoded, "round trip changed the bits");
  }
  return 0;
}
