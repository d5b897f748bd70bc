// Fuzzes the wire format parsers a receiver runs on untrusted bytes: payloads (safetensors
// container + record descriptors), manifests, commit markers and acks. The first byte picks the
// parser; a parsed payload's records must describe boxes inside their tensors and byte ranges
// inside the buffer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "refit/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t which = data[0] % 4;
  ++data;
  --size;
  switch (which) {
    case 0: {
      auto p = refit::Payload::Parse(data, size, "fuzz");
      if (!p.ok()) return 0;
      for (const refit::RecordHeader& r : p->records()) {
        if (r.data_begin > r.data_end || r.data_end > size) std::abort();
        if (r.box_offset.size() != r.shape.size()) std::abort();
        for (size_t d = 0; d < r.shape.size(); ++d) {
          if (r.box_offset[d] + r.box_extent[d] > r.shape[d]) std::abort();
        }
        volatile uint8_t sink = 0;
        if (r.data_end > r.data_begin) sink = p->record_bytes(r)[r.data_end - r.data_begin - 1];
        (void)sink;
      }
      break;
    }
    case 1:
      (void)refit::ParseManifest(data, size, "fuzz");
      break;
    case 2:
      (void)refit::ParseCommit(data, size, "fuzz");
      break;
    default:
      (void)refit::ParseAck(data, size, "fuzz");
      break;
  }
  return 0;
}
