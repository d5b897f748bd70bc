// The layout conformance suite (refit/conformance/layout_suite.h) over the shipped layouts, each
// with the model shapes and parallel configs it supports: GQA, tp dividing the heads, pp and ep
// where the layout has them, and vocabularies that need padding.
#include <string>
#include <vector>

#include "refit/conformance/layout_suite.h"

namespace refit::conformance {
namespace {

ModelDesc Model(const std::string& label) {
  for (const auto& [name, model] : StandardLayoutModels()) {
    if (name == label) return model;
  }
  ADD_FAILURE() << "no standard model '" << label << "'";
  return ModelDesc{};
}

std::string Megatron(int tp, int pp, int ep) {
  return "[layout.megatron]\n@MODEL@tp = " + std::to_string(tp) + "\npp = " + std::to_string(pp) +
         "\nep = " + std::to_string(ep) + "\n";
}

std::vector<LayoutCase> ShippedLayoutCases() {
  std::vector<LayoutCase> cases;
  // hf: every rank holds every tensor whole and sends it, so only one rank can be in the world.
  for (const std::string model : {"dense", "tied_bias_qknorm", "moe"}) {
    cases.push_back({"hf", model, 1, Model(model), ""});
  }

  cases.push_back({"megatron", "dense_tp1", 1, Model("dense"), Megatron(1, 1, 1)});
  // vocab 200 pads to 256 rows: rank 1 holds 72 real rows and 56 padding rows.
  cases.push_back({"megatron", "dense_tp2_pp2", 4, Model("dense"), Megatron(2, 2, 1)});
  ModelDesc gqa = Model("gqa");
  cases.push_back({"megatron", "gqa_tp2", 2, gqa, Megatron(2, 1, 1)});
  gqa.kv_heads = 4;
  cases.push_back({"megatron", "gqa_tp4", 4, gqa, Megatron(4, 1, 1)});
  cases.push_back(
      {"megatron", "tied_bias_qknorm_tp2_pp2", 4, Model("tied_bias_qknorm"), Megatron(2, 2, 1)});
  cases.push_back({"megatron", "moe_ep2", 2, Model("moe"), Megatron(1, 1, 2)});
  cases.push_back({"megatron", "moe_tp2_ep2_pp2", 8, Model("moe"), Megatron(2, 2, 2)});

  const std::string fsdp = "[layout.fsdp]\nshapes_from = \"@SHAPES_FROM@\"\n";
  cases.push_back({"fsdp", "dense_world1", 1, Model("dense"), fsdp});
  cases.push_back({"fsdp", "dense_world3", 3, Model("dense"), fsdp});
  ModelDesc ragged = Model("gqa");
  ragged.vocab = 201;  // 51 rows per rank, the last one 48
  ragged.hidden = 6;   // norms of 6 rows over 4 ranks: 2, 2, 2 and an empty last rank
  cases.push_back({"fsdp", "ragged_world4", 4, ragged, fsdp});
  cases.push_back({"fsdp", "moe_world4", 4, Model("moe"), fsdp});

  const std::string vllm = "[layout.vllm]\n@MODEL@";
  cases.push_back({"vllm", "dense_tp1", 1, Model("dense"), vllm});
  // vocab 100 pads to 128 rows: rank 1 holds 36 real rows and 28 padding rows.
  ModelDesc padded = Model("dense");
  padded.kv_heads = 2;
  padded.vocab = 100;
  cases.push_back({"vllm", "gqa_tp2_padded_vocab", 2, padded, vllm});
  // 2 kv heads over 4 ranks: each kv head lives on 2 ranks and is sent by one of them.
  cases.push_back({"vllm", "gqa_tp4_replicated_kv", 4, Model("gqa"), vllm});
  cases.push_back({"vllm", "tied_bias_qknorm_tp2", 2, Model("tied_bias_qknorm"), vllm});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(ShippedLayouts, LayoutConformanceTest,
                         ::testing::ValuesIn(ShippedLayoutCases()), LayoutParamName);

// Every layout the registry knows has cases above: a new layout must add its own.
TEST(LayoutConformanceCoverage, EveryRegisteredLayoutHasCases) {
  std::vector<LayoutCase> cases = ShippedLayoutCases();
  for (const std::string& name : ComponentNames(REFIT_KIND_LAYOUT)) {
    bool found = false;
    for (const LayoutCase& c : cases) found = found || c.layout == name;
    EXPECT_TRUE(found) << "layout '" << name << "' has no case in layout_conformance_test.cc";
  }
}

}  // namespace
}  // namespace refit::conformance
