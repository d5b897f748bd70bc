// list_local (plugin ABI 1.1): the hf layout lists the canonical tensors as they are, and a layout
// built for ABI 1.0 (a shorter vtable without list_local) still loads but cannot list.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "layout_test_util.h"
#include "refit/sdk/plugin.hpp"

namespace refit::testing {
namespace {

TEST(LayoutListLocal, HfListsTheCanonicalTensors) {
  std::shared_ptr<Registry> registry = TestRegistry();
  ASSERT_NE(registry, nullptr);
  auto layout = registry->CreateLayout("hf", 1, 2);
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  EXPECT_TRUE(layout.value()->CanListLocal());
  std::vector<TensorSpec> canonical = {{"a", DType::kBF16, {3, 4}}, {"b", DType::kF32, {}}};
  auto listed = layout.value()->ListLocal(canonical);
  ASSERT_TRUE(listed.ok()) << listed.status().message();
  ASSERT_EQ(listed.value().size(), 2u);
  EXPECT_EQ(listed.value()[0].name, "a");
  EXPECT_EQ(listed.value()[0].dtype, DType::kBF16);
  EXPECT_EQ(listed.value()[0].shape, (Shape{3, 4}));
  EXPECT_EQ(listed.value()[1].shape, Shape{});
}

// An ABI 1.0 layout: its vtable ends after map_tensor.
struct OldLayoutVtable {
  uint32_t struct_size;
  uint32_t reserved;
  decltype(refit_layout_vtable_t::create) create;
  decltype(refit_layout_vtable_t::destroy) destroy;
  decltype(refit_layout_vtable_t::map_tensor) map_tensor;
};

int OldCreate(const refit_host_api_t*, const refit_config_t*, int32_t, int32_t, void** instance_p,
              refit_error_t*) {
  static int instance = 0;
  *instance_p = &instance;
  return REFIT_OK;
}
void OldDestroy(void*) {}
int OldMap(void*, const refit_local_tensor_t*, refit_slice_cb, void*, refit_error_t*) {
  return REFIT_OK;
}

const OldLayoutVtable kOldVtable = {sizeof(OldLayoutVtable), 0, &OldCreate, &OldDestroy, &OldMap};
const refit_component_t kOldRows[] = {{sizeof(refit_component_t), REFIT_KIND_LAYOUT, "old_layout",
                                       "ABI 1.0 layout", 0, nullptr, 0, &kOldVtable}};
const refit_plugin_t kOldPlugin = {
    sizeof(refit_plugin_t), REFIT_ABI_MAJOR, 0, "old", "0", kOldRows, 1};

TEST(LayoutListLocal, AnAbi10LayoutLoadsButCannotList) {
  Registry registry;
  ASSERT_TRUE(registry.RegisterPlugin(&kOldPlugin, nullptr, "in-test").ok());
  auto layout = registry.CreateLayout("old_layout", 0, 1);
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  EXPECT_FALSE(layout.value()->CanListLocal());
  auto listed = layout.value()->ListLocal({{"a", DType::kF32, {2}}});
  EXPECT_EQ(listed.status().code(), StatusCode::kUnsupported);
  EXPECT_EQ(listed.status().message(),
            "layout 'old_layout': list local tensors: this layout cannot enumerate a rank's "
            "tensors (no list_local: built for plugin ABI 1.0)");
}

// A layout whose list_local breaks the contract is reported, not trusted.
class BadListLayout {
 public:
  static Result<std::unique_ptr<BadListLayout>> Create(const sdk::ConfigView&, int, int) {
    return std::make_unique<BadListLayout>();
  }
  Result<std::vector<sdk::Slice>> MapTensor(const refit_local_tensor_t&) const {
    return std::vector<sdk::Slice>{};
  }
  Result<std::vector<sdk::TensorSpec>> ListLocal(const std::vector<sdk::TensorSpec>&) const {
    return std::vector<sdk::TensorSpec>{{"x", 99, {1}}};
  }
};

const refit_component_t kBadRows[] = {
    sdk::MakeLayout<BadListLayout>("bad_list", "lists a tensor of an unknown dtype")};
const refit_plugin_t kBadPlugin = {
    sizeof(refit_plugin_t), REFIT_ABI_MAJOR, REFIT_ABI_MINOR, "bad", "0", kBadRows, 1};

TEST(LayoutListLocal, AnInvalidListedTensorIsAnError) {
  Registry registry;
  ASSERT_TRUE(registry.RegisterPlugin(&kBadPlugin, nullptr, "in-test").ok());
  auto layout = registry.CreateLayout("bad_list", 0, 1);
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  EXPECT_TRUE(layout.value()->CanListLocal());
  auto listed = layout.value()->ListLocal({});
  EXPECT_EQ(listed.status().message(),
            "layout 'bad_list': list local tensors: emitted 'x' with unknown dtype 99");
}

// An SDK layout without a ListLocal member gets a NULL list_local.
class MapOnlyLayout {
 public:
  static Result<std::unique_ptr<MapOnlyLayout>> Create(const sdk::ConfigView&, int, int) {
    return std::make_unique<MapOnlyLayout>();
  }
  Result<std::vector<sdk::Slice>> MapTensor(const refit_local_tensor_t&) const {
    return std::vector<sdk::Slice>{};
  }
};

TEST(LayoutListLocal, TheSdkLeavesListLocalNullWithoutAListLocalMember) {
  const refit_component_t row = sdk::MakeLayout<MapOnlyLayout>("map_only", "no ListLocal");
  const auto* vtable = static_cast<const refit_layout_vtable_t*>(row.vtable);
  EXPECT_EQ(vtable->struct_size, sizeof(refit_layout_vtable_t));
  EXPECT_EQ(vtable->list_local, nullptr);
  const refit_component_t with = sdk::MakeLayout<BadListLayout>("with", "has ListLocal");
  EXPECT_NE(static_cast<const refit_layout_vtable_t*>(with.vtable)->list_local, nullptr);
}

}  // namespace
}  // namespace refit::testing
