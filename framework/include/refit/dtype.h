// Element types: the one table of names, sizes and interop codes.
#pragma once

#include <cstdint>
#include <string_view>

#include "refit/export.h"
#include "refit/plugin_abi.h"
#include "refit/status.h"

namespace refit {

enum class DType : int32_t {
  kBool = REFIT_DTYPE_BOOL,
  kU8 = REFIT_DTYPE_U8,
  kI8 = REFIT_DTYPE_I8,
  kI16 = REFIT_DTYPE_I16,
  kI32 = REFIT_DTYPE_I32,
  kI64 = REFIT_DTYPE_I64,
  kF16 = REFIT_DTYPE_F16,
  kBF16 = REFIT_DTYPE_BF16,
  kF32 = REFIT_DTYPE_F32,
  kF64 = REFIT_DTYPE_F64,
  kF8E4M3 = REFIT_DTYPE_F8_E4M3,
  kF8E5M2 = REFIT_DTYPE_F8_E5M2,
};

struct DTypeInfo {
  DType dtype;
  std::string_view name;         // refit's name: "bf16", "f8_e4m3", ...
  std::string_view safetensors;  // safetensors header name: "BF16", "F8_E4M3", ...
  uint32_t size;                 // bytes per element
  uint8_t dlpack_code;  // DLDataTypeCode (kDLInt=0, kDLUInt=1, kDLFloat=2, kDLBfloat=4, kDLBool=6)
  uint8_t dlpack_bits;
  bool is_float;
};

// All supported dtypes, in enum order.
REFIT_API const DTypeInfo* AllDTypes(size_t* count);
// Never null for a valid DType; null for an out-of-range value (e.g. read off the wire).
REFIT_API const DTypeInfo* FindDType(int32_t value);
inline const DTypeInfo& Info(DType d) { return *FindDType(static_cast<int32_t>(d)); }
inline uint32_t SizeOf(DType d) { return Info(d).size; }
inline std::string_view NameOf(DType d) { return Info(d).name; }

REFIT_API Result<DType> DTypeFromName(std::string_view name);         // "bf16"
REFIT_API Result<DType> DTypeFromSafetensors(std::string_view name);  // "BF16"
REFIT_API Result<DType> DTypeFromDLPack(uint8_t code, uint8_t bits);

}  // namespace refit
