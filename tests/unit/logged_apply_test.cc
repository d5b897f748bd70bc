// The receiver's apply through its redo log (receive/apply.cc ApplyLogged): records of encodings
// with decode_changes (ctx, indices) are listed and verified without a copy, the others decoded
// into scratch; either way the result is bit-exact, and a record that codes more changes than
// its header declares, or fails its digest, is refused before any element of the window is
// written.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "common/worker_pool.h"
#include "delta_test_util.h"
#include "format/wire.h"
#include "plugins/encoding_cache.h"
#include "receive/apply.h"
#include "receive/journal.h"
#include "refit/delta.h"
#include "refit/refit.h"
#include "temp_dir_util.h"

namespace refit::internal {
namespace {

const std::string kLabel = "v00000002/payload.r0.000000.st";

// Every dtype width, around the ctx walk's 16384-element chunks, at sparse and dense change.
testing::TensorPair MixedTensors() {
  testing::TensorPair p;
  p.Add("bf16.sparse", DType::kBF16, 40000, 0.015, 1);
  p.Add("bf16.dense", DType::kBF16, 16385, 0.4, 2);
  p.Add("f32", DType::kF32, 5000, 0.05, 3);
  p.Add("u8", DType::kU8, 777, 0.1, 4);
  p.Add("f64", DType::kF64, 300, 0.2, 5);
  p.Add("unchanged", DType::kBF16, 1000, 0.0, 6);
  return p;
}

struct LoggedApply {
  std::shared_ptr<Registry> registry;
  std::unique_ptr<RedoLog> log;
  std::vector<std::vector<uint8_t>> bits;
  std::vector<TensorView> views;

  explicit LoggedApply(const testing::TensorPair& p, const std::string& dir)
      : bits(p.base_bits), views(p.base) {
    for (size_t i = 0; i < views.size(); ++i) views[i].data = bits[i].data();
    registry = LoadRegistry(nullptr).value();
    log = RedoLog::Open(dir + "/redo.log", /*durable=*/true, 0).value();
  }

  Status Apply(const std::vector<uint8_t>& bytes, WorkerPool* pool = nullptr) {
    ApplySink sink;
    sink.journal = log.get();
    sink.pool = pool;
    return Apply(bytes, sink, kLabel);
  }

  Status Apply(const std::vector<uint8_t>& bytes, ApplySink& sink, const std::string& label) {
    REFIT_ASSIGN_OR_RAISE(Payload payload, Payload::Parse(bytes.data(), bytes.size(), label));
    std::map<std::string, TensorView*> by_name;
    for (TensorView& v : views) by_name[v.name] = &v;
    EncodingCache encodings(*registry, nullptr);
    internal::ApplyScratch scratch;
    ApplyStats stats;
    return ApplyPayload(payload, encodings, CanonicalResolver(by_name), uint64_t{1} << 30, scratch,
                        &stats, &sink);
  }
};

std::vector<uint8_t> EncodeWith(const testing::TensorPair& p, const std::string& encoding) {
  auto registry = LoadRegistry(nullptr).value();
  DeltaOptions opt;
  opt.encoding = encoding;
  opt.threads = 1;
  Result<std::vector<uint8_t>> bytes = EncodeDelta(p.base, p.next, opt, *registry, nullptr);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return bytes.ok() ? *bytes : std::vector<uint8_t>{};
}

// Rebuilds `bytes` with every record's header edited by `edit`.
template <typename Edit>
std::vector<uint8_t> EditRecords(const std::vector<uint8_t>& bytes, Edit edit) {
  Payload parsed = Payload::Parse(bytes.data(), bytes.size(), kLabel).value();
  PayloadBuilder b(parsed.metadata());
  for (const RecordHeader& r : parsed.records()) {
    RecordHeader h = r;
    edit(h);
    b.Add(h, parsed.record_bytes(r), r.data_end - r.data_begin);
  }
  return b.Finish().value();
}

TEST(LoggedApply, ListedAndScratchDecodedRecordsAreBitExact) {
  const testing::TensorPair p = MixedTensors();
  for (const std::string encoding : {"ctx", "indices", "deltas", "dense", "xor", "auto"}) {
    testing::ScopedTempDir dir("logged_apply");
    LoggedApply t(p, dir.path().string());
    Status st = t.Apply(EncodeWith(p, encoding));
    ASSERT_TRUE(st.ok()) << encoding << ": " << st.ToString();
    EXPECT_TRUE(t.bits == p.next_bits) << encoding << ": not bit-exact";
  }
}

TEST(LoggedApply, ARecordCodingMoreChangesThanItDeclaresIsRefusedUnwritten) {
  const testing::TensorPair p = MixedTensors();
  for (const std::string encoding : {"ctx", "indices"}) {
    testing::ScopedTempDir dir("logged_apply");
    LoggedApply t(p, dir.path().string());
    const std::vector<uint8_t> forged = EditRecords(EncodeWith(p, encoding), [](RecordHeader& h) {
      if (h.changed > 0) --h.changed;
    });
    Status st = t.Apply(forged);
    ASSERT_FALSE(st.ok()) << encoding;
    EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
    EXPECT_NE(st.message().find("its record declares"), std::string::npos) << st.ToString();
    EXPECT_TRUE(t.bits == p.base_bits) << encoding << ": a refused window wrote elements";
  }
}

TEST(LoggedApply, AListedRecordFailingItsDigestIsRefusedUnwritten) {
  const testing::TensorPair p = MixedTensors();
  testing::ScopedTempDir dir("logged_apply");
  LoggedApply t(p, dir.path().string());
  const std::vector<uint8_t> forged =
      EditRecords(EncodeWith(p, "ctx"), [](RecordHeader& h) { h.digest ^= 0x10; });
  Status st = t.Apply(forged);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("digest mismatch after apply"), std::string::npos) << st.ToString();
  EXPECT_TRUE(t.bits == p.base_bits) << "a refused window wrote elements";
}

// A record declaring more changes than it codes leaves part of its slice of the window's buffers
// unused. Declaring every element, 60 records are several windows (8 MiB of declared changes
// each) that reuse each other's buffers, with listed and scratch-decoded records side by side:
// every record lands bit-exact, on one thread and on three.
TEST(LoggedApply, RecordsDeclaringMoreChangesThanTheyCodeAcrossWindowsAreBitExact) {
  testing::TensorPair p;
  for (int i = 0; i < 60; ++i) {
    p.Add("t" + std::to_string(i), i % 4 == 0 ? DType::kF32 : DType::kBF16, 40000 + 37 * i, 0.02,
          100 + i);
  }
  WorkerPool pool(2);
  for (const std::string encoding : {"ctx", "indices", "auto", "deltas"}) {
    const std::vector<uint8_t> declared_all =
        EditRecords(EncodeWith(p, encoding), [](RecordHeader& h) {
          h.changed = 1;
          for (uint64_t extent : h.box_extent) h.changed *= extent;
        });
    for (WorkerPool* threads : {static_cast<WorkerPool*>(nullptr), &pool}) {
      testing::ScopedTempDir dir("logged_apply");
      LoggedApply t(p, dir.path().string());
      ApplySink sink;
      sink.journal = t.log.get();
      sink.pool = threads;
      sink.threads = 3;
      Status st = t.Apply(declared_all, sink, kLabel);
      ASSERT_TRUE(st.ok()) << encoding << ": " << st.ToString();
      EXPECT_TRUE(t.bits == p.next_bits) << encoding << (threads ? " on 3 threads" : "");
    }
  }
}

// Bytes this process read with read(2)/pread(2) so far (/proc/self/io rchar, every thread); -1
// where the kernel does not account them.
int64_t BytesReadByThisProcess() {
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:") return value;
  }
  return -1;
}

// The tensors of `bits` back to back in a registered writable mapped file at `path` (read and
// written through the file), then room enough for the file to be 16 records long (0x5a bytes);
// `views` point into it.
struct LargeModelFile {
  std::string path;
  std::unique_ptr<MappedFile> file;
  std::vector<TensorView> views;
  uint64_t tensor_bytes = 0;

  LargeModelFile(const std::vector<std::vector<uint8_t>>& bits, std::vector<TensorView> tensors,
                 std::string file_path)
      : path(std::move(file_path)), views(std::move(tensors)) {
    SetMappedFileRegistrationBytesForTesting(1);
    std::string contents;
    for (const std::vector<uint8_t>& b : bits) contents.append(b.begin(), b.end());
    tensor_bytes = contents.size();
    contents.append(16 * tensor_bytes, '\x5a');
    EXPECT_TRUE(WriteFileAtomic(path, contents).ok());
    file = MappedFile::Open(path, /*writable=*/true).value();
    uint64_t at = 0;
    for (TensorView& v : views) {
      v.data = file->mutable_data() + at;
      at += v.nbytes();
    }
  }
  ~LargeModelFile() {
    file.reset();
    SetMappedFileRegistrationBytesForTesting(16ull << 20);
  }
  // The file (read through it) holds `bits` back to back.
  bool Holds(const std::vector<std::vector<uint8_t>>& bits) const {
    std::string now(tensor_bytes, '\0');
    std::ifstream(path, std::ios::binary)
        .read(now.data(), static_cast<std::streamsize>(tensor_bytes));
    std::string want;
    for (const std::vector<uint8_t>& b : bits) want.append(b.begin(), b.end());
    return now == want;
  }
};

// A full sync into a large model file is decoded into scratch and written through the file
// (ApplyInPlace: a fresh page of the shared mapping would cost a fault per 4 KiB); nothing is
// written unless the record's digest holds, and a delta's records read their old bits first.
TEST(LoggedApply, RecordsInALargeModelFileAreWrittenThroughItOnlyOnceVerified) {
  const testing::TensorPair p = MixedTensors();
  testing::ScopedTempDir dir("logged_apply");
  LargeModelFile model(p.base_bits, p.base, (dir.path() / "model").string());
  std::vector<TensorView>& views = model.views;
  auto registry = LoadRegistry(nullptr).value();
  DeltaOptions full;
  full.encoding = "dense";
  full.threads = 1;
  const std::vector<TensorView> nothing;
  const std::vector<uint8_t> full_sync =
      EncodeDelta(nothing, p.next, full, *registry, nullptr).value();
  const auto apply = [&](const std::vector<uint8_t>& bytes) {
    Payload payload = Payload::Parse(bytes.data(), bytes.size(), kLabel).value();
    std::map<std::string, TensorView*> by_name;
    for (TensorView& v : views) by_name[v.name] = &v;
    EncodingCache encodings(*registry, nullptr);
    ApplyScratch scratch;
    ApplyStats stats;
    return ApplyPayload(payload, encodings, CanonicalResolver(by_name), uint64_t{1} << 30, scratch,
                        &stats, nullptr);
  };
  // A forged digest on every record: refused, the file as it was.
  const std::vector<uint8_t> forged =
      EditRecords(full_sync, [](RecordHeader& h) { h.digest ^= 1; });
  Status st = apply(forged);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
  EXPECT_TRUE(model.Holds(p.base_bits)) << "a record failing its digest was written";
  // The full sync, then a delta back to the base (xor records read their old bits).
  ASSERT_TRUE(apply(full_sync).ok());
  EXPECT_TRUE(model.Holds(p.next_bits));
  DeltaOptions back;
  back.encoding = "xor";
  back.threads = 1;
  ASSERT_TRUE(apply(EncodeDelta(p.next, p.base, back, *registry, nullptr).value()).ok());
  EXPECT_TRUE(model.Holds(p.base_bits));
}

// Records into a large model file read their old bits into scratch; a record decoded in scratch
// (xor) grows it to hold the decoded copy next to the old bits, which must survive the growth.
// Fresh scratch each time, so every growth happens.
TEST(LoggedApply, ListedAndScratchDecodedRecordsInALargeModelFileAreBitExact) {
  const testing::TensorPair p = MixedTensors();
  for (const std::string encoding : {"ctx", "indices", "deltas", "xor", "auto"}) {
    testing::ScopedTempDir dir("logged_apply");
    LoggedApply t(p, dir.path().string());
    LargeModelFile model(p.base_bits, p.base, (dir.path() / "model").string());
    t.views = model.views;
    Status st = t.Apply(EncodeWith(p, encoding));
    ASSERT_TRUE(st.ok()) << encoding << ": " << st.ToString();
    EXPECT_TRUE(model.Holds(p.next_bits)) << encoding << ": not bit-exact";
  }
}

// A model file whose mapping is populated for reading (a long-lived receiver's, after two
// versions) is read in place: a logged apply of a delta reads nothing with read(2) and lands
// bit-exact, where the same apply into a cold file reads every record's old bits with pread.
// The sender's diff against a warm baseline reads nothing either, and its payload is the same.
TEST(LoggedApply, AWarmModelFileIsReadInPlace) {
  testing::TensorPair p;
  for (int i = 0; i < 12; ++i) {
    p.Add("t" + std::to_string(i), i % 3 == 0 ? DType::kF32 : DType::kBF16, 50000 + 17 * i, 0.02,
          400 + i);
  }
  const std::vector<uint8_t> delta = EncodeWith(p, "ctx");
  std::vector<uint8_t> cold_payload;
  for (const bool warm : {false, true}) {
    SCOPED_TRACE(warm ? "warm" : "cold");
    testing::ScopedTempDir dir("logged_apply");
    LargeModelFile model(p.base_bits, p.base, (dir.path() / "model").string());
    if (warm) {
      ASSERT_TRUE(model.file->PopulateForReading().ok());
    }
    FileRange range;
    ASSERT_TRUE(FindMappedFile(model.views[0].data, 1, &range));
    if (warm && !range.warm) GTEST_SKIP() << "no MADV_POPULATE_READ (Linux < 5.14)";

    auto registry = LoadRegistry(nullptr).value();
    DeltaOptions opt;
    opt.encoding = "ctx";
    opt.threads = 1;
    opt.chunk_bytes = 16 << 10;  // the file is many chunks long: read through it when cold
    int64_t before = BytesReadByThisProcess();
    Result<std::vector<uint8_t>> encoded =
        EncodeDelta(model.views, p.next, opt, *registry, nullptr);
    const int64_t encode_read = BytesReadByThisProcess() - before;
    ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
    if (!warm) cold_payload = *encoded;
    EXPECT_TRUE(*encoded == cold_payload) << "the payload depends on how the baseline was read";

    LoggedApply t(p, dir.path().string());
    t.views = model.views;
    before = BytesReadByThisProcess();
    Status st = t.Apply(delta);
    const int64_t apply_read = BytesReadByThisProcess() - before;
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_TRUE(model.Holds(p.next_bits)) << "not bit-exact";
    if (before < 0) continue;
    const auto tensor_bytes = static_cast<int64_t>(model.tensor_bytes);
    if (warm) {
      EXPECT_LT(encode_read, tensor_bytes / 10) << "the diff copied the warm baseline out";
      EXPECT_LT(apply_read, tensor_bytes / 10) << "the apply copied the warm model out";
    } else {
      EXPECT_GE(encode_read, tensor_bytes) << "the diff read the cold baseline in place";
      EXPECT_GE(apply_read, tensor_bytes) << "the apply read the cold model in place";
    }
  }
}

// With defer_last_sync a payload's last window is left logged (its sync running) and unwritten;
// the next payload lands it once its own first window is computed, and FinishLoggedTail lands
// the last one.
TEST(LoggedApply, ADeferredLastWindowIsWrittenOnlyWhenItLands) {
  // The model holds a, b and c; the first payload changes a and b, the second c (the pairs are
  // deterministic in their seeds).
  testing::TensorPair only_ab;
  only_ab.Add("a", DType::kBF16, 40000, 0.015, 1);
  only_ab.Add("b", DType::kF32, 5000, 0.05, 2);
  testing::TensorPair only_c;
  only_c.Add("c", DType::kBF16, 30000, 0.02, 3);
  testing::TensorPair both = only_ab;
  both.Add("c", DType::kBF16, 30000, 0.02, 3);
  testing::ScopedTempDir dir("logged_apply");
  LoggedApply t(both, dir.path().string());
  ApplySink sink;
  sink.journal = t.log.get();
  sink.defer_last_sync = true;
  ASSERT_TRUE(t.Apply(EncodeWith(only_ab, "ctx"), sink, "v00000002/payload.r0.000000.st").ok());
  ASSERT_NE(sink.tail, nullptr) << "the last window was not left";
  EXPECT_TRUE(t.bits == both.base_bits) << "a deferred window was written before it landed";
  ASSERT_TRUE(t.Apply(EncodeWith(only_c, "ctx"), sink, "v00000002/payload.r0.000001.st").ok());
  EXPECT_TRUE(t.bits[0] == both.next_bits[0] && t.bits[1] == both.next_bits[1])
      << "the next payload did not land the tail";
  EXPECT_TRUE(t.bits[2] == both.base_bits[2]) << "its own last window was written at once";
  ASSERT_TRUE(FinishLoggedTail(sink, nullptr).ok());
  EXPECT_EQ(sink.tail, nullptr);
  EXPECT_TRUE(t.bits == both.next_bits) << "not bit-exact once every window landed";
}

}  // namespace
}  // namespace refit::internal
