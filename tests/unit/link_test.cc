// Link emulation (framework/src/link/link.h): the token bucket's accounting on an injected clock
// and sleeper (bytes debited, sleeps requested; never wall time), the decorator's counters, and
// [transport] bandwidth in a config.
#include "link/link.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "refit/config.h"
#include "refit/refit.h"
#include "refit/registry.h"
#include "temp_dir_util.h"

namespace refit::internal {
namespace {

// A clock that moves only when the bucket sleeps (or the test advances it).
struct FakeTime {
  double now = 100;
  std::vector<double> sleeps;
  bool sleeping_advances = true;

  std::unique_ptr<TokenBucket> Bucket(uint64_t rate, uint64_t burst) {
    return std::make_unique<TokenBucket>(
        rate, burst, [this] { return now; },
        [this](double s) {
          sleeps.push_back(s);
          if (sleeping_advances) now += s;
        });
  }
};

TEST(TokenBucket, TheBurstCoversSmallTransfersWithoutSleeping) {
  FakeTime time;
  auto bucket = time.Bucket(1000, 100);
  EXPECT_EQ(bucket->Take(60), 0);
  EXPECT_EQ(bucket->Take(40), 0);
  EXPECT_TRUE(time.sleeps.empty());
  // The bucket is empty now: the next byte waits for its refill.
  EXPECT_DOUBLE_EQ(bucket->Take(10), 0.01);
  ASSERT_EQ(time.sleeps.size(), 1u);
  EXPECT_DOUBLE_EQ(time.sleeps[0], 0.01);
}

TEST(TokenBucket, ATransferLargerThanTheBurstPaysForItsBytesAtTheRate) {
  FakeTime time;
  auto bucket = time.Bucket(1000, 100);
  // 100 bytes from the burst, 500 at 1000 B/s.
  EXPECT_DOUBLE_EQ(bucket->Take(600), 0.5);
  // The sleep repaid the debt exactly: the bucket is empty, not refilled.
  EXPECT_DOUBLE_EQ(bucket->Take(100), 0.1);
  EXPECT_EQ(time.sleeps, (std::vector<double>{0.5, 0.1}));
}

TEST(TokenBucket, IdleTimeRefillsOnlyUpToTheBurst) {
  FakeTime time;
  auto bucket = time.Bucket(1000, 100);
  EXPECT_DOUBLE_EQ(bucket->Take(100), 0);
  time.now += 10;  // 10 s idle would be 10000 bytes: capped at the burst of 100
  EXPECT_DOUBLE_EQ(bucket->Take(300), 0.2);
  time.now += 0.05;  // the debt is repaid and 50 bytes refilled: 50 more wait 0.05 s
  EXPECT_NEAR(bucket->Take(100), 0.05, 1e-9);
}

TEST(TokenBucket, ConcurrentCallersQueueBehindEachOthersDebt) {
  FakeTime time;
  time.sleeping_advances = false;  // both callers take before either has slept
  auto bucket = time.Bucket(1000, 100);
  EXPECT_DOUBLE_EQ(bucket->Take(300), 0.2);
  EXPECT_DOUBLE_EQ(bucket->Take(300), 0.5);  // its bytes cross after the first caller's
  time.now += 0.5;                           // both debts repaid, the bucket is empty
  EXPECT_NEAR(bucket->Take(100), 0.1, 1e-9);
}

TEST(TokenBucket, ZeroRateIsUnlimited) {
  FakeTime time;
  auto bucket = time.Bucket(0, 0);
  EXPECT_EQ(bucket->Take(uint64_t{1} << 40), 0);
  EXPECT_TRUE(time.sleeps.empty());
}

TEST(TokenBucket, DefaultBurstIsTenMillisecondsOfTheRateAndAtLeast64KiB) {
  EXPECT_EQ(DefaultBurstBytes(200'000'000), 2'000'000u);
  EXPECT_EQ(DefaultBurstBytes(1'000'000), 64u << 10);
}

class LinkTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto registry = Registry::WithBuiltins();
    ASSERT_TRUE(registry.ok()) << registry.status().ToString();
    registry_ = std::move(registry).value();
    config_.SetString("transport.disk.dir", root_ + "/store");
    ConfigValue no;
    no.type = REFIT_CFG_BOOL;
    config_.Set("transport.disk.fsync", no);
  }

  std::unique_ptr<Transport> Disk() {
    auto t = registry_->CreateTransport("disk", REFIT_ROLE_SENDER, "", &config_, "transport.disk");
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return std::move(t).value();
  }

  refit::testing::ScopedTempDir temp_{"refit-link-test"};
  std::string root_ = temp_.path().string();
  std::shared_ptr<Registry> registry_;
  Config config_;
};

TEST_F(LinkTransportTest, PutsAndGetsTakeTheirBytesFromTheBucketAndAreCounted) {
  FakeTime time;
  std::shared_ptr<TokenBucket> bucket = time.Bucket(1000, 100);
  LinkTraffic traffic;
  auto wrapped = WrapTransportWithLink(Disk(), bucket, &traffic);
  ASSERT_TRUE(wrapped.ok()) << wrapped.status().ToString();
  std::unique_ptr<Transport> t = std::move(wrapped).value();
  EXPECT_EQ(t->name(), "disk");

  const std::vector<uint8_t> data(600, 7);
  ASSERT_TRUE(t->Put("v00000001/a", data.data(), data.size()).ok());
  EXPECT_EQ(time.sleeps, (std::vector<double>{0.5}));  // 100 from the burst, 500 at the rate
  std::vector<uint8_t> got(200);
  ASSERT_TRUE(t->Get("v00000001/a", 100, got.data(), got.size()).ok());
  EXPECT_EQ(got, std::vector<uint8_t>(200, 7));
  EXPECT_EQ(time.sleeps, (std::vector<double>{0.5, 0.2}));
  // Control operations move no payload bytes.
  ASSERT_TRUE(t->Size("v00000001/a").ok());
  ASSERT_TRUE(t->List("v").ok());
  EXPECT_EQ(time.sleeps.size(), 2u);
  // A failed get moved nothing and is not charged.
  EXPECT_FALSE(t->Get("missing", 0, got.data(), 1).ok());
  EXPECT_EQ(time.sleeps.size(), 2u);

  EXPECT_EQ(traffic.put_bytes.load(), 600u);
  EXPECT_EQ(traffic.puts.load(), 1u);
  EXPECT_EQ(traffic.get_bytes.load(), 200u);
  EXPECT_EQ(traffic.gets.load(), 1u);
  EXPECT_EQ(traffic.throttled_ns.load(), 700'000'000u);
  EXPECT_TRUE(t->Remove("v00000001/a").ok());
}

// A sender that reads its puts back from a copy of its own (the ucx spool) does not pay the link
// for them: its payload crosses once, not twice.
TEST_F(LinkTransportTest, LocalGetsAreCountedButNotCharged) {
  FakeTime time;
  LinkTraffic traffic;
  auto wrapped = WrapTransportWithLink(Disk(), time.Bucket(1000, 100), &traffic, LinkGets::kLocal);
  ASSERT_TRUE(wrapped.ok()) << wrapped.status().ToString();
  std::unique_ptr<Transport> t = std::move(wrapped).value();
  const std::vector<uint8_t> data(600, 3);
  ASSERT_TRUE(t->Put("v00000001/a", data.data(), data.size()).ok());
  EXPECT_EQ(time.sleeps, (std::vector<double>{0.5}));
  std::vector<uint8_t> got(600);
  ASSERT_TRUE(t->Get("v00000001/a", 0, got.data(), got.size()).ok());
  ASSERT_TRUE(t->Get("v00000001/a", 0, got.data(), got.size()).ok());
  EXPECT_EQ(got, data);
  EXPECT_EQ(time.sleeps, (std::vector<double>{0.5}));  // the put's only
  EXPECT_EQ(traffic.get_bytes.load(), 1200u);
  EXPECT_EQ(traffic.gets.load(), 2u);
  EXPECT_EQ(traffic.throttled_ns.load(), 500'000'000u);
}

TEST_F(LinkTransportTest, BandwidthIsASizeAndConfiguredTransportsAreCounted) {
  auto none = LinkOptionsFromConfig(config_);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none.value().bytes_per_second, 0u);

  auto parsed =
      Config::FromString("[transport]\nbandwidth = \"200MB\"\n[transport.disk]\ndir = \"" + root_ +
                             "/store\"\nfsync = false\n",
                         "link.toml");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_TRUE(ValidateConfig(parsed.value(), *registry_).ok());
  auto options = LinkOptionsFromConfig(parsed.value());
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(options.value().bytes_per_second, 200'000'000u);
  EXPECT_EQ(options.value().burst_bytes, 2'000'000u);

  // Within the burst: no wall-time wait, but counted for the process's sender role.
  auto t = CreateConfiguredTransport(*registry_, parsed.value(), REFIT_ROLE_SENDER, "s");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  LinkTraffic& sent = ProcessLinkTraffic(REFIT_ROLE_SENDER);
  const uint64_t before = sent.put_bytes.load();
  const std::vector<uint8_t> data(1000, 1);
  ASSERT_TRUE(t.value()->Put("k", data.data(), data.size()).ok());
  EXPECT_EQ(sent.put_bytes.load() - before, 1000u);

  auto bad = Config::FromString("[transport]\nbandwidth = \"fast\"\n", "bad.toml");
  ASSERT_TRUE(bad.ok());
  Status st = ValidateConfig(bad.value(), *registry_);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("bad.toml:2"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("transport.bandwidth"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace refit::internal
