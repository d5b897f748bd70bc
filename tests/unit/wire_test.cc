#include "format/wire.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "common/worker_pool.h"

namespace refit {
namespace {

RecordHeader MakeHeader(const std::string& tensor) {
  RecordHeader h;
  h.tensor = tensor;
  h.dtype = DType::kBF16;
  h.shape = {4, 8};
  h.box_offset = {1, 0};
  h.box_extent = {2, 8};
  h.encoding = "indices";
  h.op = REFIT_OP_OVERWRITE;
  h.changed = 3;
  h.digest = 0x0123456789abcdefull;
  return h;
}

TEST(Wire, PayloadRoundTrip) {
  PayloadBuilder b(Metadata{{"refit.version", "7"}});
  const uint8_t a[] = {1, 2, 3};
  const uint8_t c[] = {9};
  b.Add(MakeHeader("w1"), a, sizeof(a));
  RecordHeader h2 = MakeHeader("w2");
  h2.create = true;
  h2.op = REFIT_OP_XOR;
  b.Add(h2, c, sizeof(c));
  auto bytes = b.Finish();
  ASSERT_TRUE(bytes.ok()) << bytes.status().message();
  auto p = Payload::Parse(bytes->data(), bytes->size(), "p");
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_EQ(p->records().size(), 2u);
  const RecordHeader& r = p->records()[0];
  EXPECT_EQ(r.tensor, "w1");
  EXPECT_EQ(r.shape, (Shape{4, 8}));
  EXPECT_EQ(r.box_offset, (Shape{1, 0}));
  EXPECT_EQ(r.digest, 0x0123456789abcdefull);
  EXPECT_EQ(r.data_end - r.data_begin, 3u);
  EXPECT_EQ(p->record_bytes(r)[2], 3);
  EXPECT_TRUE(p->records()[1].create);
  EXPECT_EQ(p->records()[1].op, REFIT_OP_XOR);
  EXPECT_EQ(p->MetadataOr("refit.version", ""), "7");
}

// Records staged (copied, or encoded in place and trimmed) and borrowed serialize to the same
// bytes, whether the payload is assembled on one thread or split across a pool's threads.
TEST(Wire, BorrowedAndStagedRecordsGiveTheSamePayloadOnAnyThreadCount) {
  std::vector<std::vector<uint8_t>> blobs;
  for (uint64_t len :
       {uint64_t{5} << 20, uint64_t{3}, uint64_t{0}, uint64_t{9} << 20, uint64_t{77}}) {
    std::vector<uint8_t> blob(len);
    for (uint64_t i = 0; i < len; ++i) blob[i] = static_cast<uint8_t>(i * 131 + len);
    blobs.push_back(std::move(blob));
  }
  // kind 0: copied, 1: encoded in place into a larger span then trimmed, 2: borrowed.
  const auto build = [&](const std::vector<int>& kinds) {
    PayloadBuilder b(Metadata{{"refit.version", "3"}});
    for (size_t i = 0; i < blobs.size(); ++i) {
      RecordHeader h = MakeHeader("w" + std::to_string(i));
      const std::vector<uint8_t>& blob = blobs[i];
      if (kinds[i] == 0) {
        b.Add(h, blob.data(), blob.size());
      } else if (kinds[i] == 1) {
        uint8_t* out = b.AddInPlace(h, blob.size() + 100);
        std::copy(blob.begin(), blob.end(), out);
        b.TrimLast(blob.size());
      } else {
        b.AddBorrowed(h, blob.data(), blob.size());
      }
    }
    return b;
  };
  PayloadBuilder copied = build({0, 0, 0, 0, 0});
  auto reference = copied.Finish();
  ASSERT_TRUE(reference.ok()) << reference.status().message();
  internal::WorkerPool pool(3);
  for (const std::vector<int>& kinds :
       {std::vector<int>{2, 2, 2, 2, 2}, {2, 0, 2, 1, 1}, {1, 2, 0, 2, 2}}) {
    for (unsigned threads : {1u, 2u, 4u}) {
      PayloadBuilder b = build(kinds);
      EXPECT_EQ(b.data_bytes(), (uint64_t{14} << 20) + 80);
      auto bytes = threads == 1 ? b.Finish() : b.Finish(&pool, threads);
      ASSERT_TRUE(bytes.ok()) << bytes.status().message();
      EXPECT_EQ(bytes.value(), reference.value()) << "kinds " << kinds[0] << kinds[1] << kinds[2]
                                                  << kinds[3] << kinds[4] << ", " << threads;
      EXPECT_TRUE(b.empty());
    }
  }
  // Built into a payload already put (the sender's spare, AsyncPutter::TakeSpare): its old bytes
  // are gone and, when it is large enough, no other memory is taken.
  for (unsigned threads : {1u, 4u}) {
    for (size_t spare_bytes : {reference->size() + 4096, size_t{10}}) {
      std::vector<uint8_t> spare(spare_bytes, 0xab);
      const uint8_t* storage = spare.data();
      PayloadBuilder b = build({2, 0, 2, 1, 1});
      auto bytes = b.Finish(threads == 1 ? nullptr : &pool, threads, std::move(spare));
      ASSERT_TRUE(bytes.ok()) << bytes.status().message();
      EXPECT_EQ(bytes.value(), reference.value()) << threads << " threads, " << spare_bytes;
      if (spare_bytes > reference->size()) {
        EXPECT_EQ(bytes->data(), storage);
      }
    }
  }
  auto p = Payload::Parse(reference->data(), reference->size(), "p");
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_EQ(p->records().size(), blobs.size());
  for (size_t i = 0; i < blobs.size(); ++i) {
    const RecordHeader& r = p->records()[i];
    ASSERT_EQ(r.data_end - r.data_begin, blobs[i].size());
    EXPECT_TRUE(std::equal(blobs[i].begin(), blobs[i].end(), p->record_bytes(r))) << i;
  }
}

TEST(Wire, RejectsBoxOutsideShape) {
  PayloadBuilder b;
  RecordHeader h = MakeHeader("w");
  h.box_offset = {3, 0};  // 3 + 2 > 4
  b.Add(h, nullptr, 0);
  auto bytes = b.Finish();
  ASSERT_TRUE(bytes.ok());
  auto p = Payload::Parse(bytes->data(), bytes->size(), "bad.st");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("bad.st: record 0 ('w')"), std::string::npos)
      << p.status().message();
}

TEST(Wire, RejectsMoreChangesThanElements) {
  PayloadBuilder b;
  RecordHeader h = MakeHeader("w");
  h.changed = 17;
  b.Add(h, nullptr, 0);
  auto bytes = b.Finish();
  ASSERT_TRUE(bytes.ok());
  EXPECT_FALSE(Payload::Parse(bytes->data(), bytes->size(), "p").ok());
}

TEST(Wire, EveryTruncationIsAnError) {
  PayloadBuilder b;
  const uint8_t a[] = {1, 2, 3, 4};
  b.Add(MakeHeader("w"), a, sizeof(a));
  auto bytes = b.Finish();
  ASSERT_TRUE(bytes.ok());
  for (size_t n = 0; n < bytes->size(); ++n) {
    EXPECT_FALSE(Payload::Parse(bytes->data(), n, "p").ok()) << n;
  }
}

TEST(Wire, ManifestCommitAckRoundTrip) {
  Manifest m;
  m.version = 5;
  m.base_version = 4;
  m.rank = 1;
  m.world = 2;
  m.payloads.push_back({"v00000005/payload.r1.000000.st", 10, 0xfeedull, 2});
  m.tensors.push_back({"a", DType::kF32, {2, 3}});
  m.changed_elements = 9;
  std::string text = SerializeManifest(m);
  auto back = ParseManifest(reinterpret_cast<const uint8_t*>(text.data()), text.size(), "m");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->version, 5u);
  EXPECT_EQ(back->base_version, std::optional<uint64_t>(4));
  EXPECT_EQ(back->payloads[0].xxh3, 0xfeedull);
  EXPECT_EQ(back->tensors[0].shape, (Shape{2, 3}));
  EXPECT_EQ(back->changed_elements, 9u);

  Commit c;
  c.version = 5;
  c.full = true;
  c.world = 1;
  c.manifests.push_back({"v00000005/manifest.r0.json", 100, 7, 0});
  text = SerializeCommit(c);
  auto cb = ParseCommit(reinterpret_cast<const uint8_t*>(text.data()), text.size(), "c");
  ASSERT_TRUE(cb.ok()) << cb.status().message();
  EXPECT_TRUE(cb->full);
  EXPECT_FALSE(cb->base_version.has_value());

  // A commit whose manifest count disagrees with its world is rejected.
  c.world = 2;
  text = SerializeCommit(c);
  EXPECT_FALSE(ParseCommit(reinterpret_cast<const uint8_t*>(text.data()), text.size(), "c").ok());

  std::string garbage = "{\"format\": 3}";
  EXPECT_FALSE(
      ParseManifest(reinterpret_cast<const uint8_t*>(garbage.data()), garbage.size(), "g").ok());
}

TEST(Wire, Keys) {
  EXPECT_EQ(VersionDir(7), "v00000007");
  EXPECT_EQ(PayloadKey(7, 2, 3), "v00000007/payload.r2.000003.st");
  EXPECT_EQ(CommitKey(12), "v00000012/COMMIT");
  EXPECT_EQ(VersionOfKey("v00000012/COMMIT"), std::optional<uint64_t>(12));
  EXPECT_EQ(VersionOfKey("acks/r0/v00000001"), std::nullopt);
  EXPECT_EQ(VersionOfKey("vabc"), std::nullopt);
  auto d = ParseHexDigest(HexDigest(0xabcdef0123456789ull));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d.value(), 0xabcdef0123456789ull);
  EXPECT_FALSE(ParseHexDigest("xyz").ok());
}

}  // namespace
}  // namespace refit
