// What a delta covers, counted the same way by every path that makes or applies one (the
// sender, the offline diff, in-memory deltas, the receiver), so stats structs embed one of these
// instead of repeating the fields and copying them one by one.
#pragma once

#include <cstdint>

namespace refit {

struct DeltaCounters {
  uint64_t total_elements = 0;    // elements of the model (or of the tensors diffed)
  uint64_t changed_elements = 0;  // elements whose bits differ from the base
  uint64_t model_bytes = 0;       // one copy of the model, dense
  uint64_t changed_bytes = 0;     // changed elements * their size
  uint64_t records = 0;           // records written or applied

  // Fraction of the elements that changed (0 for an empty model).
  double density() const {
    return total_elements ? static_cast<double>(changed_elements) / total_elements : 0.0;
  }
  DeltaCounters& operator+=(const DeltaCounters& other) {
    total_elements += other.total_elements;
    changed_elements += other.changed_elements;
    model_bytes += other.model_bytes;
    changed_bytes += other.changed_bytes;
    records += other.records;
    return *this;
  }
};

}  // namespace refit
