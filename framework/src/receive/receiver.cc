// The receiver pipeline: poll commit -> fetch manifest and payloads -> decode + apply in place
// within a byte cap -> verify each record's digest -> commit the version locally -> acknowledge.
#include "refit/receiver.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/crypto.h"
#include "common/file_util.h"
#include "common/state_json.h"
#include "common/stopwatch.h"
#include "common/worker_pool.h"
#include "faults/faults.h"
#include "format/model_file.h"
#include "link/link.h"
#include "plugins/encoding_cache.h"
#include "plugins/layout_map.h"
#include "protocol/auth.h"
#include "protocol/chain_bridge.h"
#include "protocol/verified_io.h"
#include "receive/apply.h"
#include "receive/box_digests.h"
#include "receive/journal.h"
#include "refit/kernels/diff.h"
#include "refit/log.h"
#include "refit/offline.h"
#include "refit/sender.h"

namespace refit {

using internal::Stopwatch;
using json = nlohmann::json;

namespace {

// A payload read whole and checked against its manifest entry (size, xxh3, and SHA-256 when named).
Status FetchVerifiedPayload(Transport& transport, const PayloadRef& p,
                            std::vector<uint8_t>& buffer) {
  Status st = internal::GetVerified(transport, p.key, p.bytes, p.xxh3, buffer);
  if (st.ok() && !p.sha256.empty() && internal::Sha256Hex(buffer.data(), p.bytes) != p.sha256) {
    st = Status::Corrupt("refused: its SHA-256 differs from its manifest's");
  }
  return st;
}

// A payload fetched on a pool thread, whose Status is waited for (a future's shared state would be
// an exported template instantiation of librefit's public class).
struct Prefetch {
  bool pending = false;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;

  void Start(internal::WorkerPool& pool, Transport& transport, const PayloadRef& p,
             std::vector<uint8_t>& buffer) {
    pending = true;
    done = false;
    pool.Submit([this, &transport, &p, &buffer] {
      Status st = FetchVerifiedPayload(transport, p, buffer);
      std::lock_guard<std::mutex> lock(mu);
      status = std::move(st);
      done = true;
      cv.notify_one();
    });
  }
  Status Wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    pending = false;
    return status;
  }
};

// A commit as read from the transport, with the SHA-256 of its bytes (the chain's link).
struct CommitRead {
  Commit commit;
  std::string sha256;
};

// What syncs `file` (a checkpoint's sync_file). Made here, outside Receiver::Impl: a lambda in a
// member whose signature names an internal type would be exported from librefit.so.
std::function<Status()> SyncOf(SafetensorsFile& file) {
  return [&file] { return file.Sync(); };
}

}  // namespace

struct Receiver::Impl {
  Config config;
  std::shared_ptr<Registry> registry;
  std::unique_ptr<Transport> transport;
  std::unique_ptr<internal::EncodingCache> encodings;
  // The receiver's own sharding: records of canonical tensors land in its local shards.
  std::unique_ptr<Layout> layout;
  bool canonical = true;  // the identity layout: local tensors are the canonical ones
  std::string id;
  std::string state_dir;
  uint64_t apply_bytes = 0;
  bool durable = true;
  bool verify_payloads_first = false;
  uint64_t version = 0;
  // Set while a delta is being applied in place: the model is then neither `version` nor
  // `applying` until that version is completed (resumed through the redo log) or replaced by
  // a full sync.
  uint64_t applying = 0;
  // Set while a full sync's new file replaces the model: after a crash the file's own version
  // metadata says whether the rename happened.
  uint64_t replacing = 0;
  // Whether this process has made sure the ack of the version it started with exists (a crash
  // between committing a version locally and acknowledging it must not stall the sender).
  bool ack_checked = false;
  // The model file's redo log (journal.h), open while there is a model file; `log_bytes` its
  // size when the last version was committed (what lies past it is an interrupted attempt).
  std::unique_ptr<internal::RedoLog> redo;
  uint64_t log_bytes = 0;
  internal::CheckpointPolicy checkpoint;
  bool asked_full = false;
  // With a key, only signed versions are taken (protocol/auth.h).
  std::optional<std::string> auth_key;
  // The chain head: SHA-256 of the COMMIT of `version`; a version is taken only if it extends it.
  std::string commit_sha256;
  uint64_t max_model_bytes = 0;  // 0: bounded by the free space of state_dir only
  uint64_t max_failures = 3;
  // Failures of one version, kept across restarts in failures.json (receiver.json says only
  // what the model is): the same failure max_failures times abandons the version.
  uint64_t failed_version = 0;
  uint64_t failed_count = 0;
  std::string failed_error;
  uint64_t abandoned = 0;  // never tried again; a full sync was asked for
  std::unique_ptr<SafetensorsFile> model;
  uint64_t applied_in_process = 0;  // versions; from the second on, the model is read in place
  // Attached (Receiver::Attach): the model is caller-owned memory and there is no model file.
  bool attached = false;
  std::vector<TensorView> attached_views;
  // The attached memory is not known to hold any version (it was attached without a verified
  // loaded_version): only a full sync can be applied to it.
  bool model_unknown = false;
  // Attached: the digest of every record box the memory holds, to verify a loaded_version.
  internal::BoxDigestTable digests;
  // Attached: the records of version applied_version already in memory (an attempt that failed
  // part way), so that a retry applies each xor/step record once.
  uint64_t applied_version = 0;
  std::set<std::string> applied_records;
  std::vector<uint8_t> payload_buffer;
  std::vector<uint8_t> next_buffer;  // the payload fetched while payload_buffer's is applied
  // Applies a payload's records on `threads` threads (receiver.threads).
  std::unique_ptr<internal::WorkerPool> pool;
  std::unique_ptr<internal::WorkerPool> prefetcher = std::make_unique<internal::WorkerPool>(1);
  size_t threads = 1;
  std::string prefetched;  // key of the verified payload payload_buffer holds, if any
  internal::ApplyScratch scratch;
  // The in-place applies' windows of changes, kept from version to version.
  internal::WindowStashPtr window_stash = internal::MakeWindowStash();
  // Payloads of version early_version (our version + 1) read and computed before its commit
  // (receiver.early_bytes): used by Apply when the manifest names the same bytes. `early_seen`:
  // keys tried (computed, refused or over the budget), not read again for this version.
  struct EarlyPayload {
    std::vector<uint8_t> bytes;
    uint64_t xxh3 = 0;
    internal::EarlyWindowsPtr windows;  // null: a full sync's, its bytes only
    // Its windows' changes are in attached memory already (receiver.write_early): the n-th
    // payload written so (0: none). Dropped, it swaps the old bits back.
    uint64_t written_seq = 0;
  };
  // receiver.write_early: attached memory gets each payload's computed changes before the
  // commit (an engine that does not read its weights during a sync).
  bool write_early = false;
  uint64_t early_writes = 0;
  uint64_t early_bytes = 0;
  uint64_t early_version = 0;
  uint64_t early_held = 0;
  std::map<std::string, EarlyPayload> early;
  std::set<std::string> early_seen;

  std::string ModelPath() const { return state_dir + "/model.safetensors"; }
  std::string StatePath() const { return state_dir + "/receiver.json"; }
  std::string LogPath() const { return state_dir + "/redo.log"; }
  std::string FailuresPath() const { return state_dir + "/failures.json"; }
  std::string DigestsPath() const { return state_dir + "/digests.json"; }

  std::vector<TensorView> ModelTensors() const {
    return attached ? attached_views : model->tensors();
  }
  // Weights in caller memory are the caller's to persist: only a model file is synced.

  Status SaveState() {
    json j = {{"version", version}, {"receiver", id}};
    if (applying != 0) j["applying"] = applying;
    if (replacing != 0) j["replacing"] = replacing;
    if (!commit_sha256.empty()) j["commit_sha256"] = commit_sha256;
    if (log_bytes != 0) j["log_bytes"] = log_bytes;
    return internal::WriteFileAtomic(StatePath(), j.dump(1));
  }

  Status SaveFailures() {
    if (failed_version == 0 && abandoned == 0) {
      if (::unlink(FailuresPath().c_str()) != 0 && errno != ENOENT) {
        return Status::IoError(FailuresPath() + ": " + std::strerror(errno));
      }
      return Status::OK();
    }
    json j = {{"version", failed_version},
              {"count", failed_count},
              {"error", failed_error},
              {"abandoned", abandoned}};
    return internal::WriteFileAtomic(FailuresPath(), j.dump(1));
  }

  Status LoadFailures() {
    auto text = internal::ReadSmallFile(FailuresPath(), 1 << 20);
    if (!text.ok()) {
      return text.status().code() == StatusCode::kNotFound ? Status::OK() : text.status();
    }
    REFIT_ASSIGN_OR_RAISE(json j, internal::ParseStateObject(text.value(), FailuresPath()));
    const std::string path = FailuresPath();
    REFIT_RETURN_NOT_OK(internal::ReadStateField(j, path, "version", &failed_version));
    REFIT_RETURN_NOT_OK(internal::ReadStateField(j, path, "count", &failed_count));
    REFIT_RETURN_NOT_OK(internal::ReadStateField(j, path, "error", &failed_error));
    return internal::ReadStateField(j, path, "abandoned", &abandoned);
  }

  Status LoadState() {
    auto text = internal::ReadSmallFile(StatePath(), 1 << 20);
    if (!text.ok()) {
      // No state, or state we cannot read: never guess, ask for a full sync.
      return text.status().code() == StatusCode::kNotFound ? Status::OK() : text.status();
    }
    Result<json> parsed = internal::ParseStateObject(text.value(), StatePath());
    if (!parsed.ok() || !parsed->contains("version")) return Status::OK();
    // A value of the wrong type is not a state we can trust or silently drop: say which key.
    const json& j = parsed.value();
    uint64_t saved_version = 0, saved_applying = 0, saved_replacing = 0;
    REFIT_RETURN_NOT_OK(internal::ReadStateField(j, StatePath(), "version", &saved_version));
    REFIT_RETURN_NOT_OK(internal::ReadStateField(j, StatePath(), "applying", &saved_applying));
    REFIT_RETURN_NOT_OK(internal::ReadStateField(j, StatePath(), "replacing", &saved_replacing));
    std::string saved_sha256;
    REFIT_RETURN_NOT_OK(internal::ReadStateField(j, StatePath(), "commit_sha256", &saved_sha256));
    REFIT_RETURN_NOT_OK(internal::ReadStateField(j, StatePath(), "log_bytes", &log_bytes));
    if (attached) {
      // The chain and the version stay ours; whether the memory holds it, Attach decides.
      version = saved_version;
      applying = saved_applying;
      commit_sha256 = saved_sha256;
      replacing = 0;
      return Status::OK();
    }
    auto file = SafetensorsFile::Open(ModelPath(), /*writable=*/true);
    if (!file.ok()) return Status::OK();
    model = std::move(file).value();
    ChooseModelReads();
    version = saved_version;
    applying = saved_applying;
    replacing = saved_replacing;
    commit_sha256 = saved_sha256;
    if (replacing != 0) {
      // Killed around the rename of a full sync: the file says which version it is.
      if (internal::HoldsVersion(*model, replacing)) {
        version = replacing;
        applying = 0;
        // The log was the replaced file's; the new file was synced before the rename.
        redo.reset();
        ::unlink(LogPath().c_str());
        log_bytes = 0;
      }
      replacing = 0;
      REFIT_RETURN_NOT_OK(SaveState());
    }
    return OpenLog();
  }

  // Opens the model's redo log; entries written before a reboot (the model's pages since the
  // last checkpoint may not have reached the disk) are replayed into it.
  Status OpenLog() {
    redo.reset();
    REFIT_ASSIGN_OR_RAISE(redo,
                          internal::OpenRedoLog(LogPath(), durable, log_bytes, ModelTensors()));
    redo->UseDirectWrites();  // read back only by a recovery
    return Status::OK();
  }

  // The model file is synced and its redo log emptied every checkpoint_versions versions, once
  // the log holds checkpoint_bytes (default: the model's size), halfway there when idle, or now.
  Status MaybeCheckpoint(internal::CheckpointWhen when) {
    if (attached || redo == nullptr || model == nullptr || applying != 0) return Status::OK();
    REFIT_ASSIGN_OR_RAISE(bool done, internal::CheckpointIfDue(*redo, version, model->file_size(),
                                                               checkpoint, when, SyncOf(*model)));
    if (!done) return Status::OK();
    log_bytes = redo->bytes();
    return SaveState();
  }

  // The commit of version v (verified against the key, if any), nullopt if there is none.
  Result<std::optional<CommitRead>> ReadCommit(uint64_t v) {
    // Read until two reads agree: a commit corrupted on the way must not pass for another one.
    auto bytes = internal::GetStable(*transport, CommitKey(v), internal::kMaxControlBytes);
    if (!bytes.ok()) {
      if (bytes.status().code() == StatusCode::kNotFound) return std::optional<CommitRead>();
      return bytes.status();
    }
    REFIT_ASSIGN_OR_RAISE(Commit c,
                          ParseCommit(bytes.value().data(), bytes.value().size(), CommitKey(v)));
    if (c.version != v)
      return Status::Corrupt(CommitKey(v) + ": names version " + std::to_string(c.version));
    REFIT_RETURN_NOT_OK(internal::VerifyCommit(auth_key, c, CommitKey(v)));
    return std::optional<CommitRead>(
        CommitRead{std::move(c), internal::Sha256Hex(bytes.value().data(), bytes.value().size())});
  }

  // Version v+1 extends the chain at `version`: its commit names our commit's SHA-256. (No head
  // yet: no state, or a state written before the chain existed.)
  bool Extends(const CommitRead& next) const {
    return version == 0 || commit_sha256.empty() || next.commit.prev == commit_sha256;
  }

  // Whether full version f may replace our model: with a key its signature suffices (it was
  // verified when read, and its number is above ours); without one, every commit between ours
  // and f must exist and chain, so a version planted at any number is never taken.
  Result<bool> ChainReaches(uint64_t f) {
    if (version == 0 || auth_key || commit_sha256.empty()) return true;
    std::string head = commit_sha256;
    for (uint64_t v = version + 1; v <= f; ++v) {
      auto c = ReadCommit(v);
      if (c.ok() && !c.value()) {
        // Deleted by the sender's retention: its chain bridge spans the commits that went.
        std::optional<internal::ChainBridge> bridge = ReadBridge();
        if (!bridge || bridge->from != v - 1 || bridge->from_sha256 != head) return false;
        head = bridge->to_sha256;
        v = bridge->to;
        continue;
      }
      if (!c.ok() || c.value()->commit.prev != head) return false;
      head = c.value()->sha256;
    }
    return true;
  }

  // chain/<id>, written by the sender before it deleted commits this receiver had not reached.
  std::optional<internal::ChainBridge> ReadBridge() {
    const std::string key = internal::ChainBridgeKey(id);
    auto bytes = internal::GetStable(*transport, key, 1 << 16);
    if (!bytes.ok()) return std::nullopt;
    auto bridge = internal::ParseChainBridge(bytes.value().data(), bytes.value().size(), key);
    if (!bridge.ok() || bridge->receiver != id) return std::nullopt;
    return std::move(bridge).value();
  }

  // Our own commit and our successor's are gone while newer versions exist: the sender's
  // retention window moved past us, and only a full sync can bring us back (asked for here).
  Status CheckLeftBehind(const std::optional<uint64_t>& newest) {
    if (version == 0 || !newest || *newest <= version + 1) return Status::OK();
    REFIT_ASSIGN_OR_RAISE(std::optional<uint64_t> own, transport->Size(CommitKey(version)));
    if (own.has_value()) return Status::OK();
    const std::string why = "need full sync: receiver '" + id + "' holds version " +
                            std::to_string(version) +
                            ", whose successors were deleted by the sender's retention "
                            "(newest: version " +
                            std::to_string(*newest) + ")";
    REFIT_RETURN_NOT_OK(RequestFull(why));
    return Status::VersionMismatch(why);
  }

  Result<std::vector<Manifest>> ReadManifests(const Commit& c) {
    std::vector<Manifest> out;
    std::vector<uint8_t> bytes;
    for (const PayloadRef& ref : c.manifests) {
      if (ref.bytes > internal::kMaxControlBytes) {
        return Status::Corrupt(ref.key + ": manifest of " + std::to_string(ref.bytes) +
                               " bytes named by commit " + std::to_string(c.version));
      }
      Status got = internal::GetVerified(*transport, ref.key, ref.bytes, ref.xxh3, bytes);
      if (!got.ok()) {
        return Status(got.code(),
                      got.message() + " (manifest of commit " + std::to_string(c.version) + ")");
      }
      if (!ref.sha256.empty() && internal::Sha256Hex(bytes.data(), bytes.size()) != ref.sha256) {
        return Status::Corrupt(ref.key + ": refused: its SHA-256 differs from the one commit " +
                               std::to_string(c.version) + " names");
      }
      REFIT_ASSIGN_OR_RAISE(Manifest m, ParseManifest(bytes.data(), bytes.size(), ref.key));
      REFIT_RETURN_NOT_OK(internal::VerifyManifest(auth_key, m, ref.key));
      // A delta version may hold full parts (a rank that re-sent its shards whole); a full
      // version holds only full parts, and every delta part is on the commit's base.
      if (m.version != c.version || (c.full && !m.full) ||
          (!m.full && m.base_version != c.base_version)) {
        return Status::Corrupt(ref.key + ": manifest does not match commit " +
                               std::to_string(c.version));
      }
      out.push_back(std::move(m));
    }
    return out;
  }

  // Where records land in `tensors` (which must outlive the resolver): by name, or through our
  // layout's slices.
  Result<internal::TensorResolver> ResolverOver(std::vector<TensorView>& tensors) const {
    std::map<std::string, TensorView*> by_name;
    for (TensorView& t : tensors) by_name[t.name] = &t;
    if (canonical) return internal::CanonicalResolver(by_name);
    REFIT_ASSIGN_OR_RAISE(std::vector<internal::LocalSlice> slices,
                          internal::MapLocalTensors(*layout, internal::SpecsOf(tensors)));
    return internal::SliceResolver(std::move(slices), by_name, /*skip_foreign=*/true);
  }

  // A process that applied two versions applies version after version (`refit recv --follow`,
  // an engine's receiver): the model file's mapping is populated once, and each later version
  // reads its old bits in place rather than copying them out with pread
  // (MappedFile::PopulateForReading, once per file). A full sync's new file is populated at the
  // end of its apply.
  void WarmModel() {
    if (model == nullptr || ++applied_in_process < 2) return;
    if (Status st = model->PopulateForReading(); !st.ok()) {
      Log(LogLevel::kWarn, "receiver", st.message() + " (the model is read with pread)");
    }
  }

  // A process that applies one version reads each record's old bits once: through the model
  // file's mapping where a fault costs less than pread's copy on this machine, else with pread
  // (MappedFile::ReadInPlaceIfCheaper; a long-lived one populates the mapping later anyway).
  void ChooseModelReads() {
    bool in_place = false;
    double fault_s = 0, pread_s = 0;
    if (Status st = model->ReadInPlaceIfCheaper(&in_place, &fault_s, &pread_s); !st.ok()) {
      Log(LogLevel::kWarn, "receiver", st.message() + " (the model is read with pread)");
      return;
    }
    char costs[96] = "";
    if (fault_s > 0 || pread_s > 0) {
      std::snprintf(costs, sizeof(costs), " (a fault %.3f s/GB, pread %.3f s/GB)", fault_s,
                    pread_s);
    }
    Log(LogLevel::kDebug, "receiver",
        std::string("the model file is read ") + (in_place ? "in place" : "with pread") + costs);
  }

  // The payloads written early go back (their targets' old bits swapped in again), last written
  // first: a later one may hold the first one's bits as its old ones.
  void PutBackWrittenEarly() {
    std::vector<std::map<std::string, EarlyPayload>::iterator> written;
    for (auto it = early.begin(); it != early.end(); ++it) {
      if (it->second.written_seq != 0) written.push_back(it);
    }
    std::sort(written.begin(), written.end(), [](const auto& a, const auto& b) {
      return a->second.written_seq > b->second.written_seq;
    });
    for (const auto& it : written) early.erase(it);  // EarlyWindowsDeleter swaps them back
  }

  // Payloads written early stay only where this commit is a delta on our version that names
  // every one of them with the same bytes; else all go back before anything of it is applied.
  void PutBackEarlyUnlessNamed(const Commit& c, const std::vector<Manifest>& manifests) {
    bool named = !c.full && c.version == early_version;
    for (const auto& [key, e] : early) {
      if (!named) break;
      if (e.written_seq == 0) continue;
      bool found = false;
      for (const Manifest& m : manifests) {
        for (const PayloadRef& p : m.payloads) found = found || (p.key == key && SameBytes(e, p));
      }
      named = found;
    }
    if (!named) PutBackWrittenEarly();
  }

  void DropEarly() {
    PutBackWrittenEarly();
    early.clear();
    early_seen.clear();
    early_held = 0;
    early_version = 0;
  }

  // While version+1 has no commit: its payloads already stored are read and computed against
  // the model (decoded, digest-verified, held in memory; nothing is written), so that once the
  // commit is there only the log and the writes remain (for attached memory, only the writes).
  // Only for a model at a committed version; a payload that is not a delta on it (or over the
  // budget) is left to Apply.
  void ComputeEarlyPayloads() {
    // With a key, payload bytes are decoded only once a signed manifest names them.
    if (early_bytes == 0 || auth_key || (!attached && model == nullptr) || version == 0 ||
        applying != 0 || asked_full || model_unknown) {
      return;
    }
    if (early_version != version + 1) {
      DropEarly();
      early_version = version + 1;
    }
    Result<std::vector<std::pair<std::string, uint64_t>>> listed =
        transport->List(VersionDir(early_version) + "/payload.");
    if (!listed.ok()) return;
    for (const auto& [key, size] : listed.value()) {
      if (!early_seen.insert(key).second) continue;
      if (size > apply_bytes || early_held + size >= early_bytes) continue;
      Status st = ComputeEarlyPayload(key, size);
      if (!st.ok()) {
        Log(LogLevel::kDebug, "receiver",
            key + ": not computed before its commit (applied after it): " + st.message());
      }
    }
  }

  Status ComputeEarlyPayload(const std::string& key, uint64_t size) {
    EarlyPayload e;
    REFIT_ASSIGN_OR_RAISE(e.bytes, transport->GetAll(key, size));
    REFIT_ASSIGN_OR_RAISE(Payload payload, Payload::Parse(e.bytes.data(), e.bytes.size(), key));
    for (const RecordHeader& r : payload.records()) {
      // A full sync's: it replaces the model, nothing to compute. Its bytes are kept all the
      // same: read once (over ucx a read consumes the pushed copy; read again after the commit,
      // it crossed the link a second time, from the sender rather than the relay tree).
      if (r.create) return KeepEarly(key, std::move(e), 0);
    }
    std::vector<TensorView> tensors = ModelTensors();
    REFIT_ASSIGN_OR_RAISE(internal::TensorResolver resolve, ResolverOver(tensors));
    uint64_t held = 0;
    const bool write = attached && write_early;
    REFIT_ASSIGN_OR_RAISE(
        e.windows, internal::ComputeEarly(payload, *encodings, resolve, apply_bytes, pool.get(),
                                          threads, early_bytes - early_held - e.bytes.size(), write,
                                          scratch, window_stash.get(), &held));
    if (internal::EarlyWindowCount(e.windows.get()) == 0) return Status::OK();
    if (write) e.written_seq = ++early_writes;
    return KeepEarly(key, std::move(e), held);
  }

  Status KeepEarly(const std::string& key, EarlyPayload e, uint64_t held) {
    e.xxh3 = kernels::Digest64(e.bytes.data(), e.bytes.size());
    early_held += held + e.bytes.size();
    early[key] = std::move(e);
    return Status::OK();
  }

  // Whether the early payload `p` names holds its bytes (the manifest's digests checked, as a
  // fetch checks them): then they are moved into payload_buffer and *windows is what was
  // computed from them (null for a full sync's).
  bool TakeEarly(uint64_t v, const PayloadRef& p, internal::EarlyWindowsPtr* windows) {
    if (!EarlyMatches(v, p)) return false;
    auto it = early.find(p.key);
    EarlyPayload e = std::move(it->second);
    early.erase(it);
    payload_buffer.swap(e.bytes);
    *windows = std::move(e.windows);
    return true;
  }

  // Whether the early payload of that key holds the bytes manifest entry `p` names (else it is
  // dropped: Apply reads the stored one).
  bool EarlyMatches(uint64_t v, const PayloadRef& p) {
    if (v != early_version) return false;
    auto it = early.find(p.key);
    if (it == early.end()) return false;
    if (SameBytes(it->second, p)) return true;
    if (it->second.written_seq != 0) {
      PutBackWrittenEarly();  // all of them: see PutBackEarlyUnlessNamed
    } else {
      early.erase(it);
    }
    return false;
  }

  static bool SameBytes(const EarlyPayload& e, const PayloadRef& p) {
    return e.bytes.size() == p.bytes && e.xxh3 == p.xxh3 &&
           (p.sha256.empty() || internal::Sha256Hex(e.bytes.data(), e.bytes.size()) == p.sha256);
  }

  // With a redo log, each payload's last window lands while the next payload is computed
  // (ApplySink::defer_last_sync): `manifests` are one commit's (ReadManifests checks each names
  // its version), whose records change disjoint elements. Every window has landed when this
  // returns.
  Status ApplyPayloads(const std::vector<Manifest>& manifests, ApplyStats* stats,
                       internal::ApplySink* sink) {
    // The tail's records point into `tensors`: it lands before they go.
    std::vector<TensorView> tensors = ModelTensors();
    REFIT_ASSIGN_OR_RAISE(internal::TensorResolver resolve, ResolverOver(tensors));
    sink->defer_last_sync = true;
    Status applied = ApplyPayloadsInOrder(manifests, resolve, stats, sink);
    sink->defer_last_sync = false;
    Status landed = internal::FinishLoggedTail(*sink, stats);
    return applied.ok() ? landed : applied;
  }

  Status ApplyPayloadsInOrder(const std::vector<Manifest>& manifests,
                              const internal::TensorResolver& resolve, ApplyStats* stats,
                              internal::ApplySink* sink) {
    sink->pool = pool.get();
    sink->threads = threads;
    std::vector<std::pair<uint64_t, const PayloadRef*>> order;
    for (const Manifest& m : manifests) {
      for (const PayloadRef& p : m.payloads) order.emplace_back(m.version, &p);
    }
    // The next payload is fetched (and verified) on another thread while this one is applied:
    // two payload buffers at most.
    Prefetch next_fetch;
    for (size_t i = 0; i < order.size(); ++i) {
      const auto [v, p] = order[i];
      if (p->bytes > apply_bytes) {
        return Status::Invalid(
            p->key + ": payload of " + std::to_string(p->bytes) +
            " bytes exceeds receiver.apply_bytes = " + std::to_string(apply_bytes));
      }
      Stopwatch fetch;
      internal::EarlyWindowsPtr computed;
      const bool read_early = TakeEarly(v, *p, &computed);
      if (!read_early && next_fetch.pending) {
        Status fetched = next_fetch.Wait();
        if (!fetched.ok()) return Rejected(v, *p, fetched);
        payload_buffer.swap(next_buffer);
      } else if (!read_early && prefetched != p->key) {
        REFIT_RETURN_NOT_OK(FetchInto(v, *p, payload_buffer));
      }
      prefetched.clear();
      stats->fetch_seconds += fetch.Seconds();
      if (i + 1 < order.size() && order[i + 1].second->bytes <= apply_bytes &&
          !next_fetch.pending && early.count(order[i + 1].second->key) == 0) {
        next_fetch.Start(*prefetcher, *transport, *order[i + 1].second, next_buffer);
      }
      if (computed != nullptr) ++stats->early_payloads;
      sink->early = computed.get();
      Stopwatch apply;
      Status applied = ApplyOne(*p, resolve, stats, sink);
      sink->early = nullptr;
      if (!applied.ok()) {
        if (next_fetch.pending) (void)next_fetch.Wait();
        return applied;
      }
      stats->apply_seconds += apply.Seconds();
      stats->payloads++;
      stats->payload_bytes += p->bytes;
      internal::MaybeKillAt("receiver.record_applied");
    }
    return Status::OK();
  }

  Status ApplyOne(const PayloadRef& p, const internal::TensorResolver& resolve, ApplyStats* stats,
                  internal::ApplySink* sink) {
    REFIT_ASSIGN_OR_RAISE(Payload payload, Payload::Parse(payload_buffer.data(), p.bytes, p.key));
    return internal::ApplyPayload(payload, *encodings, resolve, apply_bytes, scratch, stats, sink);
  }

  // Fetches one payload into payload_buffer and checks it against its manifest entry (a failed
  // or corrupted read is retried a few times). A payload that stays missing, short or corrupt is
  // rejected by name, with the records it holds: none of them is applied.
  Status FetchPayload(uint64_t v, const PayloadRef& p) {
    prefetched.clear();
    return FetchInto(v, p, payload_buffer);
  }

  Status FetchInto(uint64_t v, const PayloadRef& p, std::vector<uint8_t>& buffer) {
    Status st = FetchVerifiedPayload(*transport, p, buffer);
    return st.ok() ? st : Rejected(v, p, st);
  }

  static Status Rejected(uint64_t v, const PayloadRef& p, const Status& why) {
    const std::string records = p.records == 0   ? std::string("its records")
                                : p.records == 1 ? std::string("its record 0")
                                                 : "its records 0-" + std::to_string(p.records - 1);
    return Status(why.code(), p.key + ": payload rejected, " + records + " of version " +
                                  std::to_string(v) + " not applied: " + why.message());
  }

  // Before a delta touches the model in place (or says it is `applying`), every payload of it
  // must exist at its manifest size - a metadata check, so a delta still crosses the link once -
  // and the first one is fetched and verified (it is applied first, from the buffer). A version
  // with a payload lost or cut short is refused while the model and the state still are
  // `version`. A payload whose bytes prove corrupt during the apply is re-read; until it reads
  // whole the receiver stays `applying` (it never reports a mix as a version).
  // receiver.verify_payloads_first fetches and verifies every payload here instead (each is then
  // read twice, but a payload rotten in storage is refused before the model is touched).
  Status VerifyPayloads(const std::vector<Manifest>& manifests) {
    bool first = true;
    for (const Manifest& m : manifests) {
      for (const PayloadRef& p : m.payloads) {
        if (p.bytes > apply_bytes) continue;  // refused with its own error when applied
        if (EarlyMatches(m.version, p)) {     // read and verified before the commit
          // Applied first: the payload after it is fetched while it is applied, once (fetched
          // here too, its buffer would go to this one's bytes and it would be read again).
          first = false;
          continue;
        }
        if (first || verify_payloads_first) {
          REFIT_RETURN_NOT_OK(FetchPayload(m.version, p));
          prefetched = p.key;
          first = false;
          continue;
        }
        Result<std::optional<uint64_t>> size = transport->Size(p.key);
        if (!size.ok()) return Rejected(m.version, p, size.status());
        if (!size->has_value()) return Rejected(m.version, p, Status::NotFound("it is missing"));
        if (**size != p.bytes) {
          return Rejected(m.version, p,
                          Status::Corrupt("it holds " + std::to_string(**size) +
                                          " bytes, its manifest says " + std::to_string(p.bytes)));
        }
      }
    }
    return Status::OK();
  }

  // The tensors a full sync declares, as this receiver holds them (its layout's shards).
  Result<std::vector<TensorSpec>> DeclaredTensors(const std::vector<Manifest>& manifests) const {
    std::vector<TensorSpec> specs;
    std::map<std::string, size_t> seen;
    for (const Manifest& m : manifests) {
      for (const TensorSpec& t : m.tensors) {
        if (seen.emplace(t.name, specs.size()).second) specs.push_back(t);
      }
    }
    if (!canonical) {
      // Our shards of those canonical tensors, as the layout names and shapes them.
      REFIT_ASSIGN_OR_RAISE(specs, layout->ListLocal(specs));
    }
    return specs;
  }

  // The attached tensors are exactly the ones full version v declares (names, dtypes, shapes).
  Status CheckAttachedMatch(const std::vector<TensorSpec>& specs, uint64_t v) const {
    std::map<std::string, const TensorView*> views;
    for (const TensorView& t : attached_views) views[t.name] = &t;
    const std::string in = " (full sync version " + std::to_string(v) + ")";
    for (const TensorSpec& s : specs) {
      auto it = views.find(s.name);
      if (it == views.end()) return Status::Invalid("tensor '" + s.name + "' is not attached" + in);
      const TensorView& t = *it->second;
      if (t.dtype != s.dtype || t.shape != s.shape) {
        return Status::Invalid("attached tensor '" + s.name + "' is " +
                               std::string(NameOf(t.dtype)) + ShapeToString(t.shape) +
                               ", the receiver's is " + std::string(NameOf(s.dtype)) +
                               ShapeToString(s.shape) + in);
      }
      views.erase(it);
    }
    if (!views.empty()) {
      return Status::Invalid("attached tensor '" + views.begin()->first +
                             "' is not a tensor of this receiver" + in);
    }
    return Status::OK();
  }

  // A full sync into attached memory: copied in place (there is no second copy to swap in), so
  // the memory is `applying` it from the first write until every record verified.
  Status ApplyFullAttached(const Commit& c, const std::vector<Manifest>& manifests,
                           ApplyStats* stats) {
    REFIT_ASSIGN_OR_RAISE(std::vector<TensorSpec> specs, DeclaredTensors(manifests));
    REFIT_RETURN_NOT_OK(CheckAttachedMatch(specs, c.version));
    internal::CoverageTracker coverage;
    internal::ApplySink sink;
    sink.coverage = &coverage;
    sink.before_write = [&]() -> Status {
      applying = c.version;
      model_unknown = true;
      digests.Reset(c.version);
      return SaveState();
    };
    sink.applied = [&](const TensorView& t, const Box& box, uint64_t digest) {
      digests.Record(t.name, box, digest, /*full=*/true);
    };
    REFIT_RETURN_NOT_OK(ApplyPayloads(manifests, stats, &sink));
    REFIT_RETURN_NOT_OK(
        CheckCoverage(coverage).WithContext("version " + std::to_string(c.version)));
    model_unknown = false;
    return Status::OK();
  }

  Status ApplyFull(const Commit& c, const std::vector<Manifest>& manifests, ApplyStats* stats) {
    if (attached) return ApplyFullAttached(c, manifests, stats);
    REFIT_ASSIGN_OR_RAISE(std::vector<TensorSpec> specs, DeclaredTensors(manifests));
    REFIT_RETURN_NOT_OK(CheckRoomFor(c.version, specs));
    const std::string tmp = ModelPath() + ".incoming";
    model.reset();
    REFIT_RETURN_NOT_OK(internal::CreateModelFile(
        tmp, specs, nullptr, {{internal::kVersionMetadataKey, std::to_string(c.version)}}));
    REFIT_ASSIGN_OR_RAISE(model, SafetensorsFile::Open(tmp, /*writable=*/true));
    internal::CoverageTracker coverage;
    internal::ApplySink sink;
    sink.coverage = &coverage;
    Status st = ApplyPayloads(manifests, stats, &sink);
    if (st.ok()) st = CheckCoverage(coverage).WithContext("version " + std::to_string(c.version));
    if (st.ok()) st = model->Sync();
    model.reset();
    if (!st.ok()) {
      ::unlink(tmp.c_str());
      // The previous model (if any) is untouched; reopen it.
      (void)LoadState();
      return st;
    }
    replacing = c.version;
    REFIT_RETURN_NOT_OK(SaveState());
    REFIT_RETURN_NOT_OK(internal::ReplaceFile(tmp, ModelPath()));
    internal::MaybeKillAt("receiver.model_synced");
    REFIT_ASSIGN_OR_RAISE(model, SafetensorsFile::Open(ModelPath(), /*writable=*/true));
    ChooseModelReads();
    // The new file is synced: a log of the one it replaced is emptied (killed before this, the
    // restart sees `replacing` and drops that log).
    if (redo == nullptr) {
      log_bytes = 0;
      REFIT_RETURN_NOT_OK(OpenLog());
    }
    REFIT_RETURN_NOT_OK(redo->Checkpoint(c.version));
    log_bytes = redo->bytes();
    return Status::OK();
  }

  // The elements of each local tensor a record writes: all of them for canonical receivers,
  // those its layout maps to canonical ones otherwise (a shard's padding rows get no record).
  Result<std::map<std::string, uint64_t>> MappedElements(
      const std::vector<TensorView>& tensors) const {
    std::map<std::string, uint64_t> mapped;
    if (canonical) {
      for (const TensorView& t : tensors) mapped[t.name] = t.num_elements();
      return mapped;
    }
    REFIT_ASSIGN_OR_RAISE(std::vector<internal::LocalSlice> slices,
                          internal::MapLocalTensors(*layout, internal::SpecsOf(tensors)));
    for (const internal::LocalSlice& s : slices) {
      const refit_slice_map_t& sm = s.map.map;
      uint64_t n = 1;
      for (uint32_t d = 0; d < sm.ndim; ++d) n *= sm.extent[d];
      mapped[s.local_name] += n;
    }
    return mapped;
  }

  // Every element of the new model that a record should write was written exactly once.
  Status CheckCoverage(const internal::CoverageTracker& coverage) const {
    const std::vector<TensorView> tensors = ModelTensors();
    REFIT_ASSIGN_OR_RAISE(auto mapped, MappedElements(tensors));
    return coverage.Check(tensors, &mapped);
  }

  // A full sync's declared tensors fit receiver.max_model_bytes and the free space of state_dir,
  // checked before its file is grown (a planted manifest may declare any size).
  Status CheckRoomFor(uint64_t v, const std::vector<TensorSpec>& specs) const {
    uint64_t total = 0;
    for (const TensorSpec& t : specs) {
      uint64_t bytes = 0;
      const uint64_t n = NumElements(t.shape).ValueOr(UINT64_MAX);
      if (__builtin_mul_overflow(n, SizeOf(t.dtype), &bytes) ||
          __builtin_add_overflow(total, bytes, &total)) {
        total = UINT64_MAX;
        break;
      }
    }
    const std::string what = "full sync version " + std::to_string(v) + " declares " +
                             std::to_string(total) + " bytes of tensors";
    if (max_model_bytes != 0 && total > max_model_bytes) {
      return Status::Invalid(what + ", over receiver.max_model_bytes = " +
                             std::to_string(max_model_bytes) + "; refused");
    }
    struct statvfs fs {};
    if (::statvfs(state_dir.c_str(), &fs) == 0) {
      const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
      if (total > free_bytes) {
        return Status::IoError(what + ", more than the " + std::to_string(free_bytes) +
                               " bytes free in " + state_dir + "; refused");
      }
    }
    return Status::OK();
  }

  // Applies version c (full or a delta on our version), commits it locally, acknowledges it.
  Result<ApplyStats> Apply(const CommitRead& read) {
    const Commit& c = read.commit;
    Stopwatch total;
    ApplyStats stats;
    stats.version = c.version;
    stats.full = c.full;
    prefetched.clear();
    REFIT_ASSIGN_OR_RAISE(std::vector<Manifest> manifests, ReadManifests(c));
    PutBackEarlyUnlessNamed(c, manifests);
    if (c.full) {
      REFIT_RETURN_NOT_OK(ApplyFull(c, manifests, &stats));
      applying = 0;
    } else {
      REFIT_RETURN_NOT_OK(VerifyPayloads(manifests));
      // The model is marked `applying` (and its log's interrupted entries replayed) only when
      // its first byte is about to change: a version refused before that leaves state, log and
      // model alone.
      internal::ApplySink sink;
      sink.stash = window_stash.get();
      sink.before_write = [&]() -> Status {
        REFIT_RETURN_NOT_OK(BeginInPlace(c.version, &stats));
        sink.journal = redo.get();
        if (attached) sink.applied_ids = &applied_records;
        return Status::OK();
      };
      if (attached) {
        sink.applied = [&](const TensorView& t, const Box& box, uint64_t digest) {
          digests.Record(t.name, box, digest, /*full=*/false);
        };
      }
      REFIT_RETURN_NOT_OK(ApplyPayloads(manifests, &stats, &sink));
      // Durable through the redo log, synced per window: the model's pages are flushed lazily.
      internal::MaybeKillAt("receiver.model_synced");
      applying = 0;
    }
    Stopwatch commit;
    version = c.version;
    replacing = 0;
    commit_sha256 = read.sha256;
    if (redo != nullptr) log_bytes = redo->bytes();
    REFIT_RETURN_NOT_OK(SaveState());
    if (redo != nullptr) redo->MarkCommitted();
    if (attached) {
      // What the memory now holds, to verify a loaded_version after a restart.
      digests.set_version(version);
      REFIT_RETURN_NOT_OK(internal::WriteFileAtomic(DigestsPath(), digests.Serialize()));
    }
    failed_version = failed_count = 0;
    failed_error.clear();
    if (c.full) abandoned = 0;
    REFIT_RETURN_NOT_OK(SaveFailures());
    internal::MaybeKillAt("receiver.ack");
    // Until the ack is stored, a failed put is redone by EnsureAcknowledged on the next poll.
    ack_checked = false;
    REFIT_RETURN_NOT_OK(Acknowledge(c, total.Seconds(), stats.counters.records));
    ack_checked = true;
    // After the ack: a due checkpoint does not delay the sender.
    REFIT_RETURN_NOT_OK(MaybeCheckpoint(internal::CheckpointWhen::kDue));
    WarmModel();
    stats.commit_seconds = commit.Seconds();
    stats.total_seconds = total.Seconds();
    return stats;
  }

  Status Acknowledge(const Commit& c, double seconds, uint64_t records) {
    // Our commit of that version: set when the version committed, before its ack.
    Ack ack{id, c.version, seconds, records, commit_sha256};
    std::string text = SerializeAck(ack);
    REFIT_RETURN_NOT_OK(internal::PutVerified(*transport, AckKey(id, c.version),
                                              reinterpret_cast<const uint8_t*>(text.data()),
                                              text.size()));
    if (c.full && asked_full) {
      REFIT_RETURN_NOT_OK(transport->Remove(NeedFullKey(id)));
      asked_full = false;
    }
    return Status::OK();
  }

  // A receiver killed after committing its version locally but before acknowledging it (or
  // whose ack failed to store whole) acknowledges it now, once per process (the sender waits for
  // that ack).
  Result<bool> EnsureAcknowledged() {
    if (ack_checked || version == 0 || applying != 0) return false;
    bool sent = false;
    // One damaged in storage (or half re-put when the put failed) is no answer the sender takes.
    if (!internal::ReadValidAck(*transport, id, version, commit_sha256).has_value()) {
      REFIT_ASSIGN_OR_RAISE(std::optional<CommitRead> c, ReadCommit(version));
      if (!c) {
        ack_checked = true;  // the version is gone from the transport: nothing to answer
        return false;
      }
      REFIT_RETURN_NOT_OK(Acknowledge(c->commit, 0, 0));
      sent = true;
    }
    ack_checked = true;
    return sent;
  }

  // Marks the model as being patched to version v (so that a crash leaves a receiver that knows
  // its file is no longer `version`) and replays the redo log of an interrupted attempt.
  Status BeginInPlace(uint64_t v, ApplyStats* stats) {
    stats->resumed = applying == v;
    if (applying != v) {
      applying = v;
      REFIT_RETURN_NOT_OK(SaveState());
      internal::MaybeKillAt("receiver.applying");
    }
    if (attached) {
      // Attached memory dies with the process (a restarted one gets a full sync unless its
      // memory verifies): no journal to survive a crash, only the records an earlier attempt
      // of this version applied, to skip.
      if (applied_version != v) {
        applied_version = v;
        applied_records.clear();
      }
      stats->resumed_skipped_records = 0;
      return Status::OK();
    }
    if (redo == nullptr) REFIT_RETURN_NOT_OK(OpenLog());
    // Entries past the size of the last commit are this version's interrupted attempt: their
    // records are replayed (they may not all have reached the model) and skipped.
    stats->resumed_entries = stats->resumed ? redo->interrupted_entries() : 0;
    if (stats->resumed && redo->bytes() > log_bytes) {
      REFIT_RETURN_NOT_OK(internal::ReplayInto(*redo, ModelTensors(), log_bytes));
    }
    return Status::OK();
  }

  // Asks the senders for a full sync; `failed`: the version given up on (a sender whose last
  // version was full takes only such a request as its answer).
  Status RequestFull(const std::string& why, uint64_t failed = 0) {
    PutBackWrittenEarly();  // the memory waits for a full sync: what was written early goes back
    if (!asked_full || failed != 0) {
      json j = {{"receiver", id}, {"version", version}, {"reason", why}};
      if (failed != 0) j["abandoned"] = failed;
      std::string text = j.dump();
      REFIT_RETURN_NOT_OK(internal::PutVerified(
          *transport, NeedFullKey(id), reinterpret_cast<const uint8_t*>(text.data()), text.size()));
      asked_full = true;
    }
    return Status::OK();
  }

  // The newest full version above `after` (and above `floor`) that we may take: readable,
  // signed when a key is set, and on our chain. A planted one is skipped, wherever it points.
  Result<std::optional<CommitRead>> NewestFull(const std::vector<uint64_t>& versions,
                                               uint64_t floor) {
    for (uint64_t v : versions) {
      if (v <= floor) break;
      if (v == abandoned) continue;
      auto c = ReadCommit(v);
      if (!c.ok() || !c.value() || !c.value()->commit.full) continue;
      REFIT_ASSIGN_OR_RAISE(bool chained, ChainReaches(v));
      if (chained) return c;
    }
    return std::optional<CommitRead>();
  }

  // A failed apply of version v: counted, and the same failure max_failures times in a row
  // abandons the version (a full sync is asked for) so that one bad version never stalls us.
  Status Failed(uint64_t v, const Status& why) {
    if (why.code() == StatusCode::kVersionMismatch) return why;
    if (failed_version == v && failed_error == why.message()) {
      ++failed_count;
    } else {
      failed_version = v;
      failed_count = 1;
      failed_error = why.message();
    }
    if (failed_count < max_failures) {
      REFIT_RETURN_NOT_OK(SaveFailures());
      return why;
    }
    abandoned = v;
    REFIT_RETURN_NOT_OK(SaveFailures());
    const std::string gave_up = "version " + std::to_string(v) + " abandoned after " +
                                std::to_string(failed_count) + " failures (" + why.message() + ")";
    REFIT_RETURN_NOT_OK(RequestFull(gave_up, v));
    return Status::VersionMismatch(gave_up + "; need full sync");
  }
};

Receiver::Receiver() : impl_(std::make_unique<Impl>()) {}
Receiver::~Receiver() {
  // Attached memory stays valid until here: what was written early goes back, last first.
  if (impl_ != nullptr) impl_->DropEarly();
}

Result<std::unique_ptr<Receiver>> Receiver::Make(const Config& config,
                                                 std::shared_ptr<Registry> registry) {
  std::unique_ptr<Receiver> r(new Receiver());
  Impl& m = *r->impl_;
  m.config = config;
  m.registry = std::move(registry);
  if (m.registry == nullptr) {
    REFIT_ASSIGN_OR_RAISE(m.registry, LoadRegistry(&m.config));
  }
  REFIT_RETURN_NOT_OK(ValidateConfig(m.config, *m.registry));
  REFIT_ASSIGN_OR_RAISE(m.id, m.config.GetString("receiver.id", "r0"));
  REFIT_ASSIGN_OR_RAISE(m.state_dir, m.config.RequireString("receiver.state_dir"));
  REFIT_ASSIGN_OR_RAISE(m.apply_bytes, m.config.GetSize("receiver.apply_bytes", 256ull << 20));
  REFIT_ASSIGN_OR_RAISE(m.durable, m.config.GetBool("receiver.durable", true));
  REFIT_ASSIGN_OR_RAISE(int64_t checkpoint_versions,
                        m.config.GetInt("receiver.checkpoint_versions", 8));
  m.checkpoint.versions = static_cast<uint64_t>(std::max<int64_t>(1, checkpoint_versions));
  REFIT_ASSIGN_OR_RAISE(m.checkpoint.bytes, m.config.GetSize("receiver.checkpoint_bytes", 0));
  REFIT_ASSIGN_OR_RAISE(m.verify_payloads_first,
                        m.config.GetBool("receiver.verify_payloads_first", false));
  REFIT_ASSIGN_OR_RAISE(m.max_model_bytes, m.config.GetSize("receiver.max_model_bytes", 0));
  REFIT_ASSIGN_OR_RAISE(m.early_bytes, m.config.GetSize("receiver.early_bytes", 256ull << 20));
  REFIT_ASSIGN_OR_RAISE(m.write_early, m.config.GetBool("receiver.write_early", false));
  REFIT_ASSIGN_OR_RAISE(int64_t threads, m.config.GetInt("receiver.threads", 0));
  m.threads = internal::ResolveThreadCount(threads);
  if (m.threads > 1) m.pool = std::make_unique<internal::WorkerPool>(m.threads - 1);
  REFIT_ASSIGN_OR_RAISE(int64_t max_failures, m.config.GetInt("receiver.max_apply_failures", 3));
  m.max_failures = static_cast<uint64_t>(std::max<int64_t>(1, max_failures));
  REFIT_ASSIGN_OR_RAISE(m.auth_key, internal::LoadAuthKey(m.config));
  REFIT_ASSIGN_OR_RAISE(m.transport, internal::CreateConfiguredTransport(
                                         *m.registry, m.config, REFIT_ROLE_RECEIVER, m.id));
  m.encodings = std::make_unique<internal::EncodingCache>(*m.registry, &m.config);
  REFIT_ASSIGN_OR_RAISE(int64_t rank, m.config.GetInt("receiver.rank", 0));
  REFIT_ASSIGN_OR_RAISE(int64_t world, m.config.GetInt("receiver.world", 1));
  if (world < 1 || world > 1 << 20 || rank < 0 || rank >= world) {
    return Status::Invalid(m.config.Where("receiver.rank") + ": receiver.rank " +
                           std::to_string(rank) +
                           " is not in [0, receiver.world=" + std::to_string(world) + ")");
  }
  REFIT_ASSIGN_OR_RAISE(std::string layout, m.config.GetString("layout.name", "hf"));
  m.canonical = layout == "hf";
  REFIT_ASSIGN_OR_RAISE(
      m.layout, m.registry->CreateLayout(layout, static_cast<int>(rank), static_cast<int>(world),
                                         &m.config, "layout." + layout));
  REFIT_RETURN_NOT_OK(internal::MakeDirs(m.state_dir));
  REFIT_RETURN_NOT_OK(m.LoadState());
  REFIT_RETURN_NOT_OK(m.LoadFailures());
  auto nf = m.transport->Size(NeedFullKey(m.id));
  m.asked_full = nf.ok() && nf.value().has_value();
  return r;
}

Status Receiver::Attach(const std::vector<TensorView>& tensors,
                        std::optional<uint64_t> loaded_version) {
  Impl& m = *impl_;
  // What was written early goes back into the memory attached so far (valid until this call).
  m.DropEarly();
  std::set<std::string> names;
  for (const TensorView& t : tensors) {
    if (t.name.empty()) return Status::Invalid("Attach: a tensor has an empty name");
    if (!names.insert(t.name).second) {
      return Status::Invalid("Attach: tensor '" + t.name + "' is given twice");
    }
    REFIT_ASSIGN_OR_RAISE(uint64_t n, NumElements(t.shape));
    if (n != 0 && t.data == nullptr) {
      return Status::Invalid("Attach: tensor '" + t.name + "' has no memory");
    }
  }
  m.model.reset();
  m.attached = true;
  m.attached_views = tensors;
  m.version = m.applying = 0;
  m.commit_sha256.clear();
  REFIT_RETURN_NOT_OK(m.LoadState());
  m.model_unknown = true;
  auto text = internal::ReadSmallFile(m.DigestsPath(), 1ull << 30);
  if (text.ok()) {
    auto table = internal::BoxDigestTable::Parse(text.value(), m.DigestsPath());
    if (table.ok()) m.digests = std::move(table).value();
  }
  if (loaded_version && *loaded_version == m.version && m.version != 0 && m.applying == 0 &&
      m.digests.version() == m.version) {
    REFIT_ASSIGN_OR_RAISE(auto mapped, m.MappedElements(tensors));
    m.model_unknown = !m.digests.Matches(tensors, mapped);
  }
  // Memory that holds no known version is neither `version` nor mid-apply of one: only a full
  // sync fits it, and PollOnce asks for one.
  m.applying = 0;
  return Status::OK();
}

uint64_t Receiver::version() const { return impl_->version; }
uint64_t Receiver::applying() const { return impl_->applying; }
std::string Receiver::model_path() const { return impl_->ModelPath(); }

namespace {

std::string NeedFull(const std::string& id, const std::string& why) {
  return "need full sync: receiver '" + id + "' " + why;
}

}  // namespace

Status Receiver::Checkpoint() { return impl_->MaybeCheckpoint(internal::CheckpointWhen::kNow); }
Status Receiver::IdleCheckpoint() {
  return impl_->MaybeCheckpoint(internal::CheckpointWhen::kHalfway);
}

Result<bool> Receiver::WaitForArrival(uint32_t timeout_ms) {
  return impl_->transport->Wait(timeout_ms);
}

Result<std::optional<ApplyStats>> Receiver::PollOnce() {
  Impl& m = *impl_;
  Stopwatch poll;
  REFIT_RETURN_NOT_OK(m.EnsureAcknowledged().status());
  REFIT_ASSIGN_OR_RAISE(std::optional<CommitRead> next, m.ReadCommit(m.version + 1));
  if (next && next->commit.version == m.abandoned) next.reset();  // given up on: a full is due
  if (next && !m.Extends(*next)) {
    // Counted like a failed apply: if it stays so, the version is abandoned and the sender, which
    // waits for an answer to it, is told to send a full sync.
    return m.Failed(
        next->commit.version,
        Status::Corrupt(CommitKey(next->commit.version) +
                        ": refused: does not extend the version chain at version " +
                        std::to_string(m.version) + " (its prev is not the SHA-256 of " +
                        CommitKey(m.version) + ")"));
  }
  std::optional<uint64_t> newest;
  if (!next || m.version == 0 || m.asked_full || m.model_unknown) {
    // Without a usable next delta, jump to the newest full sync we may take, if one is there.
    REFIT_ASSIGN_OR_RAISE(auto versions, internal::ListCommits(*m.transport, m.version));
    if (!versions.empty()) newest = versions.front();
    const uint64_t floor = next && next->commit.full ? next->commit.version : m.version;
    REFIT_ASSIGN_OR_RAISE(std::optional<CommitRead> full, m.NewestFull(versions, floor));
    if (full) next = std::move(full);
  }
  if (!next) {
    if (m.applying != 0) {
      // Never "up to date" while the model holds part of a version it cannot complete.
      std::string why = NeedFull(m.id, "holds part of version " + std::to_string(m.applying) +
                                           ", which can no longer be completed");
      REFIT_RETURN_NOT_OK(m.RequestFull(why));
      return Status::VersionMismatch(why);
    }
    if (m.model_unknown && m.version != 0) {
      std::string why = NeedFull(
          m.id, "has attached memory not known to hold version " + std::to_string(m.version));
      REFIT_RETURN_NOT_OK(m.RequestFull(why));
      return Status::VersionMismatch(why);
    }
    REFIT_RETURN_NOT_OK(m.CheckLeftBehind(newest));
    if (m.version == 0 && newest) {
      // Versions exist but none we can start from: ask instead of guessing.
      std::string why = NeedFull(
          m.id, "has no committed state and version " + std::to_string(*newest) + " is a delta");
      REFIT_RETURN_NOT_OK(m.RequestFull(why));
      return Status::VersionMismatch(why);
    }
    // Nothing to apply yet: the next version's payloads that are already there are computed.
    m.ComputeEarlyPayloads();
    return std::optional<ApplyStats>();
  }
  const Commit& c = next->commit;
  if (!c.full && m.model_unknown) {
    std::string why = NeedFull(m.id, "has attached memory not known to hold version " +
                                         std::to_string(m.version) + ", and version " +
                                         std::to_string(c.version) + " is a delta");
    REFIT_RETURN_NOT_OK(m.RequestFull(why));
    return Status::VersionMismatch(why);
  }
  if (!c.full && m.applying != 0 && c.version != m.applying) {
    // The model holds part of version `applying`, which cannot be completed any more.
    std::string why =
        NeedFull(m.id, "was interrupted applying version " + std::to_string(m.applying) +
                           ", and version " + std::to_string(c.version) + " is a delta");
    REFIT_RETURN_NOT_OK(m.RequestFull(why));
    return Status::VersionMismatch(why);
  }
  if (!c.full && (m.version == 0 || c.base_version != m.version)) {
    std::string why = NeedFull(m.id, "holds version " + std::to_string(m.version) + ", version " +
                                         std::to_string(c.version) + " is a delta on version " +
                                         (c.base_version ? std::to_string(*c.base_version) : "?"));
    REFIT_RETURN_NOT_OK(m.RequestFull(why));
    return Status::VersionMismatch(why);
  }
  Result<ApplyStats> applied = m.Apply(*next);
  m.DropEarly();
  if (!applied.ok()) return m.Failed(c.version, applied.status());
  applied->total_seconds = poll.Seconds();  // the whole poll: reads of commits included
  return std::optional<ApplyStats>(std::move(applied).value());
}

}  // namespace refit
