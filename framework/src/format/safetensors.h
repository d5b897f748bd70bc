// safetensors I/O: a validating reader (mmap or in-memory) and an atomic writer.
//
// Format: u64 little-endian header length N, N bytes of JSON header
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {str:
// str}}, then the byte buffer; offsets are relative to the buffer start. Every header is validated
// before any tensor byte is touched: length bound, JSON, dtype names, shape overflow, offsets in
// range, end - begin == elements * dtype size, no overlaps, no holes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "refit/export.h"
#include "refit/status.h"
#include "refit/tensor.h"

namespace refit {

namespace internal {
class MappedFile;
}

constexpr uint64_t kSafetensorsMaxHeaderBytes = 100ull << 20;  // the spec's bound

using Metadata = std::map<std::string, std::string>;

class SafetensorsFile {
 public:
  // Maps the file read-only (writable = true maps it shared read-write so tensors can be patched
  // in place; the caller msyncs through Sync()).
  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path,
                                                       bool writable = false);
  // Parses a buffer the caller keeps alive (payloads received from a transport, fuzzing).
  // label names the buffer in error messages.
  static Result<std::unique_ptr<SafetensorsFile>> FromBuffer(const uint8_t* data, uint64_t size,
                                                             std::string label);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Tensors in file order (ascending data offset). Views point into the mapping.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  // nullptr if absent.
  const TensorView* Find(const std::string& name) const;
  const Metadata& metadata() const { return metadata_; }
  const std::string& path() const { return label_; }
  uint64_t file_size() const { return size_; }
  uint64_t data_start() const { return data_start_; }  // offset of the byte buffer in the file

  // msync a writable mapping (whole file).
  Status Sync();
  // MappedFile::PopulateForReading of the file's mapping (none for FromBuffer).
  Status PopulateForReading();
  // MappedFile::ReadInPlaceIfCheaper of the file's mapping (FromBuffer: in place already, no
  // probe); the seconds per GB it measured in *fault_s_per_gb / *pread_s_per_gb (0: none).
  Status ReadInPlaceIfCheaper(bool* in_place, double* fault_s_per_gb, double* pread_s_per_gb);

 private:
  SafetensorsFile() = default;
  Status Parse();

  std::string label_;
  std::unique_ptr<internal::MappedFile> mapping_;  // null for FromBuffer
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t data_start_ = 0;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t> index_;
  Metadata metadata_;
};

// The serialized header (8-byte length + JSON, padded with spaces to a multiple of 8) for tensors
// laid out back to back in the given order, and the byte buffer size it implies. Only names,
// dtypes and shapes are read: the views' data may be null.
struct SafetensorsLayout {
  std::string header;             // includes the 8-byte length prefix
  uint64_t data_bytes = 0;        // total of all tensors' bytes
  std::vector<uint64_t> offsets;  // per tensor, relative to the buffer start
};
Result<SafetensorsLayout> PlanSafetensors(const std::vector<TensorView>& tensors,
                                          const Metadata& metadata);

// Writes a complete file through internal::AtomicFile (a temporary name, fsync, rename over path,
// fsync of the directory).
// Readers never see a partial file; on any error the previous file at path is untouched.
Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                        const Metadata& metadata = {});

namespace internal {
class WorkerPool;
}

// The same bytes in memory (used for wire payloads). With a pool, bytes of a large file are
// faulted in and copied on `threads` threads (the caller and threads - 1 of the pool's workers,
// which should have nothing else queued); the bytes do not depend on it. `reuse`: a buffer whose
// capacity is written into instead of fresh memory (its old bytes are not kept).
Result<std::vector<uint8_t>> SerializeSafetensors(const std::vector<TensorView>& tensors,
                                                  const Metadata& metadata = {},
                                                  internal::WorkerPool* pool = nullptr,
                                                  unsigned threads = 1,
                                                  std::vector<uint8_t> reuse = {});

}  // namespace refit
