// The `indices` encoding: absolute positions of the changed elements, then their new bits.
//
// Payload (all integers little-endian):
//   u8  format version (1)
//   u8  index width in bytes (4, or 8 when an index could exceed u32)
//   u16 reserved (0)
//   u64 count k
//   k   indices (strictly increasing, each < n_elems)
//   k   values (elem_size bytes each: the new bits, as stored in memory)
// The cheapest delta to produce and apply; the default until `auto` exists.
#include <bit>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

#include "refit/kernels/coding.h"
#include "refit/sdk/encoding_util.hpp"
#include "refit/sdk/plugin.hpp"

namespace {

using refit::Result;
using refit::Status;
using refit::sdk::LoadLE;
using refit::sdk::StoreLE;

static_assert(std::endian::native == std::endian::little, "indices are stored as in memory");

constexpr uint8_t kFormatVersion = 1;
constexpr uint64_t kHeaderBytes = 12;

// Bytes per index for a run of n elements: u32 unless the last index does not fit.
uint32_t IndexWidthFor(uint64_t n_elems) { return n_elems <= (uint64_t{1} << 32) ? 4 : 8; }

// kHeaderBytes + k * (width + elem_size), or false on overflow.
bool PayloadBytes(uint64_t k, uint32_t width, uint32_t elem_size, uint64_t* total) {
  uint64_t body = 0;
  return refit::sdk::CheckedMul(k, uint64_t{width} + elem_size, &body) &&
         refit::sdk::CheckedAdd(body, kHeaderBytes, total);
}

// Copies element `from` of src to slot `to` of dst, for a fixed element size (one move).
template <uint32_t kElem>
inline void CopyElement(uint8_t* dst, uint64_t to, const uint8_t* src, uint64_t from) {
  std::memcpy(dst + to * kElem, src + from * kElem, kElem);
}

// Writes the indices, checking each one: the positions come from the host, and a bad one would
// make a payload every receiver rejects. Returns the offending slot, or k when all are valid.
template <typename Index>
uint64_t WriteIndices(const uint64_t* positions, uint64_t k, uint64_t n_elems, uint8_t* indices) {
  uint64_t next_allowed = 0;  // the smallest position the next slot may hold
  for (uint64_t j = 0; j < k; ++j) {
    const uint64_t pos = positions[j];
    if (pos < next_allowed || pos >= n_elems) return j;
    next_allowed = pos + 1;
    const Index index = static_cast<Index>(pos);
    std::memcpy(indices + j * sizeof(Index), &index, sizeof(Index));  // little-endian host
  }
  return k;
}

// Every index strictly increasing and < n: then the scatter below stays inside the target and
// writes each element at most once. Returns the offending slot, or k when all are valid.
template <typename Index>
uint64_t FirstBadIndex(const uint8_t* indices, uint64_t k, uint64_t n_elems) {
  uint64_t next_allowed = 0;  // the smallest index the next slot may hold
  for (uint64_t j = 0; j < k; ++j) {
    const uint64_t pos = LoadLE<Index>(indices + j * sizeof(Index));
    if (pos < next_allowed || pos >= n_elems) return j;
    next_allowed = pos + 1;
  }
  return k;
}

template <typename Index, uint32_t kElem>
void Scatter(const uint8_t* indices, const uint8_t* values, uint64_t k, uint8_t* bits) {
  for (uint64_t j = 0; j < k; ++j) {
    CopyElement<kElem>(bits, LoadLE<Index>(indices + j * sizeof(Index)), values, j);
  }
}

// Calls fn(index_tag, elem_constant) with the runtime index width and element size as types, so
// the inner loops move fixed-size integers (both values already validated).
template <typename Fn>
void WithWidthAndElem(uint32_t width, uint32_t elem_size, Fn&& fn) {
  auto by_elem = [&](auto index_tag) {
    switch (elem_size) {
      case 1:
        fn(index_tag, std::integral_constant<uint32_t, 1>{});
        break;
      case 2:
        fn(index_tag, std::integral_constant<uint32_t, 2>{});
        break;
      case 4:
        fn(index_tag, std::integral_constant<uint32_t, 4>{});
        break;
      default:
        fn(index_tag, std::integral_constant<uint32_t, 8>{});
        break;
    }
  };
  if (width == 4) {
    by_elem(uint32_t{});
  } else {
    by_elem(uint64_t{});
  }
}

class IndicesEncoding {
 public:
  static constexpr refit_op_t kOp = REFIT_OP_OVERWRITE;
  // Relative cost of applying a record (a scatter of values at their positions); `auto` tries
  // cheaper encodings first.
  static constexpr uint32_t kApplyCost = 10;

  static Result<std::unique_ptr<IndicesEncoding>> Create(const refit::sdk::ConfigView& /*cfg*/) {
    return std::make_unique<IndicesEncoding>();
  }

  uint64_t MaxEncodedSize(const refit_encode_input_t& in) const {
    if (!refit::sdk::CheckEncodeInput(in).ok() || refit::sdk::IsFullSync(in)) return 0;
    uint64_t total = 0;
    if (!PayloadBytes(in.n_changed, IndexWidthFor(in.n_elems), in.elem_size, &total)) return 0;
    return total;
  }

  Result<uint64_t> Encode(const refit_encode_input_t& in, uint8_t* out, uint64_t cap) const {
    REFIT_RETURN_NOT_OK(refit::sdk::CheckEncodeInput(in).status());
    if (refit::sdk::IsFullSync(in)) return refit::sdk::RefuseFullSync("indices");
    const uint32_t width = IndexWidthFor(in.n_elems);
    uint64_t total = 0;
    if (!PayloadBytes(in.n_changed, width, in.elem_size, &total)) {
      return Status::Invalid(std::to_string(in.n_changed) + " changes overflow the payload size");
    }
    if (total > cap) return refit::sdk::OutputTooSmall(total, cap);
    out[0] = kFormatVersion;
    out[1] = static_cast<uint8_t>(width);
    StoreLE<uint16_t>(out + 2, 0);
    StoreLE<uint64_t>(out + 4, in.n_changed);
    uint8_t* indices = out + kHeaderBytes;
    uint8_t* values = indices + in.n_changed * width;
    const uint64_t bad =
        width == 4 ? WriteIndices<uint32_t>(in.positions, in.n_changed, in.n_elems, indices)
                   : WriteIndices<uint64_t>(in.positions, in.n_changed, in.n_elems, indices);
    if (bad < in.n_changed) {
      return Status::Invalid("position " + std::to_string(bad) + " (" +
                             std::to_string(in.positions[bad]) +
                             ") is out of range or not strictly increasing");
    }
    refit::kernels::GatherValues(in.new_bits, refit::sdk::PackedNewValues(in), in.elem_size,
                                 in.positions, in.n_changed, values);
    return total;
  }

  // A payload's parts, every index checked (strictly increasing, inside the target).
  struct Parsed {
    uint32_t width = 0;
    uint64_t k = 0;
    const uint8_t* indices = nullptr;
    const uint8_t* values = nullptr;
  };

  static Result<Parsed> Parse(const uint8_t* payload, uint64_t len,
                              const refit_decode_target_t& t) {
    REFIT_RETURN_NOT_OK(refit::sdk::CheckDecodeTarget(t).status());
    if (len < kHeaderBytes || payload == nullptr) {
      return Status::Corrupt("indices payload has " + std::to_string(len) +
                             " bytes, shorter than its " + std::to_string(kHeaderBytes) +
                             "-byte header");
    }
    if (payload[0] != kFormatVersion) {
      return Status::Unsupported("indices payload format version " + std::to_string(payload[0]) +
                                 " (this build reads version " + std::to_string(kFormatVersion) +
                                 ")");
    }
    const uint32_t width = payload[1];
    if (width != 4 && width != 8) {
      return Status::Corrupt("indices payload index width " + std::to_string(width) +
                             " is not 4 or 8");
    }
    if (LoadLE<uint16_t>(payload + 2) != 0) {
      return Status::Corrupt("indices payload reserved header bytes are not zero");
    }
    const uint64_t k = LoadLE<uint64_t>(payload + 4);
    if (k > t.n_elems) {
      return Status::Corrupt("indices payload claims " + std::to_string(k) +
                             " changes in a run of " + std::to_string(t.n_elems) + " elements");
    }
    uint64_t expected = 0;
    if (!PayloadBytes(k, width, t.elem_size, &expected) || len != expected) {
      return Status::Corrupt("indices payload has " + std::to_string(len) + " bytes, expected " +
                             std::to_string(expected) + " for " + std::to_string(k) +
                             " changes of " + std::to_string(t.elem_size) + "-byte elements");
    }
    const uint8_t* indices = payload + kHeaderBytes;
    // Validate every index before the first write: a corrupt payload leaves the target untouched.
    const uint64_t bad = width == 4 ? FirstBadIndex<uint32_t>(indices, k, t.n_elems)
                                    : FirstBadIndex<uint64_t>(indices, k, t.n_elems);
    if (bad < k) {
      const uint64_t pos =
          width == 4 ? LoadLE<uint32_t>(indices + bad * 4) : LoadLE<uint64_t>(indices + bad * 8);
      return Status::Corrupt("indices payload index " + std::to_string(bad) + " (" +
                             std::to_string(pos) + ") is out of range [0, " +
                             std::to_string(t.n_elems) + ") or not strictly increasing");
    }
    return Parsed{width, k, indices, indices + k * width};
  }

  Status Decode(const uint8_t* payload, uint64_t len, const refit_decode_target_t& t) const {
    REFIT_ASSIGN_OR_RAISE(Parsed p, Parse(payload, len, t));
    auto* bits = static_cast<uint8_t*>(t.bits);
    WithWidthAndElem(p.width, t.elem_size, [&](auto index_tag, auto elem) {
      Scatter<decltype(index_tag), decltype(elem)::value>(p.indices, p.values, p.k, bits);
    });
    return Status::OK();
  }

  Result<uint64_t> DecodeChanges(const uint8_t* payload, uint64_t len,
                                 const refit_decode_target_t& old, uint64_t* positions,
                                 uint8_t* values, uint64_t capacity) const {
    REFIT_ASSIGN_OR_RAISE(Parsed p, Parse(payload, len, old));
    if (p.k > capacity) {
      return refit::sdk::MoreChangesThanDeclared("indices payload", p.k, capacity);
    }
    for (uint64_t j = 0; j < p.k; ++j) {
      positions[j] =
          p.width == 4 ? LoadLE<uint32_t>(p.indices + j * 4) : LoadLE<uint64_t>(p.indices + j * 8);
    }
    if (p.k > 0) std::memcpy(values, p.values, p.k * old.elem_size);
    return p.k;
  }
};

}  // namespace

REFIT_PLUGIN("indices", "0.1.0",
             refit::sdk::MakeEncoding<IndicesEncoding>(
                 "indices",
                 "absolute u32/u64 positions + new bits of the changed elements "
                 "(overwrite)"))
