// The transport conformance suite: every transport must pass these checks of the keyed-blob-channel
// contract in plugin_abi.h. Instantiate TransportConformanceTest over transport names, e.g.
// ValuesIn(ComponentNames(REFIT_KIND_TRANSPORT)), with TransportParamName; see common.h for how a
// binary provides the registry.
//
// A transport needs a config to be created: RegisterTransportSetup() says how to make one per
// transport name (before RUN_ALL_TESTS). Transports without a setup are skipped with a reason.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "refit/config.h"
#include "refit/conformance/common.h"
#include "refit/registry.h"

namespace refit::conformance {

namespace fs = std::filesystem;

using Listing = std::vector<std::pair<std::string, uint64_t>>;

// How to create one transport for a test. scratch is an empty directory the test owns (removed
// afterwards); the config's keys live under "transport.<name>".
struct TransportSetup {
  std::function<Config(const fs::path& scratch)> make_config;
  std::string sender_peer_id;
  std::string receiver_peer_id;
};

inline std::map<std::string, TransportSetup>& TransportSetups() {
  static auto* setups = new std::map<std::string, TransportSetup>();
  return *setups;
}

// Registers (or replaces) how the suite creates transport `name`.
inline void RegisterTransportSetup(const std::string& name, TransportSetup setup) {
  TransportSetups()[name] = std::move(setup);
}

inline const TransportSetup* FindTransportSetup(const std::string& name) {
  auto it = TransportSetups().find(name);
  return it == TransportSetups().end() ? nullptr : &it->second;
}

inline std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word = rng();
    std::memcpy(v.data() + i, &word, 8);
  }
  for (; i < n; ++i) v[i] = static_cast<uint8_t>(rng());
  return v;
}

class TransportConformanceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto registry = LoadConformanceRegistry();
    ASSERT_TRUE(registry.ok()) << registry.status().ToString();
    registry_ = std::move(registry).value();
    setup_ = FindTransportSetup(GetParam());
    if (setup_ == nullptr) {
      GTEST_SKIP() << "transport '" << GetParam()
                   << "' has no TransportSetup: call RegisterTransportSetup for it";
    }
    std::string pattern = (fs::temp_directory_path() / "refit-transport-conf-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    scratch_ = pattern;
    config_ = setup_->make_config(scratch_);
    auto sender = Create(REFIT_ROLE_SENDER);
    ASSERT_TRUE(sender.ok()) << sender.status().ToString();
    transport_ = std::move(sender).value();
  }
  void TearDown() override {
    transport_.reset();
    if (!scratch_.empty()) {
      std::error_code ec;
      fs::remove_all(scratch_, ec);
    }
  }

  Result<std::unique_ptr<Transport>> Create(refit_transport_role_t role) {
    const std::string& peer =
        role == REFIT_ROLE_SENDER ? setup_->sender_peer_id : setup_->receiver_peer_id;
    return registry_->CreateTransport(GetParam(), role, peer, &config_, "transport." + GetParam());
  }

  void ExpectObject(Transport& t, const std::string& key, const std::vector<uint8_t>& want) {
    auto size = t.Size(key);
    ASSERT_TRUE(size.ok()) << size.status().ToString();
    ASSERT_TRUE(size.value().has_value()) << "key '" << key << "' missing";
    ASSERT_EQ(*size.value(), want.size()) << key;
    std::vector<uint8_t> got(want.size() + 1, 0xEE);  // +1: never a zero-length buffer
    Status st = t.Get(key, 0, got.data(), want.size());
    ASSERT_TRUE(st.ok()) << st.ToString();
    got.pop_back();
    EXPECT_TRUE(got == want) << "bytes of '" << key << "' differ";
  }

  std::optional<uint64_t> SizeOf(const std::string& key) {
    auto size = transport_->Size(key);
    EXPECT_TRUE(size.ok()) << size.status().ToString();
    return size.ok() ? size.value() : std::nullopt;
  }

  Listing ListOf(const std::string& prefix) {
    auto listed = transport_->List(prefix);
    EXPECT_TRUE(listed.ok()) << listed.status().ToString();
    return listed.ok() ? listed.value() : Listing{};
  }

  std::shared_ptr<Registry> registry_;
  const TransportSetup* setup_ = nullptr;
  fs::path scratch_;
  Config config_;
  std::unique_ptr<Transport> transport_;
};

TEST_P(TransportConformanceTest, PutGetRoundTrip) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{3} << 20}) {
    SCOPED_TRACE("size " + std::to_string(n));
    std::string key = "v00000001/payload.r0." + std::to_string(n) + ".st";
    std::vector<uint8_t> data = RandomBytes(n, n + 1);
    Status st = transport_->Put(key, data.data(), data.size());
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectObject(*transport_, key, data);
  }
}

TEST_P(TransportConformanceTest, RangedGet) {
  const size_t n = (size_t{3} << 20) + 17;
  std::vector<uint8_t> data = RandomBytes(n, 7);
  ASSERT_TRUE(transport_->Put("v00000002/payload.r0.000001.st", data.data(), n).ok());
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = {
      {0, 1},     {0, n},         {1, 4095}, {4095, 2}, {4096, 1 << 20}, {(1 << 20) + 3, 999},
      {n - 1, 1}, {n - 100, 100}, {n, 0},    {12345, 0}};
  for (auto [offset, len] : ranges) {
    SCOPED_TRACE("range [" + std::to_string(offset) + ", +" + std::to_string(len) + ")");
    std::vector<uint8_t> got(len + 1, 0xEE);
    Status st = transport_->Get("v00000002/payload.r0.000001.st", offset, got.data(), len);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(0, std::memcmp(got.data(), data.data() + offset, len));
    EXPECT_EQ(got[len], 0xEE) << "wrote past the requested length";
  }
}

TEST_P(TransportConformanceTest, GetPastEndOrOfMissingKeyIsAnError) {
  std::vector<uint8_t> data = RandomBytes(1000, 3);
  ASSERT_TRUE(transport_->Put("v00000003/manifest.r0.json", data.data(), data.size()).ok());
  std::vector<uint8_t> buf(2000);
  for (auto [offset, len] : std::vector<std::pair<uint64_t, uint64_t>>{
           {990, 20}, {0, 1001}, {1000, 1}, {1001, 0}, {5000, 10}}) {
    SCOPED_TRACE("range [" + std::to_string(offset) + ", +" + std::to_string(len) + ")");
    Status st = transport_->Get("v00000003/manifest.r0.json", offset, buf.data(), len);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
    EXPECT_NE(st.message().find("v00000003/manifest.r0.json"), std::string::npos) << st.ToString();
  }
  Status st = transport_->Get("v00000003/no-such-key", 0, buf.data(), 1);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
  EXPECT_NE(st.message().find("v00000003/no-such-key"), std::string::npos) << st.ToString();
}

TEST_P(TransportConformanceTest, SizeOfMissingKeyIsNullopt) {
  EXPECT_EQ(SizeOf("v00000004/COMMIT"), std::nullopt);
  EXPECT_EQ(SizeOf("never/existed/at/all"), std::nullopt);
  uint8_t byte = 1;
  ASSERT_TRUE(transport_->Put("v00000004/COMMIT", &byte, 1).ok());
  EXPECT_EQ(SizeOf("v00000004/COMMIT"), std::optional<uint64_t>(1));
  EXPECT_EQ(SizeOf("v00000004/COMMIT2"), std::nullopt);
}

TEST_P(TransportConformanceTest, OverwriteReplacesTheWholeObject) {
  const std::string key = "v00000005/manifest.r0.json";
  for (auto [n, seed] : std::vector<std::pair<size_t, uint64_t>>{
           {100000, 1}, {10, 2}, {0, 3}, {200000, 4}, {100000, 5}}) {
    SCOPED_TRACE("size " + std::to_string(n));
    std::vector<uint8_t> data = RandomBytes(n, seed);
    ASSERT_TRUE(transport_->Put(key, data.data(), data.size()).ok());
    ExpectObject(*transport_, key, data);
  }
  EXPECT_EQ(ListOf("v00000005/").size(), 1u);
}

TEST_P(TransportConformanceTest, ListByPrefix) {
  const Listing objects = {
      {"a/b/c/d/e", 5},
      {"acks/r0/v00000007", 0},
      {"acks/r1/v00000007", 1},
      {"acks/r10/v00000007", 2},
      {"v00000007/COMMIT", 3},
      {"v00000007/manifest.r0.json", 700},
      {"v00000007/payload.r0.000001.st", 70001},
      {"v00000007/payload.r0.000002.st", 4},
      {"v00000008/COMMIT", 6},
      {"v00000017/COMMIT", 7},
  };
  for (const auto& [key, size] : objects) {
    std::vector<uint8_t> data = RandomBytes(size, size);
    ASSERT_TRUE(transport_->Put(key, data.data(), data.size()).ok()) << key;
  }
  auto under = [&](const std::string& prefix) {
    Listing want;
    for (const auto& object : objects) {
      if (object.first.rfind(prefix, 0) == 0) want.push_back(object);
    }
    return want;
  };
  // Plain string prefixes: "acks/r1" also matches "acks/r10/...", "v0000001" only v00000017.
  for (const std::string prefix :
       {"", "v00000007/", "v00000007/payload.", "acks/", "acks/r1", "acks/r1/", "v0000001",
        "v0000000", "a/", "a/b/c/d/", "a/b/c/d/e", "nothing/", "v00000009/", "acks/r2"}) {
    SCOPED_TRACE("prefix '" + prefix + "'");
    Listing got = ListOf(prefix);
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, under(prefix));
  }
}

TEST_P(TransportConformanceTest, RemoveIsIdempotent) {
  uint8_t byte = 9;
  ASSERT_TRUE(transport_->Put("acks/r0/v00000006", &byte, 1).ok());
  ASSERT_TRUE(transport_->Put("acks/r0/v00000007", &byte, 1).ok());
  Status st = transport_->Remove("acks/r0/v00000006");
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(SizeOf("acks/r0/v00000006"), std::nullopt);
  EXPECT_EQ(ListOf("acks/"), (Listing{{"acks/r0/v00000007", 1}}));
  st = transport_->Remove("acks/r0/v00000006");
  EXPECT_TRUE(st.ok()) << st.ToString();
  st = transport_->Remove("never/existed");
  EXPECT_TRUE(st.ok()) << st.ToString();
  // A removed key can be put again.
  ASSERT_TRUE(transport_->Put("acks/r0/v00000006", &byte, 1).ok());
  EXPECT_EQ(SizeOf("acks/r0/v00000006"), std::optional<uint64_t>(1));
}

TEST_P(TransportConformanceTest, InvalidKeysAreRejected) {
  const std::vector<std::string> bad_keys = {
      "",   "../x", "/abs", "a//b", "a/./b", "a/../b",      ".",   "..",
      "a/", "a b",  "a\\b", "a*b",  "x\n",   "caf\xc3\xa9", "a:b", std::string(513, 'k')};
  uint8_t byte = 1;
  for (const std::string& key : bad_keys) {
    SCOPED_TRACE("key '" + key + "'");
    Status st = transport_->Put(key, &byte, 1);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    const bool printable = std::all_of(key.begin(), key.end(), [](char c) {
      return std::isprint(static_cast<unsigned char>(c)) != 0;
    });
    if (!key.empty() && key.size() < 100 && printable) {
      EXPECT_NE(st.message().find("'" + key + "'"), std::string::npos) << st.ToString();
    }
    EXPECT_EQ(transport_->Size(key).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(transport_->Get(key, 0, &byte, 1).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(transport_->Remove(key).code(), StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(transport_->List("../").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(transport_->List("/").status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ListOf("").empty()) << "a rejected put left an object behind";

  // The limit is inclusive: 512 characters in components of at most 100.
  std::string longest;
  while (longest.size() + 101 <= 512) longest += std::string(100, 'p') + "/";
  longest += std::string(512 - longest.size(), 'q');
  ASSERT_EQ(longest.size(), 512u);
  Status st = transport_->Put(longest, &byte, 1);
  EXPECT_TRUE(st.ok()) << st.ToString();
  // Every allowed character class, dots inside names included.
  st = transport_->Put("A-Z_a-z.0-9/..hidden/x..y/.z", &byte, 1);
  EXPECT_TRUE(st.ok()) << st.ToString();
}

// One instance, several threads: the framework's put thread and its control calls share an
// instance, so transports are safe to call concurrently for different keys.
TEST_P(TransportConformanceTest, ConcurrentPutsOfDistinctKeys) {
  constexpr int kThreads = 4;
  constexpr int kKeysPerThread = 16;
  auto key_of = [](int t, int k) {
    return "v00000009/payload.r" + std::to_string(t) + "." + std::to_string(k) + ".st";
  };
  auto data_of = [](int t, int k) {
    return RandomBytes(static_cast<size_t>(1000 * k + t), static_cast<uint64_t>(100 * t + k));
  };
  std::vector<Status> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kKeysPerThread; ++k) {
        std::vector<uint8_t> data = data_of(t, k);
        Status st = transport_->Put(key_of(t, k), data.data(), data.size());
        if (!st.ok()) {
          failures[t] = st;
          return;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const Status& st : failures) ASSERT_TRUE(st.ok()) << st.ToString();

  Listing listed = ListOf("v00000009/");
  ASSERT_EQ(listed.size(), static_cast<size_t>(kThreads * kKeysPerThread));
  for (int t = 0; t < kThreads; ++t) {
    for (int k = 0; k < kKeysPerThread; ++k) ExpectObject(*transport_, key_of(t, k), data_of(t, k));
  }
}

TEST_P(TransportConformanceTest, SenderAndReceiverSeeEachOthersObjects) {
  auto made = Create(REFIT_ROLE_RECEIVER);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Transport& receiver = *made.value();

  std::vector<uint8_t> manifest = RandomBytes(4321, 11);
  ASSERT_TRUE(transport_->Put("v00000010/manifest.r0.json", manifest.data(), manifest.size()).ok());
  ExpectObject(receiver, "v00000010/manifest.r0.json", manifest);
  auto listed = receiver.List("v00000010/");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed.value(), (Listing{{"v00000010/manifest.r0.json", manifest.size()}}));

  std::vector<uint8_t> ack = RandomBytes(16, 12);
  ASSERT_TRUE(receiver.Put("acks/r0/v00000010", ack.data(), ack.size()).ok());
  ExpectObject(*transport_, "acks/r0/v00000010", ack);
  EXPECT_EQ(ListOf("acks/r0/"), (Listing{{"acks/r0/v00000010", ack.size()}}));
}

// ABI 1.6 wait, where the transport has it: what arrives while a peer waits wakes it, and what
// arrived since its previous wait is not missed by the next. (Not that nothing else wakes it: a
// wake with nothing new is allowed.) Without it the host sleeps and says so.
TEST_P(TransportConformanceTest, WaitWakesForWhatArrivedSinceTheLastWait) {
  auto made = Create(REFIT_ROLE_RECEIVER);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Transport& receiver = *made.value();
  if (!receiver.can_wait()) {
    Result<bool> slept = receiver.Wait(1);
    ASSERT_TRUE(slept.ok()) << slept.status().ToString();
    EXPECT_FALSE(slept.value());
    return;
  }
  constexpr uint32_t kLongMs = 60000;     // a transport that misses the arrival returns false then
  const auto settle = [](Transport& t) {  // what arrived when the peers met
    for (int i = 0; i < 100; ++i) {
      Result<bool> woke = t.Wait(20);
      ASSERT_TRUE(woke.ok()) << woke.status().ToString();
      if (!woke.value()) return;
    }
  };
  settle(receiver);
  std::vector<uint8_t> commit = RandomBytes(100, 21);
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE(transport_->Put("v00000012/COMMIT", commit.data(), commit.size()).ok());
  });
  Result<bool> woke = receiver.Wait(kLongMs);
  later.join();
  ASSERT_TRUE(woke.ok()) << woke.status().ToString();
  EXPECT_TRUE(woke.value()) << "a put during the receiver's wait did not wake it";
  ExpectObject(receiver, "v00000012/COMMIT", commit);

  settle(receiver);
  ASSERT_TRUE(transport_->Put("v00000013/COMMIT", commit.data(), commit.size()).ok());
  ExpectObject(receiver, "v00000013/COMMIT", commit);
  woke = receiver.Wait(kLongMs);
  ASSERT_TRUE(woke.ok()) << woke.status().ToString();
  EXPECT_TRUE(woke.value()) << "a put before the receiver's wait was missed";

  settle(*transport_);
  std::vector<uint8_t> ack = RandomBytes(16, 22);
  ASSERT_TRUE(receiver.Put("acks/r0/v00000013", ack.data(), ack.size()).ok());
  ExpectObject(*transport_, "acks/r0/v00000013", ack);
  woke = transport_->Wait(kLongMs);
  ASSERT_TRUE(woke.ok()) << woke.status().ToString();
  EXPECT_TRUE(woke.value()) << "a receiver's put did not wake the sender";
}

TEST_P(TransportConformanceTest, ReadersNeverSeeAPartialOverwrite) {
  constexpr size_t kSize = size_t{1} << 20;
  constexpr int kWrites = 48;
  constexpr int kMaxReads = 20000;
  const std::string key = "v00000011/payload.r0.000001.st";
  const std::vector<uint8_t> a(kSize, 0xA5);
  const std::vector<uint8_t> b(kSize, 0x5A);
  ASSERT_TRUE(transport_->Put(key, a.data(), a.size()).ok());
  // The reader is a receiver over the same channel, as in a real sync.
  auto made = Create(REFIT_ROLE_RECEIVER);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Transport& reader = *made.value();

  std::atomic<bool> writer_done{false};
  Status writer_status;
  std::thread writer([&] {
    for (int i = 0; i < kWrites && writer_status.ok(); ++i) {
      const std::vector<uint8_t>& pattern = (i % 2 == 0) ? b : a;
      writer_status = transport_->Put(key, pattern.data(), pattern.size());
    }
    writer_done = true;
  });

  std::vector<uint8_t> got(kSize);
  int reads = 0;
  int torn = 0;
  Status reader_status;
  while (reads < kMaxReads && reader_status.ok() && (!writer_done || reads == 0)) {
    ++reads;
    auto size = reader.Size(key);
    if (!size.ok() || size.value() != std::optional<uint64_t>(kSize)) {
      reader_status =
          size.ok() ? Status::Corrupt("size is not 1 MiB mid-overwrite") : size.status();
      break;
    }
    reader_status = reader.Get(key, 0, got.data(), kSize);
    if (!reader_status.ok()) break;
    const uint8_t first = got[0];
    const bool uniform = std::all_of(got.begin(), got.end(), [&](uint8_t v) { return v == first; });
    if (!uniform || (first != 0xA5 && first != 0x5A)) ++torn;
  }
  writer.join();
  ASSERT_TRUE(writer_status.ok()) << writer_status.ToString();
  ASSERT_TRUE(reader_status.ok()) << reader_status.ToString();
  EXPECT_EQ(torn, 0) << torn << " of " << reads << " reads saw a mix of two versions";
  ExpectObject(*transport_, key, kWrites % 2 == 0 ? a : b);
  for (const auto& [listed_key, size] : ListOf("")) EXPECT_EQ(listed_key, key);
}

inline std::string TransportParamName(const ::testing::TestParamInfo<std::string>& info) {
  return SanitizeTestName(info.param);
}

}  // namespace refit::conformance
