// Hostile payloads and control objects (docs/reliability.md, "Hostile input"): every truncated or
// corrupted payload is rejected with one error line naming the payload and, where a record is at
// fault, the record and its tensor; names cannot escape or name tensors the receiver lacks; sizes
// cannot overflow.
//
// The guarantee these tests pin down, per stage:
// - Payload::Parse validates the container and every descriptor before any tensor is touched, so
//   a payload rejected there leaves the target bits exactly as they were (checked below).
// - ApplyPayload rejects a record at apply time (decode failure, digest mismatch, unknown tensor,
//   wrong dtype/shape) after the records before it were applied, and an overwrite record decoded
//   in place may leave its own box partly written: ApplyDelta's targets "may be partly updated".
//   The receiver does not depend on apply-time checks for corruption in transit: it checks each
//   payload's size and xxh3 against its manifest (itself checksummed by COMMIT) before parsing,
//   applies a full sync into model.safetensors.incoming (renamed only when every record
//   verified), marks an in-place delta as `applying` and answers a version it cannot finish
//   with need-full (docs/reliability.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "delta_test_util.h"
#include "format/wire.h"
#include "refit/delta.h"
#include "refit/refit.h"

namespace refit {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
const std::string kLabel = "v00000003/payload.r0.000002.st";

using testing::TestRegistry;

bool HasEncoding(const Registry& registry, const std::string& name) {
  return registry.Find(REFIT_KIND_ENCODING, name) != nullptr;
}

bool StartsWith(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

std::string BlobName(size_t record) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "r%06zu", record);
  return buf;
}

// Four tensors whose names differ in length, so no single corrupted byte turns one name into
// another; each fits one record (one box = the whole tensor), so a corrupted box offset cannot
// land on another valid box either. One tensor is 2-d.
testing::TensorPair FourTensors() {
  testing::TensorPair p;
  p.Add("a", DType::kBF16, 96, 0.05, 11);
  p.Add("bb.weight", DType::kF32, 40, 0.1, 12);
  p.Add("ccc.layer.norm", DType::kU8, 64, 0.08, 13);
  p.Add("dddd.mlp.up_proj.weight", DType::kBF16, 128, 0.04, 14);
  p.base[3].shape = {8, 16};
  p.next[3].shape = {8, 16};
  return p;
}

// The target of an apply: a private copy of the base bits.
struct Target {
  std::vector<std::vector<uint8_t>> bits;
  std::vector<TensorView> views;
  explicit Target(const testing::TensorPair& p) : bits(p.base_bits), views(p.base) {
    for (size_t i = 0; i < views.size(); ++i) views[i].data = bits[i].data();
  }
};

bool Equals(const Target& t, const std::vector<std::vector<uint8_t>>& expected) {
  return t.bits == expected;
}

struct Encoded {
  std::vector<uint8_t> bytes;
  uint64_t data_start = 0;           // offset of the byte buffer in the payload
  std::vector<uint64_t> begin, end;  // each record's bytes, in payload offsets
  std::vector<uint64_t> desc_begin;  // each record's descriptor in the header
  uint64_t desc_end = 0;             // end of the last descriptor
  std::vector<std::string> tensor;   // each record's tensor
};

Encoded Encode(const testing::TensorPair& p, const std::string& encoding,
               const Registry& registry) {
  DeltaOptions opt;
  opt.encoding = encoding;
  opt.threads = 1;
  Encoded e;
  auto bytes = EncodeDelta(p.base, p.next, opt, registry, nullptr);
  EXPECT_TRUE(bytes.ok()) << bytes.status().message();
  if (!bytes.ok()) return e;
  e.bytes = bytes.value();
  auto parsed = Payload::Parse(e.bytes.data(), e.bytes.size(), kLabel);
  EXPECT_TRUE(parsed.ok()) << parsed.status().message();
  if (!parsed.ok()) return e;
  e.data_start =
      static_cast<uint64_t>(parsed->record_bytes(parsed->records()[0]) - e.bytes.data()) -
      parsed->records()[0].data_begin;
  // Descriptors are JSON inside a JSON string; each starts with its "blob" key (sorted first).
  const std::string header(e.bytes.begin(), e.bytes.begin() + static_cast<long>(e.data_start));
  const std::string marker = "{\\\"blob\\\":";
  for (size_t pos = header.find(marker); pos != std::string::npos;
       pos = header.find(marker, pos + 1)) {
    e.desc_begin.push_back(pos);
  }
  e.desc_end = header.find("}]\"", e.desc_begin.empty() ? 0 : e.desc_begin.back()) + 1;
  for (const RecordHeader& r : parsed->records()) {
    e.begin.push_back(e.data_start + r.data_begin);
    e.end.push_back(e.data_start + r.data_end);
    e.tensor.push_back(r.tensor);
  }
  EXPECT_EQ(e.desc_begin.size(), e.begin.size());
  return e;
}

// The record whose descriptor (in the header) or bytes (in the buffer) hold `offset`, or -1.
int RecordAt(const Encoded& e, uint64_t offset) {
  for (size_t i = 0; i < e.begin.size(); ++i) {
    if (offset >= e.begin[i] && offset < e.end[i]) return static_cast<int>(i);
  }
  if (e.desc_begin.empty() || offset < e.desc_begin[0] || offset >= e.desc_end) return -1;
  int k = 0;
  while (k + 1 < static_cast<int>(e.desc_begin.size()) && offset >= e.desc_begin[k + 1]) ++k;
  return k;
}

void ExpectOneLine(const std::string& message) {
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_EQ(message.find('\0'), std::string::npos) << message;
}

class PayloadRejection : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    registry_ = TestRegistry();
    ASSERT_NE(registry_, nullptr);
    if (!HasEncoding(*registry_, GetParam())) {
      GTEST_SKIP() << "encoding '" << GetParam() << "' is not loadable here";
    }
    pair_ = FourTensors();
    encoded_ = Encode(pair_, GetParam(), *registry_);
    ASSERT_EQ(encoded_.begin.size(), 4u);
    // The clean payload applies bit-exactly (the reference for "benign" corruptions).
    Target t(pair_);
    auto applied = ApplyDelta(encoded_.bytes, t.views, *registry_, nullptr);
    ASSERT_TRUE(applied.ok()) << applied.status().message();
    ASSERT_TRUE(Equals(t, pair_.next_bits));
  }

  // Parses and applies `bytes` to a fresh copy of the base. Returns the error (empty if both
  // succeeded, in which case the result must be the intended one: the corruption was benign).
  std::string ParseAndApply(const std::vector<uint8_t>& bytes, int record_at_fault) {
    auto parsed = Payload::Parse(bytes.data(), bytes.size(), kLabel);
    Target t(pair_);
    auto applied = ApplyDelta(bytes, t.views, *registry_, nullptr);
    if (!parsed.ok()) {
      const std::string m = parsed.status().message();
      EXPECT_TRUE(StartsWith(m, kLabel + ": ")) << m;
      ExpectOneLine(m);
      if (record_at_fault >= 0 && m.find(": record ") != std::string::npos) {
        // Named by index (and by its name, as read, once the name itself passed the checks).
        const std::string named = kLabel + ": record " + std::to_string(record_at_fault);
        EXPECT_TRUE(StartsWith(m, named + ": ") || StartsWith(m, named + " ('")) << m;
      }
      // Rejected before apply: not one bit of the target changed.
      EXPECT_FALSE(applied.ok());
      EXPECT_TRUE(Equals(t, pair_.base_bits)) << m;
      ++parse_rejections_;
      return m;
    }
    if (!applied.ok()) {
      const std::string m = applied.status().message();
      EXPECT_TRUE(StartsWith(m, "delta: record ")) << m;
      ExpectOneLine(m);
      if (record_at_fault >= 0 && record_at_fault < static_cast<int>(encoded_.begin.size()) &&
          bytes.size() == encoded_.bytes.size()) {
        // The record at fault is the one named (a corrupted name appears as corrupted).
        EXPECT_TRUE(StartsWith(m, "delta: record " + std::to_string(record_at_fault) + " ('")) << m;
      }
      ++apply_rejections_;
      return m;
    }
    EXPECT_TRUE(Equals(t, pair_.next_bits)) << "a corrupted payload applied to wrong bits";
    ++benign_;
    return "";
  }

  std::shared_ptr<Registry> registry_;
  testing::TensorPair pair_;
  Encoded encoded_;
  int parse_rejections_ = 0;
  int apply_rejections_ = 0;
  int benign_ = 0;
};

TEST_P(PayloadRejection, EveryTruncationIsRejectedAtParseNamingTheRecordCut) {
  const std::vector<uint8_t>& full = encoded_.bytes;
  for (uint64_t len = 0; len < full.size(); ++len) {
    SCOPED_TRACE("truncated to " + std::to_string(len) + " of " + std::to_string(full.size()));
    std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<long>(len));
    auto parsed = Payload::Parse(cut.data(), cut.size(), kLabel);
    ASSERT_FALSE(parsed.ok());
    const std::string m = parsed.status().message();
    EXPECT_TRUE(StartsWith(m, kLabel + ": ")) << m;
    ExpectOneLine(m);
    if (len >= encoded_.data_start) {
      // The first record whose bytes no longer fit is named, with its blob.
      size_t k = 0;
      while (encoded_.end[k] <= len) ++k;
      EXPECT_NE(m.find("'" + BlobName(k) + "' (record " + std::to_string(k) + ")"),
                std::string::npos)
          << m;
    }
    Target t(pair_);
    EXPECT_FALSE(ApplyDelta(cut, t.views, *registry_, nullptr).ok());
    EXPECT_TRUE(Equals(t, pair_.base_bits));
  }
}

TEST_P(PayloadRejection, EveryFlippedByteIsRejectedOrHarmless) {
  const std::vector<uint8_t>& clean = encoded_.bytes;
  std::vector<uint8_t> bytes = clean;
  for (uint64_t off = 0; off < clean.size(); ++off) {
    // 0x01 keeps most JSON valid (a digit becomes another digit); 0x80 breaks UTF-8 / values.
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}}) {
      SCOPED_TRACE("byte " + std::to_string(off) + " ^ " + std::to_string(mask));
      bytes[off] ^= mask;
      ParseAndApply(bytes, RecordAt(encoded_, off));
      bytes[off] = clean[off];
    }
  }
  RecordProperty("payload_bytes", static_cast<int>(clean.size()));
  RecordProperty("rejected_at_parse", parse_rejections_);
  RecordProperty("rejected_at_apply", apply_rejections_);
  RecordProperty("harmless", benign_);
  // Every region was hit: the header at parse time, the record bytes at apply time.
  EXPECT_GT(parse_rejections_, 0);
  EXPECT_GT(apply_rejections_, 0);
}

TEST_P(PayloadRejection, CorruptedRecordBytesNameTheRecordAndTensor) {
  // Flip every byte of each record's data: the error (if any) names exactly that record.
  std::vector<uint8_t> bytes = encoded_.bytes;
  for (size_t i = 0; i < encoded_.begin.size(); ++i) {
    int rejected = 0;
    for (uint64_t off = encoded_.begin[i]; off < encoded_.end[i]; ++off) {
      bytes[off] ^= 0x5a;
      const std::string m = ParseAndApply(bytes, static_cast<int>(i));
      if (!m.empty()) {
        ++rejected;
        EXPECT_TRUE(StartsWith(
            m, "delta: record " + std::to_string(i) + " ('" + encoded_.tensor[i] + "'): "))
            << m;
      }
      bytes[off] = encoded_.bytes[off];
    }
    EXPECT_GT(rejected, 0) << "record " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Encodings, PayloadRejection,
                         ::testing::Values("dense", "indices", "xor", "deltas", "bitmask", "ctx"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// ---------------------------------------------------------------- hand-made descriptors

// A payload of one record built field by field (what a hostile sender could write).
struct OneRecord {
  RecordHeader h;
  std::vector<uint8_t> data = std::vector<uint8_t>(8, 0);
  OneRecord() {
    h.tensor = "w";
    h.dtype = DType::kU8;
    h.shape = {8};
    h.box_offset = {0};
    h.box_extent = {8};
    h.encoding = "dense";
    h.changed = 8;
  }
  std::vector<uint8_t> Bytes() const {
    PayloadBuilder b(Metadata{{"refit.format", kPayloadFormat}});
    b.Add(h, data.data(), data.size());
    auto bytes = b.Finish();
    EXPECT_TRUE(bytes.ok()) << bytes.status().message();
    return bytes.ok() ? bytes.value() : std::vector<uint8_t>{};
  }
  Status Parse() const {
    std::vector<uint8_t> bytes = Bytes();
    return Payload::Parse(bytes.data(), bytes.size(), kLabel).status();
  }
};

void ExpectRejected(const Status& st, const std::string& fragment) {
  ASSERT_FALSE(st.ok()) << "accepted; expected: " << fragment;
  EXPECT_TRUE(StartsWith(st.message(), kLabel + ": record 0")) << st.message();
  EXPECT_NE(st.message().find(fragment), std::string::npos) << st.message();
  ExpectOneLine(st.message());
}

TEST(PayloadNames, BadTensorNamesAreRejectedAtParse) {
  OneRecord r;
  r.h.tensor = "";
  ExpectRejected(r.Parse(), "empty tensor name");
  r.h.tensor = std::string("emb\0ed", 6);
  ExpectRejected(r.Parse(), "'emb\\x00ed' holds a control character");
  r.h.tensor = "two\nlines";
  ExpectRejected(r.Parse(), "holds a control character");
  r.h.tensor = std::string(5000, 'x');
  ExpectRejected(r.Parse(), "tensor name of 5000 bytes is longer than 4096");
  r.h.tensor = std::string(4096, 'x');
  EXPECT_TRUE(r.Parse().ok());
}

TEST(PayloadNames, PathLikeNamesNameNoTensorOfTheReceiver) {
  // Tensor names are keys into the model's safetensors header, never file paths: "../x" is just
  // a tensor the receiver does not have, and applying it fails without touching anything.
  auto registry = TestRegistry();
  ASSERT_NE(registry, nullptr);
  std::vector<uint8_t> bits(8, 7);
  TensorView w;
  w.name = "w";
  w.dtype = DType::kU8;
  w.shape = {8};
  w.data = bits.data();
  for (const std::string& name :
       std::vector<std::string>{"../x", "/etc/passwd", "../../w", "w/..", "W"}) {
    OneRecord r;
    r.h.tensor = name;
    ASSERT_TRUE(r.Parse().ok()) << name;
    auto applied = ApplyDelta(r.Bytes(), {w}, *registry, nullptr);
    ASSERT_FALSE(applied.ok()) << name;
    EXPECT_EQ(applied.status().message(), "delta: record 0 ('" + name + "'): tensor '" + name +
                                              "' does not exist in the receiver's model");
    EXPECT_EQ(bits, std::vector<uint8_t>(8, 7));
  }
}

TEST(PayloadSizes, ShapesWhoseSizeOverflowsAreRejected) {
  OneRecord r;
  r.h.shape = {1ull << 32, 1ull << 32};
  r.h.box_offset = {0, 0};
  r.h.box_extent = {1, 8};
  ExpectRejected(r.Parse(), "has more than 2^64 bytes");
  // Elements fit, bytes do not.
  r.h.dtype = DType::kF32;
  r.h.shape = {1ull << 62};
  r.h.box_offset = {0};
  r.h.box_extent = {2};
  ExpectRejected(r.Parse(), "shape [4611686018427387904] has more than 2^64 bytes");
  // A zero dim makes any other dim harmless.
  r.h.dtype = DType::kU8;
  r.h.shape = {0, kMax};
  r.h.box_offset = {0, 0};
  r.h.box_extent = {0, 8};
  r.h.changed = 0;
  r.data.clear();
  EXPECT_TRUE(r.Parse().ok());
}

TEST(PayloadSizes, BoxOffsetsNearTwoToThe64AreRejected) {
  OneRecord r;
  r.h.box_offset = {kMax};
  r.h.box_extent = {2};  // kMax + 2 wraps to 1, which is < 8
  ExpectRejected(r.Parse(), "box [18446744073709551615, +2) exceeds dim 0 of size 8");
  r.h.box_offset = {2};
  r.h.box_extent = {kMax};
  ExpectRejected(r.Parse(), "exceeds dim 0 of size 8");
  r.h.box_offset = {0};
  r.h.box_extent = {8};
  r.h.changed = 9;
  ExpectRejected(r.Parse(), "9 changes in a box of 8 elements");
}

TEST(PayloadSizes, BlobOffsetsNearTwoToThe64AreRejected) {
  // The container itself: data_offsets that would wrap or run past the buffer.
  for (const std::string& offsets : std::vector<std::string>{
           "[18446744073709551615,18446744073709551615]", "[0,18446744073709551615]",
           "[18446744073709551608,8]", "[8,18446744073709551616]"}) {
    std::string header =
        "{\"r000000\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":" + offsets + "}}";
    std::vector<uint8_t> bytes(8);
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(header.size() >> (8 * i));
    bytes.insert(bytes.end(), header.begin(), header.end());
    bytes.resize(bytes.size() + 8, 0);
    auto parsed = Payload::Parse(bytes.data(), bytes.size(), kLabel);
    ASSERT_FALSE(parsed.ok()) << offsets;
    EXPECT_TRUE(StartsWith(parsed.status().message(), kLabel + ": ")) << parsed.status().message();
    ExpectOneLine(parsed.status().message());
  }
}

TEST(PayloadApply, ApplyTimeFailuresNameRecordAndTensor) {
  auto registry = TestRegistry();
  ASSERT_NE(registry, nullptr);
  testing::TensorPair p = FourTensors();
  Encoded e = Encode(p, "dense", *registry);
  ASSERT_EQ(e.begin.size(), 4u);
  auto parsed = Payload::Parse(e.bytes.data(), e.bytes.size(), kLabel);
  ASSERT_TRUE(parsed.ok());

  // Rebuilds the payload with record 2 changed by `edit`.
  auto rebuilt = [&](auto edit, int64_t trim = 0) {
    PayloadBuilder b(parsed->metadata());
    for (size_t i = 0; i < parsed->records().size(); ++i) {
      RecordHeader h = parsed->records()[i];
      uint64_t len = h.data_end - h.data_begin;
      if (i == 2) {
        edit(h);
        len -= static_cast<uint64_t>(trim);
      }
      b.Add(h, parsed->record_bytes(parsed->records()[i]), len);
    }
    return b.Finish().value();
  };
  // A record refused for its structure (target, dtype, shape, encoding, op) is found before any
  // record of the payload is applied; one whose bytes fail to decode or verify only when it is
  // applied, after records 0 and 1. Record 3 is never applied.
  auto apply_error = [&](const std::vector<uint8_t>& bytes, bool structural = true) {
    Target t(p);
    auto applied = ApplyDelta(bytes, t.views, *registry, nullptr);
    EXPECT_FALSE(applied.ok());
    EXPECT_EQ(t.bits[0], structural ? p.base_bits[0] : p.next_bits[0]);
    EXPECT_EQ(t.bits[3], p.base_bits[3]);
    return applied.ok() ? std::string() : applied.status().message();
  };

  const std::string prefix = "delta: record 2 ('ccc.layer.norm'): ";
  std::string m = apply_error(rebuilt([](RecordHeader& h) { h.digest ^= 1; }), false);
  EXPECT_TRUE(StartsWith(m, prefix + "digest mismatch after apply (expected ")) << m;
  m = apply_error(rebuilt([](RecordHeader&) {}, /*trim=*/1), false);
  EXPECT_TRUE(StartsWith(m, prefix)) << m;
  EXPECT_NE(m.find("dense"), std::string::npos) << m;
  m = apply_error(rebuilt([](RecordHeader& h) { h.dtype = DType::kI8; }));
  EXPECT_EQ(m, prefix + "record is i8 but the target tensor is u8");
  m = apply_error(rebuilt([](RecordHeader& h) { h.encoding = "no_such_encoding"; }));
  EXPECT_TRUE(StartsWith(m, prefix)) << m;
  EXPECT_NE(m.find("no_such_encoding"), std::string::npos) << m;
  m = apply_error(rebuilt([](RecordHeader& h) {
    h.shape = {32, 2};
    h.box_offset = {0, 0};
    h.box_extent = {32, 2};
  }));
  EXPECT_EQ(m, prefix + "record shape [32, 2] differs from the receiver's [64]");
  m = apply_error(rebuilt([](RecordHeader& h) { h.op = REFIT_OP_XOR; }));
  EXPECT_EQ(m, prefix + "op does not match encoding 'dense'");
  m = apply_error(rebuilt([](RecordHeader& h) { h.tensor = "ccc.layer.gone"; }));
  EXPECT_EQ(m,
            "delta: record 2 ('ccc.layer.gone'): tensor 'ccc.layer.gone' does not exist in "
            "the receiver's model");
}

// ---------------------------------------------------------------- control objects

std::string WithKey(const std::string& key) {
  Manifest m;
  m.version = 7;
  m.base_version = 6;
  m.payloads.push_back({key, 10, 0x0123456789abcdefull, 1});
  return SerializeManifest(m);
}

Status ManifestStatus(const std::string& text) {
  return ParseManifest(reinterpret_cast<const uint8_t*>(text.data()), text.size(), "m.json")
      .status();
}

Status CommitStatus(const std::string& text) {
  return ParseCommit(reinterpret_cast<const uint8_t*>(text.data()), text.size(), "COMMIT").status();
}

TEST(ControlObjects, ManifestKeysStayInsideTheirVersion) {
  EXPECT_TRUE(ManifestStatus(WithKey(PayloadKey(7, 0, 0))).ok());
  const std::vector<std::string> bad_keys = {"../x",
                                             "/etc/passwd",
                                             "v00000007/../../etc/passwd",
                                             "v00000007/./x",
                                             "v00000007//x",
                                             "v00000007/",
                                             "v00000008/payload.r0.000000.st",
                                             "v00000007x/y",
                                             std::string("v00000007/a\0b", 13),
                                             "v00000007/a\\..\\b",
                                             "v00000007/" + std::string(2000, 'k')};
  for (const std::string& key : bad_keys) {
    Status st = ManifestStatus(WithKey(key));
    ASSERT_FALSE(st.ok()) << key;
    EXPECT_TRUE(StartsWith(st.message(), "m.json: payload 0: ")) << st.message();
    ExpectOneLine(st.message());
  }
  Manifest twice;
  twice.version = 7;
  twice.payloads = {{PayloadKey(7, 0, 0), 1, 0, 1}, {PayloadKey(7, 0, 0), 1, 0, 1}};
  Status st = ManifestStatus(SerializeManifest(twice));
  EXPECT_EQ(st.message(),
            "m.json: payload 1: key 'v00000007/payload.r0.000000.st' is listed twice");
}

TEST(ControlObjects, CommitKeysStayInsideTheirVersion) {
  Commit c;
  c.version = 9;
  c.world = 1;
  c.manifests = {{ManifestKey(9, 0), 100, 1, 0}};
  EXPECT_TRUE(CommitStatus(SerializeCommit(c)).ok());
  c.manifests[0].key = "v00000009/../v00000008/manifest.r0.json";
  Status st = CommitStatus(SerializeCommit(c));
  EXPECT_EQ(st.message(),
            "COMMIT: manifest 0: key 'v00000009/../v00000008/manifest.r0.json' has "
            "an empty, '.' or '..' component");
  c.manifests[0].key = ManifestKey(8, 0);
  st = CommitStatus(SerializeCommit(c));
  EXPECT_EQ(st.message(),
            "COMMIT: manifest 0: key 'v00000008/manifest.r0.json' is not inside v00000009/");
}

TEST(ControlObjects, TensorSpecListsRejectBadNamesAndOverflowingShapes) {
  auto error = [](const std::string& json) {
    auto specs = ParseTensorSpecs(json, "refit.tensors");
    EXPECT_FALSE(specs.ok()) << json;
    return specs.ok() ? std::string() : specs.status().message();
  };
  EXPECT_EQ(
      error(R"([{"name":"a","dtype":"u8","shape":[1]},{"name":"a","dtype":"u8","shape":[1]}])"),
      "refit.tensors: tensor 1 ('a'): listed twice");
  EXPECT_EQ(error(R"([{"name":"","dtype":"u8","shape":[1]}])"),
            "refit.tensors: tensor 0: empty tensor name");
  EXPECT_EQ(error(R"([{"name":"a\u0000b","dtype":"u8","shape":[1]}])"),
            "refit.tensors: tensor 0: tensor name 'a\\x00b' holds a control character");
  EXPECT_EQ(error(R"([{"name":"__metadata__","dtype":"u8","shape":[1]}])"),
            "refit.tensors: tensor 0 ('__metadata__'): reserved name");
  EXPECT_EQ(error(R"([{"name":"big","dtype":"f64","shape":[4294967296,4294967296]}])"),
            "refit.tensors: tensor 0 ('big'): shape [4294967296, 4294967296] has more than 2^64 "
            "bytes");
  EXPECT_EQ(error(R"([{"name":"big","dtype":"f64","shape":[2305843009213693952]}])"),
            "refit.tensors: tensor 0 ('big'): shape [2305843009213693952] has more than 2^64 "
            "bytes");
  EXPECT_EQ(error(R"([{"name":"x","dtype":"bf17\n","shape":[1]}])"),
            "refit.tensors: tensor 0 ('x'): unknown dtype 'bf17\\x0a'");
}

TEST(ControlObjects, AcksNameTheirReceiver) {
  auto error = [](const std::string& json) {
    auto ack = ParseAck(reinterpret_cast<const uint8_t*>(json.data()), json.size(), "acks/r0/v1");
    EXPECT_FALSE(ack.ok()) << json;
    return ack.ok() ? std::string() : ack.status().message();
  };
  EXPECT_EQ(error(R"({"receiver":"","version":1})"), "acks/r0/v1: empty receiver id");
  EXPECT_EQ(error(R"({"version":1})"), "acks/r0/v1: missing field 'receiver'");
  EXPECT_EQ(error(R"({"receiver":"r0","version":-1})"),
            "acks/r0/v1: field 'version' has the wrong type");
  EXPECT_EQ(error(R"({"receiver":"r0","version":1,"commit_sha256":"abc"})"),
            "acks/r0/v1: field 'commit_sha256' is not 64 lowercase hex digits");
  Ack a;
  a.receiver = "r0";
  a.version = 3;
  const std::string ok = SerializeAck(a);
  EXPECT_TRUE(ParseAck(reinterpret_cast<const uint8_t*>(ok.data()), ok.size(), "x").ok());
  a.commit_sha256 = std::string(64, 'e');
  const std::string named = SerializeAck(a);
  auto back = ParseAck(reinterpret_cast<const uint8_t*>(named.data()), named.size(), "x");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->commit_sha256, a.commit_sha256);
}

}  // namespace
}  // namespace refit
