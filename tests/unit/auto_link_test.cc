// `auto` mode "link": the per-record pick from a cost model (injected through a calibration
// file, or measured once per process), its config keys, and the cost model file's parser.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <string_view>

#include "delta_test_util.h"
#include "format/wire.h"
#include "plugins/encoding_cache.h"
#include "refit/delta.h"
#include "refit/log.h"
#include "refit/refit.h"
#include "refit/sender.h"
#include "send/auto_policy.h"
#include "send/calibrate.h"
#include "send/cost_model.h"
#include "temp_dir_util.h"

namespace refit {
namespace {

using testing::TestRegistry;

// bf16 only: the injected model below covers bf16, so every pick is the model's.
testing::TensorPair Bf16Pair() {
  testing::TensorPair p;
  p.Add("a", DType::kBF16, 200'000, 0.01, 1);
  p.Add("b", DType::kBF16, 300'000, 0.002, 2);
  p.Add("c", DType::kBF16, 100'000, 0.03, 3);
  return p;
}

// indices: cheap CPU, 6 bytes a change; ctx: 40x the CPU, 1 byte a change. At 10 kB/s of link
// a change's bytes cost 0.5 ms against ctx's 100 ns more CPU; unlimited, only CPU counts.
constexpr const char* kModel = R"({"link_model": {"version": 1, "dtypes": {"bf16": {
  "indices": {"encode_ns": [100, 0.1, 1], "decode_ns": [100, 0.1, 1], "bytes": [16, 0, 6]},
  "ctx": {"encode_ns": [100, 4, 50], "decode_ns": [100, 4, 50], "bytes": [16, 0, 1]}}}}})";

std::string WriteFile(const testing::ScopedTempDir& dir, const std::string& name,
                      const std::string& text) {
  const std::string path = (dir.path() / name).string();
  std::ofstream(path) << text;
  return path;
}

Config LinkConfig(const std::string& calibration, const std::string& bandwidth) {
  auto config = Config::FromString(
      "[encoding.auto]\ncandidates = [\"indices\", \"ctx\"]\n"
      "mode = \"link\"\nlink_bandwidth = \"" +
          bandwidth + "\"\ncalibration = \"" + calibration + "\"\n",
      "t.toml");
  EXPECT_TRUE(config.ok()) << config.status().message();
  return config.value();
}

std::vector<std::string> RecordEncodings(const std::vector<uint8_t>& bytes) {
  auto parsed = Payload::Parse(bytes.data(), bytes.size(), "test");
  EXPECT_TRUE(parsed.ok()) << parsed.status().message();
  std::vector<std::string> names;
  for (const RecordHeader& r : parsed.value().records()) names.push_back(r.encoding);
  return names;
}

void ExpectAppliesBitExact(const testing::TensorPair& p, const std::vector<uint8_t>& payload,
                           const Registry& registry) {
  std::vector<std::vector<uint8_t>> work = p.base_bits;
  std::vector<TensorView> views = p.base;
  for (size_t i = 0; i < views.size(); ++i) views[i].data = work[i].data();
  auto applied = ApplyDelta(payload, views, registry, nullptr);
  ASSERT_TRUE(applied.ok()) << applied.status().message();
  EXPECT_EQ(work, p.next_bits);
}

TEST(AutoLink, PicksTheSmallestPayloadOnASlowLinkAndTheCheapestCpuOnAFastOne) {
  auto registry = TestRegistry();
  testing::ScopedTempDir dir("refit-auto-link");
  const std::string model = WriteFile(dir, "model.json", kModel);
  testing::TensorPair p = Bf16Pair();
  DeltaOptions opt;
  opt.chunk_bytes = 64 << 10;
  opt.threads = 1;
  for (const auto& [bandwidth, expected] : {std::pair<std::string, std::string>{"10kB", "ctx"},
                                            {"0", "indices"},
                                            {"100GB", "indices"}}) {
    Config config = LinkConfig(model, bandwidth);
    ASSERT_TRUE(ValidateConfig(config, *registry).ok());
    auto payload = EncodeDelta(p.base, p.next, opt, *registry, &config);
    ASSERT_TRUE(payload.ok()) << payload.status().message();
    std::vector<std::string> chosen = RecordEncodings(payload.value());
    ASSERT_GT(chosen.size(), 5u);
    for (const std::string& e : chosen) EXPECT_EQ(e, expected) << "link_bandwidth " << bandwidth;
    ExpectAppliesBitExact(p, payload.value(), *registry);
    // The pick is the single encoding's record, byte for byte.
    DeltaOptions single = opt;
    single.encoding = expected;
    auto alone = EncodeDelta(p.base, p.next, single, *registry, nullptr);
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ(payload.value(), alone.value()) << bandwidth;
  }
}

TEST(AutoLink, CheapestEncodingWeighsBytesByBandwidth) {
  internal::EncodingCost cpu_cheap{{0, 1, 0}, {0, 1, 0}, {0, 0, 100}};
  internal::EncodingCost small{{0, 10, 0}, {0, 10, 0}, {0, 0, 1}};
  const std::vector<internal::EncodingCost> costs = {cpu_cheap, small};
  // 1e6 elements, 1e4 changes: cpu_cheap 2 ms + 1 MB, small 20 ms + 10 kB.
  EXPECT_EQ(internal::CheapestEncoding(costs, 1'000'000, 10'000, 0), 0u);
  EXPECT_EQ(internal::CheapestEncoding(costs, 1'000'000, 10'000, 1e9), 0u);
  EXPECT_EQ(internal::CheapestEncoding(costs, 1'000'000, 10'000, 1e7), 1u);
  // Ties go to the earlier candidate.
  EXPECT_EQ(internal::CheapestEncoding({small, small}, 10, 1, 1e6), 0u);
}

// Measured numbers vary per run, so the payload must be chosen with one set per process: the
// same payload at every thread count, and it applies bit-exactly.
TEST(AutoLink, CalibratedPayloadsAreIdenticalAcrossThreadCounts) {
  auto registry = TestRegistry();
  testing::TensorPair p = Bf16Pair();
  p.Add("f32", DType::kF32, 60'000, 0.1, 4);
  auto config =
      Config::FromString("[encoding.auto]\nmode = \"link\"\nlink_bandwidth = \"1GB\"\n", "t.toml");
  ASSERT_TRUE(config.ok());
  ASSERT_TRUE(ValidateConfig(config.value(), *registry).ok());
  DeltaOptions opt;
  opt.chunk_bytes = 64 << 10;
  std::vector<uint8_t> first;
  for (unsigned threads : {1u, 2u, 4u, 8u}) {
    opt.threads = threads;
    auto payload = EncodeDelta(p.base, p.next, opt, *registry, &config.value());
    ASSERT_TRUE(payload.ok()) << payload.status().message();
    if (first.empty()) {
      first = payload.value();
      ExpectAppliesBitExact(p, first, *registry);
    } else {
      EXPECT_EQ(payload.value(), first) << threads << " threads";
    }
  }
}

TEST(AutoLink, CalibrationMeasuresEveryCandidate) {
  auto registry = TestRegistry();
  internal::EncodingCache cache(*registry, nullptr);
  std::vector<const Encoding*> candidates;
  for (const char* name : {"indices", "deltas_zstd", "ctx"}) {
    auto enc = cache.Get(name);
    ASSERT_TRUE(enc.ok()) << name;
    candidates.push_back(enc.value());
  }
  for (DType dtype : {DType::kBF16, DType::kF32, DType::kF8E4M3, DType::kI32, DType::kBool}) {
    auto costs = internal::Calibrate(candidates, dtype);
    ASSERT_TRUE(costs.ok()) << NameOf(dtype) << ": " << costs.status().message();
    ASSERT_EQ(costs->size(), candidates.size());
    for (const internal::EncodingCost& c : *costs) {
      // Sizes are exact: every change costs bytes, and a record is never free.
      EXPECT_GT(c.bytes.change, 0) << NameOf(dtype);
      EXPECT_GT(c.bytes.At(1 << 20, 1000), 0) << NameOf(dtype);
    }
  }
}

TEST(AutoLink, DefaultModeAndBandwidthFollowTheTransport) {
  auto registry = TestRegistry();
  struct Case {
    const char* toml;
    internal::AutoMode mode;
    double bandwidth;
  };
  for (const Case& c : {
           Case{"[transport]\nname = \"disk\"\n", internal::AutoMode::kSmallest, 0},
           Case{"[transport]\nname = \"ucx\"\n", internal::AutoMode::kLink, 0},
           Case{"[transport]\nname = \"nccl\"\nbandwidth = \"300MB\"\n", internal::AutoMode::kLink,
                100e6},
           Case{"[sender]\nverify_puts = false\n[transport]\nname = \"nccl\"\nbandwidth = "
                "\"300MB\"\n",
                internal::AutoMode::kLink, 150e6},
           Case{"[transport]\nname = \"ucx\"\n[transport.ucx]\nlink_bandwidth = \"1GB\"\n",
                internal::AutoMode::kLink, 1e9},
           Case{"[transport]\nname = \"ucx\"\nbandwidth = \"300MB\"\n[encoding.auto]\n"
                "link_bandwidth = \"0\"\n",
                internal::AutoMode::kLink, 0},
           Case{"[transport]\nname = \"disk\"\n[encoding.auto]\nmode = \"link\"\n"
                "link_bandwidth = \"1.25GB\"\n",
                internal::AutoMode::kLink, 1.25e9},
       }) {
    auto config = Config::FromString(c.toml, "t.toml");
    ASSERT_TRUE(config.ok()) << c.toml;
    internal::EncodingCache cache(*registry, &config.value());
    auto policy = cache.Auto();
    ASSERT_TRUE(policy.ok()) << c.toml << policy.status().message();
    EXPECT_EQ(policy.value()->mode, c.mode) << c.toml;
    EXPECT_EQ(policy.value()->link_bandwidth, c.bandwidth) << c.toml;
  }
}

// [transport] bandwidth charges a payload at the put, at the sender's read-back (verify_puts)
// and at the receiver's get, in series; a transport whose sender reads back its own copy
// (REFIT_TRANSPORT_CAP_LOCAL_SENDER_READS, as ucx) is charged twice, not three times.
TEST(AutoLink, TheMeteredLinkCountsTheCrossingsOfTheConfiguredTransport) {
  auto registry = TestRegistry();
  const ComponentInfo* disk = registry->Find(REFIT_KIND_TRANSPORT, "disk");
  ASSERT_NE(disk, nullptr);
  const refit_component_t rows[] = {{sizeof(refit_component_t), REFIT_KIND_TRANSPORT, "spooled",
                                     "the disk transport, its sender's reads local",
                                     REFIT_TRANSPORT_CAP_LOCAL_SENDER_READS, nullptr, 0,
                                     disk->vtable, 0, 0}};
  const refit_plugin_t plugin = {
      sizeof(refit_plugin_t), REFIT_ABI_MAJOR, REFIT_ABI_MINOR, "spooled", "0", rows, 1};
  ASSERT_TRUE(registry->RegisterPlugin(&plugin, nullptr, "in-test").ok());
  struct Case {
    const char* transport;
    bool verify_puts;
    double bandwidth;
  };
  for (const Case& c : {Case{"disk", true, 100e6}, Case{"disk", false, 150e6},
                        Case{"spooled", true, 150e6}, Case{"spooled", false, 150e6}}) {
    const std::string toml = std::string("[sender]\nverify_puts = ") +
                             (c.verify_puts ? "true" : "false") + "\n[transport]\nname = \"" +
                             c.transport + "\"\nbandwidth = \"300MB\"\n[encoding.auto]\n" +
                             "mode = \"link\"\n";
    auto config = Config::FromString(toml, "t.toml");
    ASSERT_TRUE(config.ok()) << toml;
    internal::EncodingCache cache(*registry, &config.value());
    auto policy = cache.Auto();
    ASSERT_TRUE(policy.ok()) << toml << policy.status().message();
    EXPECT_EQ(policy.value()->link_bandwidth, c.bandwidth) << toml;
  }
}

// A sender in mode link measures its candidates when it is made, so that its first delta does
// not wait for the measurement (~40 ms); the other modes measure nothing. A bad [encoding.auto]
// key therefore fails Sender::Make, not the first publish.
TEST(AutoLink, ASenderInLinkModeMeasuresItsEncodingsWhenMade) {
  testing::ScopedTempDir dir("auto_link_sender");
  const std::string root = dir.path().string();
  std::vector<std::string> lines;
  std::mutex mu;
  SetLogLevel(LogLevel::kDebug);
  SetLogSink([&](LogLevel, std::string_view component, std::string_view message) {
    std::lock_guard<std::mutex> lock(mu);
    lines.push_back(std::string(component) + ": " + std::string(message));
  });
  struct Case {
    const char* mode_keys;
    bool measures;
    const char* error;  // nullptr: made
  };
  for (const Case& c :
       {Case{"mode = \"link\"\n", true, nullptr}, Case{"mode = \"smallest\"\n", false, nullptr},
        Case{"mode = \"smallest\"\nlink_bandwidth = \"1GB\"\n", false, "link_bandwidth"}}) {
    SCOPED_TRACE(c.mode_keys);
    lines.clear();
    auto config = Config::FromString("[sender]\nstate_dir = \"" + root +
                                         "/s\"\n[transport]\nname = \"disk\"\n"
                                         "[transport.disk]\ndir = \"" +
                                         root +
                                         "/sync\"\n[encoding.auto]\n"
                                         "candidates = [\"indices\", \"deltas\"]\n" +
                                         c.mode_keys,
                                     "t.toml");
    ASSERT_TRUE(config.ok()) << config.status().message();
    auto sender = Sender::Make(config.value(), 0, 1, TestRegistry());
    size_t measured = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const std::string& line : lines) {
        measured += line.find("bf16 costs of 2 encodings measured in") != std::string::npos;
      }
    }
    if (c.error != nullptr) {
      ASSERT_FALSE(sender.ok());
      EXPECT_NE(sender.status().message().find(c.error), std::string::npos)
          << sender.status().message();
      continue;
    }
    ASSERT_TRUE(sender.ok()) << sender.status().message();
    EXPECT_EQ(measured, c.measures ? 1u : 0u);
  }
  SetLogSink(nullptr);
  SetLogLevel(LogLevel::kInfo);
}

TEST(AutoLink, BadKeysAreOneLineErrorsNamingTheKey) {
  auto registry = TestRegistry();
  testing::ScopedTempDir dir("refit-auto-link");
  const std::string missing_ctx =
      WriteFile(dir, "partial.json",
                R"({"version": 1, "dtypes": {"bf16": {"indices": {"encode_ns": [0, 0, 0],
          "decode_ns": [0, 0, 0], "bytes": [0, 0, 6]}}}})");
  const std::string not_json = WriteFile(dir, "bad.json", "{\"version\": 1,");
  const std::string bad_dtype =
      WriteFile(dir, "dtype.json", R"({"version": 1, "dtypes": {"bf17": {}}})");
  struct Case {
    std::string toml;
    std::string needle;
  };
  const std::string head = "[encoding.auto]\ncandidates = [\"indices\", \"ctx\"]\n";
  for (const Case& c : {
           Case{head + "mode = \"lnk\"\n", "smallest, fastest or link"},
           Case{head + "link_bandwidth = \"1GB\"\n", "only mode \"link\" reads it"},
           Case{head + "mode = \"fastest\"\ncalibration = \"x.json\"\n", "only mode \"link\""},
           Case{head + "mode = \"link\"\nlink_bandwidth = \"fast\"\n", "link_bandwidth"},
           Case{head + "mode = \"link\"\ncalibration = \"" + (dir.path() / "none.json").string() +
                    "\"\n",
                "encoding.auto.calibration"},
           Case{head + "mode = \"link\"\ncalibration = \"" + missing_ctx + "\"\n",
                "no model of candidate 'ctx'"},
           Case{head + "mode = \"link\"\ncalibration = \"" + not_json + "\"\n",
                "not a JSON object"},
           Case{head + "mode = \"link\"\ncalibration = \"" + bad_dtype + "\"\n",
                "unknown dtype 'bf17'"},
       }) {
    auto config = Config::FromString(c.toml, "t.toml");
    ASSERT_TRUE(config.ok()) << c.toml;
    Status st = ValidateConfig(config.value(), *registry);
    ASSERT_FALSE(st.ok()) << c.toml;
    EXPECT_NE(st.message().find("t.toml:"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(c.needle), std::string::npos) << st.message();
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
  }
}

TEST(CostModelFile, RoundTripsAndAcceptsAWholeBenchResult) {
  internal::CostModelFile model;
  model["bf16"]["indices"] = {{1, 0.5, 2}, {3, 0.25, 4}, {16, 0, 6}};
  model["f32"]["ctx"] = {{0, 0, 0}, {0, 0, 0}, {0, 0.125, 1.5}};
  const std::string text = internal::SerializeCostModel(model);
  auto again = internal::ParseCostModel(text, "m.json");
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(internal::SerializeCostModel(*again), text);
  auto whole = internal::ParseCostModel("{\"rows\": [], \"link_model\": " + text + "}", "b.json");
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  EXPECT_EQ(internal::SerializeCostModel(*whole), text);
  EXPECT_DOUBLE_EQ((*whole)["bf16"]["indices"].decode_ns.elem, 0.25);
}

TEST(CostModelFile, RefusesBadInputWithOneLineNamingTheFile) {
  const std::string ok_entry =
      R"("encode_ns": [0, 1, 2], "decode_ns": [0, 1, 2], "bytes": [16, 0, 6])";
  auto doc = [&](const std::string& entry) {
    return R"({"version": 1, "dtypes": {"bf16": {"indices": {)" + entry + "}}}}";
  };
  for (const std::string& text : {
           std::string("[]"),
           std::string("not json"),
           std::string(R"({"version": 2, "dtypes": {}})"),
           std::string(R"({"version": 1})"),
           std::string(R"({"version": 1, "dtypes": {}, "extra": 1})"),
           std::string(R"({"version": 1, "dtypes": {"bf16": []}})"),
           std::string(R"({"version": 1, "dtypes": {"b f16": {}}})"),
           std::string(R"({"link_model": 3})"),
           doc(R"("encode_ns": [0, 1, 2], "decode_ns": [0, 1, 2])"),
           doc(R"("encode_ns": [0, 1], "decode_ns": [0, 1, 2], "bytes": [16, 0, 6])"),
           doc(R"("encode_ns": [0, -1, 2], "decode_ns": [0, 1, 2], "bytes": [16, 0, 6])"),
           doc(R"("encode_ns": [0, 1e999, 2], "decode_ns": [0, 1, 2], "bytes": [16, 0, 6])"),
           doc(R"("encode_ns": [0, 1e13, 2], "decode_ns": [0, 1, 2], "bytes": [16, 0, 6])"),
           doc(R"("encode_ns": [0, "1", 2], "decode_ns": [0, 1, 2], "bytes": [16, 0, 6])"),
           doc(ok_entry + R"(, "apply_ns": [0, 0, 0])"),
           // Found by fuzz_cost_model: the member's name must not make the error two lines.
           doc(ok_entry + R"(, "\ncode_ns": [0, 0, 0])"),
       }) {
    auto parsed = internal::ParseCostModel(text, "m.json");
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().message().rfind("m.json: ", 0), 0u) << parsed.status().message();
    EXPECT_EQ(parsed.status().message().find('\n'), std::string::npos);
  }
  EXPECT_TRUE(internal::ParseCostModel(doc(ok_entry), "m.json").ok());
}

}  // namespace
}  // namespace refit
