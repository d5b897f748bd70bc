// A throughput check, not a test: DISABLED_ so the default run never pays for it. Run with
//   refit_conformance_tests --gtest_also_run_disabled_tests --gtest_filter='*Throughput*'
// Env REFIT_THROUGHPUT_MIB (default 256) sizes the bf16 buffers; REFIT_KERNELS picks the diff
// kernels' SIMD level. Prints, per encoding, diff+encode and apply(+digest) in GB/s of model
// scanned (one copy), next to a plain compare-scan and memcpy over the same buffers (single
// thread, best of 3). The real benchmark is `refit bench codec`.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "refit/kernels/diff.h"
#include "refit/kernels/dispatch.h"
#include "refit/registry.h"

namespace refit {
namespace {

double Seconds(const std::chrono::steady_clock::time_point& start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

template <typename Fn>
double BestOf3(Fn&& fn) {
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, Seconds(start));
  }
  return best;
}

// A plain scalar scan: read both copies, count differing elements.
__attribute__((noinline)) uint64_t CompareScan(const uint16_t* a, const uint16_t* b, uint64_t n) {
  uint64_t count = 0;
  for (uint64_t i = 0; i < n; ++i) count += a[i] != b[i];
  return count;
}

TEST(EncodingThroughput, DISABLED_Bf16OnePercent) {
  const char* mib_env = std::getenv("REFIT_THROUGHPUT_MIB");
  const uint64_t mib = mib_env != nullptr ? std::strtoull(mib_env, nullptr, 10) : 256;
  const uint64_t bytes = mib << 20;
  const uint64_t n = bytes / 2;
  std::vector<uint16_t> old_bits(n);
  std::mt19937_64 rng(1);
  for (auto& v : old_bits) v = static_cast<uint16_t>(rng());
  std::vector<uint16_t> new_bits = old_bits;
  // ~1% of elements move by one ULP (the low bit flips, as in a real BF16 refit).
  for (uint64_t i = 0; i < n; ++i) {
    if (rng() % 100 == 0) new_bits[i] ^= 1;
  }
  const double gb = static_cast<double>(bytes) / 1e9;

  uint64_t sink = 0;
  // The reference is the fastest plain compare-scan this binary has (CountDiff at the active SIMD
  // level); the scalar loop is printed for context.
  const double t_loop = BestOf3([&] { sink += CompareScan(old_bits.data(), new_bits.data(), n); });
  const double t_scan =
      BestOf3([&] { sink += kernels::CountDiff(old_bits.data(), new_bits.data(), n, 2); });
  std::vector<uint16_t> copy(n);
  const double t_copy = BestOf3([&] {
    std::memcpy(copy.data(), new_bits.data(), bytes);
    sink += copy[n / 2];
  });
  std::vector<uint64_t> positions;
  const double t_diff = BestOf3([&] {
    positions.clear();
    kernels::DiffPositions(old_bits.data(), new_bits.data(), n, 2, &positions);
  });
  const double t_digest = BestOf3([&] { sink += kernels::Digest64(new_bits.data(), bytes); });
  std::printf("bf16 %llu MiB, %llu changes (%.3f%%), kernels %s\n",
              static_cast<unsigned long long>(mib),
              static_cast<unsigned long long>(positions.size()),
              100.0 * static_cast<double>(positions.size()) / static_cast<double>(n),
              kernels::SimdLevelName(kernels::ActiveSimdLevel()));
  std::printf(
      "  compare-scan %.2f GB/s (scalar loop %.2f)   memcpy %.2f GB/s   diff only %.2f GB/s"
      "   xxh3 %.2f GB/s\n",
      gb / t_scan, gb / t_loop, gb / t_copy, gb / t_diff, gb / t_digest);

  auto registry = Registry::WithBuiltins();
  ASSERT_TRUE(registry.ok());
  ASSERT_TRUE((*registry)->LoadDirectory(REFIT_BUILD_PLUGIN_DIR).ok());
  std::printf("  %-12s %12s %9s %14s %9s %16s %9s\n", "encoding", "payload", "of dense",
              "diff+encode", "/scan", "apply+digest", "/scan");
  // "/scan": the encoding's throughput as a fraction of the compare-scan's.
  for (const char* name : {"indices", "deltas", "deltas_zstd", "bitmask", "xor"}) {
    auto enc = (*registry)->CreateEncoding(name);
    if (!enc.ok()) {
      std::printf("  %-12s (not loaded: %s)\n", name, enc.status().ToString().c_str());
      continue;
    }
    refit_encode_input_t in{};
    in.struct_size = sizeof(in);
    in.dtype = REFIT_DTYPE_BF16;
    in.elem_size = 2;
    in.n_elems = n;
    in.old_bits = old_bits.data();
    in.new_bits = new_bits.data();
    std::vector<uint8_t> payload;
    uint64_t size = 0;
    const double t_encode = BestOf3([&] {
      positions.clear();
      kernels::DiffPositions(old_bits.data(), new_bits.data(), n, 2, &positions);
      in.positions = positions.data();
      in.n_changed = positions.size();
      payload.resize((*enc)->MaxEncodedSize(in));
      auto written = (*enc)->Encode(in, payload.data(), payload.size());
      ASSERT_TRUE(written.ok()) << name << ": " << written.status().ToString();
      size = *written;
    });
    // Apply onto a copy of the old bits (reset outside the timing), then digest the result.
    double t_apply = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      std::memcpy(copy.data(), old_bits.data(), bytes);
      refit_decode_target_t t{};
      t.struct_size = sizeof(t);
      t.dtype = REFIT_DTYPE_BF16;
      t.elem_size = 2;
      t.n_elems = n;
      t.bits = copy.data();
      const auto start = std::chrono::steady_clock::now();
      Status st = (*enc)->Decode(payload.data(), size, t);
      sink += kernels::Digest64(copy.data(), bytes);
      t_apply = std::min(t_apply, Seconds(start));
      ASSERT_TRUE(st.ok()) << name << ": " << st.ToString();
    }
    ASSERT_EQ(std::memcmp(copy.data(), new_bits.data(), bytes), 0) << name;
    std::printf("  %-12s %12llu %8.3f%% %9.2f GB/s %8.2fx %11.2f GB/s %8.2fx\n", name,
                static_cast<unsigned long long>(size),
                100.0 * static_cast<double>(size) / static_cast<double>(bytes), gb / t_encode,
                t_scan / t_encode, gb / t_apply, t_scan / t_apply);
  }
  std::printf("  (sink %llu)\n", static_cast<unsigned long long>(sink));
}

}  // namespace
}  // namespace refit
