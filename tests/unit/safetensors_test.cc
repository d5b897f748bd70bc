#include "format/safetensors.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace refit {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file from a raw header text (not padded) and data_bytes zero bytes.
std::vector<uint8_t> RawFile(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8);
  const uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(len >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data_bytes, 0);
  return out;
}

Status ParseRaw(const std::vector<uint8_t>& bytes) {
  return SafetensorsFile::FromBuffer(bytes.data(), bytes.size(), "model.safetensors").status();
}

// Expects a Corrupt (or other non-OK) status whose single-line message names the file and
// contains `needle`.
void ExpectRejected(const std::string& header, size_t data_bytes, const std::string& needle,
                    StatusCode code = StatusCode::kCorrupt) {
  SCOPED_TRACE(header);
  Status st = ParseRaw(RawFile(header, data_bytes));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), code) << st.message();
  EXPECT_EQ(st.message().rfind("model.safetensors: ", 0), 0u) << st.message();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = ::testing::TempDir() + "refit_st_XXXXXX";
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir_ = templ;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
};

// One tensor of every dtype (distinct byte patterns), plus an empty and a 0-d tensor.
struct Fixture {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorView> views;
};

Fixture EveryDType() {
  Fixture f;
  size_t count = 0;
  const DTypeInfo* all = AllDTypes(&count);
  f.storage.reserve(count + 2);
  for (size_t i = 0; i < count; ++i) {
    const Shape shape = {3, 2};
    std::vector<uint8_t> bytes(6 * all[i].size);
    for (size_t b = 0; b < bytes.size(); ++b) bytes[b] = static_cast<uint8_t>(b * 37 + i * 11 + 1);
    f.storage.push_back(std::move(bytes));
    f.views.push_back(
        {"t." + std::string(all[i].name), all[i].dtype, shape, f.storage.back().data()});
  }
  f.views.push_back({"empty", DType::kF32, {0, 4}, nullptr});
  f.storage.push_back({0x00, 0x00, 0xC0, 0x7F});  // a NaN: bits must survive untouched
  f.views.push_back({"scalar", DType::kF32, {}, f.storage.back().data()});
  return f;
}

TEST_F(SafetensorsTest, RoundTripEveryDType) {
  Fixture f = EveryDType();
  const Metadata metadata = {{"format", "pt"}, {"step", "42"}};
  const std::string path = Path("all.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, f.views, metadata).ok());

  Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const SafetensorsFile& st = **file;
  EXPECT_EQ(st.metadata(), metadata);
  EXPECT_EQ(st.data_start() % 8, 0u);
  ASSERT_EQ(st.tensors().size(), f.views.size());
  for (size_t i = 0; i < f.views.size(); ++i) {
    const TensorView& got = st.tensors()[i];
    const TensorView& want = f.views[i];
    SCOPED_TRACE(want.name);
    EXPECT_EQ(got.name, want.name);  // file order == write order
    EXPECT_EQ(got.dtype, want.dtype);
    EXPECT_EQ(got.shape, want.shape);
    ASSERT_EQ(got.nbytes(), want.nbytes());
    if (want.nbytes() > 0) {
      EXPECT_EQ(std::memcmp(got.data, want.data, want.nbytes()), 0);
    }
    EXPECT_EQ(st.Find(want.name), &got);
  }
  EXPECT_EQ(st.Find("missing"), nullptr);

  // The in-memory serialization is the same bytes, and parses the same way.
  Result<std::vector<uint8_t>> bytes = SerializeSafetensors(f.views, metadata);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, ReadBytes(path));
  Result<std::unique_ptr<SafetensorsFile>> mem =
      SafetensorsFile::FromBuffer(bytes->data(), bytes->size(), "payload");
  ASSERT_TRUE(mem.ok()) << mem.status().ToString();
  EXPECT_EQ((*mem)->tensors().size(), f.views.size());
}

TEST_F(SafetensorsTest, ByteExactAgainstHandBuiltFile) {
  const uint32_t b_values[] = {0x3F800000u, 0x40000000u};  // f32 1.0, 2.0
  const uint16_t a_values[] = {0x3F80u, 0xFFC1u};          // bf16 1.0, a NaN payload
  std::vector<TensorView> views = {
      {"b", DType::kF32, {2}, const_cast<uint32_t*>(b_values)},
      {"a", DType::kBF16, {1, 2}, const_cast<uint16_t*>(a_values)},
  };
  std::string json =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]}})";
  while ((8 + json.size()) % 8 != 0) json += ' ';
  std::vector<uint8_t> expected = RawFile(json, 0);
  const uint8_t data[] = {0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0x40, 0x80, 0x3F, 0xC1, 0xFF};
  expected.insert(expected.end(), std::begin(data), std::end(data));

  Result<SafetensorsLayout> layout = PlanSafetensors(views, {{"format", "pt"}});
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->header.size() % 8, 0u);
  EXPECT_EQ(layout->data_bytes, 12u);
  EXPECT_EQ(layout->offsets, (std::vector<uint64_t>{0, 8}));
  EXPECT_EQ(layout->header, std::string(expected.begin(), expected.begin() + 8 + json.size()));

  const std::string path = Path("hand.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, views, {{"format", "pt"}}).ok());
  EXPECT_EQ(ReadBytes(path), expected);
}

TEST_F(SafetensorsTest, EmptyDataBuffer) {
  // No tensors at all, and only empty tensors: a 0-byte data buffer must work, mapped or not.
  for (const std::vector<TensorView>& views :
       {std::vector<TensorView>{}, std::vector<TensorView>{{"e", DType::kI8, {0}, nullptr},
                                                           {"f", DType::kF64, {2, 0}, nullptr}}}) {
    const std::string path = Path("empty.safetensors");
    ASSERT_TRUE(WriteSafetensors(path, views).ok());
    Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    EXPECT_EQ((*file)->file_size(), (*file)->data_start());
    ASSERT_EQ((*file)->tensors().size(), views.size());
    for (size_t i = 0; i < views.size(); ++i) {
      EXPECT_EQ((*file)->tensors()[i].name, views[i].name);
      EXPECT_EQ((*file)->tensors()[i].nbytes(), 0u);
    }
  }
}

TEST_F(SafetensorsTest, MalformedHeaders) {
  const std::string w = R"("w":{"dtype":"BF16","shape":[3,2],"data_offsets":[0,12]})";
  // Sanity: the well-formed base case parses.
  ASSERT_TRUE(ParseRaw(RawFile("{" + w + "}", 12)).ok());

  // Truncated length prefix.
  for (size_t n : {0, 1, 7}) {
    Status st = ParseRaw(std::vector<uint8_t>(n, 0));
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kCorrupt);
    EXPECT_NE(st.message().find("model.safetensors"), std::string::npos);
    EXPECT_NE(st.message().find("too short"), std::string::npos);
  }
  // Header longer than the file, and longer than the spec's bound.
  std::vector<uint8_t> lying = RawFile("{}", 0);
  lying[0] = 200;
  Status st = ParseRaw(lying);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("runs past the end"), std::string::npos) << st.message();
  std::vector<uint8_t> huge = RawFile("{}", 0);
  huge[7] = 0x01;
  st = ParseRaw(huge);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("exceeds the limit"), std::string::npos) << st.message();

  ExpectRejected("{not json", 0, "not valid JSON");
  ExpectRejected("[1, 2]", 0, "not a JSON object");
  ExpectRejected(R"({"w":{"dtype":"XYZ","shape":[1],"data_offsets":[0,1]}})", 1, "unknown dtype");
  ExpectRejected(R"({"w":{"dtype":"U16","shape":[1],"data_offsets":[0,2]}})", 2, "'U16'",
                 StatusCode::kUnsupported);
  ExpectRejected(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,1]}})", 1, "dtype");
  // Overlap, holes (inside and at the end), out of range.
  ExpectRejected(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
                 12, "overlap");
  ExpectRejected(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                 R"("b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}})",
                 12, "bytes [4, 8] of the data buffer belong to no tensor");
  ExpectRejected(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 8,
                 "bytes [4, 8] of the data buffer belong to no tensor");
  ExpectRejected(R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}})", 8, "run past");
  ExpectRejected(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}})", 8, "end before");
  // Size mismatch, with the exact message.
  st = ParseRaw(RawFile(R"({"w":{"dtype":"BF16","shape":[3,2],"data_offsets":[0,10]}})", 10));
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_EQ(st.message(),
            "model.safetensors: tensor 'w': data_offsets [0, 10] hold 10 bytes, shape [3, 2] of "
            "bf16 needs 12");
  // Duplicates: tensor names and fields.
  ExpectRejected("{" + w + "," + w + "}", 12, "duplicate tensor name 'w'");
  ExpectRejected(R"({"w":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1,
                 "duplicate field 'dtype'");
  // Shapes: overflow, negative, fractional, too many dims, not an array.
  ExpectRejected(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],)"
                 R"("data_offsets":[0,0]}})",
                 0, "too large");
  ExpectRejected(R"({"w":{"dtype":"F16","shape":[9223372036854775808],"data_offsets":[0,0]}})", 0,
                 "too large");
  ExpectRejected(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", 0, "shape");
  ExpectRejected(R"({"w":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}})", 1, "shape");
  ExpectRejected(R"({"w":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", 1,
                 "9 dims");
  ExpectRejected(R"({"w":{"dtype":"U8","shape":1,"data_offsets":[0,1]}})", 1, "shape");
  // Entries: missing / extra fields, bad offsets, not an object.
  ExpectRejected(R"({"w":{"dtype":"U8","shape":[1]}})", 1, "missing 'data_offsets'");
  ExpectRejected(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}})", 1,
                 "unexpected field 'x'");
  ExpectRejected(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1, "data_offsets");
  ExpectRejected(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,-1]}})", 1, "data_offsets");
  ExpectRejected(R"({"w":[]})", 0, "tensor 'w'");
  // Metadata must be a string -> string object.
  ExpectRejected(R"({"__metadata__":{"k":1}})", 0, "__metadata__ 'k' is not a string");
  ExpectRejected(R"({"__metadata__":"pt"})", 0, "__metadata__");
  // Names with control characters stay on one line in messages.
  ExpectRejected("{\"a\\nb\":{\"dtype\":\"XYZ\",\"shape\":[],\"data_offsets\":[0,1]}}", 1,
                 "'a\\x0ab'");
}

TEST_F(SafetensorsTest, OpenErrorsNameThePath) {
  Result<std::unique_ptr<SafetensorsFile>> missing = SafetensorsFile::Open(Path("nope.st"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.st"), std::string::npos);

  const std::string empty = Path("empty.st");
  WriteBytes(empty, {});
  Result<std::unique_ptr<SafetensorsFile>> zero = SafetensorsFile::Open(empty);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(zero.status().message().rfind(empty, 0), 0u);

  const std::string bad = Path("bad.st");
  WriteBytes(bad, RawFile(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,1]}})", 1));
  Result<std::unique_ptr<SafetensorsFile>> corrupt = SafetensorsFile::Open(bad);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_EQ(corrupt.status().message().rfind(bad + ": tensor 'w'", 0), 0u)
      << corrupt.status().message();

  EXPECT_FALSE(SafetensorsFile::Open(dir_).ok());  // a directory
}

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  uint8_t bytes[4] = {1, 2, 3, 4};
  const std::string path = Path("w.safetensors");
  std::vector<TensorView> dup = {{"x", DType::kU8, {2}, bytes}, {"x", DType::kU8, {2}, bytes + 2}};
  Status st = WriteSafetensors(path, dup);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("duplicate tensor name 'x'"), std::string::npos) << st.message();
  EXPECT_FALSE(fs::exists(path));

  EXPECT_FALSE(SerializeSafetensors({{"__metadata__", DType::kU8, {1}, bytes}}).ok());
  EXPECT_FALSE(SerializeSafetensors({{"n", DType::kU8, {1}, nullptr}}).ok());
  EXPECT_FALSE(SerializeSafetensors({{"\xff", DType::kU8, {1}, bytes}}).ok());
  EXPECT_FALSE(SerializeSafetensors({{"x", DType::kU8, {1}, bytes}}, {{"k", "\xc3"}}).ok());
  EXPECT_FALSE(SerializeSafetensors({{"x", DType::kU8, Shape(9, 1), bytes}}).ok());
  EXPECT_FALSE(SerializeSafetensors({{"x", DType::kU8, {1ull << 40, 1ull << 40}, bytes}}).ok());
  EXPECT_FALSE(SerializeSafetensors({{"x", static_cast<DType>(99), {1}, bytes}}).ok());
  EXPECT_TRUE(SerializeSafetensors({{"\xc3\xa9t\xc3\xa9", DType::kU8, {1}, bytes}}).ok());
}

TEST_F(SafetensorsTest, AtomicWriterLeavesOldFileOnFailure) {
  uint8_t v1[2] = {1, 1};
  uint8_t v2[2] = {2, 2};
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"x", DType::kU8, {2}, v1}}).ok());
  const std::vector<uint8_t> old_bytes = ReadBytes(path);
  auto no_tmp_left = [&] {
    for (const auto& entry : fs::directory_iterator(dir_)) {
      if (entry.path().filename().string().find(".tmp.") != std::string::npos &&
          !entry.is_directory()) {
        return false;
      }
    }
    return true;
  };

  // Duplicate name: rejected before touching the disk.
  Status st = WriteSafetensors(path, {{"x", DType::kU8, {1}, v2}, {"x", DType::kU8, {1}, v2}});
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(path), std::string::npos) << st.message();
  EXPECT_EQ(ReadBytes(path), old_bytes);
  EXPECT_TRUE(no_tmp_left());

  // The temporary file cannot be created (the target's name is as long as a name may be, so the
  // temporary name next to it is too long).
  const std::string long_path = Path(std::string(250, 'm'));
  ASSERT_TRUE(std::ofstream(long_path).good());
  st = WriteSafetensors(long_path, {{"x", DType::kU8, {2}, v2}});
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find(long_path), std::string::npos) << st.message();
  EXPECT_TRUE(fs::exists(long_path));
  EXPECT_EQ(fs::file_size(long_path), 0u);
  fs::remove(long_path);

  // The rename fails (the target is a non-empty directory): the tmp file is removed.
  const std::string dir_target = Path("as_dir");
  fs::create_directories(dir_target + "/inside");
  st = WriteSafetensors(dir_target, {{"x", DType::kU8, {2}, v2}});
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_TRUE(fs::is_directory(dir_target + "/inside"));
  EXPECT_TRUE(no_tmp_left());

  // A directory that does not exist.
  st = WriteSafetensors(Path("no/such/dir/m.safetensors"), {{"x", DType::kU8, {2}, v2}});
  EXPECT_EQ(st.code(), StatusCode::kIoError);

  // An unwritable directory (root ignores permissions, so only checked as a normal user).
  if (::geteuid() != 0) {
    ASSERT_EQ(::chmod(dir_.c_str(), 0555), 0);
    st = WriteSafetensors(path, {{"x", DType::kU8, {2}, v2}});
    ::chmod(dir_.c_str(), 0755);
    EXPECT_EQ(st.code(), StatusCode::kIoError);
    EXPECT_EQ(ReadBytes(path), old_bytes);
  }

  // And a successful overwrite replaces it.
  ASSERT_TRUE(WriteSafetensors(path, {{"x", DType::kU8, {2}, v2}}).ok());
  Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->Find("x")->bytes()[0], 2);
  EXPECT_TRUE(no_tmp_left());
}

TEST_F(SafetensorsTest, WritableMappingPatchAndSync) {
  std::vector<uint16_t> w(64);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint16_t>(i * 3);
  uint8_t flag = 1;
  const std::string path = Path("patch.safetensors");
  ASSERT_TRUE(WriteSafetensors(
                  path, {{"w", DType::kBF16, {8, 8}, w.data()}, {"f", DType::kBool, {}, &flag}})
                  .ok());
  {
    Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path, /*writable=*/true);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    const TensorView* t = (*file)->Find("w");
    ASSERT_NE(t, nullptr);
    const uint16_t patched = 0xBEEF;
    std::memcpy(t->bytes() + 10 * 2, &patched, 2);
    (*file)->Find("f")->bytes()[0] = 0;
    ASSERT_TRUE((*file)->Sync().ok());
  }
  Result<std::unique_ptr<SafetensorsFile>> again = SafetensorsFile::Open(path);
  ASSERT_TRUE(again.ok());
  const TensorView* t = (*again)->Find("w");
  uint16_t value = 0;
  std::memcpy(&value, t->bytes() + 10 * 2, 2);
  EXPECT_EQ(value, 0xBEEF);
  std::memcpy(&value, t->bytes() + 11 * 2, 2);
  EXPECT_EQ(value, 33);
  EXPECT_EQ((*again)->Find("f")->bytes()[0], 0);
  EXPECT_TRUE((*again)->Sync().ok());  // harmless on a read-only mapping
}

}  // namespace
}  // namespace refit
