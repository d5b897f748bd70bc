// Signed versions and the version chain (docs/reliability.md, "Trust boundary"): with a key
// ([auth] key_file or REFIT_AUTH_KEY) every manifest and commit carries an HMAC-SHA256 and every
// object they name its SHA-256; a version a writer of the sync directory made or altered without
// the key is refused with one line, the receiver's model staying its committed version, and the
// key itself never appears in any output or stored object. Without a key, the chain (each
// commit's prev = SHA-256 of the previous COMMIT as stored) still refuses a planted version.
#include <gtest/gtest.h>

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "sync_fixture.h"

namespace refit::testing {
namespace {

namespace fs = std::filesystem;

const std::string kKey = "k3y-0123456789abcdef-SECRET-xyzzy";

class AuthChainTest : public SyncFixture {
 protected:
  void SetUp() override {
    SyncFixture::SetUp();
    WriteAll(dir_ / "auth.key", kKey + "\n");  // the trailing newline is not part of the key
    SyncConfig c;
    c.tail = "\n[auth]\nkey_file = \"" + dir_ / "auth.key" + "\"\n";
    WriteConfig(c);
  }

  // The key (or a long piece of it) is in no output so far and in no object of the sync dir.
  void ExpectKeyNowhere() const {
    const std::string piece = kKey.substr(4, 16);
    EXPECT_EQ(all_output_.find(piece), std::string::npos)
        << "the key appears in the output of a refit command:\n"
        << all_output_;
    for (const auto& e : fs::recursive_directory_iterator(dir_ / "sync")) {
      if (!e.is_regular_file()) continue;
      EXPECT_EQ(ReadAll(e.path().string()).find(piece), std::string::npos)
          << "the key is stored in " << e.path();
    }
  }

  // Refused with one line saying so; the model and state stay at version v.
  void ExpectRefused(const CommandResult& r, int v, const std::string& what) {
    EXPECT_NE(r.exit_code, 0) << what << " was not refused: " << r.out << r.err;
    EXPECT_NE(r.err.find("refused"), std::string::npos)
        << what << ": the error does not say \"refused\": " << r.err;
    EXPECT_EQ(LineCount(r.err), 1) << what << ": not one line: " << r.err;
    ExpectModelAt(v, what);
    EXPECT_FALSE(LogHasUncommittedEntries(dir_ / "receiver"))
        << what << ": the redo log holds entries of the refused version";
  }
};

// Checks version v's stored commit, manifests and payloads are signed with `key` and chained.
void ExpectSignedAndChained(const SyncStore& store, uint64_t v, const std::string& key) {
  const std::string where = "version " + std::to_string(v);
  const std::string ctext = store.Get(CommitKey(v));
  auto commit = ParseCommit(reinterpret_cast<const uint8_t*>(ctext.data()), ctext.size(), where);
  ASSERT_TRUE(commit.ok()) << commit.status().message();
  Commit c = commit.value();
  EXPECT_EQ(c.prev, v == 1 ? std::string() : store.CommitSha(v - 1))
      << where << ": commit's prev is not the SHA-256 of the previous COMMIT";
  const std::string cmac = c.mac;
  c.mac.clear();
  EXPECT_EQ(cmac, HmacSha256Hex(key, SerializeCommit(c))) << where << ": commit mac";
  for (const PayloadRef& mref : c.manifests) {
    const std::string mtext = store.Get(mref.key);
    EXPECT_EQ(mref.sha256, Sha256Hex(mtext)) << mref.key << ": sha256 in the commit";
    auto parsed =
        ParseManifest(reinterpret_cast<const uint8_t*>(mtext.data()), mtext.size(), mref.key);
    ASSERT_TRUE(parsed.ok()) << parsed.status().message();
    Manifest m = parsed.value();
    const std::string mmac = m.mac;
    m.mac.clear();
    EXPECT_EQ(mmac, HmacSha256Hex(key, SerializeManifest(m))) << mref.key << ": manifest mac";
    for (const PayloadRef& pref : m.payloads) {
      EXPECT_EQ(pref.sha256, Sha256Hex(store.Get(pref.key))) << pref.key << ": sha256";
    }
  }
}

TEST(ForgeDigests, MatchPublishedTestVectors) {
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  // RFC 4231, test case 2.
  EXPECT_EQ(HmacSha256Hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST_F(AuthChainTest, HonestSignedSyncAppliesAndCarriesMacsAndDigests) {
  ASSERT_NO_FATAL_FAILURE(SyncUpTo(3));
  for (uint64_t v = 1; v <= 3; ++v) ExpectSignedAndChained(Store(), v, kKey);
  ExpectKeyNowhere();
  ExpectOutsideUntouched();
}

enum class Forgery { kMacRemoved, kPayloadChangedMacStale, kSignedButPayloadShaStale };

void PrintTo(Forgery f, std::ostream* os) {
  *os << (f == Forgery::kMacRemoved               ? "mac removed"
          : f == Forgery::kPayloadChangedMacStale ? "payload changed, mac stale"
                                                  : "re-signed, payload sha256 stale");
}

class AuthForgeryTest : public AuthChainTest, public ::testing::WithParamInterface<Forgery> {};

// Version 2 re-stored with correct transport checksums by a writer without the key (or, for the
// last case, with it, to show each named object's SHA-256 is checked too).
TEST_P(AuthForgeryTest, VersionAlteredWithoutTheKeyIsRefused) {
  // Dense records: a changed byte with its record digest recomputed is a forgery that would
  // apply cleanly if nothing but the transport checksums and record digests were checked.
  SyncConfig c;
  c.sender_extra = "encoding = \"dense\"\n";
  c.tail = "\n[auth]\nkey_file = \"" + dir_ / "auth.key" + "\"\n";
  WriteConfig(c);
  ASSERT_NO_FATAL_FAILURE(SyncUpTo(1));
  auto s = Send(2);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  const SyncStore store = Store();
  const auto honest = store.SaveVersion(2);
  ForgedVersion v;
  ASSERT_TRUE(store.Load(2, &v));
  ForgeOptions o;
  if (GetParam() != Forgery::kMacRemoved) {
    ASSERT_FALSE(v.parts[0].payloads.empty());
    ForgedRecord& r = v.parts[0].payloads[0].records[0];
    ASSERT_EQ(r.header.encoding, "dense");
    ASSERT_EQ(r.header.digest, Xxh3(r.bytes)) << "a dense record's digest is not that of its bytes";
    r.bytes[r.bytes.size() / 2] ^= 0x01;
    r.header.digest = Xxh3(r.bytes);
  }
  if (GetParam() == Forgery::kPayloadChangedMacStale) o.keep_macs = true;
  if (GetParam() == Forgery::kSignedButPayloadShaStale) {
    o.key = kKey;
    o.recompute_payload_sha256 = false;  // the manifest's sha256 in the commit is right
  }
  store.Store(v, 2, o);
  ExpectRefused(Recv(), 1, "a forged version 2");
  ExpectOutsideUntouched();

  store.RestoreVersion(2, honest);
  auto r = Recv();
  ASSERT_EQ(r.exit_code, 0) << "the honest version 2 was not applied: " << r.err;
  ExpectModelAt(2, "after the honest version 2");
  ExpectKeyNowhere();
}

INSTANTIATE_TEST_SUITE_P(Forgeries, AuthForgeryTest,
                         ::testing::Values(Forgery::kMacRemoved, Forgery::kPayloadChangedMacStale,
                                           Forgery::kSignedButPayloadShaStale),
                         [](const ::testing::TestParamInfo<Forgery>& info) {
                           switch (info.param) {
                             case Forgery::kMacRemoved:
                               return std::string("MacRemoved");
                             case Forgery::kPayloadChangedMacStale:
                               return std::string("PayloadChangedMacStale");
                             case Forgery::kSignedButPayloadShaStale:
                               return std::string("SignedButPayloadShaStale");
                           }
                           return std::string("unknown");
                         });

TEST_F(AuthChainTest, KeyFromTheEnvironmentSignsAndVerifies) {
  WriteConfig(SyncConfig{});  // no [auth]: the key comes from REFIT_AUTH_KEY only
  const std::vector<std::string> env = {"REFIT_AUTH_KEY=" + kKey};
  ASSERT_NO_FATAL_FAILURE(SyncUpTo(2, env));
  ExpectSignedAndChained(Store(), 2, kKey);
  auto s = Send(3, env);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  const SyncStore store = Store();
  const auto honest = store.SaveVersion(3);
  ForgedVersion v;
  ASSERT_TRUE(store.Load(3, &v));
  store.Store(v, 3);  // macs removed
  ExpectRefused(Recv(env), 2, "version 3 without its macs (key from REFIT_AUTH_KEY)");

  store.RestoreVersion(3, honest);
  auto r = Recv(env);
  ASSERT_EQ(r.exit_code, 0) << "the honest version 3 was not applied: " << r.err;
  ExpectModelAt(3, "after the honest version 3");
  ExpectKeyNowhere();
  ExpectOutsideUntouched();
}

TEST_F(AuthChainTest, KeyFileShorterThan16BytesIsAConfigError) {
  const std::string short_key = "0123456789abcde";  // 15 bytes once the newline is dropped
  WriteAll(dir_ / "auth.key", short_key + "\n");
  for (const char* cmd : {"send", "recv"}) {
    auto r = std::string(cmd) == "send" ? Send(1) : Recv();
    EXPECT_EQ(r.exit_code, 2) << cmd << " with a 15-byte key: " << r.out << r.err;
    EXPECT_EQ(LineCount(r.err), 1) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find("auth.key_file"), std::string::npos)
        << cmd << ": the error does not name auth.key_file: " << r.err;
    EXPECT_EQ(r.err.find(short_key), std::string::npos) << cmd << " printed the key: " << r.err;
    EXPECT_EQ(r.out.find(short_key), std::string::npos) << cmd << " printed the key: " << r.out;
  }
  EXPECT_FALSE(Store().Has(CommitKey(1))) << "a version was published with a rejected key";
  EXPECT_FALSE(Exists("receiver/model.safetensors"));
  ExpectOutsideUntouched();
}

// No key: a version planted at the next number that does not extend the receiver's chain (version
// 2 replayed as 3, its base rewritten, its prev still naming version 1's commit) is refused; the
// sender then publishes version 3 honestly over it, and that applies.
TEST_F(AuthChainTest, WithoutAKeyTheChainRefusesAPlantedVersion) {
  WriteConfig(SyncConfig{});
  ASSERT_NO_FATAL_FAILURE(SyncUpTo(2));
  const SyncStore store = Store();
  ForgedVersion v;
  ASSERT_TRUE(store.Load(2, &v));
  ASSERT_EQ(v.commit.prev, store.CommitSha(1)) << "version 2 does not chain to version 1";
  v.commit.base_version = 2;
  for (ForgedPart& part : v.parts) {
    if (!part.manifest.full) part.manifest.base_version = 2;
  }
  store.Store(v, 3);
  auto r = Recv();
  EXPECT_NE(r.exit_code, 0) << "a replayed version off the chain was taken: " << r.out;
  EXPECT_EQ(LineCount(r.err), 1) << r.err;
  ExpectModelAt(2, "after the replayed version 3");

  auto s = Send(3);
  ASSERT_EQ(s.exit_code, 0) << "the sender did not republish version 3 honestly: " << s.err;
  EXPECT_NE(s.out.find("published version 3"), std::string::npos) << s.out;
  EXPECT_EQ(store.ParsedCommit(3).prev, store.CommitSha(2))
      << "the republished version 3 does not chain to version 2";
  r = Recv();
  ASSERT_EQ(r.exit_code, 0) << "the honest version 3 was not applied: " << r.err;
  ExpectModelAt(3, "after the honest version 3");
  ExpectOutsideUntouched();
}

}  // namespace
}  // namespace refit::testing
