/* Plain-C codes shared by the plugin ABI (refit/plugin_abi.h) and the C API (<refit.h>): status
 * codes and element types. Both are part of two ABIs and of the wire format: never renumber.
 */
#ifndef REFIT_C_TYPES_H_
#define REFIT_C_TYPES_H_

#ifdef __cplusplus
extern "C" {
#endif

/* Same values as refit::StatusCode. */
typedef enum refit_status_code {
  REFIT_OK = 0,
  REFIT_ERR_INVALID = 1,
  REFIT_ERR_NOT_FOUND = 2,
  REFIT_ERR_IO = 3,
  REFIT_ERR_CORRUPT = 4,
  REFIT_ERR_UNSUPPORTED = 5,
  REFIT_ERR_VERSION = 6,
  REFIT_ERR_EXISTS = 7,
  REFIT_ERR_TIMEOUT = 8,
  REFIT_ERR_INTERNAL = 9
} refit_status_code_t;

/* Element types. Values are stored in wire records: never renumber. */
typedef enum refit_dtype {
  REFIT_DTYPE_BOOL = 1,
  REFIT_DTYPE_U8 = 2,
  REFIT_DTYPE_I8 = 3,
  REFIT_DTYPE_I16 = 4,
  REFIT_DTYPE_I32 = 5,
  REFIT_DTYPE_I64 = 6,
  REFIT_DTYPE_F16 = 7,
  REFIT_DTYPE_BF16 = 8,
  REFIT_DTYPE_F32 = 9,
  REFIT_DTYPE_F64 = 10,
  REFIT_DTYPE_F8_E4M3 = 11,
  REFIT_DTYPE_F8_E5M2 = 12
} refit_dtype_t;

#ifdef __cplusplus
}
#endif

#endif /* REFIT_C_TYPES_H_ */
