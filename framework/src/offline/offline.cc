// Offline deltas between checkpoint files (`refit diff` / `refit apply`).
#include "refit/offline.h"

#include <unistd.h>

#include <algorithm>
#include <map>

#include "common/file_util.h"
#include "common/stopwatch.h"
#include "format/model_file.h"
#include "plugins/encoding_cache.h"
#include "receive/apply.h"
#include "refit/kernels/diff.h"
#include "refit/receiver.h"
#include "refit/sender.h"
#include "send/auto_policy.h"
#include "send/encode_tensor_sets.h"

namespace refit {

using internal::Stopwatch;

uint64_t ModelDigest(const std::vector<TensorView>& tensors) {
  std::vector<const TensorView*> sorted;
  for (const TensorView& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorView* a, const TensorView* b) { return a->name < b->name; });
  kernels::DigestStream stream;
  for (const TensorView* t : sorted) {
    stream.Update(t->name.data(), t->name.size() + 0);
    stream.Update("\0", 1);
    std::string_view dtype = NameOf(t->dtype);
    stream.Update(dtype.data(), dtype.size());
    uint64_t ndim = t->shape.size();
    stream.Update(&ndim, sizeof(ndim));
    stream.Update(t->shape.data(), ndim * sizeof(uint64_t));
    uint64_t bits = kernels::Digest64(t->data, t->nbytes());
    stream.Update(&bits, sizeof(bits));
  }
  return stream.Final();
}

namespace {

// The bytes of a delta's encoded records: what apply's progress counts.
uint64_t RecordBytes(const Payload& delta) {
  uint64_t bytes = 0;
  for (const RecordHeader& r : delta.records()) bytes += r.data_end - r.data_begin;
  return bytes;
}

// `resolve`, reporting to `progress` (when set) the bytes of the records before each one resolved:
// records are resolved one at a time, in order, just before each is applied.
internal::TensorResolver ReportingResolver(internal::TensorResolver resolve, const Payload& delta,
                                           const ProgressFn& progress) {
  if (!progress) return resolve;
  return [resolve = std::move(resolve), progress, total = RecordBytes(delta),
          done = uint64_t{0}](const RecordHeader& record) mutable {
    progress(done, total);
    done += record.data_end - record.data_begin;
    return resolve(record);
  };
}

}  // namespace

Result<DiffStats> DiffFiles(const std::string& base_path, const std::string& new_path,
                            const std::string& out_path, const std::string& encoding,
                            const Registry& registry, const Config* config,
                            const ProgressFn& progress) {
  if (encoding != internal::kAutoEncoding &&
      registry.Find(REFIT_KIND_ENCODING, encoding) == nullptr) {
    std::string known = internal::kAutoEncoding;
    for (const ComponentInfo* c : registry.List()) {
      if (c->kind == REFIT_KIND_ENCODING) known += (known.empty() ? "" : ", ") + c->name;
    }
    return Status::NotFound("unknown encoding '" + encoding + "' (known: " + known + ")");
  }
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<SafetensorsFile> base, SafetensorsFile::Open(base_path));
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<SafetensorsFile> next, SafetensorsFile::Open(new_path));
  Metadata md = {{"refit.format", kDeltaFormat},
                 {"refit.base_digest", HexDigest(ModelDigest(base->tensors()))},
                 {"refit.new_digest", HexDigest(ModelDigest(next->tensors()))},
                 {"refit.tensors", SerializeTensorSpecs(internal::SpecsOf(next->tensors()))}};
  DeltaOptions options;
  options.encoding = encoding;
  DeltaEncodeStats encoded;
  REFIT_ASSIGN_OR_RAISE(std::vector<uint8_t> delta,
                        internal::EncodeTensorSets(base->tensors(), next->tensors(), options, md,
                                                   registry, config, &encoded, progress));
  REFIT_RETURN_NOT_OK(internal::WriteFileAtomic(
      out_path, std::string_view(reinterpret_cast<const char*>(delta.data()), delta.size())));
  DiffStats stats;
  stats.tensors = next->tensors().size();
  stats.counters = encoded.counters;
  stats.delta_bytes = delta.size();
  return stats;
}

Result<ApplyStats> ApplyFile(const std::string& base_path, const std::string& delta_path,
                             const std::string& out_path, const Registry& registry,
                             const Config* config, const ProgressFn& progress) {
  Stopwatch total;
  // The delta is parsed in place, never copied.
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<internal::MappedFile> delta_file,
                        internal::MappedFile::Open(delta_path));
  REFIT_ASSIGN_OR_RAISE(Payload delta,
                        Payload::Parse(delta_file->data(), delta_file->size(), delta_path));
  if (delta.MetadataOr("refit.format", "") != kDeltaFormat) {
    return Status::Corrupt(delta_path + ": not a refit delta (made by `refit diff`)");
  }
  REFIT_ASSIGN_OR_RAISE(uint64_t base_digest,
                        ParseHexDigest(delta.MetadataOr("refit.base_digest", "")));
  REFIT_ASSIGN_OR_RAISE(uint64_t new_digest,
                        ParseHexDigest(delta.MetadataOr("refit.new_digest", "")));
  REFIT_ASSIGN_OR_RAISE(std::vector<TensorSpec> specs,
                        ParseTensorSpecs(delta.MetadataOr("refit.tensors", "[]"), delta_path));

  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<SafetensorsFile> base, SafetensorsFile::Open(base_path));
  uint64_t have = ModelDigest(base->tensors());
  if (have != base_digest) {
    return Status::VersionMismatch(
        "wrong base: " + delta_path + " was made against a base with digest " +
        HexDigest(base_digest) + ", but " + base_path + " has digest " + HexDigest(have));
  }

  const std::string tmp = internal::TempPathFor(out_path);
  REFIT_RETURN_NOT_OK(internal::CreateModelFile(tmp, specs, base.get(), {}));
  base.reset();
  Status st;
  ApplyStats stats;
  {
    auto out = SafetensorsFile::Open(tmp, /*writable=*/true);
    st = out.status();
    if (st.ok()) {
      std::vector<TensorView> tensors = out.value()->tensors();
      std::map<std::string, TensorView*> by_name;
      for (TensorView& t : tensors) by_name[t.name] = &t;
      internal::EncodingCache encodings(registry, config);
      internal::ApplyScratch scratch;
      st = internal::ApplyPayload(
          delta, encodings,
          ReportingResolver(internal::CanonicalResolver(by_name), delta, progress), UINT64_MAX,
          scratch, &stats);
      if (st.ok() && progress) progress(RecordBytes(delta), RecordBytes(delta));
      if (st.ok() && ModelDigest(out.value()->tensors()) != new_digest) {
        st = Status::Corrupt(delta_path +
                             ": result does not match the digest of the new checkpoint");
      }
      if (st.ok()) st = out.value()->Sync();
    }
  }
  if (st.ok()) st = internal::ReplaceFile(tmp, out_path);
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  stats.payloads = 1;
  stats.payload_bytes = delta_file->size();
  stats.total_seconds = total.Seconds();
  return stats;
}

}  // namespace refit
