// The receiver's apply journal: a redo log that makes applying non-idempotent records (xor, step)
// exactly-once across crashes (invariant 4, docs/architecture.md).
//
// A non-idempotent record is decoded into scratch and verified first; the elements it changes
// (box-relative positions + their new bits) are then appended here as an OVERWRITE entry, synced
// when the receiver is durable, and only then written into the model. Replaying entries is
// idempotent, so after a crash the receiver replays the journal and skips the journaled records:
// an xor is never applied twice, and a record cut short by the crash was not journaled, so its
// box still holds the old bits and it is applied afresh. A torn last entry fails its checksum and
// is dropped (it never reached the model).
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/box.h"
#include "refit/export.h"
#include "refit/status.h"
#include "refit/tensor.h"

namespace refit::internal {

class ApplyJournal {
 public:
  // Opens `path` for applying `version` on `base`: a journal of the same (version, base) is
  // resumed (its valid entries loaded, a torn tail cut off); any other is discarded.
  static Result<std::unique_ptr<ApplyJournal>> Open(const std::string& path, uint64_t version,
                                                    uint64_t base, bool durable);
  ~ApplyJournal();

  // Entries loaded from an earlier, interrupted attempt at this version.
  size_t resumed_entries() const { return resumed_; }
  bool Has(const std::string& record_id) const { return ids_.count(record_id) != 0; }

  // Appends one overwrite entry (synced when durable) before the record touches the model.
  // positions are box-relative row-major element indices; values holds positions.size() elements.
  Status Append(const std::string& record_id, const std::string& tensor, const Box& box,
                uint32_t elem_size, const std::vector<uint64_t>& positions, const uint8_t* values);

  // Writes every loaded entry into `tensors` (by name); idempotent.
  Status Replay(const std::map<std::string, TensorView*>& tensors) const;

  // The version is committed: the journal is no longer needed.
  Status Remove();

 private:
  struct Entry {
    std::string id;
    std::string tensor;
    Box box;
    uint32_t elem_size = 0;
    std::vector<uint64_t> positions;
    std::vector<uint8_t> values;
  };
  ApplyJournal() = default;
  Status Load(uint64_t file_size);

  std::string path_;
  int fd_ = -1;
  bool durable_ = false;
  size_t resumed_ = 0;
  std::set<std::string> ids_;
  std::vector<Entry> loaded_;
};

// Element index in a row-major tensor of the box's i-th element (row-major within the box).
uint64_t BoxElementIndex(const Shape& shape, const Box& box, uint64_t i);

}  // namespace refit::internal
