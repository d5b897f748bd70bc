// The [faults] transport decorator (framework/src/faults/faults.h): each fault kind does what it
// says, decisions are reproducible from the seed, and the verified put/get helpers see through
// them.
#include "faults/faults.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "protocol/verified_io.h"
#include "refit/config.h"
#include "refit/kernels/diff.h"
#include "refit/refit.h"
#include "refit/registry.h"
#include "temp_dir_util.h"

namespace refit::internal {
namespace {

namespace fs = std::filesystem;

class FaultTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto registry = Registry::WithBuiltins();
    ASSERT_TRUE(registry.ok()) << registry.status().ToString();
    registry_ = std::move(registry).value();
  }

  std::unique_ptr<Transport> Disk() {
    Config config;
    config.SetString("transport.disk.dir", root_ + "/store");
    ConfigValue no;
    no.type = REFIT_CFG_BOOL;
    no.bool_value = false;
    config.Set("transport.disk.fsync", no);
    auto t = registry_->CreateTransport("disk", REFIT_ROLE_SENDER, "", &config, "transport.disk");
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return std::move(t).value();
  }

  // A decorated disk transport, with one fault kind at probability 1.
  std::unique_ptr<Transport> Faulty(FaultOptions o, std::shared_ptr<FaultInjector>* out = nullptr) {
    auto faults = std::make_shared<FaultInjector>(std::move(o));
    if (out != nullptr) *out = faults;
    auto t = WrapTransportWithFaults(Disk(), faults);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return std::move(t).value();
  }

  std::vector<uint8_t> Bytes(size_t n, uint8_t seed = 1) {
    std::vector<uint8_t> b(n);
    for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(seed + 31 * i);
    return b;
  }

  refit::testing::ScopedTempDir temp_{"refit-faults-test"};
  std::string root_ = temp_.path().string();
  std::shared_ptr<Registry> registry_;
};

TEST_F(FaultTransportTest, NoFaultsPassesEverythingThrough) {
  auto t = Faulty({});
  const auto data = Bytes(1000);
  ASSERT_TRUE(t->Put("v00000001/a", data.data(), data.size()).ok());
  auto got = t->GetAll("v00000001/a", 1 << 20);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got.value(), data);
  auto list = t->List("v");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list.value().size(), 1u);
  EXPECT_EQ(list.value()[0].second, 1000u);
  EXPECT_TRUE(t->Remove("v00000001/a").ok());
  EXPECT_FALSE(t->Size("v00000001/a").value().has_value());
  EXPECT_EQ(t->name(), "faults");
}

TEST_F(FaultTransportTest, DropReportsSuccessAndWritesNothing) {
  FaultOptions o;
  o.drop_put = 1;
  std::shared_ptr<FaultInjector> faults;
  auto t = Faulty(o, &faults);
  const auto data = Bytes(100);
  ASSERT_TRUE(t->Put("k", data.data(), data.size()).ok());
  EXPECT_FALSE(Disk()->Size("k").value().has_value());
  EXPECT_EQ(faults->counts()["drop_put"], 1u);
}

TEST_F(FaultTransportTest, TruncateWritesAStrictPrefix) {
  FaultOptions o;
  o.truncate_put = 1;
  auto t = Faulty(o);
  const auto data = Bytes(4096);
  ASSERT_TRUE(t->Put("k", data.data(), data.size()).ok());
  auto stored = Disk()->GetAll("k", 1 << 20);
  ASSERT_TRUE(stored.ok());
  ASSERT_LT(stored.value().size(), data.size());
  EXPECT_TRUE(std::equal(stored.value().begin(), stored.value().end(), data.begin()));
}

TEST_F(FaultTransportTest, CorruptPutStoresOtherBytesOfTheSameSize) {
  FaultOptions o;
  o.corrupt_put = 1;
  auto t = Faulty(o);
  const auto data = Bytes(4096);
  ASSERT_TRUE(t->Put("k", data.data(), data.size()).ok());
  auto stored = Disk()->GetAll("k", 1 << 20);
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored.value().size(), data.size());
  size_t differing = 0;
  for (size_t i = 0; i < data.size(); ++i) differing += stored.value()[i] != data[i];
  EXPECT_GE(differing, 1u);
  EXPECT_LE(differing, 3u);
}

TEST_F(FaultTransportTest, EnospcAndEioFailNamingTheKeyAndWriteNothing) {
  for (bool enospc : {true, false}) {
    FaultOptions o;
    (enospc ? o.enospc_put : o.eio_put) = 1;
    auto t = Faulty(o);
    const auto data = Bytes(10);
    Status st = t->Put("v00000003/payload.r0.000000.st", data.data(), data.size());
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kIoError);
    EXPECT_NE(st.message().find("v00000003/payload.r0.000000.st"), std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find(enospc ? "No space left on device" : "Input/output error"),
              std::string::npos)
        << st.message();
    EXPECT_FALSE(Disk()->Size("v00000003/payload.r0.000000.st").value().has_value());
  }
}

TEST_F(FaultTransportTest, GetFaultsFailOrCorruptWhatIsReturnedNotWhatIsStored) {
  const auto data = Bytes(512);
  ASSERT_TRUE(Disk()->Put("k", data.data(), data.size()).ok());
  FaultOptions fail;
  fail.fail_get = 1;
  auto failing = Faulty(fail);
  std::vector<uint8_t> buf(data.size());
  Status st = failing->Get("k", 0, buf.data(), buf.size());
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("'k'"), std::string::npos) << st.message();

  FaultOptions corrupt;
  corrupt.corrupt_get = 1;
  auto corrupting = Faulty(corrupt);
  ASSERT_TRUE(corrupting->Get("k", 0, buf.data(), buf.size()).ok());
  EXPECT_NE(buf, data);
  EXPECT_EQ(Disk()->GetAll("k", 1 << 20).value(), data);  // storage untouched
}

TEST_F(FaultTransportTest, DelayStillDoesTheOperation) {
  FaultOptions o;
  o.delay = 1;
  o.delay_ms = 2;
  std::shared_ptr<FaultInjector> faults;
  auto t = Faulty(o, &faults);
  const auto data = Bytes(10);
  ASSERT_TRUE(t->Put("k", data.data(), data.size()).ok());
  EXPECT_EQ(t->GetAll("k", 100).value(), data);
  EXPECT_GE(faults->counts()["delay"], 3u);  // put, size, get
}

TEST_F(FaultTransportTest, DecisionsAreReproducibleFromTheSeed) {
  auto run = [&](uint64_t seed) {
    FaultOptions o;
    o.seed = seed;
    o.drop_put = 0.2;
    o.corrupt_put = 0.2;
    o.eio_put = 0.2;
    FaultInjector faults(o);
    std::string trace;
    for (int i = 0; i < 200; ++i) {
      trace += std::to_string(
                   static_cast<int>(faults.Draw("put", "key" + std::to_string(i % 7)) * 1000)) +
               ",";
    }
    return trace;
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));

  // The same seed stores the same bytes through the decorator.
  auto stored = [&](uint64_t seed) {
    fs::remove_all(root_ + "/store");
    FaultOptions o;
    o.seed = seed;
    o.truncate_put = 0.3;
    o.corrupt_put = 0.3;
    auto t = Faulty(o);
    std::string all;
    for (int i = 0; i < 20; ++i) {
      const auto data = Bytes(256, static_cast<uint8_t>(i));
      const std::string key = "k" + std::to_string(i);
      EXPECT_TRUE(t->Put(key, data.data(), data.size()).ok());
      auto got = Disk()->GetAll(key, 1 << 20);
      all += std::string(got.value().begin(), got.value().end()) + "|";
    }
    return all;
  };
  EXPECT_EQ(stored(42), stored(42));
  EXPECT_NE(stored(42), stored(43));
}

TEST_F(FaultTransportTest, FaultLogRecordsEveryInjectedFault) {
  FaultOptions o;
  o.drop_put = 1;
  o.log = root_ + "/faults.log";
  auto t = Faulty(o);
  const auto data = Bytes(10);
  ASSERT_TRUE(t->Put("a", data.data(), data.size()).ok());
  ASSERT_TRUE(t->Put("b", data.data(), data.size()).ok());
  std::ifstream in(o.log);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "drop_put a\ndrop_put b\n");
}

TEST_F(FaultTransportTest, PutVerifiedRedoesSilentlyFailedPutsAndGetVerifiedRereads) {
  FaultOptions o;
  o.seed = 3;
  o.drop_put = 0.15;
  o.truncate_put = 0.15;
  o.corrupt_put = 0.15;
  o.corrupt_get = 0.15;
  auto t = Faulty(o);
  int verified = 0;
  for (int i = 0; i < 40; ++i) {
    const auto data = Bytes(300, static_cast<uint8_t>(i));
    const std::string key = "k" + std::to_string(i);
    Status st = PutVerified(*t, key, data.data(), data.size(), /*attempts=*/16);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ++verified;
    EXPECT_EQ(Disk()->GetAll(key, 1 << 20).value(), data);
    std::vector<uint8_t> got;
    ASSERT_TRUE(
        GetVerified(*t, key, data.size(), kernels::Digest64(data.data(), data.size()), got, 16)
            .ok());
    EXPECT_EQ(got, data);
  }
  EXPECT_EQ(verified, 40);
}

TEST_F(FaultTransportTest, PutVerifiedReturnsInjectedErrorsAtOnce) {
  FaultOptions o;
  o.enospc_put = 1;
  auto t = Faulty(o);
  const auto data = Bytes(10);
  Status st = PutVerified(*t, "v00000002/manifest.r0.json", data.data(), data.size());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("v00000002/manifest.r0.json"), std::string::npos) << st.message();
}

TEST(FaultConfig, KeysAreValidatedAndNamed) {
  auto parse = [](const std::string& text) {
    auto config = Config::FromString(text, "f.toml");
    EXPECT_TRUE(config.ok()) << config.status().ToString();
    return FaultOptionsFromConfig(config.value());
  };
  EXPECT_FALSE(parse("[sender]\nstate_dir = \"x\"\n").value().has_value());
  EXPECT_FALSE(parse("[faults]\nenabled = false\ndrop_put = 0.5\n").value().has_value());
  auto ok = parse(
      "[faults]\nseed = 9\ndrop_put = 0.1\nkill = 0.01\nkill_points = "
      "[\"sender.commit_put\"]\n");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  ASSERT_TRUE(ok.value().has_value());
  EXPECT_EQ(ok.value()->seed, 9u);
  EXPECT_EQ(ok.value()->kill_points, std::vector<std::string>{"sender.commit_put"});
  auto bad = parse("[faults]\ndrop_put = 1.5\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("faults.drop_put"), std::string::npos);
  auto sum = parse("[faults]\ndrop_put = 0.6\neio_put = 0.6\n");
  EXPECT_FALSE(sum.ok());
  auto point = parse("[faults]\nkill_points = [\"sender.nowhere\"]\n");
  ASSERT_FALSE(point.ok());
  EXPECT_NE(point.status().message().find("sender.nowhere"), std::string::npos);
}

TEST(FaultConfig, ValidateConfigAcceptsTheFaultsSectionAndRejectsTypos) {
  auto registry = Registry::WithBuiltins();
  ASSERT_TRUE(registry.ok());
  auto good = Config::FromString("[faults]\nseed = 1\ncorrupt_get = 0.1\n", "f.toml");
  ASSERT_TRUE(good.ok());
  EXPECT_TRUE(ValidateConfig(good.value(), *registry.value()).ok());
  auto typo = Config::FromString("[faults]\ncorupt_get = 0.1\n", "f.toml");
  ASSERT_TRUE(typo.ok());
  Status st = ValidateConfig(typo.value(), *registry.value());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("faults.corupt_get"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace refit::internal
