// The one dtype table: names, sizes, safetensors names and DLPack codes.
#include "refit/dtype.h"

#include <dlpack/dlpack.h>

#include <array>
#include <string>

namespace refit {
namespace {

// DLPack codes the installed dlpack.h may predate. kDLBool (6) is fixed by dlpack >= 0.8; the
// fp8 codes exist only from dlpack 1.1 on. Without them fp8 has no DLPack code at all: 0xFF never
// matches a real code, so DTypeFromDLPack and ToDLPack report it as unsupported.
constexpr uint8_t kDLPackBool = 6;
constexpr uint8_t kNoDLPackCode = 0xFF;
#if defined(DLPACK_MAJOR_VERSION) && \
    (DLPACK_MAJOR_VERSION > 1 || (DLPACK_MAJOR_VERSION == 1 && DLPACK_MINOR_VERSION >= 1))
constexpr uint8_t kDLPackF8E4M3 = kDLFloat8_e4m3fn;
constexpr uint8_t kDLPackF8E5M2 = kDLFloat8_e5m2;
#else
constexpr uint8_t kDLPackF8E4M3 = kNoDLPackCode;
constexpr uint8_t kDLPackF8E5M2 = kNoDLPackCode;
#endif

constexpr uint8_t kInt = kDLInt;
constexpr uint8_t kUInt = kDLUInt;
constexpr uint8_t kFloat = kDLFloat;
constexpr uint8_t kBfloat = kDLBfloat;

// In enum order: kTable[value - 1] describes DType(value).
constexpr std::array<DTypeInfo, 12> kTable = {{
    {DType::kBool, "bool", "BOOL", 1, kDLPackBool, 8, false},
    {DType::kU8, "u8", "U8", 1, kUInt, 8, false},
    {DType::kI8, "i8", "I8", 1, kInt, 8, false},
    {DType::kI16, "i16", "I16", 2, kInt, 16, false},
    {DType::kI32, "i32", "I32", 4, kInt, 32, false},
    {DType::kI64, "i64", "I64", 8, kInt, 64, false},
    {DType::kF16, "f16", "F16", 2, kFloat, 16, true},
    {DType::kBF16, "bf16", "BF16", 2, kBfloat, 16, true},
    {DType::kF32, "f32", "F32", 4, kFloat, 32, true},
    {DType::kF64, "f64", "F64", 8, kFloat, 64, true},
    {DType::kF8E4M3, "f8_e4m3", "F8_E4M3", 1, kDLPackF8E4M3, 8, true},
    {DType::kF8E5M2, "f8_e5m2", "F8_E5M2", 1, kDLPackF8E5M2, 8, true},
}};

constexpr bool TableIsInEnumOrder() {
  for (size_t i = 0; i < kTable.size(); ++i) {
    if (static_cast<size_t>(kTable[i].dtype) != i + 1) return false;
  }
  return true;
}
static_assert(TableIsInEnumOrder(), "kTable must be indexed by DType value - 1");

}  // namespace

const DTypeInfo* AllDTypes(size_t* count) {
  if (count != nullptr) *count = kTable.size();
  return kTable.data();
}

const DTypeInfo* FindDType(int32_t value) {
  if (value < 1 || static_cast<size_t>(value) > kTable.size()) return nullptr;
  return &kTable[static_cast<size_t>(value) - 1];
}

Result<DType> DTypeFromName(std::string_view name) {
  for (const DTypeInfo& info : kTable) {
    if (info.name == name) return info.dtype;
  }
  return Status::Unsupported("unknown dtype '" + std::string(name) + "'");
}

Result<DType> DTypeFromSafetensors(std::string_view name) {
  for (const DTypeInfo& info : kTable) {
    if (info.safetensors == name) return info.dtype;
  }
  return Status::Unsupported("unsupported safetensors dtype '" + std::string(name) + "'");
}

Result<DType> DTypeFromDLPack(uint8_t code, uint8_t bits) {
  if (code != kNoDLPackCode) {
    for (const DTypeInfo& info : kTable) {
      if (info.dlpack_code == code && info.dlpack_bits == bits) return info.dtype;
    }
  }
  return Status::Unsupported("unsupported DLPack dtype (code " + std::to_string(code) + ", " +
                             std::to_string(bits) + " bits)");
}

}  // namespace refit
