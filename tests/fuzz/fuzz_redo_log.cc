// Fuzzes the redo log a receiver (and a sender) reads back from its state directory after a
// crash: RedoLog::Open indexes and cuts what follows a valid header, Replay writes entries into a
// small model. The input is the file's bytes after a valid header (first byte odd) or the whole
// file (even). Nothing may crash, read or write outside the model, or fail with more than one
// line; what Open accepted must reopen the same, and replay twice to the same bits.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "receive/journal.h"

namespace refit::internal {
// The kill points of the faults layer are not part of this harness.
void MaybeKillAt(const char*) {}
}  // namespace refit::internal

namespace {

using refit::internal::RedoLog;

std::string TempPath() {
  static const std::string path = "/tmp/fuzz-redo-" + std::to_string(::getpid()) + ".log";
  return path;
}

void CheckError(const refit::Status& st) {
  if (st.ok()) return;
  FUZZ_CHECK(st.message().find('\n') == std::string::npos, "multi-line error: %s",
             st.message().c_str());
}

// A valid empty log's header, as Open writes it (this boot, checkpoint version 0).
std::string ValidHeader() {
  static const std::string header = [] {
    const std::string path = TempPath() + ".h";
    ::unlink(path.c_str());
    { auto log = RedoLog::Open(path, false, 0); }
    std::string h(RedoLog::HeaderBytes(), '\0');
    FILE* f = std::fopen(path.c_str(), "rb");
    FUZZ_CHECK(f != nullptr && std::fread(h.data(), 1, h.size(), f) == h.size(), "no header");
    std::fclose(f);
    ::unlink(path.c_str());
    return h;
  }();
  return header;
}

// Writes the seed corpus: logs of a few entries (one per kind of box: contiguous, a sub-box, an
// 8-byte-position box is not needed: positions are box-relative), each after the header.
void WriteSeeds(const std::string& dir) {
  const std::string path = TempPath() + ".seed";
  auto write_seed = [&](int n, const std::function<void(RedoLog&)>& fill) {
    ::unlink(path.c_str());
    {
      auto log = RedoLog::Open(path, false, 0);
      FUZZ_CHECK(log.ok(), "open");
      fill(*log.value());
      FUZZ_CHECK(log.value()->Flush().ok(), "flush");
    }
    FILE* in = std::fopen(path.c_str(), "rb");
    std::string bytes;
    char buf[4096];
    size_t got;
    while ((got = std::fread(buf, 1, sizeof(buf), in)) > 0) bytes.append(buf, got);
    std::fclose(in);
    FILE* out = std::fopen((dir + "/seed" + std::to_string(n)).c_str(), "wb");
    std::fputc(1, out);
    std::fwrite(bytes.data() + RedoLog::HeaderBytes(), 1, bytes.size() - RedoLog::HeaderBytes(),
                out);
    std::fclose(out);
  };
  const uint16_t w[] = {0x7FC1, 0x8000, 0x0001};
  const float v[] = {-0.0f, 1.5f};
  const uint64_t pos[] = {0, 2, 5};
  write_seed(0, [&](RedoLog& log) {
    (void)log.Stage("p#0", "w", refit::Box{{1, 2}, {2, 3}}, 2, pos, 3,
                    reinterpret_cast<const uint8_t*>(w));
  });
  write_seed(1, [&](RedoLog& log) {
    (void)log.Stage("p#1", "v", refit::Box{{0}, {5}}, 4, pos, 2,
                    reinterpret_cast<const uint8_t*>(v));
    (void)log.Stage("p#2", "w", refit::Box{{0, 0}, {4, 6}}, 2, pos, 3,
                    reinterpret_cast<const uint8_t*>(w));
  });
  write_seed(2, [&](RedoLog& log) {
    (void)log.Stage("pending#end", "", refit::Box{}, 1, nullptr, 0, nullptr);
  });
  ::unlink(path.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("REFIT_FUZZ_WRITE_SEEDS")) {
    WriteSeeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string file;
  if (size > 0 && (data[0] & 1) != 0) file = ValidHeader();
  if (size > 0) file.append(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string path = TempPath();
  FILE* f = std::fopen(path.c_str(), "wb");
  FUZZ_CHECK(f != nullptr, "cannot write %s", path.c_str());
  if (!file.empty()) std::fwrite(file.data(), 1, file.size(), f);
  std::fclose(f);

  auto opened = RedoLog::Open(path, false, 0);
  CheckError(opened.status());
  if (opened.ok()) {
    RedoLog& log = *opened.value();
    FUZZ_CHECK(log.bytes() <= std::max<uint64_t>(file.size(), RedoLog::HeaderBytes()),
               "the log grew on open");
    // A 4x6 i16 tensor and a 5-element f32 vector.
    std::vector<uint16_t> w(24, 0), w2(24, 0);
    std::vector<float> v(5, 0), v2(5, 0);
    auto views = [](std::vector<uint16_t>& wb, std::vector<float>& vb) {
      refit::TensorView tw, tv;
      tw.name = "w";
      tw.dtype = refit::DType::kI16;
      tw.shape = {4, 6};
      tw.data = wb.data();
      tv.name = "v";
      tv.dtype = refit::DType::kF32;
      tv.shape = {5};
      tv.data = vb.data();
      return std::vector<refit::TensorView>{tw, tv};
    };
    const refit::Status first = refit::internal::ReplayInto(log, views(w, v));
    CheckError(first);
    const refit::Status second = refit::internal::ReplayInto(log, views(w2, v2));
    FUZZ_CHECK(first.ok() == second.ok(), "replay is not deterministic");
    if (first.ok()) {
      FUZZ_CHECK(w == w2 && std::memcmp(v.data(), v2.data(), v.size() * 4) == 0,
                 "two replays wrote different bits");
    }
    const uint64_t cut = log.bytes();
    opened.value().reset();
    auto again = RedoLog::Open(path, false, 0);
    FUZZ_CHECK(again.ok(), "a log Open accepted does not reopen: %s",
               again.status().message().c_str());
    FUZZ_CHECK(again.value()->bytes() == cut, "reopen moved the end");
  }
  ::unlink(path.c_str());
  return 0;
}
