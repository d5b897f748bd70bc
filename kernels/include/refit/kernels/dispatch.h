// Runtime CPU dispatch for the SIMD kernels.
//
// One binary runs on any x86-64: the level is chosen once per process (on first use) from cpuid
// via __builtin_cpu_supports, never from -march. REFIT_KERNELS=scalar|sse2|avx2|avx512 forces a
// level for tests and benchmarks; a forced level the CPU lacks falls back to the best one it has
// (never an illegal instruction). Every level produces identical results: the scalar kernels are
// the reference the others are tested against.
#pragma once

#include <cstdint>
#include <vector>

#include "refit/kernels/diff.h"

namespace refit::kernels {

enum class SimdLevel : int { kScalar = 0, kSse2 = 1, kAvx2 = 2, kAvx512 = 3 };

// "scalar", "sse2", "avx2" or "avx512".
const char* SimdLevelName(SimdLevel level);

// Whether this CPU (and this build) can run the level's kernels.
bool SimdLevelSupported(SimdLevel level);

// The best level this CPU supports.
SimdLevel BestSimdLevel();

// The level DiffPositions / CountDiff / Digest64 use in this process (REFIT_KERNELS or
// BestSimdLevel()).
SimdLevel ActiveSimdLevel();

// DiffPositions / CountDiff (diff.h) at an explicit level, for tests and benchmarks. An
// unsupported level runs the best supported one instead.
uint64_t DiffPositionsAt(SimdLevel level, const void* old_bits, const void* new_bits, uint64_t n,
                         uint32_t elem_size, std::vector<uint64_t>* positions);
uint64_t CountDiffAt(SimdLevel level, const void* old_bits, const void* new_bits, uint64_t n,
                     uint32_t elem_size);
DiffDigest DiffPositionsAndDigestAt(SimdLevel level, const void* old_bits, const void* new_bits,
                                    uint64_t n, uint32_t elem_size, PositionList* positions,
                                    ChangedValues values = {});

// Digest64 (diff.h) with the xxh3 loop of an explicit level (unsupported: the best supported).
uint64_t Digest64At(SimdLevel level, const void* data, uint64_t len);

}  // namespace refit::kernels
