// Header-only helpers every encoding plugin needs: validating what the host hands in and reading
// or writing little-endian integers in payloads. Part of the SDK so third-party encodings get the
// same checks (and the same error texts) as the builtin ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "refit/plugin_abi.h"
#include "refit/status.h"

namespace refit::sdk {

// The host's progress hook of decode_changes (ABI 1.7): a decoder that lists in position order
// calls it whenever every change below element `done` is among the first `listed` it stored
// (arguments never decrease), so that the host verifies those elements while they are in
// cache. A no-op where the host offers none.
class ListProgress {
 public:
  ListProgress() = default;
  static ListProgress Of(const refit_decoded_changes_t& changes) {
    ListProgress p;
    if (changes.struct_size >=
        offsetof(refit_decoded_changes_t, progress_user) + sizeof(changes.progress_user)) {
      p.fn_ = changes.progress;
      p.user_ = changes.progress_user;
    }
    return p;
  }
  bool wanted() const { return fn_ != nullptr; }
  void operator()(uint64_t done, uint64_t listed) const {
    if (fn_ != nullptr) fn_(user_, done, listed);
  }

 private:
  void (*fn_)(void* user, uint64_t done, uint64_t listed) = nullptr;
  void* user_ = nullptr;
};

// *product = a * b; false (and *product unspecified) on overflow. Likewise CheckedAdd.
inline bool CheckedMul(uint64_t a, uint64_t b, uint64_t* product) {
  return !__builtin_mul_overflow(a, b, product);
}
inline bool CheckedAdd(uint64_t a, uint64_t b, uint64_t* sum) {
  return !__builtin_add_overflow(a, b, sum);
}

inline bool IsValidElemSize(uint32_t elem_size) {
  return elem_size == 1 || elem_size == 2 || elem_size == 4 || elem_size == 8;
}

// n_elems * elem_size, validated (elem_size in {1,2,4,8}, no overflow).
inline Result<uint64_t> ElementBytes(uint64_t n_elems, uint32_t elem_size) {
  if (!IsValidElemSize(elem_size)) {
    return Status::Invalid("element size " + std::to_string(elem_size) +
                           " is not 1, 2, 4 or 8 bytes");
  }
  uint64_t bytes = 0;
  if (!CheckedMul(n_elems, elem_size, &bytes)) {
    return Status::Invalid(std::to_string(n_elems) + " elements of " + std::to_string(elem_size) +
                           " bytes overflow a 64-bit size");
  }
  return bytes;
}

// The size of an ABI 1.0 encode input (1.2 appended the packed values).
constexpr uint32_t kEncodeInputV1Size = offsetof(refit_encode_input_t, old_values);

// Checks the host's encode input: struct size, element size, pointers the fields promise.
// Returns the byte size of the run (n_elems * elem_size).
inline Result<uint64_t> CheckEncodeInput(const refit_encode_input_t& in) {
  if (in.struct_size < kEncodeInputV1Size) {
    return Status::Invalid("encode input struct_size " + std::to_string(in.struct_size) +
                           " is smaller than " + std::to_string(kEncodeInputV1Size));
  }
  REFIT_ASSIGN_OR_RAISE(uint64_t bytes, ElementBytes(in.n_elems, in.elem_size));
  if (bytes > 0 && in.new_bits == nullptr) return Status::Invalid("encode input has no new_bits");
  if (in.old_bits != nullptr && in.n_changed > 0 && in.positions == nullptr) {
    return Status::Invalid("encode input has old_bits and " + std::to_string(in.n_changed) +
                           " changes but no positions");
  }
  if (in.n_changed > in.n_elems) {
    return Status::Invalid("encode input has " + std::to_string(in.n_changed) +
                           " changed positions for " + std::to_string(in.n_elems) + " elements");
  }
  return bytes;
}

// The changed elements' old / new bits packed in position order when the host provided them
// (ABI 1.2), else nullptr: gather from old_bits / new_bits at the positions then.
// (Both fields arrived together: an input that has one has the other.)
inline bool HasPackedValues(const refit_encode_input_t& in) {
  return in.struct_size >= offsetof(refit_encode_input_t, new_values) + sizeof(in.new_values);
}
inline const uint8_t* PackedOldValues(const refit_encode_input_t& in) {
  return HasPackedValues(in) ? static_cast<const uint8_t*>(in.old_values) : nullptr;
}
inline const uint8_t* PackedNewValues(const refit_encode_input_t& in) {
  return HasPackedValues(in) ? static_cast<const uint8_t*>(in.new_values) : nullptr;
}

// Checks the host's decode target. Returns the byte size of the run (n_elems * elem_size).
inline Result<uint64_t> CheckDecodeTarget(const refit_decode_target_t& target) {
  if (target.struct_size < sizeof(refit_decode_target_t)) {
    return Status::Invalid("decode target struct_size " + std::to_string(target.struct_size) +
                           " is smaller than " + std::to_string(sizeof(refit_decode_target_t)));
  }
  REFIT_ASSIGN_OR_RAISE(uint64_t bytes, ElementBytes(target.n_elems, target.elem_size));
  if (bytes > 0 && target.bits == nullptr) return Status::Invalid("decode target has no bits");
  return bytes;
}

// The error for an output buffer encode() cannot fit into.
// No old bits but elements to encode: a full sync, which only encodings with
// REFIT_ENC_CAP_FULL_SYNC (dense) carry. An empty run is an empty delta either way (its vectors
// may hand over null pointers).
inline bool IsFullSync(const refit_encode_input_t& in) {
  return in.old_bits == nullptr && in.n_elems > 0;
}

// What a changes-only encoding answers to a full sync.
inline Status RefuseFullSync(const char* encoding) {
  return Status::Unsupported(std::string(encoding) +
                             " encodes changes only: a full sync (no old bits) needs an encoding "
                             "with the full-sync capability, e.g. dense");
}

inline Status OutputTooSmall(uint64_t need, uint64_t cap) {
  return Status::Invalid("output buffer of " + std::to_string(cap) + " bytes is too small (need " +
                         std::to_string(need) + ")");
}

// decode_changes of a payload that codes more changes than the room the host gave (the record
// header's count): refused, whatever the encoding.
inline Status MoreChangesThanDeclared(const std::string& what, uint64_t changes, uint64_t room) {
  return Status::Corrupt(what + " codes " + std::to_string(changes) + " changes, more than the " +
                         std::to_string(room) + " its record declares");
}

// Little-endian integers at any alignment (payloads are byte streams).
template <typename T>
inline void StoreLE(uint8_t* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
template <typename T>
inline T LoadLE(const uint8_t* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<T>(p[i]) << (8 * i));
  return v;
}

}  // namespace refit::sdk
