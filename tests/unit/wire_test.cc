#include "format/wire.h"

#include <gtest/gtest.h>

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
