#include "refit/dtype.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace refit {
namespace {

struct Expected {
  DType dtype;
  const char* name;
  const char* safetensors;
  uint32_t size;
};

constexpr Expected kExpected[] = {
    {DType::kBool, "bool", "BOOL", 1},
    {DType::kU8, "u8", "U8", 1},
    {DType::kI8, "i8", "I8", 1},
    {DType::kI16, "i16", "I16", 2},
    {DType::kI32, "i32", "I32", 4},
    {DType::kI64, "i64", "I64", 8},
    {DType::kF16, "f16", "F16", 2},
    {DType::kBF16, "bf16", "BF16", 2},
    {DType::kF32, "f32", "F32", 4},
    {DType::kF64, "f64", "F64", 8},
    {DType::kF8E4M3, "f8_e4m3", "F8_E4M3", 1},
    {DType::kF8E5M2, "f8_e5m2", "F8_E5M2", 1},
};

TEST(DTypeTest, TableMatchesTheSpecification) {
  size_t count = 0;
  const DTypeInfo* all = AllDTypes(&count);
  ASSERT_EQ(count, std::size(kExpected));
  for (size_t i = 0; i < count; ++i) {
    SCOPED_TRACE(kExpected[i].name);
    EXPECT_EQ(all[i].dtype, kExpected[i].dtype);
    EXPECT_EQ(all[i].name, kExpected[i].name);
    EXPECT_EQ(all[i].safetensors, kExpected[i].safetensors);
    EXPECT_EQ(all[i].size, kExpected[i].size);
    EXPECT_EQ(SizeOf(kExpected[i].dtype), kExpected[i].size);
    EXPECT_EQ(NameOf(kExpected[i].dtype), kExpected[i].name);
    EXPECT_EQ(all[i].dlpack_bits, kExpected[i].size * 8);
  }
}

TEST(DTypeTest, FindDTypeByWireValue) {
  for (const Expected& e : kExpected) {
    const DTypeInfo* info = FindDType(static_cast<int32_t>(e.dtype));
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->dtype, e.dtype);
  }
  EXPECT_EQ(FindDType(0), nullptr);
  EXPECT_EQ(FindDType(13), nullptr);
  EXPECT_EQ(FindDType(-1), nullptr);
  EXPECT_EQ(FindDType(1 << 30), nullptr);
}

TEST(DTypeTest, NamesRoundTrip) {
  for (const Expected& e : kExpected) {
    Result<DType> by_name = DTypeFromName(e.name);
    ASSERT_TRUE(by_name.ok()) << e.name;
    EXPECT_EQ(*by_name, e.dtype);
    Result<DType> by_st = DTypeFromSafetensors(e.safetensors);
    ASSERT_TRUE(by_st.ok()) << e.safetensors;
    EXPECT_EQ(*by_st, e.dtype);
  }
  // Names are exact: refit names are lower case, safetensors names upper case.
  EXPECT_FALSE(DTypeFromName("BF16").ok());
  EXPECT_FALSE(DTypeFromSafetensors("bf16").ok());
  Result<DType> bad = DTypeFromName("float128");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("float128"), std::string::npos);
}

TEST(DTypeTest, DLPackCodes) {
  EXPECT_EQ(Info(DType::kBool).dlpack_code, 6);
  EXPECT_EQ(Info(DType::kU8).dlpack_code, 1);
  EXPECT_EQ(Info(DType::kI32).dlpack_code, 0);
  EXPECT_EQ(Info(DType::kF32).dlpack_code, 2);
  EXPECT_EQ(Info(DType::kBF16).dlpack_code, 4);
  EXPECT_TRUE(Info(DType::kF16).is_float);
  EXPECT_FALSE(Info(DType::kI64).is_float);

  // Every dtype with a DLPack code maps back to itself; the (code, bits) pairs are unique.
  std::set<std::pair<int, int>> seen;
  size_t count = 0;
  const DTypeInfo* all = AllDTypes(&count);
  for (size_t i = 0; i < count; ++i) {
    Result<DType> back = DTypeFromDLPack(all[i].dlpack_code, all[i].dlpack_bits);
    if (all[i].dtype == DType::kF8E4M3 || all[i].dtype == DType::kF8E5M2) {
      // Only dlpack >= 1.1 has fp8 codes; older headers report them unsupported.
      if (!back.ok()) {
        EXPECT_EQ(back.status().code(), StatusCode::kUnsupported);
        continue;
      }
    }
    ASSERT_TRUE(back.ok()) << all[i].name;
    EXPECT_EQ(*back, all[i].dtype);
    EXPECT_TRUE(seen.insert({all[i].dlpack_code, all[i].dlpack_bits}).second) << all[i].name;
  }
  Result<DType> complex64 = DTypeFromDLPack(5, 64);
  ASSERT_FALSE(complex64.ok());
  EXPECT_EQ(complex64.status().code(), StatusCode::kUnsupported);
  EXPECT_FALSE(DTypeFromDLPack(2, 24).ok());
}

}  // namespace
}  // namespace refit
