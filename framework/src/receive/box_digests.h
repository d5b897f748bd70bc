// What an attached receiver's memory holds, in a form it can check after a restart without a
// copy of the model: the digest of every record box it last wrote. A full sync writes every
// (mapped) element once, so its records tile the model; a delta's records reuse the same chunk
// boxes (the sender cuts tensors the same way every version), so each replaces one entry. The
// table costs one entry per record box and is updated per record: proportional to the change.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/box.h"
#include "refit/status.h"
#include "refit/tensor.h"

namespace refit::internal {

class BoxDigestTable {
 public:
  // A full sync starts a new table for `version`.
  void Reset(uint64_t version);
  // A record of `box` of `tensor` now holds bits of this digest. During a delta, a box the table
  // does not hold exactly (another chunking) makes the table stale: it can no longer vouch.
  void Record(const std::string& tensor, const Box& box, uint64_t digest, bool full);
  void set_version(uint64_t version) { version_ = version; }
  uint64_t version() const { return version_; }
  bool stale() const { return stale_; }

  // Whether `tensors` hold exactly the bits recorded: every entry's box hashes to its digest and
  // the entries of each tensor add up to `mapped` elements (those a record writes). Reads every
  // recorded byte once.
  bool Matches(const std::vector<TensorView>& tensors,
               const std::map<std::string, uint64_t>& mapped) const;

  std::string Serialize() const;
  static Result<BoxDigestTable> Parse(const std::string& text, const std::string& label);

 private:
  struct Entry {
    Shape extent;
    uint64_t digest = 0;
  };
  uint64_t version_ = 0;
  bool stale_ = true;                                    // nothing recorded yet
  std::map<std::string, std::map<Shape, Entry>> boxes_;  // tensor -> box offset -> entry
};

}  // namespace refit::internal
