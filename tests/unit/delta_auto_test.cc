// The framework's `auto` encoding: picks the smallest candidate per record, honours the
// [encoding.auto] keys, and is deterministic.
#include <gtest/gtest.h>

#include <algorithm>

#include "delta_test_util.h"
#include "format/wire.h"
#include "refit/delta.h"
#include "refit/refit.h"
#include "send/auto_policy.h"

namespace refit {
namespace {

using testing::TestRegistry;

testing::TensorPair MixedDensities() {
  testing::TensorPair p;
  p.Add("sparse", DType::kBF16, 200'000, 0.001, 1);
  p.Add("medium", DType::kBF16, 200'000, 0.03, 2);
  p.Add("dense", DType::kBF16, 50'000, 0.9, 3);
  p.Add("f32", DType::kF32, 60'000, 0.1, 4);
  return p;
}

std::vector<uint64_t> RecordSizes(const std::vector<uint8_t>& bytes,
                                  std::vector<std::string>* encodings = nullptr) {
  auto parsed = Payload::Parse(bytes.data(), bytes.size(), "test");
  EXPECT_TRUE(parsed.ok()) << parsed.status().message();
  std::vector<uint64_t> sizes;
  for (const RecordHeader& r : parsed.value().records()) {
    sizes.push_back(r.data_end - r.data_begin);
    if (encodings != nullptr) encodings->push_back(r.encoding);
  }
  return sizes;
}

// The encodings auto's default candidates come from: every registered one (dense as the
// fallback of every record).
std::vector<std::string> EncodingNames(const Registry& registry) {
  std::vector<std::string> names;
  for (const ComponentInfo* c : registry.List()) {
    if (c->kind == REFIT_KIND_ENCODING && c->name != "auto") names.push_back(c->name);
  }
  return names;
}

// The default order comes from the apply costs the encodings declare, not from names in the core:
// the shipped ones keep the order (and so the payloads) they always had, dense opts out.
TEST(AutoEncoding, DefaultCandidatesFollowTheDeclaredApplyCost) {
  auto registry = TestRegistry();
  EXPECT_EQ(
      internal::AutoDefaultCandidates(*registry),
      (std::vector<std::string>{"indices", "bitmask", "deltas", "deltas_zstd", "xor", "ctx"}));
  const ComponentInfo* dense = registry->Find(REFIT_KIND_ENCODING, "dense");
  ASSERT_NE(dense, nullptr);
  EXPECT_NE(dense->capabilities & REFIT_ENC_CAP_NOT_AUTO, 0u);
}

TEST(AutoEncoding, PicksTheSmallestCandidatePerRecord) {
  auto registry = TestRegistry();
  testing::TensorPair p = MixedDensities();
  DeltaOptions opt;
  opt.chunk_bytes = 64 << 10;
  opt.threads = 1;
  opt.encoding = "auto";
  auto auto_payload = EncodeDelta(p.base, p.next, opt, *registry, nullptr);
  ASSERT_TRUE(auto_payload.ok()) << auto_payload.status().message();
  std::vector<std::string> chosen;
  std::vector<uint64_t> best = RecordSizes(auto_payload.value(), &chosen);
  ASSERT_GT(best.size(), 8u);

  // dense is every record's fallback, so the minimum runs over every encoding.
  std::vector<uint64_t> minimum(best.size(), UINT64_MAX);
  for (const std::string& name : EncodingNames(*registry)) {
    opt.encoding = name;
    auto one = EncodeDelta(p.base, p.next, opt, *registry, nullptr);
    ASSERT_TRUE(one.ok()) << name << ": " << one.status().message();
    std::vector<uint64_t> sizes = RecordSizes(one.value());
    ASSERT_EQ(sizes.size(), best.size()) << name;
    for (size_t i = 0; i < sizes.size(); ++i) minimum[i] = std::min(minimum[i], sizes[i]);
  }
  EXPECT_EQ(best, minimum);
  for (const std::string& e : chosen) {
    EXPECT_NE(e, "auto") << "records name the real encoding";
  }

  // And it applies bit-exactly.
  std::vector<std::vector<uint8_t>> work = p.base_bits;
  std::vector<TensorView> views = p.base;
  for (size_t i = 0; i < views.size(); ++i) views[i].data = work[i].data();
  auto applied = ApplyDelta(auto_payload.value(), views, *registry, nullptr);
  ASSERT_TRUE(applied.ok()) << applied.status().message();
  EXPECT_EQ(work, p.next_bits);
}

TEST(AutoEncoding, RestrictedCandidatesAreHonoured) {
  auto registry = TestRegistry();
  testing::TensorPair p = MixedDensities();
  auto config = Config::FromString("[encoding.auto]\ncandidates = [\"indices\"]\n", "t.toml");
  ASSERT_TRUE(config.ok());
  ASSERT_TRUE(ValidateConfig(config.value(), *registry).ok());
  DeltaOptions opt;
  opt.chunk_bytes = 64 << 10;
  opt.threads = 1;
  auto payload = EncodeDelta(p.base, p.next, opt, *registry, &config.value());
  ASSERT_TRUE(payload.ok()) << payload.status().message();
  std::vector<std::string> chosen;
  RecordSizes(payload.value(), &chosen);
  for (const std::string& e : chosen) EXPECT_TRUE(e == "indices" || e == "dense") << e;
  EXPECT_NE(std::find(chosen.begin(), chosen.end(), "indices"), chosen.end());
  EXPECT_NE(std::find(chosen.begin(), chosen.end(), "dense"), chosen.end());
}

TEST(AutoEncoding, FastestModeTakesTheFirstCandidateWithinBudget) {
  auto registry = TestRegistry();
  testing::TensorPair p = MixedDensities();
  // A huge budget accepts the first candidate whenever it beats dense.
  auto config = Config::FromString(
      "[encoding.auto]\ncandidates = [\"indices\", \"dense\"]\nmode = \"fastest\"\nbudget = "
      "1000.0\n",
      "t.toml");
  ASSERT_TRUE(config.ok());
  ASSERT_TRUE(ValidateConfig(config.value(), *registry).ok());
  DeltaOptions opt;
  opt.chunk_bytes = 64 << 10;
  opt.threads = 1;
  auto payload = EncodeDelta(p.base, p.next, opt, *registry, &config.value());
  ASSERT_TRUE(payload.ok()) << payload.status().message();
  opt.encoding = "indices";
  auto indices = EncodeDelta(p.base, p.next, opt, *registry, nullptr);
  ASSERT_TRUE(indices.ok());
  EXPECT_EQ(payload.value(), indices.value());
}

TEST(AutoEncoding, UnknownCandidateIsAnErrorNamingTheKey) {
  auto registry = TestRegistry();
  auto config =
      Config::FromString("[encoding.auto]\ncandidates = [\"indices\", \"nope\"]\n", "t.toml");
  ASSERT_TRUE(config.ok());
  Status st = ValidateConfig(config.value(), *registry);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("t.toml:2"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("encoding.auto.candidates"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("'nope'"), std::string::npos) << st.message();

  testing::TensorPair p = MixedDensities();
  auto payload = EncodeDelta(p.base, p.next, DeltaOptions{}, *registry, &config.value());
  ASSERT_FALSE(payload.ok());
  EXPECT_NE(payload.status().message().find("encoding.auto.candidates"), std::string::npos);
}

TEST(AutoEncoding, BadModeAndBudgetAndKeysAreRejected) {
  auto registry = TestRegistry();
  for (const char* text :
       {"[encoding.auto]\nmode = \"quick\"\n", "[encoding.auto]\nbudget = 0.5\n",
        "[encoding.auto]\nbudgett = 1.5\n", "[encoding.auto]\ncandidates = [\"auto\"]\n"}) {
    auto config = Config::FromString(text, "t.toml");
    ASSERT_TRUE(config.ok()) << text;
    Status st = ValidateConfig(config.value(), *registry);
    EXPECT_FALSE(st.ok()) << text;
    EXPECT_NE(st.message().find("t.toml:2"), std::string::npos) << st.message();
  }
  auto ok = Config::FromString("[sender]\nencoding = \"auto\"\nthreads = 4\n", "t.toml");
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ValidateConfig(ok.value(), *registry).ok());
}

TEST(AutoEncoding, PayloadsAreIdenticalAcrossRuns) {
  auto registry = TestRegistry();
  testing::TensorPair p = MixedDensities();
  DeltaOptions opt;
  opt.chunk_bytes = 64 << 10;
  auto first = EncodeDelta(p.base, p.next, opt, *registry, nullptr);
  auto second = EncodeDelta(p.base, p.next, opt, *registry, nullptr);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first.value(), second.value());
}

}  // namespace
}  // namespace refit
