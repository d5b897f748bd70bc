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

// The payloads of a full sync (old bits null) of `slices` through one writer.
Result<std::vector<std::vector<uint8_t>>> FullSyncPayloads(
    const std::vector<internal::SliceSource>& slices, const Registry& registry, unsigned threads,
    uint64_t bucket_bytes) {
  internal::EncodingCache encodings(registry, nullptr);
  std::vector<std::vector<uint8_t>> out;
  internal::DeltaWriter writer(
      encodings, "dense", 1 << 20, bucket_bytes, {},
      [&](std::vector<uint8_t>&& payload, uint64_t) {
        out.push_back(std::move(payload));
        return Status::OK();
      },
      threads);
  uint64_t model_bytes = 0;
  for (const internal::SliceSource& s : slices) {
    model_bytes += BoxElements(s.local_box) * SizeOf(s.dtype);
  }
  writer.ExpectBytes(model_bytes);
  for (const internal::SliceSource& s : slices) REFIT_RETURN_NOT_OK(writer.Add(s));
  REFIT_RETURN_NOT_OK(writer.Finish());
  return out;
}

// Dense records borrow the caller's bits where a slice is contiguous and are staged where it is
// gathered from a strided box; the last payload is assembled on every thread (large enough here
// to be split). The payloads are the one-thread ones, and they rebuild every bit.
TEST(PipelineDeterminism, BorrowedAndGatheredDenseRecordsAssembleAlikeOnAnyThreadCount) {
  auto registry = LoadRegistry(nullptr);
  ASSERT_TRUE(registry.ok()) << registry.status().message();
  testing::TensorPair p;
  p.Add("matrix", DType::kBF16, 2048 * 2048, 1.0, 71);  // 8 MiB, cut into two column halves
  p.Add("vector", DType::kF32, 3'000'000, 1.0, 72);     // 12 MB, contiguous
  p.Add("small", DType::kBF16, 1000, 1.0, 73);
  std::vector<internal::SliceSource> slices;
  for (size_t i = 0; i < p.next.size(); ++i) {
    internal::SliceSource src;
    src.tensor = src.local_tensor = p.next[i].name;
    src.dtype = p.next[i].dtype;
    src.canonical_shape = src.local_shape = i == 0 ? Shape{2048, 2048} : Shape{p.next[i].shape[0]};
    src.new_bits = p.next[i].bytes();
    if (i > 0) {
      src.canonical_offset = {0};
      src.local_box = Box{{0}, src.local_shape};
      slices.push_back(src);
      continue;
    }
    for (uint64_t col : {uint64_t{0}, uint64_t{1024}}) {
      src.canonical_offset = {0, col};
      src.local_box = Box{{0, col}, {2048, 1024}};
      slices.push_back(src);
    }
  }
  // One payload (assembled after the last chunk), or many (flushed with chunks in flight).
  for (uint64_t bucket : {uint64_t{1} << 30, uint64_t{3} << 20}) {
    auto one = FullSyncPayloads(slices, *registry.value(), 1, bucket);
    ASSERT_TRUE(one.ok()) << one.status().message();
    for (unsigned threads : {2u, 3u}) {
      auto pooled = FullSyncPayloads(slices, *registry.value(), threads, bucket);
      ASSERT_TRUE(pooled.ok()) << pooled.status().message();
      EXPECT_EQ(one.value(), pooled.value()) << threads << " threads, bucket " << bucket;
    }
    std::vector<std::vector<uint8_t>> work;
    std::vector<TensorView> views = p.next;
    views[0].shape = {2048, 2048};
    for (size_t i = 0; i < views.size(); ++i) {
      work.emplace_back(p.next_bits[i].size(), 0);
      views[i].data = work[i].data();
    }
    for (const std::vector<uint8_t>& payload : one.value()) {
      auto applied = ApplyDelta(payload, views, *registry.value(), nullptr);
      ASSERT_TRUE(applied.ok()) << applied.status().message();
    }
    EXPECT_EQ(work, p.next_bits) << "bucket " << bucket;
  }
}

}  // namespace
}  // namespace refit
