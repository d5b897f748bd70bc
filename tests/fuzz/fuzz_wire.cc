// Fuzzes the payload parser a receiver runs on untrusted bytes (safetensors container + record
// descriptors). A rejected payload gets one error line naming the payload; an accepted one has
// records whose boxes lie inside their tensors and whose bytes lie inside the buffer, and it
// survives a rebuild through PayloadBuilder unchanged. Manifests, commits and acks have their own
// target (fuzz_manifest.cc).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "format/wire.h"
#include "fuzz_check.h"

namespace {

const std::string kLabel = "v00000001/payload.r0.000000.st";

bool SameHeader(const refit::RecordHeader& a, const refit::RecordHeader& b) {
  return a.tensor == b.tensor && a.dtype == b.dtype && a.shape == b.shape &&
         a.box_offset == b.box_offset && a.box_extent == b.box_extent && a.encoding == b.encoding &&
         a.op == b.op && a.changed == b.changed && a.digest == b.digest && a.create == b.create &&
         a.data_end - a.data_begin == b.data_end - b.data_begin;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto p = refit::Payload::Parse(data, size, kLabel);
  if (!p.ok()) {
    const std::string m = p.status().message();
    FUZZ_CHECK(m.rfind(kLabel + ": ", 0) == 0, "error does not name the payload: %s", m.c_str());
    FUZZ_CHECK(m.find('\n') == std::string::npos, "multi-line error: %s", m.c_str());
    return 0;
  }
  const uint8_t* buffer_end = data + size;
  uint64_t checksum = 0;
  for (const refit::RecordHeader& r : p->records()) {
    FUZZ_CHECK(r.data_begin <= r.data_end, "negative record length");
    FUZZ_CHECK(p->record_bytes(r) + (r.data_end - r.data_begin) <= buffer_end,
               "record bytes past the buffer");
    FUZZ_CHECK(!r.tensor.empty() && r.tensor.find('\0') == std::string::npos, "bad tensor name");
    FUZZ_CHECK(!r.encoding.empty(), "empty encoding");
    FUZZ_CHECK(r.box_offset.size() == r.shape.size() && r.box_extent.size() == r.shape.size(),
               "box rank");
    for (size_t d = 0; d < r.shape.size(); ++d) {
      FUZZ_CHECK(r.box_offset[d] <= r.shape[d] && r.box_extent[d] <= r.shape[d] - r.box_offset[d],
                 "box outside the tensor");
    }
    FUZZ_CHECK(r.changed <= r.box_elements(), "more changes than elements");
    const uint8_t* bytes = p->record_bytes(r);
    for (uint64_t i = r.data_begin; i < r.data_end; ++i) checksum += bytes[i - r.data_begin];
  }

  // Rebuild: the same headers and bytes serialize to a payload that parses to the same records.
  // Odd records go through the in-place path (reserve more, write, trim), as the sender's do.
  refit::PayloadBuilder builder(p->metadata());
  for (size_t i = 0; i < p->records().size(); ++i) {
    const refit::RecordHeader& r = p->records()[i];
    const uint64_t len = r.data_end - r.data_begin;
    if (i % 2 == 0) {
      builder.Add(r, p->record_bytes(r), len);
    } else {
      uint8_t* out = builder.AddInPlace(r, len + 8);
      if (len > 0) std::memcpy(out, p->record_bytes(r), len);
      builder.TrimLast(len);
    }
  }
  auto rebuilt = builder.Finish();
  FUZZ_CHECK(rebuilt.ok(), "rebuild failed: %s", rebuilt.status().ToString().c_str());
  auto again = refit::Payload::Parse(rebuilt->data(), rebuilt->size(), "again");
  FUZZ_CHECK(again.ok(), "re-parse failed: %s", again.status().ToString().c_str());
  FUZZ_CHECK(again->records().size() == p->records().size(), "record count differs");
  FUZZ_CHECK(again->MetadataOr("refit.format", "-") == p->MetadataOr("refit.format", "-"),
             "metadata differs");
  for (size_t i = 0; i < p->records().size(); ++i) {
    FUZZ_CHECK(SameHeader(again->records()[i], p->records()[i]), "record %zu differs", i);
  }
  __asm__ volatile("" : : "r"(checksum) : "memory");  // keeps the reads
  return 0;
}
