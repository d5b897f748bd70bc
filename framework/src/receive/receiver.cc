// The receiver pipeline: poll commit -> fetch manifest and payloads -> decode + apply in place
// within a byte cap -> verify each record's digest -> commit the version locally -> acknowledge.
#include "refit/receiver.h"

#include <unistd.h>

#include <map>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "common/state_json.h"
#include "common/stopwatch.h"
#include "faults/faults.h"
#include "format/model_file.h"
#include "plugins/encoding_cache.h"
#include "plugins/layout_map.h"
#include "protocol/verified_io.h"
#include "receive/apply.h"
#include "receive/journal.h"
#include "refit/kernels/diff.h"
#include "refit/offline.h"
#include "refit/sender.h"

namespace refit {

using internal::Stopwatch;
using json = nlohmann::json;

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
  // `applying` until that version is completed (resumed through the journal) or replaced by
  // a full sync.
  uint64_t applying = 0;
  // Set while a full sync's new file replaces the model: after a crash the file's own version
  // metadata says whether the rename happened.
  uint64_t replacing = 0;
  // Whether this process has made sure the ack of the version it started with exists (a crash
  // between committing a version locally and acknowledging it must not stall the sender).
  bool ack_checked = false;
  std::unique_ptr<internal::ApplyJournal> journal;
  bool asked_full = false;
  std::unique_ptr<SafetensorsFile> model;
  std::vector<uint8_t> payload_buffer;
  std::string prefetched;  // key of the verified payload payload_buffer holds, if any
  std::vector<uint8_t> scratch;

  std::string ModelPath() const { return state_dir + "/model.safetensors"; }
  std::string StatePath() const { return state_dir + "/receiver.json"; }
  std::string JournalPath() const { return state_dir + "/apply.journal"; }

  Status SaveState() {
    json j = {{"version", version}, {"receiver", id}};
    if (applying != 0) j["applying"] = applying;
    if (replacing != 0) j["replacing"] = replacing;
    return internal::WriteFileAtomic(StatePath(), j.dump(1));
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
    auto file = SafetensorsFile::Open(ModelPath(), /*writable=*/true);
    if (!file.ok()) return Status::OK();
    model = std::move(file).value();
    version = saved_version;
    applying = saved_applying;
    replacing = saved_replacing;
    if (replacing != 0) {
      // Killed around the rename of a full sync: the file says which version it is.
      if (internal::HoldsVersion(*model, replacing)) {
        version = replacing;
        applying = 0;
        ::unlink(JournalPath().c_str());
      }
      replacing = 0;
      REFIT_RETURN_NOT_OK(SaveState());
    }
    return Status::OK();
  }

  Result<std::optional<Commit>> ReadCommit(uint64_t v) {
    // Read until two reads agree: a commit corrupted on the way must not pass for another one.
    auto bytes = internal::GetStable(*transport, CommitKey(v), internal::kMaxControlBytes);
    if (!bytes.ok()) {
      if (bytes.status().code() == StatusCode::kNotFound) return std::optional<Commit>();
      return bytes.status();
    }
    REFIT_ASSIGN_OR_RAISE(Commit c,
                          ParseCommit(bytes.value().data(), bytes.value().size(), CommitKey(v)));
    if (c.version != v)
      return Status::Corrupt(CommitKey(v) + ": names version " + std::to_string(c.version));
    return std::optional<Commit>(c);
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
      REFIT_ASSIGN_OR_RAISE(Manifest m, ParseManifest(bytes.data(), bytes.size(), ref.key));
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

  Status ApplyPayloads(const std::vector<Manifest>& manifests, ApplyStats* stats) {
    std::map<std::string, TensorView*> by_name;
    std::vector<TensorView> tensors = model->tensors();
    for (TensorView& t : tensors) by_name[t.name] = &t;
    internal::TensorResolver resolve;
    if (canonical) {
      resolve = internal::CanonicalResolver(by_name);
    } else {
      REFIT_ASSIGN_OR_RAISE(std::vector<internal::LocalSlice> slices,
                            internal::MapLocalTensors(*layout, internal::SpecsOf(tensors)));
      resolve = internal::SliceResolver(std::move(slices), by_name, /*skip_foreign=*/true);
    }
    for (const Manifest& m : manifests) {
      for (const PayloadRef& p : m.payloads) {
        if (p.bytes > apply_bytes) {
          return Status::Invalid(
              p.key + ": payload of " + std::to_string(p.bytes) +
              " bytes exceeds receiver.apply_bytes = " + std::to_string(apply_bytes));
        }
        Stopwatch fetch;
        if (prefetched != p.key) REFIT_RETURN_NOT_OK(FetchPayload(m.version, p));
        prefetched.clear();
        stats->fetch_seconds += fetch.Seconds();
        Stopwatch apply;
        REFIT_ASSIGN_OR_RAISE(Payload payload,
                              Payload::Parse(payload_buffer.data(), p.bytes, p.key));
        REFIT_RETURN_NOT_OK(internal::ApplyPayload(payload, *encodings, resolve, apply_bytes,
                                                   scratch, stats, journal.get()));
        stats->apply_seconds += apply.Seconds();
        stats->payloads++;
        stats->payload_bytes += p.bytes;
        internal::MaybeKillAt("receiver.record_applied");
      }
    }
    return Status::OK();
  }

  // Fetches one payload into payload_buffer and checks it against its manifest entry (a failed
  // or corrupted read is retried a few times). A payload that stays missing, short or corrupt is
  // rejected by name, with the records it holds: none of them is applied.
  Status FetchPayload(uint64_t v, const PayloadRef& p) {
    prefetched.clear();
    Status st = internal::GetVerified(*transport, p.key, p.bytes, p.xxh3, payload_buffer);
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

  Status ApplyFull(const Commit& c, const std::vector<Manifest>& manifests, ApplyStats* stats) {
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
    const std::string tmp = ModelPath() + ".incoming";
    model.reset();
    REFIT_RETURN_NOT_OK(internal::CreateModelFile(
        tmp, specs, nullptr, {{internal::kVersionMetadataKey, std::to_string(c.version)}}));
    REFIT_ASSIGN_OR_RAISE(model, SafetensorsFile::Open(tmp, /*writable=*/true));
    Status st = ApplyPayloads(manifests, stats);
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
    return Status::OK();
  }

  // Applies version c (full or a delta on our version), commits it locally, acknowledges it.
  Result<ApplyStats> Apply(const Commit& c) {
    Stopwatch total;
    ApplyStats stats;
    stats.version = c.version;
    stats.full = c.full;
    prefetched.clear();
    REFIT_ASSIGN_OR_RAISE(std::vector<Manifest> manifests, ReadManifests(c));
    if (c.full) {
      REFIT_RETURN_NOT_OK(ApplyFull(c, manifests, &stats));
      applying = 0;
    } else {
      REFIT_RETURN_NOT_OK(VerifyPayloads(manifests));
      REFIT_RETURN_NOT_OK(BeginInPlace(c.version, &stats));
      REFIT_RETURN_NOT_OK(ApplyPayloads(manifests, &stats));
      REFIT_RETURN_NOT_OK(model->Sync());
      internal::MaybeKillAt("receiver.model_synced");
      applying = 0;
    }
    version = c.version;
    replacing = 0;
    REFIT_RETURN_NOT_OK(SaveState());
    internal::MaybeKillAt("receiver.ack");
    if (journal != nullptr) {
      REFIT_RETURN_NOT_OK(journal->Remove());
      journal.reset();
    } else {
      ::unlink(JournalPath().c_str());  // a journal of a version a full sync replaced
    }
    stats.total_seconds = total.Seconds();
    // Until the ack is stored, a failed put is redone by EnsureAcknowledged on the next poll.
    ack_checked = false;
    REFIT_RETURN_NOT_OK(Acknowledge(c, stats.total_seconds, stats.counters.records));
    ack_checked = true;
    return stats;
  }

  Status Acknowledge(const Commit& c, double seconds, uint64_t records) {
    Ack ack{id, c.version, seconds, records};
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

  // A receiver killed after committing its version locally but before acknowledging it
  // acknowledges it now, once per process (the sender waits for that ack).
  Result<bool> EnsureAcknowledged() {
    if (ack_checked || version == 0 || applying != 0) return false;
    REFIT_ASSIGN_OR_RAISE(std::optional<uint64_t> ack, transport->Size(AckKey(id, version)));
    bool sent = false;
    if (!ack.has_value()) {
      REFIT_ASSIGN_OR_RAISE(std::optional<Commit> c, ReadCommit(version));
      if (!c) {
        ack_checked = true;  // the version is gone from the transport: nothing to answer
        return false;
      }
      REFIT_RETURN_NOT_OK(Acknowledge(*c, 0, 0));
      sent = true;
    }
    ack_checked = true;
    return sent;
  }

  // Marks the model as being patched to version v (so that a crash leaves a receiver that knows
  // its file is no longer `version`) and opens the journal, replaying an interrupted attempt.
  Status BeginInPlace(uint64_t v, ApplyStats* stats) {
    stats->resumed = applying == v;
    if (applying != v) {
      applying = v;
      REFIT_RETURN_NOT_OK(SaveState());
      internal::MaybeKillAt("receiver.applying");
    }
    REFIT_ASSIGN_OR_RAISE(journal,
                          internal::ApplyJournal::Open(JournalPath(), v, version, durable));
    stats->resumed_entries = journal->resumed_entries();
    if (journal->resumed_entries() > 0) {
      std::map<std::string, TensorView*> by_name;
      std::vector<TensorView> tensors = model->tensors();
      for (TensorView& t : tensors) by_name[t.name] = &t;
      REFIT_RETURN_NOT_OK(journal->Replay(by_name));
    }
    return Status::OK();
  }

  Status RequestFull(const std::string& why) {
    if (!asked_full) {
      json j = {{"receiver", id}, {"version", version}, {"reason", why}};
      std::string text = j.dump();
      REFIT_RETURN_NOT_OK(internal::PutVerified(
          *transport, NeedFullKey(id), reinterpret_cast<const uint8_t*>(text.data()), text.size()));
      asked_full = true;
    }
    return Status::OK();
  }

  // The newest committed full version above `after`, and the newest committed version at all,
  // by listing the sync directory.
  struct CommitScan {
    std::optional<uint64_t> latest_full;
    std::optional<uint64_t> latest;
  };
  Result<CommitScan> ScanCommits(uint64_t after) {
    REFIT_ASSIGN_OR_RAISE(auto keys, transport->List("v"));
    CommitScan scan;
    for (auto it = keys.rbegin(); it != keys.rend(); ++it) {
      const std::string& key = it->first;
      if (key.size() < 7 || key.compare(key.size() - 7, 7, "/COMMIT") != 0) continue;
      std::optional<uint64_t> v = VersionOfKey(key);
      if (!v || *v <= after) continue;
      if (!scan.latest || *v > *scan.latest) scan.latest = *v;
      if (scan.latest_full && *v <= *scan.latest_full) continue;
      REFIT_ASSIGN_OR_RAISE(std::optional<Commit> c, ReadCommit(*v));
      if (c && c->full) scan.latest_full = *v;
    }
    return scan;
  }
};

Receiver::Receiver() : impl_(std::make_unique<Impl>()) {}
Receiver::~Receiver() = default;

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
  REFIT_ASSIGN_OR_RAISE(m.verify_payloads_first,
                        m.config.GetBool("receiver.verify_payloads_first", false));
  REFIT_ASSIGN_OR_RAISE(m.transport, internal::CreateTransportWithFaults(
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
  auto nf = m.transport->Size(NeedFullKey(m.id));
  m.asked_full = nf.ok() && nf.value().has_value();
  return r;
}

uint64_t Receiver::version() const { return impl_->version; }
std::string Receiver::model_path() const { return impl_->ModelPath(); }

Result<std::optional<ApplyStats>> Receiver::PollOnce() {
  Impl& m = *impl_;
  REFIT_RETURN_NOT_OK(m.EnsureAcknowledged().status());
  REFIT_ASSIGN_OR_RAISE(std::optional<Commit> next, m.ReadCommit(m.version + 1));
  std::optional<uint64_t> newest;
  if (!next || m.version == 0 || m.asked_full) {
    // Without a usable next delta, jump to the newest full sync if one is out there.
    REFIT_ASSIGN_OR_RAISE(Impl::CommitScan scan, m.ScanCommits(m.version));
    newest = scan.latest;
    if (scan.latest_full && (!next || !next->full || *scan.latest_full > next->version)) {
      REFIT_ASSIGN_OR_RAISE(next, m.ReadCommit(*scan.latest_full));
    }
  }
  if (!next) {
    if (m.version == 0 && newest) {
      // Versions exist but none we can start from: ask instead of guessing.
      std::string why = "need full sync: receiver '" + m.id + "' has no committed state and " +
                        "version " + std::to_string(*newest) + " is a delta";
      REFIT_RETURN_NOT_OK(m.RequestFull(why));
      return Status::VersionMismatch(why);
    }
    return std::optional<ApplyStats>();
  }
  if (!next->full && m.applying != 0 && next->version != m.applying) {
    // The model holds part of version `applying`, which cannot be completed any more.
    std::string why = "need full sync: receiver '" + m.id + "' was interrupted applying version " +
                      std::to_string(m.applying) + ", and version " +
                      std::to_string(next->version) + " is a delta";
    REFIT_RETURN_NOT_OK(m.RequestFull(why));
    return Status::VersionMismatch(why);
  }
  if (!next->full && (m.version == 0 || next->base_version != m.version)) {
    std::string why = "need full sync: receiver '" + m.id + "' holds version " +
                      std::to_string(m.version) + ", version " + std::to_string(next->version) +
                      " is a delta on version " +
                      (next->base_version ? std::to_string(*next->base_version) : "?");
    REFIT_RETURN_NOT_OK(m.RequestFull(why));
    return Status::VersionMismatch(why);
  }
  REFIT_ASSIGN_OR_RAISE(ApplyStats stats, m.Apply(*next));
  return std::optional<ApplyStats>(stats);
}

}  // namespace refit
