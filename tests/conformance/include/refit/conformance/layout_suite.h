// The layout conformance suite: for each case (a layout, a model and a world size) the slices every
// rank's local tensors map to cover each canonical element exactly once, map_tensor agrees with
// list_local, and canonical bits cut into shards through the slices map back exactly.
//
// Instantiate LayoutConformanceTest over LayoutCase values with LayoutParamName; see common.h for
// how a binary provides the registry. A case's config_template is the TOML the layout is created
// from (section [layout.<name>]), where @MODEL@ stands for the model's keys (ModelDesc::Toml) and
// @SHAPES_FROM@ for the path of a safetensors file holding the case's canonical checkpoint.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "refit/config.h"
#include "refit/conformance/common.h"
#include "refit/conformance/layout_util.h"
#include "refit/registry.h"

namespace refit::conformance {

struct LayoutCase {
  std::string layout;
  std::string label;  // unique per layout: names the test
  int world = 1;
  ModelDesc model;
  std::string config_template;
};

// How gtest shows a case (instead of its bytes).
inline void PrintTo(const LayoutCase& c, std::ostream* os) {
  *os << c.layout << "/" << c.label << " world=" << c.world;
}

// The model shapes a layout should handle whatever its parallelism: label -> model.
inline std::vector<std::pair<std::string, ModelDesc>> StandardLayoutModels() {
  std::vector<std::pair<std::string, ModelDesc>> out;
  out.emplace_back("dense", ModelDesc{});
  ModelDesc gqa;
  gqa.heads = 8;
  gqa.kv_heads = 2;
  gqa.head_dim = 2;
  gqa.vocab = 100;
  out.emplace_back("gqa", gqa);
  ModelDesc tied;
  tied.tie = true;
  tied.qk_norm = true;
  tied.qkv_bias = true;
  tied.vocab = 131;
  out.emplace_back("tied_bias_qknorm", tied);
  ModelDesc moe;
  moe.experts = 4;
  out.emplace_back("moe", moe);
  return out;
}

class LayoutConformanceTest : public ::testing::TestWithParam<LayoutCase> {
 protected:
  void SetUp() override {
    const LayoutCase& c = GetParam();
    auto registry = LoadConformanceRegistry();
    ASSERT_TRUE(registry.ok()) << registry.status().ToString();
    registry_ = std::move(registry).value();
    canonical_ = MakeCheckpoint(c.model);
    std::string toml = ReplaceAll(c.config_template, "@MODEL@", c.model.Toml());
    if (toml.find("@SHAPES_FROM@") != std::string::npos) {
      std::string dir = ::testing::TempDir() + "refit-layout-conf-XXXXXX";
      ASSERT_NE(::mkdtemp(dir.data()), nullptr);
      shapes_file_ = dir + "/canonical.safetensors";
      scratch_ = dir;
      Status st = WriteCheckpointFile(shapes_file_, canonical_);
      ASSERT_TRUE(st.ok()) << st.ToString();
      toml = ReplaceAll(toml, "@SHAPES_FROM@", shapes_file_);
    }
    Result<Config> config = Config::FromString(toml, c.layout + "-" + c.label + ".toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = std::move(config).value();
    auto probe = registry_->CreateLayout(c.layout, 0, c.world, &config_, "layout." + c.layout);
    ASSERT_TRUE(probe.ok()) << probe.status().ToString();
    if (!probe.value()->CanListLocal()) {
      GTEST_SKIP() << "layout '" << c.layout
                   << "' has no list_local: the suite cannot enumerate a rank's tensors";
    }
    ranks_ = ShardAll(*registry_, c.layout, c.world, config_, canonical_);
    ASSERT_EQ(ranks_.size(), static_cast<size_t>(c.world));
  }
  void TearDown() override {
    if (!shapes_file_.empty()) ::unlink(shapes_file_.c_str());
    if (!scratch_.empty()) ::rmdir(scratch_.c_str());
  }

  std::shared_ptr<Registry> registry_;
  std::vector<CanonicalTensor> canonical_;
  std::string scratch_, shapes_file_;
  Config config_;
  std::vector<RankShards> ranks_;
};

TEST_P(LayoutConformanceTest, EveryCanonicalElementIsSentOnce) {
  ExpectExactCover(canonical_, ranks_);
}

TEST_P(LayoutConformanceTest, MapTensorAgreesWithListLocal) {
  ExpectMapAgreesWithList(*registry_, GetParam().layout, GetParam().world, config_, canonical_,
                          ranks_);
}

TEST_P(LayoutConformanceTest, ShardsMapBackToTheCanonicalBits) {
  ExpectRoundTrip(canonical_, ranks_);
}

inline std::string LayoutParamName(const ::testing::TestParamInfo<LayoutCase>& info) {
  return SanitizeTestName(info.param.layout + "_" + info.param.label);
}

}  // namespace refit::conformance
