// Fuzzes every builtin encoding's decode with untrusted payloads.
//
// Input: byte 0 picks the encoding (byte % kNumEncodings) and the dtype's element size
// ((byte / kNumEncodings) % 12, in refit_dtype_t order); the rest is the payload. The target is a
// run of kElems elements with guard bytes on both sides. Checks: no crash / sanitizer report, the
// guards are intact, an error fills a one-line message, an overwrite payload that decoded once
// decodes again to the same bits (idempotent), and the bits an accepted payload produced survive a
// round trip through the encoder (as a delta from the initial bits, and as a full sync where the
// encoding can), and decode_changes, where an encoding has it, lists what decode wrote.
//
// The encodings' plugin sources are compiled into this binary with distinct entry names
// (tests/fuzz/CMakeLists.txt); a new builtin encoding adds its entry to kEntries below. The same
// harness built with REFIT_FUZZ_ONE_ENTRY=<entry> fuzzes one loadable encoding (decode_<name>).
// Seeds in corpus/decode/: <selector byte><payload>, valid payloads of each encoding for kElems
// elements, e.g. indices_bf16_k5_w4 = 0x0f (1 + 2 * 7), then 01 04 0000 0500000000000000, five u32
// indices, five u16 values.
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz_check.h"
#include "refit/kernels/diff.h"
#include "refit/plugin_abi.h"

#ifdef REFIT_FUZZ_ONE_ENTRY
// A target for one encoding (tests/fuzz/CMakeLists.txt: decode_<name>): byte 0 is just the dtype.
extern "C" const refit_plugin_t* REFIT_FUZZ_ONE_ENTRY(const refit_host_api_t* host);
#else
extern "C" const refit_plugin_t* fuzz_entry_dense(const refit_host_api_t* host);
extern "C" const refit_plugin_t* fuzz_entry_indices(const refit_host_api_t* host);
#endif

namespace {

#ifdef REFIT_FUZZ_ONE_ENTRY
constexpr refit_plugin_entry_fn kEntries[] = {&REFIT_FUZZ_ONE_ENTRY};
#else
constexpr refit_plugin_entry_fn kEntries[] = {&fuzz_entry_dense, &fuzz_entry_indices};
#endif
constexpr uint64_t kElems = 97;
constexpr size_t kGuardBytes = 256;
constexpr uint8_t kGuardByte = 0xA5;
// Element sizes of refit_dtype_t 1..12.
constexpr uint32_t kElemSizes[12] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8, 1, 1};

struct LoadedEncoding {
  const char* name;
  uint64_t capabilities;
  const refit_encoding_vtable_t* vtable;
  void* instance;
};

const std::vector<LoadedEncoding>& Encodings() {
  static const std::vector<LoadedEncoding>* loaded = [] {
    auto* out = new std::vector<LoadedEncoding>;
    for (refit_plugin_entry_fn entry : kEntries) {
      const refit_plugin_t* plugin = entry(nullptr);
      for (size_t i = 0; i < plugin->n_components; ++i) {
        const refit_component_t& c = plugin->components[i];
        if (c.kind != REFIT_KIND_ENCODING) continue;
        const auto* vt = static_cast<const refit_encoding_vtable_t*>(c.vtable);
        void* instance = nullptr;
        refit_error_t err{};
        FUZZ_CHECK(vt->create(nullptr, nullptr, &instance, &err) == REFIT_OK, "create %s: %s",
                   c.name, err.message);
        out->push_back({c.name, c.capabilities, vt, instance});
      }
    }
    return out;
  }();
  return *loaded;
}

bool GuardsIntact(const std::vector<uint8_t>& buf, size_t bytes) {
  for (size_t i = 0; i < kGuardBytes; ++i) {
    if (buf[i] != kGuardByte || buf[kGuardBytes + bytes + i] != kGuardByte) return false;
  }
  return true;
}

// Encodes `want` (from `initial`, or from nothing when full_sync) and decodes the result onto a
// copy of `initial`: it must give `want` back.
void CheckRoundTrip(const LoadedEncoding& enc, int32_t dtype, uint32_t elem_size,
                    const std::vector<uint8_t>& initial, const std::vector<uint8_t>& want,
                    bool full_sync) {
  std::vector<uint64_t> positions;
  refit_encode_input_t in{};
  in.struct_size = sizeof(in);
  in.dtype = dtype;
  in.elem_size = elem_size;
  in.n_elems = kElems;
  in.new_bits = want.data();
  if (full_sync) {
    in.n_changed = kElems;
  } else {
    in.old_bits = initial.data();
    in.n_changed =
        refit::kernels::DiffPositions(initial.data(), want.data(), kElems, elem_size, &positions);
    in.positions = positions.data();
  }
  const char* what = full_sync ? "full sync" : "delta";
  uint64_t max = 0;
  refit_error_t err{};
  FUZZ_CHECK(enc.vtable->max_encoded_size(enc.instance, &in, &max, &err) == REFIT_OK,
             "%s: %s re-encode: MaxEncodedSize failed: %s", enc.name, what, err.message);
  FUZZ_CHECK(max > 0, "%s: %s re-encode: MaxEncodedSize is 0", enc.name, what);
  std::vector<uint8_t> out(max);
  uint64_t size = 0;
  FUZZ_CHECK(enc.vtable->encode(enc.instance, &in, out.data(), max, &size, &err) == REFIT_OK,
             "%s: %s re-encode failed: %s", enc.name, what, err.message);
  FUZZ_CHECK(size <= max, "%s: %s encode wrote %llu > max %llu", enc.name, what,
             static_cast<unsigned long long>(size), static_cast<unsigned long long>(max));
  out.resize(size);  // exact size: a sanitizer catches reads past the end
  std::vector<uint8_t> bits = initial;
  refit_decode_target_t target{};
  target.struct_size = sizeof(target);
  target.dtype = dtype;
  target.elem_size = elem_size;
  target.n_elems = kElems;
  target.bits = bits.data();
  FUZZ_CHECK(enc.vtable->decode(enc.instance, out.data(), size, &target, &err) == REFIT_OK,
             "%s: %s decode of its own payload failed: %s", enc.name, what, err.message);
  FUZZ_CHECK(bits == want, "%s: %s round trip changed the bits", enc.name, what);
}

// ABI 1.4 decode_changes, where offered: the same verdict as decode (or unsupported), a listing
// inside its room, ascending and inside the run, that patched into `initial` gives decode's bits;
// `initial` is only read.
void CheckListedChanges(const LoadedEncoding& enc, const uint8_t* payload, uint64_t len,
                        const refit_decode_target_t& target, const std::vector<uint8_t>& initial,
                        int decode_rc, const uint8_t* decoded) {
  const refit_encoding_vtable_t* vt = enc.vtable;
  if (vt->struct_size < offsetof(refit_encoding_vtable_t, decode_changes) + sizeof(void*) ||
      vt->decode_changes == nullptr) {
    return;
  }
  const uint32_t elem_size = target.elem_size;
  std::vector<uint8_t> old = initial;
  refit_decode_target_t old_target = target;
  old_target.bits = old.data();
  std::vector<uint64_t> positions(kElems + 1, ~uint64_t{0});  // one guard slot past the room
  std::vector<uint8_t> values((kElems + 1) * elem_size, kGuardByte);
  refit_decoded_changes_t listed{};
  listed.struct_size = sizeof(listed);
  listed.capacity = kElems;
  listed.positions = positions.data();
  listed.values = values.data();
  refit_error_t err{};
  const int rc = vt->decode_changes(enc.instance, payload, len, &old_target, &listed, &err);
  FUZZ_CHECK(old == initial, "%s: decode_changes wrote the old bits", enc.name);
  FUZZ_CHECK(positions[kElems] == ~uint64_t{0}, "%s: decode_changes wrote past its room", enc.name);
  for (uint32_t b = 0; b < elem_size; ++b) {
    FUZZ_CHECK(values[kElems * elem_size + b] == kGuardByte, "%s: a value past the room", enc.name);
  }
  if (rc == REFIT_ERR_UNSUPPORTED) return;
  FUZZ_CHECK((rc == REFIT_OK) == (decode_rc == REFIT_OK), "%s: decode_changes rc %d, decode rc %d",
             enc.name, rc, decode_rc);
  if (rc != REFIT_OK) return;
  FUZZ_CHECK(listed.count <= kElems, "%s: %llu changes listed", enc.name,
             static_cast<unsigned long long>(listed.count));
  for (uint64_t j = 0; j < listed.count; ++j) {
    FUZZ_CHECK(positions[j] < kElems && (j == 0 || positions[j] > positions[j - 1]),
               "%s: listed positions out of order or range", enc.name);
    std::memcpy(old.data() + positions[j] * elem_size, values.data() + j * elem_size, elem_size);
  }
  FUZZ_CHECK(std::memcmp(old.data(), decoded, old.size()) == 0,
             "%s: listed changes differ from the decode", enc.name);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::vector<LoadedEncoding>& encodings = Encodings();
  const LoadedEncoding& enc = encodings[data[0] % encodings.size()];
  const uint32_t dtype_index = (data[0] / encodings.size()) % 12;
  const uint32_t elem_size = kElemSizes[dtype_index];
  const size_t bytes = kElems * elem_size;
  // The payload is the input's tail, so it ends exactly where the fuzzer's allocation does.
  const uint8_t* payload = data + 1;
  const uint64_t len = size - 1;

  std::vector<uint8_t> initial(bytes);
  for (size_t i = 0; i < bytes; ++i) initial[i] = static_cast<uint8_t>(i * 7);
  std::vector<uint8_t> buf(bytes + 2 * kGuardBytes, kGuardByte);
  std::memcpy(buf.data() + kGuardBytes, initial.data(), bytes);
  refit_decode_target_t target{};
  target.struct_size = sizeof(target);
  target.dtype = static_cast<int32_t>(dtype_index + 1);
  target.elem_size = elem_size;
  target.n_elems = kElems;
  target.bits = buf.data() + kGuardBytes;

  refit_error_t err{};
  const int rc = enc.vtable->decode(enc.instance, payload, len, &target, &err);
  FUZZ_CHECK(GuardsIntact(buf, bytes), "%s decode (rc %d) wrote outside the target", enc.name, rc);
  CheckListedChanges(enc, payload, len, target, initial, rc, buf.data() + kGuardBytes);
  if (rc != REFIT_OK) {
    FUZZ_CHECK(err.code == rc, "%s: error code %d but rc %d", enc.name, err.code, rc);
    FUZZ_CHECK(err.message[0] != '\0', "%s: empty error message (rc %d)", enc.name, rc);
    FUZZ_CHECK(std::strchr(err.message, '\n') == nullptr, "%s: multi-line error: %s", enc.name,
               err.message);
    return 0;
  }
  const std::vector<uint8_t> decoded(buf.begin() + kGuardBytes, buf.begin() + kGuardBytes + bytes);
  CheckRoundTrip(enc, target.dtype, elem_size, initial, decoded, /*full_sync=*/false);
  if (enc.capabilities & REFIT_ENC_CAP_FULL_SYNC) {
    CheckRoundTrip(enc, target.dtype, elem_size, initial, decoded, /*full_sync=*/true);
  }
  if (enc.vtable->op == REFIT_OP_OVERWRITE) {
    refit_error_t err2{};
    FUZZ_CHECK(enc.vtable->decode(enc.instance, payload, len, &target, &err2) == REFIT_OK,
               "%s: second decode of an accepted payload failed: %s", enc.name, err2.message);
    FUZZ_CHECK(std::memcmp(decoded.data(), buf.data() + kGuardBytes, bytes) == 0,
               "%s: overwrite decode is not idempotent", enc.name);
  }
  return 0;
}
