#include "refit/tensor.h"

#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace refit {
namespace {

template <typename T>
T Unwrap(Result<T> result) {
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  return result.ok() ? std::move(result).value() : T{};
}

TEST(TensorTest, NumElements) {
  EXPECT_EQ(Unwrap(NumElements({})), 1u);  // a 0-d tensor is one scalar
  EXPECT_EQ(Unwrap(NumElements({2, 3})), 6u);
  EXPECT_EQ(Unwrap(NumElements({7, 0, 5})), 0u);
  // A zero dim wins even when the other dims alone would overflow.
  EXPECT_EQ(Unwrap(NumElements({1ull << 40, 1ull << 40, 0})), 0u);
  EXPECT_EQ(Unwrap(NumElements({1ull << 32, (1ull << 32) - 1})), (1ull << 32) * ((1ull << 32) - 1));
  Result<uint64_t> overflow = NumElements({1ull << 32, 1ull << 32});
  ASSERT_FALSE(overflow.ok());
  EXPECT_NE(overflow.status().message().find("[4294967296, 4294967296]"), std::string::npos);
}

TEST(TensorTest, ShapeToString) {
  EXPECT_EQ(ShapeToString({}), "[]");
  EXPECT_EQ(ShapeToString({5}), "[5]");
  EXPECT_EQ(ShapeToString({2, 3}), "[2, 3]");
}

TEST(TensorTest, ViewSizes) {
  TensorView view;
  view.dtype = DType::kBF16;
  view.shape = {4, 3};
  EXPECT_EQ(view.num_elements(), 12u);
  EXPECT_EQ(view.nbytes(), 24u);
  view.shape = {};
  EXPECT_EQ(view.nbytes(), 2u);
}

// A DLManagedTensor over caller-owned storage.
struct FakeDLPack {
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DLManagedTensor managed{};

  FakeDLPack(void* data, DLDataType dtype, std::vector<int64_t> dims,
             std::vector<int64_t> stride_values = {})
      : shape(std::move(dims)), strides(std::move(stride_values)) {
    managed.dl_tensor.data = data;
    managed.dl_tensor.device = {kDLCPU, 0};
    managed.dl_tensor.ndim = static_cast<int>(shape.size());
    managed.dl_tensor.dtype = dtype;
    managed.dl_tensor.shape = shape.data();
    managed.dl_tensor.strides = strides.empty() ? nullptr : strides.data();
  }
};

TEST(TensorTest, ViewFromDLPackContiguous) {
  std::vector<uint16_t> storage(2 * 3 + 4);
  FakeDLPack fake(storage.data(), DLDataType{kDLBfloat, 16, 1}, {2, 3});
  Result<TensorView> view = ViewFromDLPack(&fake.managed, "w");
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->name, "w");
  EXPECT_EQ(view->dtype, DType::kBF16);
  EXPECT_EQ(view->shape, (Shape{2, 3}));
  EXPECT_EQ(view->data, storage.data());

  // Explicit row-major strides and a byte offset (honoured).
  FakeDLPack strided(storage.data(), DLDataType{kDLInt, 16, 1}, {2, 3}, {3, 1});
  strided.managed.dl_tensor.byte_offset = 8;
  view = ViewFromDLPack(&strided.managed, "s");
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->dtype, DType::kI16);
  EXPECT_EQ(view->bytes(), reinterpret_cast<uint8_t*>(storage.data()) + 8);

  // Extent-1 dims may carry any stride.
  FakeDLPack unit_dim(storage.data(), DLDataType{kDLFloat, 16, 1}, {1, 3}, {99, 1});
  EXPECT_TRUE(ViewFromDLPack(&unit_dim.managed, "u").ok());

  // bool (kDLBool = 6) and a 0-d scalar.
  FakeDLPack scalar(storage.data(), DLDataType{6, 8, 1}, {});
  view = ViewFromDLPack(&scalar.managed, "flag");
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->dtype, DType::kBool);
  EXPECT_TRUE(view->shape.empty());
}

TEST(TensorTest, ViewFromDLPackRejects) {
  std::vector<float> storage(16);
  EXPECT_EQ(ViewFromDLPack(nullptr, "x").status().code(), StatusCode::kInvalidArgument);

  FakeDLPack transposed(storage.data(), DLDataType{kDLFloat, 32, 1}, {2, 3}, {1, 2});
  Result<TensorView> view = ViewFromDLPack(&transposed.managed, "t");
  ASSERT_FALSE(view.ok());
  EXPECT_EQ(view.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(view.status().message().find("'t'"), std::string::npos);
  EXPECT_NE(view.status().message().find("contiguous"), std::string::npos);

  FakeDLPack gpu(storage.data(), DLDataType{kDLFloat, 32, 1}, {4});
  gpu.managed.dl_tensor.device = {kDLCUDA, 0};
  EXPECT_EQ(ViewFromDLPack(&gpu.managed, "g").status().code(), StatusCode::kUnsupported);

  FakeDLPack lanes(storage.data(), DLDataType{kDLFloat, 32, 4}, {4});
  EXPECT_EQ(ViewFromDLPack(&lanes.managed, "l").status().code(), StatusCode::kUnsupported);

  FakeDLPack complex(storage.data(), DLDataType{5, 64, 1}, {4});
  EXPECT_EQ(ViewFromDLPack(&complex.managed, "c").status().code(), StatusCode::kUnsupported);

  FakeDLPack negative(storage.data(), DLDataType{kDLFloat, 32, 1}, {-1, 4});
  EXPECT_EQ(ViewFromDLPack(&negative.managed, "n").status().code(), StatusCode::kInvalidArgument);

  FakeDLPack many_dims(storage.data(), DLDataType{kDLFloat, 32, 1}, std::vector<int64_t>(9, 1));
  EXPECT_FALSE(ViewFromDLPack(&many_dims.managed, "m").ok());

  FakeDLPack huge(storage.data(), DLDataType{kDLFloat, 32, 1}, {1ll << 62, 1ll << 62});
  EXPECT_FALSE(ViewFromDLPack(&huge.managed, "h").ok());

  FakeDLPack null_data(nullptr, DLDataType{kDLFloat, 32, 1}, {4});
  EXPECT_FALSE(ViewFromDLPack(&null_data.managed, "z").ok());
  FakeDLPack empty(nullptr, DLDataType{kDLFloat, 32, 1}, {0, 4});
  EXPECT_TRUE(ViewFromDLPack(&empty.managed, "e").ok());
}

TEST(TensorTest, ToDLPackRoundTrip) {
  std::vector<int32_t> storage = {1, 2, 3, 4, 5, 6};
  TensorView view{"x", DType::kI32, {3, 2}, storage.data()};
  Result<DLManagedTensor*> managed = ToDLPack(view);
  ASSERT_TRUE(managed.ok()) << managed.status().ToString();
  DLManagedTensor* m = *managed;
  EXPECT_EQ(m->dl_tensor.data, storage.data());
  EXPECT_EQ(m->dl_tensor.ndim, 2);
  EXPECT_EQ(m->dl_tensor.shape[0], 3);
  EXPECT_EQ(m->dl_tensor.shape[1], 2);
  EXPECT_EQ(m->dl_tensor.strides, nullptr);
  EXPECT_EQ(m->dl_tensor.device.device_type, kDLCPU);
  EXPECT_EQ(m->dl_tensor.dtype.code, kDLInt);
  EXPECT_EQ(m->dl_tensor.dtype.bits, 32);
  EXPECT_EQ(m->dl_tensor.dtype.lanes, 1);

  Result<TensorView> back = ViewFromDLPack(m, "x");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->dtype, DType::kI32);
  EXPECT_EQ(back->shape, view.shape);
  EXPECT_EQ(back->data, view.data);
  m->deleter(m);  // frees only the wrapper (ASan would flag a double free or leak)
  EXPECT_EQ(storage[5], 6);
}

TEST(TensorTest, ToDLPackFp8NeedsNewDLPack) {
  uint8_t byte = 0;
  TensorView view{"f8", DType::kF8E4M3, {1}, &byte};
  Result<DLManagedTensor*> managed = ToDLPack(view);
  if (managed.ok()) {
    (*managed)->deleter(*managed);
    GTEST_SKIP() << "this dlpack.h has fp8 codes";
  }
  EXPECT_EQ(managed.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(managed.status().message().find("f8_e4m3"), std::string::npos);
}

}  // namespace
}  // namespace refit
