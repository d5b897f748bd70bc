// The sender pipeline: baseline -> bitwise diff -> encode -> bucket -> transport -> manifest ->
// commit; the baseline advances only after every receiver acknowledged (DESIGN invariant 3).
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "engine.h"
#include "refit/kernels/diff.h"
#include "refit/pipeline.h"

namespace refit {

using internal::Stopwatch;
using json = nlohmann::json;

namespace {

Status MakeDirs(const std::string& path) {
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    partial = path.substr(0, pos);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      return Status::IoError("mkdir " + partial + ": " + std::strerror(errno));
    }
  }
  return Status::OK();
}

// One local slice: what the layout says a local tensor covers.
struct LocalSlice {
  std::string local_name;
  SliceMap map;
};

}  // namespace

struct Sender::Impl {
  Config config;
  std::shared_ptr<Registry> registry;
  std::unique_ptr<Transport> transport;
  std::unique_ptr<Layout> layout;
  std::unique_ptr<internal::EncodingCache> encodings;
  int rank = 0;
  int world = 1;
  std::string state_dir;
  std::string encoding;
  uint64_t bucket_bytes = 0;
  uint64_t chunk_bytes = 0;
  unsigned threads = 1;
  std::vector<std::string> receivers;
  double ack_timeout = 600;
  int64_t full_every = 0;
  int64_t poll_ms = 50;

  uint64_t baseline_version = 0;
  uint64_t published_version = 0;
  bool published_full = false;
  bool force_full = false;
  std::unique_ptr<SafetensorsFile> baseline;
  std::vector<Ack> acks;

  std::string StatePath() const { return state_dir + "/sender.r" + std::to_string(rank) + ".json"; }
  std::string BaselinePath() const {
    return state_dir + "/baseline.r" + std::to_string(rank) + ".safetensors";
  }
  std::string PendingPath() const {
    return state_dir + "/pending.r" + std::to_string(rank) + ".safetensors";
  }

  Status SaveState() {
    json j = {{"baseline_version", baseline_version},
              {"published_version", published_version},
              {"published_full", published_full},
              {"force_full", force_full}};
    return internal::WriteFileAtomic(StatePath(), j.dump(1));
  }

  Status LoadState() {
    auto text = internal::ReadSmallFile(StatePath(), 1 << 20);
    if (!text.ok()) {
      if (text.status().code() == StatusCode::kNotFound) return Status::OK();
      return text.status();
    }
    json j = json::parse(text.value(), nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j["baseline_version"].is_number_unsigned() ||
        !j["published_version"].is_number_unsigned()) {
      return Status::Corrupt(StatePath() +
                             ": unreadable sender state (remove the state_dir to "
                             "start over with a full sync)");
    }
    baseline_version = j["baseline_version"].get<uint64_t>();
    published_version = j["published_version"].get<uint64_t>();
    published_full = j.value("published_full", false);
    force_full = j.value("force_full", false);
    if (baseline_version > 0) {
      auto file = SafetensorsFile::Open(BaselinePath(), /*writable=*/true);
      if (!file.ok()) {
        // A lost baseline only costs a full sync; it never corrupts receivers.
        baseline_version = 0;
        force_full = true;
      } else {
        baseline = std::move(file).value();
      }
    }
    return Status::OK();
  }

  Result<std::vector<LocalSlice>> MapAll(const std::vector<TensorView>& tensors) {
    std::vector<LocalSlice> out;
    for (const TensorView& t : tensors) {
      refit_local_tensor_t local{};
      local.struct_size = sizeof(local);
      local.dtype = static_cast<int32_t>(t.dtype);
      local.name = t.name.c_str();
      if (t.shape.size() > REFIT_MAX_DIMS) {
        return Status::Unsupported("tensor '" + t.name + "' has more than 8 dims");
      }
      local.ndim = static_cast<uint32_t>(t.shape.size());
      for (size_t d = 0; d < t.shape.size(); ++d) local.shape[d] = t.shape[d];
      ASSIGN_OR_RAISE(std::vector<SliceMap> maps, layout->MapTensor(local));
      for (SliceMap& m : maps) {
        if (m.map.ndim != t.shape.size()) {
          return Status::Internal("layout '" + layout->name() + "' mapped '" + t.name +
                                  "' with a different rank");
        }
        if (m.map.replicated && m.map.owner_rank != rank) continue;  // another rank sends it
        out.push_back({t.name, std::move(m)});
      }
    }
    return out;
  }

  // An ack answers any version; a "need full" request answers only a delta (a receiver can
  // always apply a full sync, so for a full version we wait for its ack).
  bool AnswerPresent(const std::string& receiver, uint64_t version, bool* need_full) {
    auto ack = transport->Size(AckKey(receiver, version));
    if (ack.ok() && ack.value().has_value()) return true;
    if (published_full) return false;
    auto nf = transport->Size(NeedFullKey(receiver));
    if (nf.ok() && nf.value().has_value()) {
      *need_full = true;
      return true;
    }
    return false;
  }

  // Applies our own published delta (re-read from the transport, digest-verified) to the
  // baseline, or swaps in the pending full copy.
  Status AdvanceBaseline() {
    if (published_full) {
      baseline.reset();
      if (::rename(PendingPath().c_str(), BaselinePath().c_str()) != 0) {
        return Status::IoError("rename " + PendingPath() + ": " + std::strerror(errno));
      }
      RETURN_NOT_OK(internal::FsyncPath(state_dir));
      ASSIGN_OR_RAISE(baseline, SafetensorsFile::Open(BaselinePath(), /*writable=*/true));
    } else {
      if (baseline == nullptr) return Status::Internal("delta published without a baseline");
      ASSIGN_OR_RAISE(
          std::vector<uint8_t> mbytes,
          transport->GetAll(ManifestKey(published_version, rank), internal::kMaxControlBytes));
      ASSIGN_OR_RAISE(Manifest m, ParseManifest(mbytes.data(), mbytes.size(),
                                                ManifestKey(published_version, rank)));
      // Canonical record boxes back to local boxes through the same slice maps that made them.
      std::vector<TensorView> locals = baseline->tensors();
      std::map<std::string, TensorView*> by_name;
      for (TensorView& t : locals) by_name[t.name] = &t;
      ASSIGN_OR_RAISE(std::vector<LocalSlice> slices, MapAll(locals));
      std::multimap<std::string, const LocalSlice*> by_canonical;
      for (const LocalSlice& s : slices) by_canonical.emplace(s.map.canonical_name, &s);
      internal::TensorResolver resolve =
          [&](const RecordHeader& r) -> Result<internal::ApplyTarget> {
        auto range = by_canonical.equal_range(r.tensor);
        for (auto it = range.first; it != range.second; ++it) {
          const refit_slice_map_t& sm = it->second->map.map;
          bool inside = true;
          Box local;
          for (uint32_t d = 0; d < sm.ndim && inside; ++d) {
            inside = r.box_offset[d] >= sm.canonical_offset[d] &&
                     r.box_offset[d] + r.box_extent[d] <= sm.canonical_offset[d] + sm.extent[d];
            local.offset.push_back(r.box_offset[d] - sm.canonical_offset[d] + sm.local_offset[d]);
          }
          if (!inside || sm.ndim != r.box_offset.size()) continue;
          local.extent = r.box_extent;
          return internal::ApplyTarget{by_name[it->second->local_name], local};
        }
        return Status::NotFound("no local slice of '" + r.tensor + "' holds the record's box");
      };
      std::vector<uint8_t> scratch;
      for (const PayloadRef& p : m.payloads) {
        ASSIGN_OR_RAISE(std::vector<uint8_t> bytes, transport->GetAll(p.key, p.bytes));
        if (bytes.size() != p.bytes || kernels::Digest64(bytes.data(), bytes.size()) != p.xxh3) {
          return Status::Corrupt(p.key + ": payload changed after publishing");
        }
        ASSIGN_OR_RAISE(Payload payload, Payload::Parse(bytes.data(), bytes.size(), p.key));
        RETURN_NOT_OK(
            internal::ApplyPayload(payload, *encodings, resolve, UINT64_MAX, scratch, nullptr));
      }
      RETURN_NOT_OK(baseline->Sync());
    }
    baseline_version = published_version;
    return SaveState();
  }
};

Sender::Sender() : impl_(std::make_unique<Impl>()) {}
Sender::~Sender() = default;

Result<std::unique_ptr<Sender>> Sender::Make(const Config& config, int rank, int world) {
  std::unique_ptr<Sender> s(new Sender());
  Impl& m = *s->impl_;
  m.config = config;
  m.rank = rank;
  m.world = world;
  if (world < 1 || rank < 0 || rank >= world) {
    return Status::Invalid("rank " + std::to_string(rank) +
                           " is not in [0, world=" + std::to_string(world) + ")");
  }
  ASSIGN_OR_RAISE(m.registry, MakeRegistry(&m.config));
  RETURN_NOT_OK(ValidateConfig(m.config, *m.registry));
  ASSIGN_OR_RAISE(m.state_dir, m.config.RequireString("sender.state_dir"));
  ASSIGN_OR_RAISE(m.encoding, m.config.GetString("sender.encoding", internal::kAutoEncoding));
  ASSIGN_OR_RAISE(int64_t threads, m.config.GetInt("sender.threads", 0));
  m.threads = internal::DeltaWriter::ResolveThreads(threads);
  ASSIGN_OR_RAISE(m.bucket_bytes, m.config.GetSize("sender.bucket_bytes", 64ull << 20));
  ASSIGN_OR_RAISE(m.chunk_bytes, m.config.GetSize("sender.chunk_bytes", 16ull << 20));
  if (m.chunk_bytes > m.bucket_bytes) m.chunk_bytes = m.bucket_bytes;
  ASSIGN_OR_RAISE(m.receivers, m.config.GetStringList("sender.receivers", {}));
  ASSIGN_OR_RAISE(m.ack_timeout, m.config.GetDouble("sender.ack_timeout_s", 600));
  ASSIGN_OR_RAISE(m.full_every, m.config.GetInt("sender.full_every", 0));
  ASSIGN_OR_RAISE(m.poll_ms, m.config.GetInt("sender.poll_interval_ms", 50));
  ASSIGN_OR_RAISE(std::string transport, m.config.GetString("transport.name", "disk"));
  ASSIGN_OR_RAISE(m.transport, m.registry->CreateTransport(transport, REFIT_ROLE_SENDER,
                                                           "sender-r" + std::to_string(rank),
                                                           &m.config, "transport." + transport));
  ASSIGN_OR_RAISE(std::string layout, m.config.GetString("layout.name", "hf"));
  ASSIGN_OR_RAISE(m.layout,
                  m.registry->CreateLayout(layout, rank, world, &m.config, "layout." + layout));
  m.encodings = std::make_unique<internal::EncodingCache>(*m.registry, &m.config);
  RETURN_NOT_OK(MakeDirs(m.state_dir));
  RETURN_NOT_OK(m.LoadState());
  return s;
}

uint64_t Sender::baseline_version() const { return impl_->baseline_version; }
uint64_t Sender::published_version() const { return impl_->published_version; }
const std::vector<Ack>& Sender::acks() const { return impl_->acks; }

Status Sender::WaitAndAdvance(double timeout_seconds) {
  Impl& m = *impl_;
  if (m.published_version == m.baseline_version) return Status::OK();
  Stopwatch clock;
  std::set<std::string> pending(m.receivers.begin(), m.receivers.end());
  bool need_full = false;
  while (true) {
    for (auto it = pending.begin(); it != pending.end();) {
      it =
          m.AnswerPresent(*it, m.published_version, &need_full) ? pending.erase(it) : std::next(it);
    }
    if (pending.empty()) break;
    if (clock.Seconds() > timeout_seconds) {
      std::string names;
      for (const std::string& r : pending) names += (names.empty() ? "" : ", ") + r;
      return Status::Timeout("version " + std::to_string(m.published_version) +
                             " not acknowledged within " + std::to_string(timeout_seconds) +
                             " s by: " + names + " (baseline stays at version " +
                             std::to_string(m.baseline_version) + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(m.poll_ms));
  }
  m.acks.clear();
  for (const std::string& r : m.receivers) {
    auto bytes = m.transport->GetAll(AckKey(r, m.published_version), internal::kMaxControlBytes);
    if (!bytes.ok()) continue;  // answered with need-full instead
    auto ack = ParseAck(bytes.value().data(), bytes.value().size(), AckKey(r, m.published_version));
    if (ack.ok()) m.acks.push_back(ack.value());
  }
  if (need_full) m.force_full = true;
  return m.AdvanceBaseline();
}

Result<SyncStats> Sender::Publish(const std::vector<TensorView>& weights) {
  Impl& m = *impl_;
  Stopwatch total;
  SyncStats stats;
  {
    Stopwatch wait;
    RETURN_NOT_OK(WaitAndAdvance(m.ack_timeout));
    stats.wait_seconds = wait.Seconds();
  }
  const uint64_t version = m.published_version + 1;

  // Same tensor set as the baseline? Otherwise this is a new model: full sync.
  bool full = m.baseline == nullptr || m.force_full ||
              (m.full_every > 0 && version % static_cast<uint64_t>(m.full_every) == 0);
  std::map<std::string, const TensorView*> old_by_name;
  if (!full) {
    for (const TensorView& t : m.baseline->tensors()) old_by_name[t.name] = &t;
    if (old_by_name.size() != weights.size()) full = true;
    for (const TensorView& t : weights) {
      auto it = old_by_name.find(t.name);
      if (it == old_by_name.end() || it->second->dtype != t.dtype || it->second->shape != t.shape) {
        full = true;
      }
    }
  }

  ASSIGN_OR_RAISE(std::vector<LocalSlice> slices, m.MapAll(weights));
  std::map<std::string, const TensorView*> new_by_name;
  for (const TensorView& t : weights) new_by_name[t.name] = &t;

  Manifest manifest;
  manifest.version = version;
  if (!full) manifest.base_version = m.baseline_version;
  manifest.full = full;
  manifest.rank = m.rank;
  manifest.world = m.world;

  uint64_t seq = 0;
  std::vector<PayloadRef> refs;
  internal::AsyncPutter putter([&](const std::string& key, const std::vector<uint8_t>& bytes) {
    return m.transport->Put(key, bytes.data(), bytes.size());
  });
  Metadata md = {{"refit.format", kPayloadFormat},
                 {"refit.version", std::to_string(version)},
                 {"refit.rank", std::to_string(m.rank)}};
  internal::DeltaWriter writer(
      *m.encodings, m.encoding, m.chunk_bytes, m.bucket_bytes, md,
      [&](std::vector<uint8_t>&& payload, uint64_t records) -> Status {
        PayloadRef ref;
        ref.key = PayloadKey(version, m.rank, seq++);
        ref.bytes = payload.size();
        ref.xxh3 = kernels::Digest64(payload.data(), payload.size());
        ref.records = records;
        refs.push_back(ref);
        return putter.Submit(ref.key, std::move(payload));
      },
      m.threads);

  std::set<std::string> canonical_seen;
  for (const LocalSlice& s : slices) {
    const TensorView& t = *new_by_name[s.local_name];
    const refit_slice_map_t& sm = s.map.map;
    internal::SliceSource src;
    src.tensor = s.map.canonical_name;
    src.dtype = t.dtype;
    src.canonical_shape.assign(sm.canonical_shape, sm.canonical_shape + sm.ndim);
    src.canonical_offset.assign(sm.canonical_offset, sm.canonical_offset + sm.ndim);
    src.local_shape = t.shape;
    src.local_box.offset.assign(sm.local_offset, sm.local_offset + sm.ndim);
    src.local_box.extent.assign(sm.extent, sm.extent + sm.ndim);
    src.new_bits = t.bytes();
    src.old_bits = full ? nullptr : old_by_name[t.name]->bytes();
    if (full && canonical_seen.insert(src.tensor).second) {
      manifest.tensors.push_back({src.tensor, src.dtype, src.canonical_shape});
    }
    RETURN_NOT_OK(writer.Add(src));
  }
  RETURN_NOT_OK(writer.Finish());
  RETURN_NOT_OK(putter.Drain());
  stats.send_seconds = putter.wait_seconds();

  manifest.payloads = refs;
  manifest.total_elements = writer.total_elements;
  manifest.changed_elements = writer.changed_elements;
  manifest.model_bytes = writer.model_bytes;
  manifest.changed_bytes = writer.changed_bytes;
  for (const PayloadRef& r : refs) manifest.payload_bytes += r.bytes;
  std::string mtext = SerializeManifest(manifest);
  const std::string mkey = ManifestKey(version, m.rank);
  RETURN_NOT_OK(
      m.transport->Put(mkey, reinterpret_cast<const uint8_t*>(mtext.data()), mtext.size()));

  // Keep what we published so the baseline can advance to it once acknowledged.
  if (full)
    RETURN_NOT_OK(
        WriteSafetensors(m.PendingPath(), weights, {{"refit.version", std::to_string(version)}}));

  if (m.rank == 0) {
    // The commit marker is written last, once every rank's manifest exists.
    Commit commit;
    commit.version = version;
    commit.base_version = manifest.base_version;
    commit.full = full;
    commit.world = m.world;
    Stopwatch wait;
    for (int r = 0; r < m.world; ++r) {
      const std::string key = ManifestKey(version, r);
      std::vector<uint8_t> bytes;
      while (true) {
        auto got = m.transport->GetAll(key, internal::kMaxControlBytes);
        if (got.ok()) {
          bytes = std::move(got).value();
          break;
        }
        if (got.status().code() != StatusCode::kNotFound) return got.status();
        if (wait.Seconds() > m.ack_timeout) {
          return Status::Timeout("rank " + std::to_string(r) + " wrote no manifest for version " +
                                 std::to_string(version));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(m.poll_ms));
      }
      commit.manifests.push_back(
          {key, bytes.size(), kernels::Digest64(bytes.data(), bytes.size()), 0});
    }
    std::string ctext = SerializeCommit(commit);
    RETURN_NOT_OK(m.transport->Put(CommitKey(version),
                                   reinterpret_cast<const uint8_t*>(ctext.data()), ctext.size()));
  }
  m.published_version = version;
  m.published_full = full;
  m.force_full = false;
  RETURN_NOT_OK(m.SaveState());

  stats.version = version;
  stats.base_version = manifest.base_version;
  stats.full = full;
  stats.tensors = weights.size();
  stats.total_elements = writer.total_elements;
  stats.changed_elements = writer.changed_elements;
  stats.model_bytes = writer.model_bytes;
  stats.changed_bytes = writer.changed_bytes;
  stats.payload_bytes = manifest.payload_bytes;
  stats.records = writer.records;
  stats.payloads = refs.size();
  stats.diff_seconds = writer.diff_seconds;
  stats.encode_seconds = writer.encode_seconds;
  stats.total_seconds = total.Seconds();
  return stats;
}

}  // namespace refit
