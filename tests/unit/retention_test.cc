// Retention's rules on a real disk transport (framework/src/send/retention.h): what is deleted,
// what is left alone, and the chain bridges written for receivers left behind. The end-to-end
// behaviour with real processes is in tests/integration/retention_test.cc.
#include "send/retention.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "common/crypto.h"
#include "format/wire.h"
#include "protocol/chain_bridge.h"
#include "refit/config.h"
#include "refit/registry.h"
#include "temp_dir_util.h"

namespace refit {
namespace {

class RetentionRules : public ::testing::Test {
 protected:
  void SetUp() override {
    auto registry = Registry::WithBuiltins();
    ASSERT_TRUE(registry.ok()) << registry.status().ToString();
    registry_ = std::move(registry).value();
    Config config;
    config.SetString("transport.disk.dir", dir_.path().string());
    auto t = registry_->CreateTransport("disk", REFIT_ROLE_SENDER, "", &config, "transport.disk");
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    transport_ = std::move(t).value();
  }

  void Put(const std::string& key, const std::string& text) {
    ASSERT_TRUE(
        transport_->Put(key, reinterpret_cast<const uint8_t*>(text.data()), text.size()).ok())
        << key;
  }
  bool Has(const std::string& key) {
    auto size = transport_->Size(key);
    return size.ok() && size->has_value();
  }
  std::string Sha(uint64_t v) { return commit_sha_.at(v); }

  // Version v of two ranks: commit (chained to v-1 unless `prev` is given), manifests, payloads.
  void PutVersion(uint64_t v, const std::string* prev = nullptr) {
    Commit c;
    c.version = v;
    c.base_version = v - 1;
    c.world = 2;
    c.prev = prev != nullptr ? *prev : (v > 1 ? Sha(v - 1) : "");
    for (int rank = 0; rank < 2; ++rank) {
      c.manifests.push_back({ManifestKey(v, rank), 2, 0, 0, ""});
      Put(ManifestKey(v, rank), "{}");
      Put(PayloadKey(v, rank, 0), "payload");
    }
    const std::string text = SerializeCommit(c);
    commit_sha_[v] = internal::Sha256Hex(text);
    Put(CommitKey(v), text);
  }

  std::set<std::string> Keys(const std::string& prefix) {
    std::set<std::string> out;
    auto listed = transport_->List(prefix);
    EXPECT_TRUE(listed.ok());
    for (const auto& e : listed.value()) out.insert(e.first);
    return out;
  }

  internal::ChainBridge Bridge(const std::string& id) {
    auto bytes = transport_->GetAll(internal::ChainBridgeKey(id), 1 << 16);
    EXPECT_TRUE(bytes.ok()) << "no bridge for " << id;
    if (!bytes.ok()) return {};
    auto b = internal::ParseChainBridge(bytes->data(), bytes->size(), "bridge");
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    return b.ok() ? b.value() : internal::ChainBridge{};
  }

  testing::ScopedTempDir dir_{"refit-retention"};
  std::shared_ptr<Registry> registry_;
  std::unique_ptr<Transport> transport_;
  std::map<uint64_t, std::string> commit_sha_;
};

TEST_F(RetentionRules, DeletesExpiredVersionsWholeAndKeepsWhatIsNotOurs) {
  for (uint64_t v = 1; v <= 6; ++v) {
    PutVersion(v);
    Put(AckKey("r0", v), "{}");
  }
  Put(AckKey("r1", 1), "{}");
  Put(AckKey("r1", 2), "{}");
  Put(NeedFullKey("r1"), "{}");
  Put(AckKey("r2", 99), "{}");         // planted: above the newest version
  Put("vault/x", "not a version");     // not ours
  Put("v0000001/COMMIT", "7 digits");  // not a version directory
  Put("v000000001/COMMIT", "9 digits, but not VersionDir(1)");

  auto stats = internal::ApplyRetention(*transport_, 6, 2);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->versions_removed, 4u);
  EXPECT_EQ(stats->objects_removed, 4u * 5);
  EXPECT_EQ(stats->bridges_written, 1u);
  EXPECT_EQ(Keys("v"),
            (std::set<std::string>{"v0000001/COMMIT", "v000000001/COMMIT", "vault/x", CommitKey(5),
                                   ManifestKey(5, 0), ManifestKey(5, 1), PayloadKey(5, 0, 0),
                                   PayloadKey(5, 1, 0), CommitKey(6), ManifestKey(6, 0),
                                   ManifestKey(6, 1), PayloadKey(6, 0, 0), PayloadKey(6, 1, 0)}));
  // Acks: r0 keeps those of kept versions, r1 its latest and its need-full request, r2's planted
  // ack is left alone.
  EXPECT_EQ(Keys("acks/"), (std::set<std::string>{AckKey("r0", 5), AckKey("r0", 6), AckKey("r1", 2),
                                                  NeedFullKey("r1"), AckKey("r2", 99)}));
  // r1 holds version 2: its bridge spans the deleted commits 3..4.
  internal::ChainBridge b = Bridge("r1");
  EXPECT_EQ(b.receiver, "r1");
  EXPECT_EQ(b.from, 2u);
  EXPECT_EQ(b.from_sha256, Sha(2));
  EXPECT_EQ(b.to, 4u);
  EXPECT_EQ(b.to_sha256, Sha(4));
  EXPECT_FALSE(Has(internal::ChainBridgeKey("r0")));

  // The window moves on: the bridge is extended, then dropped once r1 acked inside the window.
  PutVersion(7);
  ASSERT_TRUE(internal::ApplyRetention(*transport_, 7, 2).ok());
  b = Bridge("r1");
  EXPECT_EQ(b.from, 2u);
  EXPECT_EQ(b.from_sha256, Sha(2));
  EXPECT_EQ(b.to, 5u);
  EXPECT_EQ(b.to_sha256, Sha(5));
  Put(AckKey("r1", 7), "{}");
  PutVersion(8);
  ASSERT_TRUE(internal::ApplyRetention(*transport_, 8, 2).ok());
  EXPECT_FALSE(Has(internal::ChainBridgeKey("r1")));
  EXPECT_FALSE(Has(AckKey("r1", 2)));

  // Idempotent: a second pass finds nothing to do.
  auto again = internal::ApplyRetention(*transport_, 8, 2);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->versions_removed + again->acks_removed + again->bridges_written, 0u);
}

TEST_F(RetentionRules, LeftoversWithoutACommitAreRemovedAndKeepZeroDeletesNothing) {
  for (uint64_t v = 1; v <= 4; ++v) PutVersion(v);
  ASSERT_TRUE(transport_->Remove(CommitKey(1)).ok());  // a pass killed after this
  auto none = internal::ApplyRetention(*transport_, 4, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->objects_removed, 0u);
  auto stats = internal::ApplyRetention(*transport_, 4, 3);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->versions_removed, 1u);
  EXPECT_EQ(stats->objects_removed, 4u);
  EXPECT_TRUE(Keys(VersionDir(1) + "/").empty());
  EXPECT_TRUE(Has(CommitKey(2)));
}

TEST_F(RetentionRules, ABrokenChainGetsNoBridgeAndTheStoreStaysBounded) {
  PutVersion(1);
  PutVersion(2);
  const std::string forged(64, 'a');
  PutVersion(3, &forged);  // does not name version 2's commit
  for (uint64_t v = 4; v <= 6; ++v) PutVersion(v);
  Put(AckKey("r1", 1), "{}");
  auto stats = internal::ApplyRetention(*transport_, 6, 2);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->bridges_written, 0u);
  EXPECT_FALSE(Has(internal::ChainBridgeKey("r1")));
  EXPECT_FALSE(Has(CommitKey(4)));
  EXPECT_TRUE(Has(CommitKey(5)));
}

TEST(ChainBridgeFormat, RoundTripsAndRefusesMalformedBridges) {
  internal::ChainBridge b{"r1", 2, std::string(64, 'a'), 5, std::string(64, 'b')};
  const std::string text = internal::SerializeChainBridge(b);
  auto parsed = internal::ParseChainBridge(reinterpret_cast<const uint8_t*>(text.data()),
                                           text.size(), "chain/r1");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->to, 5u);
  EXPECT_EQ(parsed->to_sha256, b.to_sha256);
  const std::string bad[] = {
      "",
      "[]",
      "{\"format\": \"refit-chain-bridge-v1\"}",
      "{\"format\": \"other\", \"receiver\": \"r1\", \"from\": 1, \"from_sha256\": \"\", \"to\": "
      "2, \"to_sha256\": \"\"}",
      internal::SerializeChainBridge({"r1", 5, b.from_sha256, 5, b.to_sha256}),
      internal::SerializeChainBridge({"r1", 2, "ABC", 5, b.to_sha256})};
  for (const std::string& t : bad) {
    auto r = internal::ParseChainBridge(reinterpret_cast<const uint8_t*>(t.data()), t.size(),
                                        "chain/r1");
    ASSERT_FALSE(r.ok()) << t;
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << t;
    EXPECT_EQ(r.status().message().rfind("chain/r1: ", 0), 0u) << r.status().message();
  }
}

}  // namespace
}  // namespace refit
