#include "refit/delta.h"

#include <algorithm>
#include <map>
#include <memory>

#include "common/stopwatch.h"
#include "common/worker_pool.h"
#include "format/model_file.h"
#include "offline/delta_internal.h"
#include "receive/apply.h"
#include "send/delta_writer.h"
#include "send/encode_tensor_sets.h"

namespace refit {

namespace internal {

Result<std::vector<uint8_t>> EncodeTensorSets(const std::vector<TensorView>& base,
                                              const std::vector<TensorView>& next,
                                              const DeltaOptions& options, Metadata metadata,
                                              const Registry& registry, const Config* config,
                                              DeltaEncodeStats* stats, const ProgressFn& progress) {
  std::map<std::string, const TensorView*> base_by_name;
  for (const TensorView& t : base) base_by_name[t.name] = &t;
  EncodingCache encodings(registry, config);
  std::vector<uint8_t> out;
  Stopwatch clock;
  DeltaWriter writer(
      encodings, options.encoding, options.chunk_bytes, UINT64_MAX, metadata,
      [&](std::vector<uint8_t>&& payload, uint64_t) {
        out = std::move(payload);
        return Status::OK();
      },
      options.threads == 0 ? ResolveThreadCount(0) : options.threads);
  // One payload holds everything: its encoded records are staged in a buffer sized for a sparse
  // delta (typically a few percent of the model; a denser one grows it as needed). Dense
  // records are not staged: whole tensors are contiguous, so they borrow the tensors' bits.
  uint64_t model_bytes = 0;
  for (const TensorView& t : next) model_bytes += t.nbytes();
  writer.ReserveOutput(std::min<uint64_t>(model_bytes / 8, uint64_t{1} << 30));
  writer.ExpectBytes(model_bytes);
  uint64_t done = 0;
  for (const TensorView& t : next) {
    auto it = base_by_name.find(t.name);
    const bool same =
        it != base_by_name.end() && it->second->dtype == t.dtype && it->second->shape == t.shape;
    SliceSource src;
    src.tensor = t.name;
    src.dtype = t.dtype;
    src.canonical_shape = t.shape;
    src.canonical_offset.assign(t.shape.size(), 0);
    src.local_shape = t.shape;
    src.local_box = Box{Shape(t.shape.size(), 0), t.shape};
    src.new_bits = t.bytes();
    src.old_bits = same ? it->second->bytes() : nullptr;
    REFIT_RETURN_NOT_OK(writer.Add(src));
    if (progress) progress(done += t.nbytes(), model_bytes);
  }
  REFIT_RETURN_NOT_OK(writer.Finish());
  if (out.empty()) {
    // No change at all: still a valid payload with no records.
    PayloadBuilder empty(std::move(metadata));
    REFIT_ASSIGN_OR_RAISE(out, empty.Finish());
  }
  if (stats != nullptr) {
    stats->counters = writer.counters;
    stats->seconds = clock.Seconds();
  }
  return out;
}

}  // namespace internal

Result<std::vector<uint8_t>> EncodeDelta(const std::vector<TensorView>& base,
                                         const std::vector<TensorView>& next,
                                         const DeltaOptions& options, const Registry& registry,
                                         const Config* config, DeltaEncodeStats* stats) {
  return internal::EncodeTensorSets(base, next, options, Metadata{{"refit.format", kPayloadFormat}},
                                    registry, config, stats);
}

Result<ApplyStats> ApplyDelta(const std::vector<uint8_t>& payload,
                              const std::vector<TensorView>& tensors, const Registry& registry,
                              const Config* config) {
  return internal::ApplyDeltaOnThreads(payload, tensors, registry, config, 1);
}

namespace internal {

Result<ApplyStats> ApplyDeltaOnThreads(const std::vector<uint8_t>& payload,
                                       const std::vector<TensorView>& tensors,
                                       const Registry& registry, const Config* config,
                                       unsigned threads) {
  Stopwatch clock;
  REFIT_ASSIGN_OR_RAISE(Payload parsed, Payload::Parse(payload.data(), payload.size(), "delta"));
  std::map<std::string, TensorView*> by_name;
  std::vector<TensorView> views = tensors;  // the resolver wants mutable pointers to views
  for (TensorView& t : views) by_name[t.name] = &t;
  EncodingCache encodings(registry, config);
  ApplyStats stats;
  ApplyScratch scratch;
  ApplySink sink;
  std::unique_ptr<WorkerPool> pool;
  threads = ResolveThreadCount(threads);
  if (threads > 1) {
    pool = std::make_unique<WorkerPool>(threads - 1);  // the caller applies too
    sink.pool = pool.get();
    sink.threads = threads;
  }
  REFIT_RETURN_NOT_OK(ApplyPayload(parsed, encodings, CanonicalResolver(std::move(by_name)),
                                   UINT64_MAX, scratch, &stats, &sink));
  stats.payloads = 1;
  stats.payload_bytes = payload.size();
  stats.apply_seconds = clock.Seconds();
  stats.total_seconds = stats.apply_seconds;
  return stats;
}

Result<uint64_t> SenderChunkBytes(const Config& config) {
  REFIT_ASSIGN_OR_RAISE(uint64_t bucket_bytes, config.GetSize("sender.bucket_bytes", 64ull << 20));
  REFIT_ASSIGN_OR_RAISE(uint64_t chunk_bytes,
                        config.GetSize("sender.chunk_bytes", DeltaOptions().chunk_bytes));
  return std::min(chunk_bytes, bucket_bytes);
}

}  // namespace internal

}  // namespace refit
