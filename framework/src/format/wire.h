// Wire format v1: records, payloads, manifests, commit markers and acks (docs/wire-format.md).
//
// A payload is a safetensors blob: each record's encoded bytes are one U8 tensor ("r000000", ...)
// and the record descriptors are a JSON array in __metadata__["refit.records"]. Any safetensors
// tool can open a payload; refit validates every descriptor before applying anything.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "format/safetensors.h"
#include "refit/export.h"
#include "refit/kernels/buffer.h"
#include "refit/plugin_abi.h"
#include "refit/sender.h"
#include "refit/status.h"
#include "refit/tensor.h"

namespace refit {

constexpr const char* kPayloadFormat = "refit-payload-v1";
constexpr const char* kDeltaFormat = "refit-delta-v1";  // offline `refit diff` output
constexpr const char* kManifestFormat = "refit-manifest-v1";
constexpr const char* kCommitFormat = "refit-commit-v1";

// One record: a box of one canonical tensor, encoded by one encoding.
struct RecordHeader {
  std::string tensor;  // canonical tensor name
  DType dtype = DType::kU8;
  Shape shape;       // the canonical tensor's full shape
  Shape box_offset;  // per dim
  Shape box_extent;  // per dim; positions inside the record are row-major within the box
  std::string encoding;
  refit_op_t op = REFIT_OP_OVERWRITE;
  uint64_t changed = 0;  // elements changed (n for dense/full records)
  uint64_t digest = 0;   // xxh3-64 of the box's new bits, row-major
  bool create = false;   // full-sync record: the receiver may (re)create the tensor
  // Position of the encoded bytes inside the payload's byte buffer (filled by the parser).
  uint64_t data_begin = 0;
  uint64_t data_end = 0;

  uint64_t box_elements() const;  // product of box_extent (validated: no overflow)
};

// Accumulates encoded records and serializes them as one payload.
class PayloadBuilder {
 public:
  // Metadata added to __metadata__ (e.g. version, rank); "refit.records" is reserved.
  explicit PayloadBuilder(Metadata metadata = {});
  // Appends a record; bytes are copied. Returns the record's index.
  size_t Add(RecordHeader header, const uint8_t* bytes, uint64_t len);
  // Reserves len bytes for a record encoded in place; the span stays valid until the next Add*.
  uint8_t* AddInPlace(RecordHeader header, uint64_t len);
  void TrimLast(uint64_t final_len);  // shrink the last AddInPlace record to what was written
  // Appends a record whose bytes stay the caller's: Finish copies them straight into the payload
  // (one copy instead of two for a dense record); they must stay valid and unchanged until then.
  size_t AddBorrowed(RecordHeader header, const uint8_t* bytes, uint64_t len);
  size_t num_records() const { return headers_.size(); }
  uint64_t data_bytes() const { return data_bytes_; }  // of every record, borrowed ones included
  bool empty() const { return headers_.empty(); }
  void Reserve(uint64_t bytes) { data_.reserve(bytes); }
  // Resets the builder. With a pool, a large payload is assembled on `threads` threads
  // (SerializeSafetensors); into `reuse`'s capacity when it has enough.
  Result<std::vector<uint8_t>> Finish(internal::WorkerPool* pool = nullptr, unsigned threads = 1,
                                      std::vector<uint8_t> reuse = {});
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

 private:
  // The record's header and where its bytes are (borrowed, or null: data_'s end).
  void AppendRecord(RecordHeader header, uint64_t len, const uint8_t* borrowed);

  Metadata metadata_;
  std::vector<RecordHeader> headers_;  // data_begin/data_end: where the bytes go in the payload
  // Per record: its bytes lent by the caller, or null when they are in data_ from inline_at_.
  std::vector<const uint8_t*> borrowed_;
  std::vector<uint64_t> inline_at_;
  kernels::UninitVector<uint8_t> data_;  // every byte is written by Add or an in-place encode
  uint64_t data_bytes_ = 0;
};

// A parsed, validated payload over a buffer the caller keeps alive.
class Payload {
 public:
  // Validates the safetensors container and every record descriptor (known dtype, box inside the
  // shape, extent product without overflow, encoding name non-empty, digest present, blob
  // present). Errors name `label` and the record index.
  static Result<Payload> Parse(const uint8_t* data, uint64_t size, std::string label);

  const std::vector<RecordHeader>& records() const { return records_; }
  const Metadata& metadata() const { return metadata_; }
  const std::string& label() const { return label_; }
  const uint8_t* record_bytes(const RecordHeader& r) const { return buffer_ + r.data_begin; }
  std::string MetadataOr(const std::string& key, const std::string& fallback) const;

 private:
  std::string label_;
  const uint8_t* buffer_ = nullptr;  // start of the safetensors byte buffer
  std::vector<RecordHeader> records_;
  Metadata metadata_;
};

// ---- per-sync control objects (JSON) ----

// TensorSpec (name, dtype, shape) lives in refit/tensor.h.

struct PayloadRef {
  std::string key;
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
  uint64_t records = 0;
  // SHA-256 (hex) of the object, set when versions are signed ([auth]): xxh3 catches corruption,
  // not a forged object made to collide with it.
  std::string sha256;
};

struct Manifest {
  uint64_t version = 0;
  std::optional<uint64_t> base_version;  // nullopt: full sync (applies on any state)
  bool full = false;
  int rank = 0;
  int world = 1;
  std::vector<PayloadRef> payloads;
  // For full syncs: every canonical tensor this rank owns (the receiver builds its model from it).
  std::vector<TensorSpec> tensors;
  uint64_t total_elements = 0;
  uint64_t changed_elements = 0;
  uint64_t model_bytes = 0;
  uint64_t changed_bytes = 0;
  uint64_t payload_bytes = 0;
  std::string mac;  // HMAC-SHA256 (hex) of the manifest serialized without it; empty: unsigned
};

struct Commit {
  uint64_t version = 0;
  std::optional<uint64_t> base_version;
  bool full = false;
  int world = 1;
  std::vector<PayloadRef> manifests;  // key + xxh3 of each rank's manifest
  // The version chain: SHA-256 (hex) of the previous version's COMMIT bytes as published; empty
  // only for a sender's first version. A receiver takes a version only when it extends the
  // chain it holds (docs/reliability.md, "Trust boundary").
  std::string prev;
  std::string mac;  // HMAC-SHA256 (hex) of the commit serialized without it; empty: unsigned
};

std::string SerializeManifest(const Manifest& m);
Result<Manifest> ParseManifest(const uint8_t* data, uint64_t size, const std::string& label);
std::string SerializeCommit(const Commit& c);
Result<Commit> ParseCommit(const uint8_t* data, uint64_t size, const std::string& label);
std::string SerializeAck(const Ack& a);
Result<Ack> ParseAck(const uint8_t* data, uint64_t size, const std::string& label);

// Encodes/decodes tensor spec lists (offline deltas carry NEW's tensor list in metadata).
std::string SerializeTensorSpecs(const std::vector<TensorSpec>& specs);
Result<std::vector<TensorSpec>> ParseTensorSpecs(const std::string& json, const std::string& label);

// ---- transport keys (docs/wire-format.md "Keys") ----
std::string VersionDir(uint64_t version);  // "v00000007"
std::string PayloadKey(uint64_t version, int rank, uint64_t seq);
std::string ManifestKey(uint64_t version, int rank);
std::string CommitKey(uint64_t version);
std::string AckKey(const std::string& receiver, uint64_t version);
std::string NeedFullKey(const std::string& receiver);
// "v00000007/..." -> 7; nullopt for anything else.
std::optional<uint64_t> VersionOfKey(const std::string& key);

std::string HexDigest(uint64_t digest);
Result<uint64_t> ParseHexDigest(const std::string& text);

}  // namespace refit
