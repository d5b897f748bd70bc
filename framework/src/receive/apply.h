// Decode, apply and verify the records of one payload.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/box.h"
#include "format/wire.h"
#include "plugins/encoding_cache.h"
#include "refit/receiver.h"

namespace refit::internal {

// Where a record lands: a box (same extent as the record's) of a writable local tensor. The
// receiver's layout decides; for canonical (hf) receivers it is the record's own box.
struct ApplyTarget {
  TensorView* tensor = nullptr;
  Box box;
};
using TensorResolver = std::function<Result<ApplyTarget>(const RecordHeader& record)>;

// The identity resolver over canonical tensors by name (checks name, dtype and full shape).
TensorResolver CanonicalResolver(std::map<std::string, TensorView*> tensors);

class ApplyJournal;  // journal.h

// Validates, decodes, applies and digest-verifies every record of a payload. With a journal,
// xor/step records are applied exactly once across crashes (journal.h); without one (offline
// apply into a copy, the sender's own baseline) they are applied in place.
Status ApplyPayload(const Payload& payload, EncodingCache& encodings, const TensorResolver& resolve,
                    uint64_t max_record_bytes, std::vector<uint8_t>& scratch, ApplyStats* stats,
                    ApplyJournal* journal = nullptr);

}  // namespace refit::internal
