// Forging objects in a disk transport's sync directory, as a writer of that directory (without the
// key, or - to isolate one check - with it) would: a version's commit, manifests and payloads are
// parsed into editable structures and stored again under any version number with every
// transport checksum (bytes, xxh3) recomputed, so what a forgery trips over is the chain, the
// signatures or the receiver's structural checks, never a plain checksum.
//
// SHA-256 and HMAC-SHA256 come from OpenSSL (reference_crypto.h), independent of the code under
// test, so the tests check refit's digests and MACs instead of reusing them.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cli_harness.h"
#include "format/wire.h"
#include "reference_crypto.h"
#include "refit/kernels/diff.h"

namespace refit::testing {

// Lowercase hex SHA-256 of `data`.
inline std::string Sha256Hex(const std::string& data) { return ReferenceSha256Hex(data); }

// Lowercase hex HMAC-SHA256(key, text).
inline std::string HmacSha256Hex(const std::string& key, const std::string& text) {
  return ReferenceHmacSha256Hex(key, text);
}

inline uint64_t Xxh3(const std::string& bytes) {
  return kernels::Digest64(bytes.data(), bytes.size());
}

// One record of a payload: its descriptor and its encoded bytes (edit either).
struct ForgedRecord {
  RecordHeader header;
  std::string bytes;
};
struct ForgedPayload {
  Metadata metadata;  // without "refit.records" (the builder writes it)
  std::vector<ForgedRecord> records;
  std::string sha256;  // the reference's sha256 as loaded ("" when unsigned)
};
struct ForgedPart {
  Manifest manifest;  // its payload references are rebuilt on Store
  std::vector<ForgedPayload> payloads;
  std::string sha256;  // the commit's reference's sha256 as loaded
};
struct ForgedVersion {
  Commit commit;  // its manifest references are rebuilt on Store; prev is stored as it is here
  std::vector<ForgedPart> parts;
};

// How Store treats the signatures and the SHA-256 of referenced objects.
struct ForgeOptions {
  // Sign manifests and commit with this key (as the sender would), after every other change.
  std::optional<std::string> key;
  // Without a key: keep the (now stale) macs as loaded instead of removing them.
  bool keep_macs = false;
  // Recompute the sha256 of each reference that carried one (payloads named by manifests,
  // manifests named by the commit); false: keep the loaded (now stale) one.
  bool recompute_payload_sha256 = true;
  bool recompute_manifest_sha256 = true;
  // Give every reference a sha256, even where the loaded one had none.
  bool add_sha256 = false;
};

// The objects of a disk transport's directory, by key ("v00000002/COMMIT").
class SyncStore {
 public:
  explicit SyncStore(std::string root) : root_(std::move(root)) {}

  std::string Path(const std::string& key) const { return root_ + "/" + key; }
  bool Has(const std::string& key) const { return std::filesystem::exists(Path(key)); }
  std::string Get(const std::string& key) const { return ReadAll(Path(key)); }
  void Put(const std::string& key, const std::string& bytes) const {
    std::filesystem::create_directories(std::filesystem::path(Path(key)).parent_path());
    WriteAll(Path(key), bytes);
  }
  // SHA-256 of a version's COMMIT exactly as stored (what the next version's prev names).
  std::string CommitSha(uint64_t v) const { return Sha256Hex(Get(CommitKey(v))); }

  // Version v's stored commit, parsed (a failed parse fails the calling test).
  Commit ParsedCommit(uint64_t v) const {
    const std::string bytes = Get(CommitKey(v));
    auto c = ParseCommit(U8(bytes), bytes.size(), CommitKey(v));
    EXPECT_TRUE(c.ok()) << c.status().message();
    return c.ok() ? c.value() : Commit{};
  }

  // Every object of version v's directory, to put back later with Restore.
  std::map<std::string, std::string> SaveVersion(uint64_t v) const {
    std::map<std::string, std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(Path(VersionDir(v)))) {
      out[VersionDir(v) + "/" + e.path().filename().string()] = ReadAll(e.path().string());
    }
    return out;
  }
  // Removes version v's directory and puts the saved objects back.
  void RestoreVersion(uint64_t v, const std::map<std::string, std::string>& saved) const {
    std::filesystem::remove_all(Path(VersionDir(v)));
    for (const auto& [key, bytes] : saved) Put(key, bytes);
  }

  // Parses version v (commit, manifests, payloads) into *out.
  ::testing::AssertionResult Load(uint64_t v, ForgedVersion* out) const {
    const std::string ckey = CommitKey(v);
    const std::string cbytes = Get(ckey);
    auto commit = ParseCommit(U8(cbytes), cbytes.size(), ckey);
    if (!commit.ok()) return ::testing::AssertionFailure() << commit.status().message();
    out->commit = commit.value();
    out->parts.clear();
    for (const PayloadRef& mref : out->commit.manifests) {
      const std::string mbytes = Get(mref.key);
      auto manifest = ParseManifest(U8(mbytes), mbytes.size(), mref.key);
      if (!manifest.ok()) return ::testing::AssertionFailure() << manifest.status().message();
      ForgedPart part{manifest.value(), {}, mref.sha256};
      for (const PayloadRef& pref : part.manifest.payloads) {
        ForgedPayload fp;
        if (auto r = LoadPayload(pref, &fp); !r) return r;
        part.payloads.push_back(std::move(fp));
      }
      out->parts.push_back(std::move(part));
    }
    return ::testing::AssertionSuccess();
  }

  // Stores `v` as version `as_version` (keys, version fields and payload metadata rewritten),
  // with bytes/xxh3 (and sha256, see ForgeOptions) of every reference recomputed. Leaves
  // commit.prev and base versions as they are in `v`. Returns the stored COMMIT bytes.
  std::string Store(ForgedVersion v, uint64_t as_version, const ForgeOptions& o = {}) const {
    v.commit.version = as_version;
    v.commit.manifests.clear();
    for (ForgedPart& part : v.parts) {
      Manifest& m = part.manifest;
      m.version = as_version;
      m.payloads.clear();
      m.payload_bytes = 0;
      for (size_t seq = 0; seq < part.payloads.size(); ++seq) {
        const std::string bytes = BuildPayload(part.payloads[seq], as_version);
        PayloadRef ref = Ref(PayloadKey(as_version, m.rank, seq), bytes, part.payloads[seq].sha256,
                             o.recompute_payload_sha256, o);
        ref.records = part.payloads[seq].records.size();
        Put(ref.key, bytes);
        m.payloads.push_back(ref);
        m.payload_bytes += ref.bytes;
      }
      SetMac(o, &m.mac, [&] { return SerializeManifest(m); });
      const std::string mtext = SerializeManifest(m);
      const std::string mkey = ManifestKey(as_version, m.rank);
      Put(mkey, mtext);
      v.commit.manifests.push_back(Ref(mkey, mtext, part.sha256, o.recompute_manifest_sha256, o));
    }
    SetMac(o, &v.commit.mac, [&] { return SerializeCommit(v.commit); });
    const std::string ctext = SerializeCommit(v.commit);
    Put(CommitKey(as_version), ctext);
    return ctext;
  }

 private:
  static const uint8_t* U8(const std::string& s) {
    return reinterpret_cast<const uint8_t*>(s.data());
  }

  ::testing::AssertionResult LoadPayload(const PayloadRef& ref, ForgedPayload* out) const {
    const std::string bytes = Get(ref.key);
    auto payload = Payload::Parse(U8(bytes), bytes.size(), ref.key);
    if (!payload.ok()) return ::testing::AssertionFailure() << payload.status().message();
    out->metadata = payload.value().metadata();
    out->metadata.erase("refit.records");
    out->sha256 = ref.sha256;
    for (const RecordHeader& h : payload.value().records()) {
      const uint8_t* b = payload.value().record_bytes(h);
      out->records.push_back({h, std::string(reinterpret_cast<const char*>(b),
                                             static_cast<size_t>(h.data_end - h.data_begin))});
    }
    return ::testing::AssertionSuccess();
  }

  static std::string BuildPayload(const ForgedPayload& p, uint64_t as_version) {
    Metadata md = p.metadata;
    if (md.count("refit.version") != 0) md["refit.version"] = std::to_string(as_version);
    PayloadBuilder builder(md);
    for (const ForgedRecord& r : p.records) {
      builder.Add(r.header, reinterpret_cast<const uint8_t*>(r.bytes.data()), r.bytes.size());
    }
    auto bytes = builder.Finish();
    EXPECT_TRUE(bytes.ok()) << bytes.status().message();
    if (!bytes.ok()) return std::string();
    return std::string(bytes.value().begin(), bytes.value().end());
  }

  static PayloadRef Ref(const std::string& key, const std::string& bytes,
                        const std::string& loaded_sha, bool recompute, const ForgeOptions& o) {
    PayloadRef ref;
    ref.key = key;
    ref.bytes = bytes.size();
    ref.xxh3 = Xxh3(bytes);
    const bool had = !loaded_sha.empty();
    if ((had && recompute) || o.add_sha256) {
      ref.sha256 = Sha256Hex(bytes);
    } else {
      ref.sha256 = loaded_sha;
    }
    return ref;
  }

  template <typename Serialize>
  static void SetMac(const ForgeOptions& o, std::string* mac, Serialize serialize) {
    if (o.key) {
      mac->clear();
      *mac = HmacSha256Hex(*o.key, serialize());
    } else if (!o.keep_macs) {
      mac->clear();
    }
  }

  std::string root_;
};

}  // namespace refit::testing
