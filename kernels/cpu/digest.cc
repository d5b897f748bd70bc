// The per-record digest (xxh3-64: XXH3_64bits, no seed) with runtime CPU dispatch.
//
// xxHash picks its vector code at compile time from -m flags, which a portable build keeps at the
// x86-64 baseline (SSE2): compute-bound at about 15 GB/s here, slower than memory, so the digest
// pass cost more than the diff. xxHash also ships AVX2 / AVX-512 variants of its inner loop for
// runtime dispatch (XXH_X86DISPATCH, XXH_DISPATCH_*: each compiled under a target attribute); this
// file instantiates the long-input hash and the streaming update once per level and picks one like
// the diff kernels do (dispatch.h). The AVX-512 level uses the AVX2 variant: measured on the Zen 4
// machines we run on, xxHash's AVX-512 loop hashes memory-resident data at ~15 GB/s against ~24 for
// AVX2, and slows down the diff it is interleaved with. Every variant computes the same xxh3
// value: only the speed depends on the level.
#include <cstdlib>

#include "refit/kernels/diff.h"
#include "refit/kernels/dispatch.h"

#if defined(__x86_64__)
#include <immintrin.h>       // the AVX2 variant uses intrinsics xxhash.h does not include itself
#define XXH_X86DISPATCH      // 64-byte accumulator alignment, SSE2 variant always compiled
#define XXH_DISPATCH_AVX2 1  // compile the AVX2 variant under its target attribute
#define XXH_TARGET_AVX2 __attribute__((target("avx2")))
#define XXH_TARGET_SSE2
#define REFIT_DIGEST_X86 1
#endif

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace refit::kernels {
namespace {

using HashFn = uint64_t (*)(const void* data, size_t len);
using UpdateFn = void (*)(void* state, const void* data, uint64_t len);

struct DigestKernels {
  HashFn hash;
  UpdateFn update;
};

// One level: the long-input loop with the level's accumulate / scramble steps inlined, the short
// inputs (<= 240 bytes, no vector code) shared, and the streaming update with the same steps.
#define REFIT_DEFINE_DIGEST(Name, ATTR, SUFFIX)                                                    \
  ATTR XXH64_hash_t HashLong##Name(const void* XXH_RESTRICT input, size_t len,                     \
                                   XXH64_hash_t /*seed*/, const xxh_u8* XXH_RESTRICT /*secret*/,   \
                                   size_t /*secret_len*/) {                                        \
    return XXH3_hashLong_64b_internal(input, len, XXH3_kSecret, sizeof(XXH3_kSecret),              \
                                      XXH3_accumulate_512_##SUFFIX, XXH3_scrambleAcc_##SUFFIX);    \
  }                                                                                                \
  uint64_t Hash##Name(const void* data, size_t len) {                                              \
    return XXH3_64bits_internal(data, len, 0, XXH3_kSecret, sizeof(XXH3_kSecret), HashLong##Name); \
  }                                                                                                \
  ATTR void Update##Name(void* state, const void* data, uint64_t len) {                            \
    XXH3_update(static_cast<XXH3_state_t*>(state), static_cast<const xxh_u8*>(data),               \
                static_cast<size_t>(len), XXH3_accumulate_512_##SUFFIX,                            \
                XXH3_scrambleAcc_##SUFFIX);                                                        \
  }                                                                                                \
  constexpr DigestKernels k##Name##Digest = {&Hash##Name, &Update##Name};

#define REFIT_NO_TARGET

REFIT_DEFINE_DIGEST(Scalar, REFIT_NO_TARGET, scalar)
#if defined(REFIT_DIGEST_X86)
REFIT_DEFINE_DIGEST(Sse2, REFIT_NO_TARGET, sse2)
REFIT_DEFINE_DIGEST(Avx2, XXH_TARGET_AVX2, avx2)
#endif

#undef REFIT_DEFINE_DIGEST

const DigestKernels& DigestFor(SimdLevel level) {
  if (!SimdLevelSupported(level)) level = BestSimdLevel();
  switch (level) {
#if defined(REFIT_DIGEST_X86)
    case SimdLevel::kAvx512:  // see the top of the file
    case SimdLevel::kAvx2:
      return kAvx2Digest;
    case SimdLevel::kSse2:
      return kSse2Digest;
#endif
    default:
      return kScalarDigest;
  }
}

const DigestKernels& ActiveDigest() {
  static const DigestKernels& kernels = DigestFor(ActiveSimdLevel());
  return kernels;
}

XXH3_state_t* State(void* p) { return static_cast<XXH3_state_t*>(p); }

}  // namespace

uint64_t Digest64(const void* data, uint64_t len) {
  return ActiveDigest().hash(data, static_cast<size_t>(len));
}

uint64_t Digest64At(SimdLevel level, const void* data, uint64_t len) {
  return DigestFor(level).hash(data, static_cast<size_t>(len));
}

DigestStream::DigestStream() : DigestStream(ActiveSimdLevel()) {}

DigestStream::DigestStream(SimdLevel level)
    : state_(XXH3_createState()), update_(DigestFor(level).update) {
  // XXH3_createState fails only when malloc does, as anywhere else in the process.
  if (state_ == nullptr) std::abort();
  XXH3_64bits_reset(State(state_));
}

DigestStream::~DigestStream() { XXH3_freeState(State(state_)); }

void DigestStream::Update(const void* data, uint64_t len) {
  if (len == 0) return;
  update_(state_, data, len);
}

uint64_t DigestStream::Final() const { return XXH3_64bits_digest(State(state_)); }

}  // namespace refit::kernels
