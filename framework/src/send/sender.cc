// The sender pipeline: baseline -> bitwise diff -> encode -> bucket -> transport -> manifest ->
// commit; the baseline advances only after every receiver acknowledged (invariant 3,
// docs/architecture.md).
#include "refit/sender.h"

#include <algorithm>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>
#include <thread>

#include "common/crypto.h"
#include "common/file_util.h"
#include "common/state_json.h"
#include "common/stopwatch.h"
#include "faults/faults.h"
#include "format/model_file.h"
#include "link/link.h"
#include "offline/delta_internal.h"
#include "plugins/encoding_cache.h"
#include "plugins/layout_map.h"
#include "protocol/auth.h"
#include "protocol/verified_io.h"
#include "receive/apply.h"
#include "receive/journal.h"
#include "refit/kernels/diff.h"
#include "refit/log.h"
#include "refit/offline.h"
#include "refit/receiver.h"
#include "send/async_putter.h"
#include "send/auto_policy.h"
#include "send/delta_writer.h"
#include "send/retention.h"

namespace refit {

using internal::LocalSlice;
using internal::MakeDirs;
using internal::Stopwatch;
using json = nlohmann::json;

namespace {

// The slice of a local tensor the writer diffs: its new bits, its old ones (null for a full
// sync) and where it sits in the canonical tensor.
internal::SliceSource SliceSourceOf(const LocalSlice& s, const TensorView& t,
                                    const TensorView* old) {
  const refit_slice_map_t& sm = s.map.map;
  internal::SliceSource src;
  src.tensor = s.map.canonical_name;
  src.local_tensor = s.local_name;
  src.dtype = t.dtype;
  src.canonical_shape.assign(sm.canonical_shape, sm.canonical_shape + sm.ndim);
  src.canonical_offset.assign(sm.canonical_offset, sm.canonical_offset + sm.ndim);
  src.local_shape = t.shape;
  src.local_box.offset.assign(sm.local_offset, sm.local_offset + sm.ndim);
  src.local_box.extent.assign(sm.extent, sm.extent + sm.ndim);
  src.new_bits = t.bytes();
  src.old_bits = old != nullptr ? old->bytes() : nullptr;
  return src;
}

// Staged pending changes written at once. 64 MiB left 9-98 ms of writes (25 MB per version of
// a 1 GB model at 1.5% density) after the last record, on the way to the commit; 4 MiB, 2-20 ms.
constexpr uint64_t kPendingFlushBytes = 4ull << 20;

// Pending changes held in memory for the next diff to write (RedoOverlay) up to this many bytes
// of log entries (~25 MB per version of a 1 GB model at 1.5% density); more are replayed first.
constexpr uint64_t kMaxDeferredAdvanceBytes = 512ull << 20;

// Appends each record's changes of a delta to the baseline's redo log, past its committed size
// (ids `prefix` + a counter), written but not synced.
internal::DeltaWriter::ChangesFn PendingChangesSink(internal::RedoLog* log, const char* prefix) {
  return [log, prefix, entries = uint64_t{0}](const internal::SliceSource& src, const Box& box,
                                              const uint64_t* positions, uint64_t count,
                                              const uint8_t* values) mutable -> Status {
    REFIT_RETURN_NOT_OK(log->Stage(prefix + std::to_string(entries++), src.local_tensor, box,
                                   SizeOf(src.dtype), positions, count, values));
    // Written in small pieces as the diff goes: the changes of a version are not all held in
    // memory, and what is left to write once the last record is encoded (before the commit,
    // FinishPendingChanges) stays a few MiB.
    return log->staged_bytes() > kPendingFlushBytes ? log->Flush(/*sync=*/false) : Status::OK();
  };
}

// What retention calls between its removals: the payload handed over meanwhile is put. (A
// lambda in Sender::Impl would export its typeinfo from librefit.so.)
std::function<void()> PutWaitingOf(internal::AsyncPutter& putter) {
  return [&putter] { putter.PutWaiting(); };
}

// Adds a slice to the writer, cut into pieces at the receivers' shard boundaries when `cuts`
// has some for its tensor (so each record lands in one receiver shard).
Status AddCutSlice(internal::DeltaWriter& writer, const internal::SliceSource& src,
                   const internal::ShardCuts* cuts) {
  auto cut = cuts != nullptr ? cuts->find(src.tensor) : internal::ShardCuts::const_iterator();
  if (cuts == nullptr || cut == cuts->end()) return writer.Add(src);
  // Cut in canonical coordinates, then back to local ones (same extent).
  Box canonical_box{src.canonical_offset, src.local_box.extent};
  for (const Box& piece : internal::CutBox(canonical_box, cut->second)) {
    internal::SliceSource part = src;
    part.canonical_offset = piece.offset;
    part.local_box.extent = piece.extent;
    for (size_t d = 0; d < piece.offset.size(); ++d) {
      part.local_box.offset[d] += piece.offset[d] - src.canonical_offset[d];
    }
    REFIT_RETURN_NOT_OK(writer.Add(part));
  }
  return Status::OK();
}

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
  uint64_t stream_bytes = 0;  // sender.stream_bytes: flush a payload per this much of the model
  unsigned threads = 1;
  // Lent to every version's DeltaWriter: its threads and scratch are faulted in once.
  internal::DeltaWriter::Workspace writer_workspace;
  std::vector<std::string> receivers;
  double ack_timeout = 600;
  int64_t full_every = 0;
  uint64_t keep_versions = 3;  // committed versions kept on the transport; 0: all (retention.h)
  int64_t poll_ms = 50;
  // Read every object back after putting it: a commit is written only once every object it
  // names is verified in storage (a put may report success and store nothing, or other bytes).
  bool verify_puts = true;
  // Mode "pp": ranks are gathered in stages of stage_ranks consecutive ranks; a stage's members
  // publish into a node-local staging transport, and its leader (the stage's first rank) forwards
  // their deltas with its own. Mode "tp": every rank publishes to the transport itself.
  bool pp_mode = false;
  int stage_ranks = 1;
  std::unique_ptr<Transport> stage;  // pp members and leaders: the node-local staging area
  Transport* out = nullptr;          // where this rank's payloads and manifest go
  bool IsStageLeader() const { return !pp_mode || rank % stage_ranks == 0; }
  std::string receiver_layout;  // empty: receivers hold canonical tensors
  int receiver_world = 1;
  internal::ShardCuts cuts;
  std::optional<std::set<std::string>> cuts_for;

  ProgressFn progress;  // SetProgress: reported from DiffSlices

  uint64_t baseline_version = 0;
  // The baseline file's redo log, open while there is a baseline; `log_bytes` its size after the
  // last completed advance (what lies past it is an interrupted one).
  std::unique_ptr<internal::RedoLog> redo;
  uint64_t log_bytes = 0;
  internal::CheckpointPolicy checkpoint;
  uint64_t published_version = 0;
  bool published_full = false;
  bool force_full = false;
  std::unique_ptr<SafetensorsFile> baseline;
  uint64_t advances_in_process = 0;  // from the second on, the baseline is read in place
  std::vector<Ack> acks;
  uint64_t advance_resumed_entries = 0;  // of the last baseline advance
  double advance_seconds = 0;            // of the last baseline advance
  // An advance left to the next version's diff (Publish): the pending changes it writes into the
  // baseline as it reads it, and the log's size once the advance is complete (its marker's end).
  bool may_defer_advance = false;
  std::unique_ptr<internal::RedoOverlay> deferred_advance;
  uint64_t deferred_log_bytes = 0;
  // With a key, manifests and commits are signed and name their objects' SHA-256.
  std::optional<std::string> auth_key;
  // Rank 0: SHA-256 of the COMMIT of published_version, the `prev` of the next commit.
  std::string commit_sha256;
  // This rank's manifest of version manifest_version (its attempt at published_version + 1, or
  // published_version): a COMMIT found at the next version number is ours only if it names this
  // manifest; one planted there is never adopted.
  uint64_t manifest_version = 0;
  std::string manifest_sha256;
  // No state file was found: this sender never published from this state_dir.
  bool no_state = false;
  // Another rank's copy of the published commit's SHA-256 (PublishedCommitSha256).
  uint64_t read_commit_version = 0;
  std::string read_commit_sha256;

  std::string StatePath() const { return state_dir + "/sender.r" + std::to_string(rank) + ".json"; }
  std::string BaselinePath() const {
    return state_dir + "/baseline.r" + std::to_string(rank) + ".safetensors";
  }
  std::string PendingPath() const {
    return state_dir + "/pending.r" + std::to_string(rank) + ".safetensors";
  }

  Status PutChecked(Transport& t, const std::string& key, const uint8_t* data, uint64_t len) {
    return verify_puts ? internal::PutVerified(t, key, data, len) : t.Put(key, data, len);
  }

  Status SaveState() {
    json j = {{"baseline_version", baseline_version},
              {"published_version", published_version},
              {"published_full", published_full},
              {"force_full", force_full}};
    if (!commit_sha256.empty()) j["commit_sha256"] = commit_sha256;
    if (log_bytes != 0) j["log_bytes"] = log_bytes;
    if (manifest_version != 0) {
      j["manifest_version"] = manifest_version;
      j["manifest_sha256"] = manifest_sha256;
    }
    return internal::WriteFileAtomic(StatePath(), j.dump(1));
  }

  Status LoadState() {
    auto text = internal::ReadSmallFile(StatePath(), 1 << 20);
    if (!text.ok()) {
      if (text.status().code() == StatusCode::kNotFound) {
        no_state = true;
        return Status::OK();
      }
      return text.status();
    }
    REFIT_ASSIGN_OR_RAISE(json j, internal::ParseStateObject(text.value(), StatePath()));
    if (!j.contains("baseline_version") || !j.contains("published_version")) {
      return Status::Corrupt(StatePath() +
                             ": unreadable sender state (remove the state_dir to "
                             "start over with a full sync)");
    }
    const std::string path = StatePath();
    REFIT_RETURN_NOT_OK(internal::ReadStateField(j, path, "baseline_version", &baseline_version));
    REFIT_RETURN_NOT_OK(internal::ReadStateField(j, path, "published_version", &published_version));
    REFIT_RETURN_NOT_OK(internal::ReadStateField(j, path, "published_full", &published_full));
    REFIT_RETURN_NOT_OK(internal::ReadStateField(j, path, "force_full", &force_full));
    REFIT_RETURN_NOT_OK(internal::ReadStateField(j, path, "commit_sha256", &commit_sha256));
    REFIT_RETURN_NOT_OK(internal::ReadStateField(j, path, "manifest_version", &manifest_version));
    REFIT_RETURN_NOT_OK(internal::ReadStateField(j, path, "manifest_sha256", &manifest_sha256));
    REFIT_RETURN_NOT_OK(internal::ReadStateField(j, path, "log_bytes", &log_bytes));
    if (baseline_version > 0) {
      auto file = SafetensorsFile::Open(BaselinePath(), /*writable=*/true);
      if (!file.ok()) {
        // A lost baseline only costs a full sync; it never corrupts receivers.
        baseline_version = 0;
        force_full = true;
      } else {
        baseline = std::move(file).value();
        REFIT_RETURN_NOT_OK(OpenLog());
      }
    }
    return Status::OK();
  }

  // The baseline's redo log (receive/journal.h): entries written before a reboot are replayed
  // (the baseline's pages since the last checkpoint may not have reached the disk).
  Status OpenLog() {
    redo.reset();
    REFIT_ASSIGN_OR_RAISE(redo, internal::OpenRedoLog(AdvanceLogPath(), /*durable=*/true, log_bytes,
                                                      baseline->tensors()));
    return Status::OK();
  }

  // The baseline file is synced and its log emptied every checkpoint.versions versions or once
  // the log holds checkpoint.bytes (default: the baseline's size).
  Status MaybeCheckpoint() {
    if (redo == nullptr || baseline == nullptr) return Status::OK();
    REFIT_ASSIGN_OR_RAISE(bool done,
                          internal::CheckpointIfDue(*redo, baseline_version, baseline->file_size(),
                                                    checkpoint, internal::CheckpointWhen::kDue,
                                                    [&] { return baseline->Sync(); }));
    if (!done) return Status::OK();
    log_bytes = redo->bytes();
    return SaveState();
  }

  // The slices this rank sends (a replicated slice is sent by its owner rank only).
  Result<std::vector<LocalSlice>> MapAll(const std::vector<TensorView>& tensors) {
    REFIT_ASSIGN_OR_RAISE(std::vector<LocalSlice> all,
                          internal::MapLocalTensors(*layout, internal::SpecsOf(tensors)));
    std::vector<LocalSlice> out;
    for (LocalSlice& s : all) {
      if (s.map.map.replicated && s.map.map.owner_rank != rank) continue;
      out.push_back(std::move(s));
    }
    return out;
  }

  // Records never straddle a receiver shard: with sender.receiver_layout set, slices are cut at
  // the receivers' shard boundaries (computed once per canonical tensor set).
  Result<const internal::ShardCuts*> Cuts(const std::vector<LocalSlice>& slices,
                                          const std::map<std::string, const TensorView*>& locals) {
    if (receiver_layout.empty()) return nullptr;
    std::vector<TensorSpec> canonical;
    std::set<std::string> seen;
    for (const LocalSlice& s : slices) {
      if (!seen.insert(s.map.canonical_name).second) continue;
      const refit_slice_map_t& sm = s.map.map;
      canonical.push_back({s.map.canonical_name, locals.at(s.local_name)->dtype,
                           Shape(sm.canonical_shape, sm.canonical_shape + sm.ndim)});
    }
    if (!cuts_for || *cuts_for != seen) {
      REFIT_ASSIGN_OR_RAISE(cuts, internal::ReceiverShardCuts(*registry, &config, receiver_layout,
                                                              receiver_world, canonical));
      cuts_for = seen;
    }
    return &cuts;
  }

  // A pp stage leader forwards its members' manifests and payloads (deltas, or their shards
  // on a full sync) from the staging area, each verified against its manifest, to the transport.
  Status ForwardStage(uint64_t version) {
    Stopwatch wait;
    for (int member = rank + 1; member < rank + stage_ranks && member < world; ++member) {
      const std::string key = ManifestKey(version, member);
      std::vector<uint8_t> mbytes;
      while (true) {
        auto got = stage->GetAll(key, internal::kMaxControlBytes);
        if (got.ok()) {
          mbytes = std::move(got).value();
          break;
        }
        if (got.status().code() != StatusCode::kNotFound) return got.status();
        if (wait.Seconds() > ack_timeout) {
          return Status::Timeout("stage member rank " + std::to_string(member) +
                                 " staged no manifest for version " + std::to_string(version));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
      }
      REFIT_ASSIGN_OR_RAISE(Manifest staged, ParseManifest(mbytes.data(), mbytes.size(), key));
      if (staged.version != version || staged.rank != member) {
        return Status::Corrupt(key + ": staged manifest names another version or rank");
      }
      for (const PayloadRef& p : staged.payloads) {
        REFIT_ASSIGN_OR_RAISE(std::vector<uint8_t> bytes, stage->GetAll(p.key, p.bytes));
        if (bytes.size() != p.bytes || kernels::Digest64(bytes.data(), bytes.size()) != p.xxh3) {
          return Status::Corrupt(p.key + ": staged payload differs from its manifest");
        }
        REFIT_RETURN_NOT_OK(PutChecked(*transport, p.key, bytes.data(), bytes.size()));
      }
      REFIT_RETURN_NOT_OK(PutChecked(*transport, key, mbytes.data(), mbytes.size()));
    }
    return Status::OK();
  }

  // Rank 0: the commit marker of `version`, once every rank's manifest exists (waits for them).
  Result<std::string> BuildCommit(uint64_t version) {
    Commit commit;
    commit.version = version;
    commit.full = true;
    commit.world = world;
    std::optional<uint64_t> delta_base;
    Stopwatch wait;
    for (int r = 0; r < world; ++r) {
      const std::string key = ManifestKey(version, r);
      std::vector<uint8_t> bytes;
      while (true) {
        auto got = internal::GetStable(*transport, key, internal::kMaxControlBytes);
        if (got.ok()) {
          bytes = std::move(got).value();
          break;
        }
        if (got.status().code() != StatusCode::kNotFound) return got.status();
        if (wait.Seconds() > ack_timeout) {
          return Status::Timeout("rank " + std::to_string(r) + " wrote no manifest for version " +
                                 std::to_string(version));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
      }
      REFIT_ASSIGN_OR_RAISE(Manifest rm, ParseManifest(bytes.data(), bytes.size(), key));
      if (rm.version != version) {
        return Status::Corrupt(key + ": names version " + std::to_string(rm.version));
      }
      // Ranks decide full vs delta on their own (a rank that lost its baseline goes full): the
      // version is full only when every rank's part is, and every delta part must share a base.
      commit.full = commit.full && rm.full;
      if (!rm.full) {
        if (delta_base && rm.base_version != delta_base) {
          return Status::Internal("version " + std::to_string(version) +
                                  ": ranks diffed against different base versions");
        }
        delta_base = rm.base_version;
      }
      PayloadRef ref{key, bytes.size(), kernels::Digest64(bytes.data(), bytes.size()), 0, ""};
      if (auth_key) ref.sha256 = internal::Sha256Hex(bytes.data(), bytes.size());
      commit.manifests.push_back(std::move(ref));
    }
    commit.base_version = commit.full ? std::nullopt : delta_base;
    REFIT_ASSIGN_OR_RAISE(commit.prev, PrevCommitSha256(version));
    if (auth_key) internal::SignCommit(*auth_key, &commit);
    return SerializeCommit(commit);
  }

  // The chain link of `version`'s commit: the SHA-256 of the commit before it, as published.
  Result<std::string> PrevCommitSha256(uint64_t version) {
    if (version <= 1) return std::string();
    if (published_version == version - 1 && !commit_sha256.empty()) return commit_sha256;
    // A state written before the chain existed: the stored commit is the one published.
    auto bytes =
        internal::GetStable(*transport, CommitKey(version - 1), internal::kMaxControlBytes);
    if (!bytes.ok()) {
      if (bytes.status().code() == StatusCode::kNotFound) return std::string();
      return bytes.status();
    }
    return internal::Sha256Hex(bytes.value().data(), bytes.value().size());
  }

  // Whether this rank's stored manifest of `version` is the one it put (not one planted).
  Result<bool> OwnManifestStored(uint64_t version) {
    if (manifest_version != version || manifest_sha256.empty()) return false;
    auto bytes = internal::GetStable(*out, ManifestKey(version, rank), internal::kMaxControlBytes);
    if (!bytes.ok()) {
      if (bytes.status().code() == StatusCode::kNotFound) return false;
      return bytes.status();
    }
    return internal::Sha256Hex(bytes.value().data(), bytes.value().size()) == manifest_sha256;
  }

  // A sender without state (a new or lost state_dir) over a transport that already holds
  // committed versions: its numbering goes on after the newest of them, with a full sync chained
  // to it. Starting again at version 1 would give old version numbers a second meaning:
  // receivers that took the old ones would follow the old history and never answer the new.
  Status ContinueAfterStoredVersions() {
    if (!no_state) return Status::OK();
    no_state = false;
    REFIT_ASSIGN_OR_RAISE(std::vector<uint64_t> stored, internal::ListCommits(*transport, 0));
    if (stored.empty()) return Status::OK();
    const uint64_t newest = stored.front();
    Log(LogLevel::kWarn, "sender",
        "no sender state in " + state_dir + " but the transport holds versions up to " +
            std::to_string(newest) + ": publishing version " + std::to_string(newest + 1) +
            " as a full sync");
    // Kept in memory: the publish's own state saves record it, and a kill before them skips again.
    published_version = baseline_version = newest;
    force_full = true;
    return Status::OK();
  }

  // An earlier attempt at version published_version+1 died (killed, or a put failed) before this
  // rank's state said it was published. If its commit is out there, the version is committed:
  // adopt it (rank 0 first rewrites a commit that does not read back as it should). Otherwise no
  // receiver can have seen it: remove this rank's leftovers, and the version number is reused.
  Status RecoverUnfinished(SyncStats* stats) {
    const uint64_t version = published_version + 1;
    REFIT_ASSIGN_OR_RAISE(std::optional<uint64_t> commit_size, transport->Size(CommitKey(version)));
    bool committed = commit_size.has_value();
    if (committed) {
      // A commit that names a manifest this rank never put was planted: not ours to adopt.
      REFIT_ASSIGN_OR_RAISE(bool own, OwnManifestStored(version));
      if (!own) {
        if (rank == 0) REFIT_RETURN_NOT_OK(transport->Remove(CommitKey(version)));
        committed = false;
      }
    }
    if (!committed) {
      const std::string mine = VersionDir(version) + "/payload.r" + std::to_string(rank) + ".";
      const std::string manifest = ManifestKey(version, rank);
      REFIT_ASSIGN_OR_RAISE(auto stale, out->List(VersionDir(version) + "/"));
      for (const auto& entry : stale) {
        if (entry.first.compare(0, mine.size(), mine) != 0 && entry.first != manifest) continue;
        REFIT_RETURN_NOT_OK(out->Remove(entry.first));
        stats->republished = true;
      }
      return Status::OK();
    }
    if (rank == 0) {
      REFIT_ASSIGN_OR_RAISE(std::string expected, BuildCommit(version));
      auto stored = internal::GetStable(*transport, CommitKey(version), internal::kMaxControlBytes);
      if (!stored.ok() || std::string(stored.value().begin(), stored.value().end()) != expected) {
        REFIT_RETURN_NOT_OK(PutChecked(*transport, CommitKey(version),
                                       reinterpret_cast<const uint8_t*>(expected.data()),
                                       expected.size()));
      }
    }
    REFIT_ASSIGN_OR_RAISE(
        std::vector<uint8_t> mbytes,
        internal::GetStable(*out, ManifestKey(version, rank), internal::kMaxControlBytes));
    REFIT_ASSIGN_OR_RAISE(Manifest mine,
                          ParseManifest(mbytes.data(), mbytes.size(), ManifestKey(version, rank)));
    published_version = version;
    published_full = mine.full;
    force_full = false;
    if (rank == 0) {
      REFIT_ASSIGN_OR_RAISE(
          std::vector<uint8_t> cbytes,
          internal::GetStable(*transport, CommitKey(version), internal::kMaxControlBytes));
      commit_sha256 = internal::Sha256Hex(cbytes.data(), cbytes.size());
    }
    REFIT_RETURN_NOT_OK(SaveState());
    stats->adopted_commit = true;
    return Status::OK();
  }

  // The SHA-256 of the published commit of `version`, which its acks must name: rank 0 wrote it;
  // another rank reads it from the transport once (rank 0 stores it after every rank's
  // manifest, and receivers ack only after reading it). Empty when unknown: not checked.
  std::string PublishedCommitSha256(uint64_t version) {
    if (version != published_version) return "";
    if (!commit_sha256.empty()) return commit_sha256;  // rank 0
    if (read_commit_version != version) {
      Result<std::string> stored = PrevCommitSha256(version + 1);  // the commit of `version`
      if (!stored.ok() || stored.value().empty()) return "";
      read_commit_sha256 = stored.value();
      read_commit_version = version;
    }
    return read_commit_sha256;
  }

  // An ack answers any version; a "need full" request answers only a delta (a receiver can
  // always apply a full sync, so for a full version we wait for its ack).
  bool AnswerPresent(const std::string& receiver, uint64_t version, bool* need_full) {
    if (internal::ReadValidAck(*transport, receiver, version, PublishedCommitSha256(version)))
      return true;
    auto request = internal::GetStable(*transport, NeedFullKey(receiver), 1 << 20);
    if (!request.ok()) return false;
    // A receiver can apply any honest full sync, so a full version is answered by a request
    // only when the request says that this very version failed to apply (it was abandoned).
    if (published_full) {
      json j = json::parse(request.value().begin(), request.value().end(), nullptr, false);
      auto failed = j.is_object() ? j.find("abandoned") : j.end();
      if (failed == j.end() || !failed->is_number_unsigned() ||
          failed->get<uint64_t>() != version) {
        return false;
      }
    }
    *need_full = true;
    return true;
  }

  std::string AdvanceLogPath() const {
    return state_dir + "/baseline.r" + std::to_string(rank) + ".redo.log";
  }
  // The changes of a published delta, from the diff that made it, wait in the baseline's redo
  // log past its committed size (`log_bytes`), written but not synced, closed by a marker naming
  // the version: the baseline advances by them once the version is acknowledged (no decode of
  // our own payloads, no copy). Ids of those entries, of the marker and of the advance's start.
  static constexpr char kPendingPrefix[] = "pending#";
  static std::string PendingEndId(uint64_t version) {
    return "pending#end.v" + std::to_string(version);
  }
  static std::string AdvanceId(uint64_t version) { return "advance.v" + std::to_string(version); }

  // Drops the redo log's entries past its committed size (`log_bytes`; a log never committed
  // keeps only its header).
  Status DropUncommitted() {
    return redo->TruncateTo(std::max(log_bytes, internal::RedoLog::HeaderBytes()));
  }

  // Closes the pending changes of `version` with its marker, written (not synced: their
  // writeback is started once the version is committed, StartPendingWriteback).
  Status FinishPendingChanges(uint64_t version) {
    REFIT_RETURN_NOT_OK(redo->Stage(PendingEndId(version), "", Box{}, 1, nullptr, 0, nullptr));
    return redo->Flush(/*sync=*/false);
  }

  // Starts writing the pending changes to disk so that the advance's sync finds little left.
  // After the commit, not before: submitting a version's log (tens of MB for 1 GB of model)
  // blocks for 5-25 ms, which receivers would wait for.
  void StartPendingWriteback() { redo->StartWriteback(); }

  // Advances the baseline by the pending changes: a marker of the advance and everything before
  // it synced, then the changes written into the file (a kill after the sync replays them). In
  // Publish, they are left to the next version's diff when they suit an overlay and no
  // checkpoint is due (a checkpoint empties the log, which then still holds the next version's
  // pending changes): each chunk of the baseline is advanced as the diff reads it, so the
  // baseline is read once per version, not twice.
  Status AdvanceFromPending() {
    const std::string started = AdvanceId(published_version);
    const bool resumed = redo->Has(started);
    if (resumed) {
      // Killed mid advance (maybe before its sync returned): synced again, replayed again. What
      // follows the marker is the next version's pending changes from a diff that advanced the
      // baseline as it read it: dropped, that version is diffed again.
      advance_resumed_entries = redo->interrupted_entries();
      REFIT_ASSIGN_OR_RAISE(const uint64_t marker_end, redo->EndOfEntry(started, log_bytes));
      REFIT_RETURN_NOT_OK(redo->TruncateTo(marker_end));
      REFIT_RETURN_NOT_OK(redo->Sync());
    } else {
      REFIT_RETURN_NOT_OK(redo->Stage(started, "", Box{}, 1, nullptr, 0, nullptr));
      REFIT_RETURN_NOT_OK(redo->Flush());
    }
    internal::MaybeKillAt("sender.advance");
    if (!resumed) {
      REFIT_ASSIGN_OR_RAISE(deferred_advance, LoadDeferrable());
      if (deferred_advance != nullptr) {
        deferred_log_bytes = redo->bytes();
        return Status::OK();
      }
    }
    // One version's records: disjoint, replayed on the sender's threads.
    return internal::ReplayInto(*redo, baseline->tensors(), log_bytes, UINT64_MAX,
                                std::max(1u, threads));
  }

  // The pending changes as an overlay for the next diff, or null: not in Publish, a checkpoint
  // due once advanced, or changes that do not suit one (receive/journal.h).
  Result<std::unique_ptr<internal::RedoOverlay>> LoadDeferrable() {
    if (!may_defer_advance ||
        internal::CheckpointDue(*redo, published_version, baseline->file_size(), checkpoint)) {
      return std::unique_ptr<internal::RedoOverlay>();
    }
    return internal::RedoOverlay::Load(*redo, log_bytes, redo->bytes(), baseline->tensors(),
                                       kMaxDeferredAdvanceBytes);
  }

  // Completes an advance left to the diff: what the diff did not read is written now, and the
  // baseline holds the published version. The log keeps the next version's pending changes,
  // written since, past its new committed size.
  Status FinishDeferredAdvance() {
    if (deferred_advance == nullptr) return Status::OK();
    REFIT_RETURN_NOT_OK(deferred_advance->ApplyRest());
    deferred_advance.reset();
    baseline_version = published_version;
    log_bytes = deferred_log_bytes;
    return SaveState();
  }

  // The baseline is not advanced to the published version (a receiver asked for a full sync, or
  // what this rank published was changed in storage): it is dropped and the next version is a
  // full sync, which replaces it once acknowledged. `tampered`: what was found changed.
  Status DropBaseline(const std::string& tampered) {
    if (!tampered.empty()) {
      Log(LogLevel::kWarn, "sender",
          tampered + " (the sync directory was tampered with); the next version is a full sync");
    }
    baseline.reset();
    baseline_version = 0;
    force_full = true;
    redo.reset();
    ::unlink(AdvanceLogPath().c_str());
    log_bytes = 0;
    return SaveState();
  }

  // Rank 0: the stored commit of the published version is still the one this sender wrote. One
  // changed in storage is what receivers walked through: the next version chains to it (so every
  // receiver can take it) and is a full sync (so whatever was forged is replaced).
  Status CheckOwnCommit() {
    if (rank != 0 || published_version == 0 || commit_sha256.empty()) return Status::OK();
    auto bytes =
        internal::GetStable(*transport, CommitKey(published_version), internal::kMaxControlBytes);
    if (!bytes.ok()) {
      return bytes.status().code() == StatusCode::kNotFound ? Status::OK() : bytes.status();
    }
    const std::string stored = internal::Sha256Hex(bytes.value().data(), bytes.value().size());
    if (stored == commit_sha256) return Status::OK();
    Log(LogLevel::kWarn, "sender",
        CommitKey(published_version) +
            " differs from the commit this sender wrote (the sync directory was tampered with); "
            "the next version is a full sync");
    commit_sha256 = stored;
    force_full = true;
    return SaveState();
  }

  // `auto` mode link measures its candidates on this machine once per process (calibrate.h):
  // here, so that a long-lived sender pays for it when it starts, not in its first delta's
  // publish (tens of milliseconds, each of its receivers waiting). Other dtypes are measured
  // when their first record comes (DeltaWriter::Prepare measures bf16 for one-shot writers).
  Status CalibrateLinkMode() {
    if (encoding != internal::kAutoEncoding) return Status::OK();
    REFIT_ASSIGN_OR_RAISE(const internal::AutoPolicy* policy, encodings->Auto());
    if (policy->mode != internal::AutoMode::kLink) return Status::OK();
    Stopwatch clock;
    REFIT_RETURN_NOT_OK(policy->Costs(DType::kBF16).status());
    Log(LogLevel::kDebug, "sender",
        "auto mode link: bf16 costs of " + std::to_string(policy->candidates.size()) +
            " encodings measured in " + std::to_string(static_cast<int>(clock.Seconds() * 1e3)) +
            " ms");
    return Status::OK();
  }

  // A process that advanced its baseline twice publishes version after version (a trainer's
  // sender): the baseline's mapping is populated once, and each later diff reads it in place
  // rather than copying it out with pread (MappedFile::PopulateForReading, once per file).
  // `refit send`, one version a process, never gets here.
  void WarmBaseline() {
    if (baseline == nullptr || ++advances_in_process < 2) return;
    if (Status st = baseline->PopulateForReading(); !st.ok()) {
      Log(LogLevel::kWarn, "sender", st.message() + " (the baseline is read with pread)");
    }
  }

  // Applies our own published delta (re-read from the transport, digest-verified) to the
  // baseline, or swaps in the pending full copy.
  Status AdvanceBaseline() {
    if (published_full) {
      baseline.reset();
      if (Status moved = internal::ReplaceFile(PendingPath(), BaselinePath()); !moved.ok()) {
        // Killed after the rename, before the state said so: the baseline is the full copy.
        auto current = SafetensorsFile::Open(BaselinePath(), /*writable=*/true);
        if (moved.code() != StatusCode::kNotFound || !current.ok() ||
            !internal::HoldsVersion(*current.value(), published_version)) {
          return moved;
        }
        REFIT_RETURN_NOT_OK(internal::FsyncPath(state_dir));
      }
      internal::MaybeKillAt("sender.advance");
      REFIT_ASSIGN_OR_RAISE(baseline, SafetensorsFile::Open(BaselinePath(), /*writable=*/true));
      // The full copy was synced when written: the log of the baseline it replaced is emptied.
      if (redo == nullptr) {
        log_bytes = 0;
        REFIT_RETURN_NOT_OK(OpenLog());
      }
      REFIT_RETURN_NOT_OK(redo->Checkpoint(published_version));
      log_bytes = redo->bytes();
    } else {
      return AdvanceDelta();
    }
    baseline_version = published_version;
    return SaveState();
  }

  // Advances the baseline by our own published delta once every receiver acknowledged it: by the
  // pending changes the diff recorded, else (lost to a crash) by decoding our payloads. Either
  // way each payload is re-read and checked against what this rank published.
  Status AdvanceDelta() {
    if (baseline == nullptr) return Status::Internal("delta published without a baseline");
    REFIT_ASSIGN_OR_RAISE(std::vector<uint8_t> mbytes,
                          internal::GetStable(*out, ManifestKey(published_version, rank),
                                              internal::kMaxControlBytes));
    if (manifest_version == published_version && !manifest_sha256.empty() &&
        internal::Sha256Hex(mbytes.data(), mbytes.size()) != manifest_sha256) {
      return DropBaseline(ManifestKey(published_version, rank) +
                          " differs from the manifest this rank published");
    }
    REFIT_ASSIGN_OR_RAISE(Manifest m, ParseManifest(mbytes.data(), mbytes.size(),
                                                    ManifestKey(published_version, rank)));
    if (redo == nullptr) REFIT_RETURN_NOT_OK(OpenLog());
    // The pending changes are whole when their marker is there; cut short (or lost to a power
    // cut: they were not synced) the baseline was not touched yet (an advance syncs them before
    // any write) and they are dropped: the advance decodes our payloads instead.
    const bool pending = redo->Has(PendingEndId(published_version));
    if (!pending && redo->HasIdWithPrefix(kPendingPrefix)) REFIT_RETURN_NOT_OK(DropUncommitted());
    internal::TensorResolver resolve;
    std::vector<TensorView> locals;  // what the resolver points into
    if (!pending) {
      // Canonical record boxes back to local boxes through the same slice maps that made them.
      locals = baseline->tensors();
      std::map<std::string, TensorView*> by_name;
      for (TensorView& t : locals) by_name[t.name] = &t;
      REFIT_ASSIGN_OR_RAISE(std::vector<LocalSlice> slices, MapAll(locals));
      resolve = internal::SliceResolver(std::move(slices), std::move(by_name),
                                        /*skip_foreign=*/false);
      // Entries past the size of the last completed advance are an interrupted one: replayed,
      // their records skipped.
      advance_resumed_entries = redo->interrupted_entries();
      if (redo->bytes() > log_bytes)
        REFIT_RETURN_NOT_OK(internal::ReplayInto(*redo, baseline->tensors(), log_bytes));
    }
    internal::ApplyScratch scratch;
    std::vector<uint8_t> bytes;
    for (const PayloadRef& p : m.payloads) {
      REFIT_RETURN_NOT_OK(internal::GetVerified(*out, p.key, p.bytes, p.xxh3, bytes)
                              .WithContext("advancing the baseline to version " +
                                           std::to_string(published_version)));
      if (!p.sha256.empty() && internal::Sha256Hex(bytes.data(), bytes.size()) != p.sha256) {
        return DropBaseline(p.key + " differs from the payload this rank published");
      }
      if (pending) continue;
      REFIT_ASSIGN_OR_RAISE(Payload payload, Payload::Parse(bytes.data(), bytes.size(), p.key));
      internal::ApplySink sink;
      sink.journal = redo.get();
      REFIT_RETURN_NOT_OK(internal::ApplyPayload(payload, *encodings, resolve, UINT64_MAX, scratch,
                                                 nullptr, &sink));
      internal::MaybeKillAt("sender.advance");
    }
    if (pending) {
      REFIT_RETURN_NOT_OK(AdvanceFromPending());
      if (deferred_advance != nullptr)
        return Status::OK();  // FinishDeferredAdvance, after the diff
    }
    baseline_version = published_version;
    log_bytes = redo->bytes();
    REFIT_RETURN_NOT_OK(SaveState());
    redo->MarkCommitted();
    return MaybeCheckpoint();
  }

  // A delta's changes go to the baseline's redo log as the writer finds them, after whatever an
  // earlier attempt left past its committed size (dropped). Whether it tracks them (not for a
  // full sync).
  Result<bool> TrackChanges(bool full, internal::DeltaWriter& writer) {
    if (full) return false;
    if (redo == nullptr) REFIT_RETURN_NOT_OK(OpenLog());
    // An advance left to this diff ends the log now (its pending changes must stay).
    if (deferred_advance == nullptr) REFIT_RETURN_NOT_OK(DropUncommitted());
    writer.SetOldBitsOverlay(deferred_advance.get());
    writer.SetChangesSink(PendingChangesSink(redo.get(), kPendingPrefix));
    return true;
  }

  // Publish's steps (defined here, in the class, so they stay hidden in librefit.so).

  // Publish's wait for the acks: the advance may be left to the diff that follows. (One left by
  // a publish that failed is dropped here: the next advance finds its marker and replays it.)
  Status WaitAndAdvanceBeforeDiff(Sender& sender) {
    deferred_advance.reset();
    may_defer_advance = true;
    Status waited = sender.WaitAndAdvance(ack_timeout);
    may_defer_advance = false;
    return waited;
  }

  // This rank's manifest of `version`, its payloads still to come.
  Manifest NewManifest(uint64_t version, bool full) const {
    Manifest manifest;
    manifest.version = version;
    // A delta is on the published version: the baseline holds it, or will once the diff has
    // written the advance left to it.
    if (!full) manifest.base_version = deferred_advance ? published_version : baseline_version;
    manifest.full = full;
    manifest.rank = rank;
    manifest.world = world;
    return manifest;
  }

  // Whether this version is a full sync (no baseline, one was asked for, or the tensor set
  // changed); fills old_by_name with the baseline's tensors.
  bool NeedsFull(uint64_t version, const std::vector<TensorView>& weights,
                 std::map<std::string, const TensorView*>* old_by_name) const {
    if (baseline == nullptr || force_full ||
        (full_every > 0 && version % static_cast<uint64_t>(full_every) == 0)) {
      return true;
    }
    // Same tensor set as the baseline? Otherwise this is a new model: full sync.
    for (const TensorView& t : baseline->tensors()) (*old_by_name)[t.name] = &t;
    bool full = old_by_name->size() != weights.size();
    for (const TensorView& t : weights) {
      auto it = old_by_name->find(t.name);
      if (it == old_by_name->end() || it->second->dtype != t.dtype ||
          it->second->shape != t.shape) {
        full = true;
      }
    }
    return full;
  }

  // Hands every local slice of `weights` to the writer; a full sync lists its tensors in the
  // manifest.
  Status DiffSlices(const std::vector<TensorView>& weights, bool full,
                    const std::map<std::string, const TensorView*>& old_by_name,
                    internal::DeltaWriter& writer, Manifest* manifest) {
    REFIT_ASSIGN_OR_RAISE(std::vector<LocalSlice> slices, MapAll(weights));
    std::map<std::string, const TensorView*> new_by_name;
    for (const TensorView& t : weights) new_by_name[t.name] = &t;
    REFIT_ASSIGN_OR_RAISE(const internal::ShardCuts* cuts, Cuts(slices, new_by_name));
    std::set<std::string> canonical_seen;
    // Progress in bytes of the local weights the slices cover.
    auto slice_bytes = [&](const LocalSlice& s) {
      uint64_t n = SizeOf(new_by_name[s.local_name]->dtype);
      for (uint32_t d = 0; d < s.map.map.ndim; ++d) n *= s.map.map.extent[d];
      return n;
    };
    uint64_t done = 0, total = 0;
    for (const LocalSlice& s : slices) total += slice_bytes(s);
    writer.ExpectBytes(total);  // a small model is diffed on fewer threads
    for (const LocalSlice& s : slices) {
      const TensorView& t = *new_by_name[s.local_name];
      const internal::SliceSource src =
          SliceSourceOf(s, t, full ? nullptr : old_by_name.find(t.name)->second);
      if (full && canonical_seen.insert(src.tensor).second) {
        manifest->tensors.push_back({src.tensor, src.dtype, src.canonical_shape});
      }
      REFIT_RETURN_NOT_OK(AddCutSlice(writer, src, cuts));
      if (progress) progress(done += slice_bytes(s), total);
    }
    return Status::OK();
  }

  // A full sync's copy of the weights, the baseline once every receiver acknowledged it.
  Status WritePendingCopy(const std::vector<TensorView>& weights, uint64_t version) const {
    return WriteSafetensors(PendingPath(), weights,
                            {{internal::kVersionMetadataKey, std::to_string(version)}});
  }

  // WritePendingCopy on a thread of its own: the write and sync (seconds on a large model,
  // mostly waiting on the disk) run beside the encode and the puts, not before the commit.
  std::future<Status> StartPendingCopy(const std::vector<TensorView>& weights, uint64_t version) {
    const auto write = [this, &weights, version] { return WritePendingCopy(weights, version); };
    try {
      return std::async(std::launch::async, write);
    } catch (const std::system_error&) {  // no thread to be had: written at the commit
      return std::async(std::launch::deferred, write);
    }
  }

  // Writes the manifest, forwards a pp stage, waits for a full sync's pending copy of the
  // weights (`pending_copy`, written while its payloads were encoded and put), writes the commit
  // marker on rank 0 and records the version as published.
  Status PutManifestAndCommit(Manifest manifest, bool full, std::future<Status>& pending_copy) {
    const uint64_t version = manifest.version;
    if (auth_key) internal::SignManifest(*auth_key, &manifest);
    std::string mtext = SerializeManifest(manifest);
    const std::string mkey = ManifestKey(version, rank);
    // Recorded before the put: a commit found at this version later is ours only if it is this.
    manifest_version = version;
    manifest_sha256 = internal::Sha256Hex(mtext);
    REFIT_RETURN_NOT_OK(SaveState());
    REFIT_RETURN_NOT_OK(
        PutChecked(*out, mkey, reinterpret_cast<const uint8_t*>(mtext.data()), mtext.size()));
    internal::MaybeKillAt("sender.manifest_put");
    if (pp_mode && IsStageLeader()) REFIT_RETURN_NOT_OK(ForwardStage(version));

    // Keep what we published so the baseline can advance to it once acknowledged.
    if (full) REFIT_RETURN_NOT_OK(pending_copy.get());

    if (rank == 0) {
      // The commit marker is written last, once every rank's manifest exists.
      REFIT_ASSIGN_OR_RAISE(std::string ctext, BuildCommit(version));
      REFIT_RETURN_NOT_OK(PutChecked(*transport, CommitKey(version),
                                     reinterpret_cast<const uint8_t*>(ctext.data()), ctext.size()));
      internal::MaybeKillAt("sender.commit_put");
      commit_sha256 = internal::Sha256Hex(ctext);
    }
    published_version = version;
    published_full = full;
    force_full = false;
    return SaveState();
  }

  // Rank 0, once every receiver answered the newest version: versions beyond the window go
  // (send/retention.h). Cleanup never stalls training: a failure is a warning (OK is returned),
  // and the next publish tries again.
  // On the payload writer's thread: payloads handed over meanwhile are put between its removals.
  Status Retain(internal::AsyncPutter& putter) {
    auto retained = internal::ApplyRetention(*transport, published_version, keep_versions,
                                             PutWaitingOf(putter));
    if (!retained.ok()) {
      Log(LogLevel::kWarn, "sender",
          "retention: " + retained.status().message() + " (retried at the next publish)");
    }
    return Status::OK();
  }

  // Before a version's diff: an unfinished publish recovered, the previous version's acks waited
  // for (its advance done, or left to the diff).
  Status BeforeDiff(Sender& sender, SyncStats* stats) {
    Stopwatch wait;
    REFIT_RETURN_NOT_OK(RecoverUnfinished(stats));
    advance_resumed_entries = 0;
    advance_seconds = 0;
    REFIT_RETURN_NOT_OK(WaitAndAdvanceBeforeDiff(sender));
    REFIT_RETURN_NOT_OK(CheckOwnCommit());
    stats->advance_resumed_entries = advance_resumed_entries;
    stats->advance_seconds = advance_seconds;
    stats->wait_seconds = wait.Seconds() - advance_seconds;
    return Status::OK();
  }

  // The [sender] keys (docs/config.md), each checked where it is read.
  Status ReadOptions() {
    REFIT_ASSIGN_OR_RAISE(state_dir, config.RequireString("sender.state_dir"));
    REFIT_ASSIGN_OR_RAISE(encoding, config.GetString("sender.encoding", internal::kAutoEncoding));
    REFIT_ASSIGN_OR_RAISE(int64_t configured_threads, config.GetInt("sender.threads", 0));
    threads = internal::ResolveThreadCount(configured_threads);
    REFIT_ASSIGN_OR_RAISE(bucket_bytes, config.GetSize("sender.bucket_bytes", 64ull << 20));
    REFIT_ASSIGN_OR_RAISE(chunk_bytes, internal::SenderChunkBytes(config));
    REFIT_ASSIGN_OR_RAISE(stream_bytes, config.GetSize("sender.stream_bytes", 128ull << 20));
    REFIT_ASSIGN_OR_RAISE(receivers, config.GetStringList("sender.receivers", {}));
    REFIT_ASSIGN_OR_RAISE(ack_timeout, config.GetDouble("sender.ack_timeout_s", 600));
    REFIT_ASSIGN_OR_RAISE(int64_t versions, config.GetInt("sender.checkpoint_versions", 8));
    checkpoint.versions = static_cast<uint64_t>(std::max<int64_t>(1, versions));
    REFIT_ASSIGN_OR_RAISE(checkpoint.bytes, config.GetSize("sender.checkpoint_bytes", 0));
    REFIT_ASSIGN_OR_RAISE(full_every, config.GetInt("sender.full_every", 0));
    REFIT_ASSIGN_OR_RAISE(int64_t keep, config.GetInt("sender.keep_versions", 3));
    keep_versions = static_cast<uint64_t>(keep);
    REFIT_ASSIGN_OR_RAISE(poll_ms, config.GetInt("sender.poll_interval_ms", 50));
    REFIT_ASSIGN_OR_RAISE(std::string mode, config.GetString("sender.mode", "tp"));
    if (mode != "tp" && mode != "pp") {
      return Status::Invalid(config.Where("sender.mode") +
                             ": sender.mode must be \"tp\" or "
                             "\"pp\", got \"" +
                             mode + "\"");
    }
    pp_mode = mode == "pp";
    REFIT_ASSIGN_OR_RAISE(int64_t configured_stage_ranks, config.GetInt("sender.stage_ranks", 1));
    if (configured_stage_ranks < 1 || configured_stage_ranks > world) {
      return Status::Invalid(config.Where("sender.stage_ranks") + ": sender.stage_ranks " +
                             std::to_string(configured_stage_ranks) +
                             " is not in [1, world=" + std::to_string(world) + "]");
    }
    stage_ranks = static_cast<int>(configured_stage_ranks);
    REFIT_ASSIGN_OR_RAISE(receiver_layout, config.GetString("sender.receiver_layout", ""));
    REFIT_ASSIGN_OR_RAISE(int64_t configured_receiver_world,
                          config.GetInt("sender.receiver_world", 1));
    if (configured_receiver_world < 1 || configured_receiver_world > 1 << 20) {
      return Status::Invalid(config.Where("sender.receiver_world") +
                             ": sender.receiver_world must be in [1, 2^20]");
    }
    receiver_world = static_cast<int>(configured_receiver_world);
    if (!receiver_layout.empty() && registry->Find(REFIT_KIND_LAYOUT, receiver_layout) == nullptr) {
      return Status::Invalid(config.Where("sender.receiver_layout") + ": unknown layout '" +
                             receiver_layout + "'");
    }
    return Status::OK();
  }

  // pp mode: the stage's non-leader ranks put their parts through a node-local staging transport.
  Status OpenStage() {
    REFIT_ASSIGN_OR_RAISE(std::string stage_dir, config.RequireString("sender.stage_dir"));
    REFIT_ASSIGN_OR_RAISE(std::string stage_transport,
                          config.GetString("sender.stage_transport", "disk"));
    const ComponentInfo* stage_info = registry->Find(REFIT_KIND_TRANSPORT, stage_transport);
    if (stage_info == nullptr) {
      return Status::Invalid(config.Where("sender.stage_transport") +
                             ": sender.stage_transport: unknown transport '" + stage_transport +
                             "'");
    }
    // Staged parts are rewritten by the next version anyway: a transport that can skip fsync
    // is told to.
    bool has_fsync = false;
    for (const ConfigKeySpec& key : stage_info->config_keys) has_fsync |= key.name == "fsync";
    const std::string stage_section = "transport." + stage_transport;
    REFIT_ASSIGN_OR_RAISE(
        Config stage_config,
        Config::FromString("[" + stage_section + "]\ndir = " + json(stage_dir).dump() + "\n" +
                               (has_fsync ? "fsync = false\n" : ""),
                           "sender.stage_dir"));
    REFIT_ASSIGN_OR_RAISE(stage, registry->CreateTransport(stage_transport, REFIT_ROLE_SENDER,
                                                           "stage-r" + std::to_string(rank),
                                                           &stage_config, stage_section));
    if (!IsStageLeader()) out = stage.get();
    return Status::OK();
  }
};

Sender::Sender() : impl_(std::make_unique<Impl>()) {}
Sender::~Sender() = default;

Result<std::unique_ptr<Sender>> Sender::Make(const Config& config, int rank, int world,
                                             std::shared_ptr<Registry> registry) {
  std::unique_ptr<Sender> s(new Sender());
  Impl& m = *s->impl_;
  m.config = config;
  m.rank = rank;
  m.world = world;
  if (world < 1 || rank < 0 || rank >= world) {
    return Status::Invalid("rank " + std::to_string(rank) +
                           " is not in [0, world=" + std::to_string(world) + ")");
  }
  m.registry = std::move(registry);
  if (m.registry == nullptr) {
    REFIT_ASSIGN_OR_RAISE(m.registry, LoadRegistry(&m.config));
  }
  REFIT_RETURN_NOT_OK(ValidateConfig(m.config, *m.registry));
  REFIT_RETURN_NOT_OK(m.ReadOptions());
  REFIT_ASSIGN_OR_RAISE(m.verify_puts, m.config.GetBool("sender.verify_puts", true));
  REFIT_ASSIGN_OR_RAISE(m.auth_key, internal::LoadAuthKey(m.config));
  REFIT_ASSIGN_OR_RAISE(
      m.transport, internal::CreateConfiguredTransport(*m.registry, m.config, REFIT_ROLE_SENDER,
                                                       "sender-r" + std::to_string(rank)));
  m.out = m.transport.get();
  if (m.pp_mode && m.stage_ranks > 1) {
    REFIT_RETURN_NOT_OK(m.OpenStage());
  } else {
    m.pp_mode = false;  // stages of one rank: every rank is its own leader
  }
  REFIT_ASSIGN_OR_RAISE(std::string layout, m.config.GetString("layout.name", "hf"));
  REFIT_ASSIGN_OR_RAISE(
      m.layout, m.registry->CreateLayout(layout, rank, world, &m.config, "layout." + layout));
  m.encodings = std::make_unique<internal::EncodingCache>(*m.registry, &m.config);
  REFIT_RETURN_NOT_OK(m.CalibrateLinkMode());
  REFIT_RETURN_NOT_OK(MakeDirs(m.state_dir));
  REFIT_RETURN_NOT_OK(m.LoadState());
  REFIT_RETURN_NOT_OK(m.ContinueAfterStoredVersions());
  return s;
}

uint64_t Sender::baseline_version() const { return impl_->baseline_version; }
uint64_t Sender::published_version() const { return impl_->published_version; }
const std::vector<Ack>& Sender::acks() const { return impl_->acks; }

std::vector<std::string> Sender::Unanswered() {
  Impl& m = *impl_;
  std::vector<std::string> out;
  if (m.published_version == m.baseline_version) return out;
  bool need_full = false;
  for (const std::string& r : m.receivers) {
    if (!m.AnswerPresent(r, m.published_version, &need_full)) out.push_back(r);
  }
  return out;
}

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
    // Woken when a receiver's ack arrives (ucx), else after poll_ms (never past the timeout).
    const double left_ms = 1000 * (timeout_seconds - clock.Seconds()) + 1;
    const double wait_ms = std::clamp<double>(left_ms, 1, static_cast<double>(m.poll_ms));
    REFIT_RETURN_NOT_OK(m.transport->Wait(static_cast<uint32_t>(wait_ms)).status());
  }
  m.acks.clear();
  for (const std::string& r : m.receivers) {
    std::optional<Ack> ack = internal::ReadValidAck(*m.transport, r, m.published_version,
                                                    m.PublishedCommitSha256(m.published_version));
    if (ack) m.acks.push_back(std::move(*ack));  // else answered with need-full instead
  }
  // A need-full request makes the next version full: it needs no baseline, so this one is not
  // advanced (nor read back) at all.
  Stopwatch advance;
  REFIT_RETURN_NOT_OK(need_full ? m.DropBaseline("") : m.AdvanceBaseline());
  m.WarmBaseline();
  m.advance_seconds = advance.Seconds();
  if (m.out != m.transport.get()) {
    // A pp stage member's staged parts of this version were forwarded (before the commit) and
    // are now in the baseline: the node-local staging area keeps nothing older.
    // Only this rank's objects: a node's stages may share one staging directory.
    const std::string payloads =
        VersionDir(m.published_version) + "/payload.r" + std::to_string(m.rank) + ".";
    REFIT_ASSIGN_OR_RAISE(auto staged, m.out->List(payloads));
    for (const auto& entry : staged) REFIT_RETURN_NOT_OK(m.out->Remove(entry.first));
    REFIT_RETURN_NOT_OK(m.out->Remove(ManifestKey(m.published_version, m.rank)));
  }
  return Status::OK();
}

void Sender::SetProgress(ProgressFn fn) { impl_->progress = std::move(fn); }

Result<SyncStats> Sender::Publish(const std::vector<TensorView>& weights) {
  Impl& m = *impl_;
  Stopwatch total;
  SyncStats stats;
  // Payloads are put on a background thread while the writer encodes the next one.
  internal::AsyncPutter putter([&](const std::string& key, const std::vector<uint8_t>& bytes) {
    Status st = m.PutChecked(*m.out, key, bytes.data(), bytes.size());
    if (st.ok()) internal::MaybeKillAt("sender.payload_put");
    return st;
  });
  REFIT_RETURN_NOT_OK(m.BeforeDiff(*this, &stats));
  // Retention's deletes (a full sync's payloads: a second or more on a large model) run while
  // the diff does.
  if (m.rank == 0) putter.RunFirst([&m, &putter] { return m.Retain(putter); });
  const uint64_t version = m.published_version + 1;
  std::map<std::string, const TensorView*> old_by_name;
  const bool full = m.NeedsFull(version, weights, &old_by_name);
  if (full) REFIT_RETURN_NOT_OK(m.FinishDeferredAdvance());  // a full sync reads no baseline
  // Every return below waits for the full copy (the future's destructor): `weights` outlive it.
  std::future<Status> pending_copy;
  if (full) pending_copy = m.StartPendingCopy(weights, version);

  Manifest manifest = m.NewManifest(version, full);

  Metadata md = {{"refit.format", kPayloadFormat},
                 {internal::kVersionMetadataKey, std::to_string(version)},
                 {"refit.rank", std::to_string(m.rank)}};
  internal::DeltaWriter writer(
      *m.encodings, m.encoding, m.chunk_bytes, m.bucket_bytes, md,
      [&](std::vector<uint8_t>&& payload, uint64_t records) -> Status {
        PayloadRef ref;
        ref.key = PayloadKey(version, m.rank, manifest.payloads.size());
        ref.bytes = payload.size();
        ref.xxh3 = kernels::Digest64(payload.data(), payload.size());
        ref.records = records;
        if (m.auth_key) ref.sha256 = internal::Sha256Hex(payload.data(), payload.size());
        manifest.payloads.push_back(ref);
        manifest.payload_bytes += ref.bytes;
        return putter.Submit(ref.key, std::move(payload));
      },
      m.threads, &m.writer_workspace);
  writer.SetStreamBytes(m.stream_bytes);
  writer.SetSpareBuffers([&putter] { return putter.TakeSpare(); });
  // A delta's changes are kept as they are diffed: the baseline advances by them once acked.
  REFIT_ASSIGN_OR_RAISE(const bool tracked, m.TrackChanges(full, writer));
  REFIT_RETURN_NOT_OK(m.DiffSlices(weights, full, old_by_name, writer, &manifest));
  REFIT_RETURN_NOT_OK(writer.Finish());
  stats.advanced_in_diff = m.deferred_advance != nullptr;
  REFIT_RETURN_NOT_OK(m.FinishDeferredAdvance());
  if (tracked) REFIT_RETURN_NOT_OK(m.FinishPendingChanges(version));
  REFIT_RETURN_NOT_OK(putter.Drain());
  stats.send_seconds = putter.wait_seconds();

  manifest.total_elements = writer.counters.total_elements;
  manifest.changed_elements = writer.counters.changed_elements;
  manifest.model_bytes = writer.counters.model_bytes;
  manifest.changed_bytes = writer.counters.changed_bytes;
  Stopwatch commit;
  REFIT_RETURN_NOT_OK(m.PutManifestAndCommit(manifest, full, pending_copy));
  stats.commit_seconds = commit.Seconds();
  if (tracked) m.StartPendingWriteback();

  stats.version = version;
  stats.base_version = manifest.base_version;
  stats.full = full;
  stats.tensors = weights.size();
  stats.counters = writer.counters;
  stats.payload_bytes = manifest.payload_bytes;
  stats.payloads = manifest.payloads.size();
  stats.diff_seconds = writer.diff_seconds;
  stats.encode_seconds = writer.encode_seconds;
  stats.total_seconds = total.Seconds();
  return stats;
}

}  // namespace refit
