// The fsdp layout: DTensor Shard(0) chunks (ceil(rows / world), short or empty last ranks), exact
// cover and a bit-exact round trip over 4 ranks; map_tensor reads the canonical shapes from
// shapes_from.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "layout_test_util.h"

namespace refit::testing {
namespace {

class FsdpLayoutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ModelDesc m;
    m.vocab = 201;  // 51 rows per rank, the last one 48
    m.hidden = 6;   // norms of 6 rows: 2, 2, 2 and an empty last rank
    m.heads = 2;
    m.kv_heads = 1;
    m.head_dim = 3;
    m.ffn = 10;
    canonical_ = MakeCheckpoint(m);
    canonical_.push_back({"scalar", DType::kF32, {}, {1, 2, 3, 4}});
    canonical_.push_back({"empty", DType::kBF16, {0, 4}, {}});
    canonical_.push_back({"two_rows", DType::kI32, {2, 3}, std::vector<uint8_t>(24, 7)});
    path_ = ::testing::TempDir() + "refit_fsdp_" + std::to_string(::getpid()) + ".safetensors";
    ASSERT_TRUE(WriteSafetensors(path_, Views(canonical_)).ok());
    Result<Config> c =
        Config::FromString("[layout.fsdp]\nshapes_from = \"" + path_ + "\"\n", "fsdp.toml");
    ASSERT_TRUE(c.ok()) << c.status().message();
    config_ = c.value();
    registry_ = TestRegistry();
    ASSERT_NE(registry_, nullptr);
  }
  void TearDown() override { ::unlink(path_.c_str()); }

  std::vector<CanonicalTensor> canonical_;
  std::string path_;
  Config config_;
  std::shared_ptr<Registry> registry_;
};

TEST_F(FsdpLayoutTest, FourRanksCoverEveryElementOnce) {
  std::vector<RankShards> ranks = ShardAll(*registry_, "fsdp", 4, config_, canonical_);
  ASSERT_EQ(ranks.size(), 4u);
  ExpectExactCover(canonical_, ranks);
  ExpectRoundTrip(canonical_, ranks);
  // Local names are the canonical names; rows follow torch.chunk.
  for (const RankShards& rank : ranks) {
    ASSERT_EQ(rank.tensors.size(), canonical_.size());
    for (size_t i = 0; i < canonical_.size(); ++i) {
      EXPECT_EQ(rank.tensors[i].spec.name, canonical_[i].name);
    }
  }
  EXPECT_EQ(ranks[0].Find("model.embed_tokens.weight")->spec.shape, (Shape{51, 6}));
  EXPECT_EQ(ranks[3].Find("model.embed_tokens.weight")->spec.shape, (Shape{48, 6}));
  EXPECT_EQ(ranks[2].Find("model.norm.weight")->spec.shape, (Shape{2}));
  EXPECT_EQ(ranks[3].Find("model.norm.weight")->spec.shape, (Shape{0}));
  EXPECT_EQ(ranks[1].Find("two_rows")->spec.shape, (Shape{1, 3}));
  EXPECT_EQ(ranks[2].Find("two_rows")->spec.shape, (Shape{0, 3}));
  EXPECT_EQ(ranks[3].Find("scalar")->spec.shape, (Shape{}));
  const CanonicalTensor* embed = FindCanonical(canonical_, "model.embed_tokens.weight");
  EXPECT_TRUE(ranks[1].Find("model.embed_tokens.weight")->bytes == Rows(*embed, 51, 51));
}

TEST_F(FsdpLayoutTest, MapTensorNeedsTheCanonicalShapes) {
  auto layout = registry_->CreateLayout("fsdp", 0, 4, nullptr, "");
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  refit_local_tensor_t local{};
  local.struct_size = sizeof(local);
  local.dtype = REFIT_DTYPE_F32;
  local.name = "model.norm.weight";
  local.ndim = 1;
  local.shape[0] = 2;
  EXPECT_EQ(layout.value()->MapTensor(local).status().message(),
            "layout 'fsdp': map 'model.norm.weight': the canonical shape is unknown: set "
            "shapes_from to the checkpoint the shards were cut from");
  layout = registry_->CreateLayout("fsdp", 3, 4, &config_, "layout.fsdp");
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  EXPECT_EQ(layout.value()->MapTensor(local).status().message(),
            "layout 'fsdp': map 'model.norm.weight': local tensor 'model.norm.weight' has shape "
            "[2], the layout's config gives [0]");
}

TEST(FsdpLayout, ShapesFromMustBeASafetensorsFile) {
  std::shared_ptr<Registry> registry = TestRegistry();
  ASSERT_NE(registry, nullptr);
  const std::string path = ::testing::TempDir() + "refit_fsdp_bad_" + std::to_string(::getpid());
  std::ofstream(path, std::ios::binary) << std::string("\x08\0\0\0\0\0\0\0{\"a\":[1]", 16);
  Result<Config> c = Config::FromString("[layout.fsdp]\nshapes_from = \"" + path + "\"\n");
  ASSERT_TRUE(c.ok());
  auto layout = registry->CreateLayout("fsdp", 0, 2, &c.value(), "layout.fsdp");
  EXPECT_EQ(layout.status().message(),
            "layout 'fsdp': create: " + path + ": safetensors header is not a JSON object");
  ::unlink(path.c_str());
}

}  // namespace
}  // namespace refit::testing
