// Fuzzes the safetensors reader: any input is either rejected with a one-line error naming the
// buffer, or yields views that tile the data buffer exactly and survive a write/read round trip
// (in memory, through Open() on a temp file, and through the atomic writer).
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "format/safetensors.h"
#include "fuzz_check.h"

namespace {

using refit::SafetensorsFile;

void CheckError(const refit::Status& st, const std::string& label) {
  FUZZ_CHECK(!st.ok(), "expected an error");
  FUZZ_CHECK(st.message().rfind(label + ": ", 0) == 0, "error does not name %s: %s", label.c_str(),
             st.message().c_str());
  FUZZ_CHECK(st.message().find('\n') == std::string::npos, "multi-line error: %s",
             st.message().c_str());
}

// Same tensors (names, dtypes, shapes, bits) and metadata.
void CheckSame(const SafetensorsFile& a, const SafetensorsFile& b) {
  FUZZ_CHECK(a.tensors().size() == b.tensors().size(), "tensor count %zu vs %zu",
             a.tensors().size(), b.tensors().size());
  FUZZ_CHECK(a.metadata() == b.metadata(), "metadata differs");
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    const refit::TensorView& x = a.tensors()[i];
    const refit::TensorView& y = b.tensors()[i];
    FUZZ_CHECK(x.name == y.name && x.dtype == y.dtype && x.shape == y.shape, "tensor %zu differs",
               i);
    FUZZ_CHECK(x.nbytes() == 0 || std::memcmp(x.data, y.data, x.nbytes()) == 0,
               "bits of tensor %zu differ", i);
  }
}

// Opens the input as a real file: a regular file under the temp dir, since the writable mapping
// refuses a path that is a symbolic link (as /proc/self/fd/N of a memfd is).
std::unique_ptr<SafetensorsFile> OpenThroughFile(const uint8_t* data, size_t size, bool writable,
                                                 bool expect_ok) {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/fuzz_safetensors." +
           std::to_string(::getpid());
  }();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return nullptr;
  size_t written = 0;
  while (written < size) {
    const ssize_t n = ::write(fd, data + written, size - written);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  ::close(fd);
  auto opened = SafetensorsFile::Open(path, writable);
  ::unlink(path.c_str());  // the mapping outlives the name
  if (written != size) return nullptr;
  FUZZ_CHECK(opened.ok() == expect_ok, "Open and FromBuffer disagree: %s",
             opened.status().ToString().c_str());
  if (!opened.ok()) {
    CheckError(opened.status(), path);
    return nullptr;
  }
  return std::move(opened).value();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string label = "fuzz.safetensors";
  auto parsed = SafetensorsFile::FromBuffer(data, size, label);
  const bool writable = size > 0 && (data[size - 1] & 1) != 0;
  std::unique_ptr<SafetensorsFile> mapped = OpenThroughFile(data, size, writable, parsed.ok());
  if (!parsed.ok()) {
    CheckError(parsed.status(), label);
    return 0;
  }
  const SafetensorsFile& file = *parsed.value();

  // The views tile the data buffer in order, and every byte is readable (ASan checks).
  FUZZ_CHECK(file.data_start() <= size, "data_start out of range");
  uint64_t offset = file.data_start();
  uint64_t checksum = 0;
  for (const refit::TensorView& t : file.tensors()) {
    FUZZ_CHECK(t.bytes() == data + offset, "tensor '%s' is not where expected", t.name.c_str());
    FUZZ_CHECK(file.Find(t.name) == &t, "Find('%s') is wrong", t.name.c_str());
    for (uint64_t i = 0; i < t.nbytes(); ++i) checksum += t.bytes()[i];
    offset += t.nbytes();
  }
  FUZZ_CHECK(offset == size, "tensors cover %llu of %zu bytes",
             static_cast<unsigned long long>(offset), size);

  // Round trip: serialize what was read, read it back, compare.
  auto bytes = refit::SerializeSafetensors(file.tensors(), file.metadata());
  FUZZ_CHECK(bytes.ok(), "re-serialization failed: %s", bytes.status().ToString().c_str());
  auto again = SafetensorsFile::FromBuffer(bytes->data(), bytes->size(), "again");
  FUZZ_CHECK(again.ok(), "re-read failed: %s", again.status().ToString().c_str());
  CheckSame(file, **again);
  FUZZ_CHECK(bytes->size() - (*again)->data_start() == size - file.data_start(),
             "data buffer size changed");

  if (mapped != nullptr) {
    CheckSame(file, *mapped);
    FUZZ_CHECK(mapped->Sync().ok(), "Sync failed");
  }

  // The atomic writer on tmpfs produces exactly the serialized bytes.
  static const std::string out_path = "/dev/shm/refit_fuzz_" + std::to_string(::getpid()) + ".st";
  refit::Status written = refit::WriteSafetensors(out_path, file.tensors(), file.metadata());
  if (written.ok()) {
    auto reopened = SafetensorsFile::Open(out_path);
    FUZZ_CHECK(reopened.ok(), "re-open failed: %s", reopened.status().ToString().c_str());
    CheckSame(file, **reopened);
    FUZZ_CHECK((*reopened)->file_size() == bytes->size(), "written size differs");
    ::unlink(out_path.c_str());
  }
  __asm__ volatile("" : : "r"(checksum) : "memory");  // keeps the reads from being optimized out
  return 0;
}
