// Internal building blocks shared by the sender, the receiver and offline deltas.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "refit/box.h"
#include "refit/config.h"
#include "refit/delta.h"
#include "refit/pipeline.h"
#include "refit/registry.h"
#include "refit/safetensors.h"
#include "refit/wire.h"

namespace refit::internal {

// Bound on control objects read from a transport (manifests, commit markers, acks).
constexpr uint64_t kMaxControlBytes = 64ull << 20;

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double Seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

// The framework-level `auto` encoding (docs/config.md [encoding.auto]). It is not a plugin: a
// plugin cannot call other plugins, so the writer runs every candidate and keeps one per record.
constexpr const char* kAutoEncoding = "auto";

struct AutoPolicy {
  std::vector<const Encoding*> candidates;  // cheapest to apply first
  bool fastest = false;                     // mode "fastest" (else "smallest")
  double budget = 1.1;                      // "fastest": max size / smallest size
};

// The [encoding.auto] keys, for validation and `refit plugins` (names relative to the section).
std::vector<ConfigKeySpec> AutoConfigSpecs();

// Encodings by name, created on first use with their [encoding.<name>] config section.
class EncodingCache {
 public:
  EncodingCache(const Registry& registry, const Config* config)
      : registry_(registry), config_(config) {}
  Result<const Encoding*> Get(const std::string& name);
  // The [encoding.auto] policy with its candidates resolved (errors name the key).
  Result<const AutoPolicy*> Auto();

 private:
  const Registry& registry_;
  const Config* config_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<Encoding>> encodings_;
  std::mutex auto_mu_;
  std::unique_ptr<AutoPolicy> auto_;
};

// Default candidates of `auto`, cheapest to apply first; registered encodings not listed here
// follow in name order. dense is never a candidate: it is every record's fallback.
const std::vector<std::string>& AutoPreferredOrder();

// One slice to diff and encode: a box of a local tensor that maps onto a box (same extent) of a
// canonical tensor.
struct SliceSource {
  std::string tensor;  // canonical name
  DType dtype = DType::kU8;
  Shape canonical_shape;
  Shape canonical_offset;
  Shape local_shape;
  Box local_box;
  const uint8_t* new_bits = nullptr;  // local tensor base
  const uint8_t* old_bits = nullptr;  // local baseline base; null for a full sync
};

// A fixed set of worker threads running queued tasks in submission order of start.
class WorkerPool {
 public:
  explicit WorkerPool(unsigned threads);
  ~WorkerPool();  // finishes queued tasks, then joins
  void Submit(std::function<void()> task);

 private:
  void Run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::function<void()>> queue_;  // FIFO via head_
  size_t head_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// Diffs, encodes and packs records into size-capped payloads, handing each full payload to
// `flush`. Chunks are diffed and encoded on `threads` workers (0: hardware concurrency, 1: inline
// on the caller's thread) but appended in their original order and flushed on sizes alone, so the
// payload bytes do not depend on timing or the thread count. At most `threads` chunks (each with
// its positions and encoded scratch) are in flight.
//
// The bits an added slice points to must stay valid and unchanged until Finish() returns.
class DeltaWriter {
 public:
  using FlushFn = std::function<Status(std::vector<uint8_t>&& payload, uint64_t records)>;
  DeltaWriter(EncodingCache& encodings, std::string encoding, uint64_t chunk_bytes,
              uint64_t bucket_bytes, Metadata payload_metadata, FlushFn flush,
              unsigned threads = 0);
  ~DeltaWriter();  // waits for chunks still in flight (after an error)

  Status Add(const SliceSource& slice);
  Status Finish();  // waits for every chunk, flushes the last partial payload
  // Sizes the payload being built for about `bytes` up front (before the first Add): one
  // allocation instead of a chain of reallocations, each copying and faulting in fresh pages.
  void ReserveOutput(uint64_t bytes) {
    if (builder_.empty()) builder_.Reserve(bytes);
  }

  uint64_t total_elements = 0;
  uint64_t changed_elements = 0;
  uint64_t model_bytes = 0;
  uint64_t changed_bytes = 0;
  uint64_t records = 0;
  double diff_seconds = 0;    // summed over worker threads
  double encode_seconds = 0;  // summed over worker threads

  static unsigned ResolveThreads(int64_t configured);  // <= 0: hardware concurrency

 private:
  struct Slot;
  Status Prepare();
  void Compute(Slot& slot);   // diff + digest + encode (any thread)
  Status Commit(Slot& slot);  // append in order (caller's thread)
  Status WaitAndCommit(Slot& slot);
  Status DrainSlots();
  Status Flush();

  EncodingCache& encodings_;
  std::string encoding_;
  uint64_t chunk_bytes_;
  uint64_t bucket_bytes_;
  PayloadBuilder builder_;
  FlushFn flush_;
  unsigned threads_;
  bool prepared_ = false;
  const Encoding* dense_ = nullptr;
  const Encoding* single_ = nullptr;  // the configured encoding unless auto/dense
  const AutoPolicy* auto_ = nullptr;
  std::vector<std::unique_ptr<Slot>> slots_;
  size_t next_slot_ = 0;
  std::mutex slot_mu_;
  std::condition_variable slot_cv_;
  std::unique_ptr<WorkerPool> pool_;
};

// Puts payloads on a background thread: at most one being written while the next one is built.
class AsyncPutter {
 public:
  using PutFn = std::function<Status(const std::string& key, const std::vector<uint8_t>& bytes)>;
  explicit AsyncPutter(PutFn put);
  ~AsyncPutter();
  // Blocks until the writer is idle, then hands over the payload. Returns an earlier put's error.
  Status Submit(std::string key, std::vector<uint8_t>&& payload);
  // Waits for the last put; returns the first error.
  Status Drain();
  double wait_seconds() const { return wait_seconds_; }

 private:
  void Run();
  PutFn put_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string slot_key_;
  std::vector<uint8_t> slot_;
  bool has_work_ = false;
  bool busy_ = false;
  bool stop_ = false;
  Status error_;
  double wait_seconds_ = 0;
  std::thread thread_;
};

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

// Fault injection for crash tests: when the environment variable REFIT_KILL_AT names `point`
// ("point" or "point:N" for its N-th hit in this process), the process dies there at once
// (SIGKILL), as a crash would.
void MaybeKillAt(const char* point);

// Writes a new safetensors file laid out for `specs`, each tensor's bytes copied from `source`
// when it holds a tensor of the same name, dtype and shape, else zero. Not atomic: callers write
// to a temporary name and rename.
Status CreateModelFile(const std::string& path, const std::vector<TensorSpec>& specs,
                       const SafetensorsFile* source, Metadata metadata);

// The metadata key of the version a full copy (a receiver's model, a sender's pending baseline)
// or a payload holds.
inline constexpr char kVersionMetadataKey[] = "refit.version";
// Whether `file` says it holds `version`: how a process killed between renaming a full copy into
// place and saving its state learns which copy it has.
bool HoldsVersion(const SafetensorsFile& file, uint64_t version);

// Small control files (state json): tmp + fsync + rename.
Status WriteFileAtomic(const std::string& path, std::string_view contents);
Result<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes);
Status FsyncPath(const std::string& path);

std::vector<TensorSpec> SpecsOf(const std::vector<TensorView>& tensors);

// One payload taking `base` to `next` (whole tensors matched by name; new, retyped or reshaped
// tensors go dense) with the given payload metadata: EncodeDelta and `refit diff` share it.
Result<std::vector<uint8_t>> EncodeTensorSets(const std::vector<TensorView>& base,
                                              const std::vector<TensorView>& next,
                                              const DeltaOptions& options, Metadata metadata,
                                              const Registry& registry, const Config* config,
                                              DeltaEncodeStats* stats);

}  // namespace refit::internal
