// Chunks are encoded on a thread pool, yet the payload bytes must not depend on the thread count.
#include <gtest/gtest.h>

#include "delta_test_util.h"
#include "offline/delta_internal.h"
#include "plugins/encoding_cache.h"
#include "refit/delta.h"
#include "refit/refit.h"
#include "send/delta_writer.h"

namespace refit {
namespace {

std::vector<std::string> AllEncodings(const Registry& registry) {
  std::vector<std::string> encodings = {"auto"};
  for (const ComponentInfo* c : registry.List()) {
    if (c->kind == REFIT_KIND_ENCODING) encodings.push_back(c->name);
  }
  return encodings;
}

TEST(PipelineDeterminism, OneAndFourThreadsGiveIdenticalPayloads) {
  auto registry = LoadRegistry(nullptr);
  ASSERT_TRUE(registry.ok()) << registry.status().message();
  testing::TensorPair p;
  p.Add("a", DType::kBF16, 300'000, 0.01, 11);
  p.Add("b", DType::kBF16, 5'000, 0.2, 12);  // smaller than a chunk
  p.Add("c", DType::kF32, 100'000, 0.5, 13);
  p.Add("d", DType::kU8, 70'000, 0.002, 14);
  p.Add("e", DType::kF64, 20'000, 1.0, 15);
  // Enough bytes that the writer keeps its threads (it uses fewer below 1 MiB per thread).
  p.Add("f", DType::kBF16, 2'500'000, 0.01, 16);

  std::vector<std::string> encodings = {"auto"};
  for (const ComponentInfo* c : registry.value()->List()) {
    if (c->kind == REFIT_KIND_ENCODING) encodings.push_back(c->name);
  }
  ASSERT_GE(encodings.size(), 3u);  // auto, dense, indices at least
  for (const std::string& name : encodings) {
    DeltaOptions opt;
    opt.encoding = name;
    opt.chunk_bytes = 128 << 10;  // many chunks per tensor, above the size computed inline
    opt.threads = 1;
    auto inline_payload = EncodeDelta(p.base, p.next, opt, *registry.value(), nullptr);
    ASSERT_TRUE(inline_payload.ok()) << name << ": " << inline_payload.status().message();
    for (unsigned threads : {2u, 4u}) {
      opt.threads = threads;
      auto pooled = EncodeDelta(p.base, p.next, opt, *registry.value(), nullptr);
      ASSERT_TRUE(pooled.ok()) << name << ": " << pooled.status().message();
      EXPECT_EQ(inline_payload.value(), pooled.value())
          << name << " with " << threads << " threads";
    }
    // The pooled payload also applies bit-exactly.
    std::vector<std::vector<uint8_t>> work = p.base_bits;
    std::vector<TensorView> views = p.base;
    for (size_t i = 0; i < views.size(); ++i) views[i].data = work[i].data();
    auto applied = ApplyDelta(inline_payload.value(), views, *registry.value(), nullptr);
    ASSERT_TRUE(applied.ok()) << name << ": " << applied.status().message();
    EXPECT_EQ(work, p.next_bits) << name;
  }
}

TEST(PipelineDeterminism, FullSyncIsIdenticalAcrossThreadCounts) {
  auto registry = LoadRegistry(nullptr);
  ASSERT_TRUE(registry.ok());
  testing::TensorPair p;
  p.Add("a", DType::kBF16, 100'000, 0.01, 21);
  p.Add("b", DType::kF16, 7'000, 0.01, 22);
  p.Add("c", DType::kBF16, 1'600'000, 0.01, 23);  // > 1 MiB per thread: the pool is used
  DeltaOptions opt;
  opt.chunk_bytes = 128 << 10;
  opt.threads = 1;
  auto one = EncodeDelta({}, p.next, opt, *registry.value(), nullptr);  // no base: dense
  opt.threads = 3;
  auto three = EncodeDelta({}, p.next, opt, *registry.value(), nullptr);
  ASSERT_TRUE(one.ok() && three.ok());
  EXPECT_EQ(one.value(), three.value());
}

// Chunks of very different sizes (tiny ones the caller computes itself, large ones queued to the
// workers, more of them than there are threads): the payload is still the one-thread payload, and
// applying it on several threads gives the same bits as on one.
TEST(PipelineDeterminism, MixedChunkSizesAcrossThreadCountsAndApplyThreads) {
  auto registry = LoadRegistry(nullptr);
  ASSERT_TRUE(registry.ok()) << registry.status().message();
  testing::TensorPair p;
  p.Add("embed", DType::kBF16, 1'500'000, 0.015, 31);
  for (int i = 0; i < 6; ++i) {
    p.Add("norm." + std::to_string(i), DType::kBF16, 384, 0.05, 40 + i);
    p.Add("proj." + std::to_string(i), DType::kBF16, 150'000 * (i + 1), 0.015, 50 + i);
  }
  p.Add("head", DType::kF32, 700'000, 0.01, 32);
  for (const std::string& name : AllEncodings(*registry.value())) {
    DeltaOptions opt;
    opt.encoding = name;
    opt.chunk_bytes = 1 << 20;
    opt.threads = 1;
    auto one = EncodeDelta(p.base, p.next, opt, *registry.value(), nullptr);
    ASSERT_TRUE(one.ok()) << name << ": " << one.status().message();
    for (unsigned threads : {2u, 3u, 8u}) {
      opt.threads = threads;
      auto pooled = EncodeDelta(p.base, p.next, opt, *registry.value(), nullptr);
      ASSERT_TRUE(pooled.ok()) << name << ": " << pooled.status().message();
      EXPECT_EQ(one.value(), pooled.value()) << name << " with " << threads << " threads";
    }
    for (unsigned threads : {1u, 3u}) {
      std::vector<std::vector<uint8_t>> work = p.base_bits;
      std::vector<TensorView> views = p.base;
      for (size_t i = 0; i < views.size(); ++i) views[i].data = work[i].data();
      auto applied =
          internal::ApplyDeltaOnThreads(one.value(), views, *registry.value(), nullptr, threads);
      ASSERT_TRUE(applied.ok()) << name << ": " << applied.status().message();
      EXPECT_EQ(work, p.next_bits) << name << " applied on " << threads << " threads";
    }
  }
}

// One payload of `p` from a DeltaWriter lent `workspace` (null: its own). flush_fails: the flush
// refuses the payload, with chunks still in flight on the workers.
Result<std::vector<uint8_t>> WriteWith(const testing::TensorPair& p, const Registry& registry,
                                       const std::string& encoding, unsigned threads,
                                       internal::DeltaWriter::Workspace* workspace,
                                       bool flush_fails = false) {
  internal::EncodingCache encodings(registry, nullptr);
  std::vector<uint8_t> out;
  internal::DeltaWriter writer(
      encodings, encoding, 64 << 10, 256 << 10, {},
      [&](std::vector<uint8_t>&& payload, uint64_t) {
        if (flush_fails) return Status::IoError("flush refused");
        out.insert(out.end(), payload.begin(), payload.end());
        return Status::OK();
      },
      threads, workspace);
  uint64_t model_bytes = 0;
  for (const TensorView& t : p.next) model_bytes += t.nbytes();
  writer.ExpectBytes(model_bytes);
  for (size_t i = 0; i < p.next.size(); ++i) {
    const TensorView& t = p.next[i];
    internal::SliceSource src;
    src.tensor = src.local_tensor = t.name;
    src.dtype = t.dtype;
    src.canonical_shape = src.local_shape = t.shape;
    src.canonical_offset.assign(t.shape.size(), 0);
    src.local_box = Box{Shape(t.shape.size(), 0), t.shape};
    src.new_bits = t.bytes();
    src.old_bits = p.base[i].bytes();
    REFIT_RETURN_NOT_OK(writer.Add(src));
  }
  REFIT_RETURN_NOT_OK(writer.Finish());
  return out;
}

// A sender lends one workspace (threads and scratch) to every version's writer: the payloads
// are those of writers with their own, across thread counts, encodings, and after a writer that
// failed with chunks in flight.
TEST(PipelineDeterminism, AWorkspaceLentToSuccessiveWritersChangesNoPayload) {
  auto registry = LoadRegistry(nullptr);
  ASSERT_TRUE(registry.ok()) << registry.status().message();
  testing::TensorPair p;
  p.Add("embed", DType::kBF16, 1'200'000, 0.015, 61);
  p.Add("norm", DType::kBF16, 512, 0.05, 62);
  p.Add("proj", DType::kF32, 400'000, 0.01, 63);
  internal::DeltaWriter::Workspace workspace;
  for (const std::string encoding : {"indices", "ctx", "auto", "dense"}) {
    auto own = WriteWith(p, *registry.value(), encoding, 1, nullptr);
    ASSERT_TRUE(own.ok()) << encoding << ": " << own.status().message();
    for (unsigned threads : {2u, 4u, 4u, 1u, 3u}) {
      auto lent = WriteWith(p, *registry.value(), encoding, threads, &workspace);
      ASSERT_TRUE(lent.ok()) << encoding << ": " << lent.status().message();
      EXPECT_EQ(own.value(), lent.value()) << encoding << " on " << threads << " threads";
    }
    auto failed = WriteWith(p, *registry.value(), encoding, 4, &workspace, /*flush_fails=*/true);
    EXPECT_EQ(failed.status().code(), StatusCode::kIoError) << encoding;
    auto after = WriteWith(p, *registry.value(), encoding, 4, &workspace);
    ASSERT_TRUE(after.ok()) << encoding << ": " << after.status().message();
    EXPECT_EQ(own.value(), after.value()) << encoding << " after a failed writer";
  }
}

}  // namespace
}  // namespace refit
