/* refit's C API: a sender and a receiver of delta-compressed weight versions, for programs (and
 * language bindings) that cannot use the C++ API in refit/refit.h. Plain C99; docs/c-api.md has
 * the lines a C program writes.
 *
 * ABI rules:
 * - Handles are opaque; made by *_new_from_file / *_new_from_toml, released by *_free (NULL is a
 *   no-op). A handle is used from one thread at a time; different handles from any threads.
 * - Every fallible function returns a refit_status_t: REFIT_OK (0) or the refit_status_code_t of
 *   the failure (the values of refit::StatusCode). The message is one line naming the file, key,
 *   tensor or version at fault, read with refit_last_error() (this thread's most recent call) or
 *   refit_*_last_error(handle) (that handle's most recent call); "" after a call that succeeded.
 *   The strings stay valid until the next call on the same thread / handle.
 * - Output parameters (`*_p`) are written only on success.
 * - Stats structs start with `struct_size`: the caller sets it to sizeof(the struct it was
 *   compiled with) and the library fills only the fields that fit, so the structs can grow at
 *   their end without breaking older callers.
 * - No C++ exception and no C++ type crosses this ABI.
 *
 * Tensors: caller-owned, contiguous, row-major CPU memory. A sender only reads them during the
 * call that takes them; a receiver writes the memory it was attached to during every poll, until
 * the next attach or its free. Element types are the refit_dtype_t codes (refit::DType's values):
 *   REFIT_DTYPE_BOOL 1, U8 2, I8 3, I16 4, I32 5, I64 6, F16 7, BF16 8, F32 9, F64 10,
 *   F8_E4M3 11, F8_E5M2 12.
 */
#ifndef REFIT_H_
#define REFIT_H_

#include <stddef.h>
#include <stdint.h>

#include "refit/c_types.h" /* refit_status_code_t (REFIT_OK, REFIT_ERR_*), refit_dtype_t */
#include "refit/export.h"  /* REFIT_API */

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t refit_status_t; /* a refit_status_code_t value */

struct DLManagedTensor; /* dlpack.h: the *_dlpack functions take CPU, contiguous tensors */

typedef struct refit_sender refit_sender_t;
typedef struct refit_receiver refit_receiver_t;

/* One tensor: `ndim` dims in `shape` (ndim 0: a scalar), `dtype` a refit_dtype_t code. The
 * library copies name and shape during the call; `data` must stay valid as described above. */
typedef struct refit_tensor {
  const char* name;
  void* data;
  int32_t dtype;
  int32_t ndim;
  const int64_t* shape;
} refit_tensor_t;

/* What one publish did (this rank's part of the version). */
typedef struct refit_sync_stats {
  uint32_t struct_size; /* set by the caller: sizeof(refit_sync_stats_t) */
  int32_t full;         /* 1: a full (dense) sync; 0: a delta on base_version */
  uint64_t version;
  uint64_t base_version; /* 0 for a full sync */
  uint64_t tensors;
  uint64_t total_elements;
  uint64_t changed_elements;
  uint64_t records;
  uint64_t payloads;
  uint64_t payload_bytes; /* what crossed the transport */
  double wait_seconds;    /* waiting for the previous version's acks and the baseline advance */
  double total_seconds;
} refit_sync_stats_t;

/* What one applied version did on a receiver. */
typedef struct refit_apply_stats {
  uint32_t struct_size; /* set by the caller: sizeof(refit_apply_stats_t) */
  int32_t full;
  uint64_t version;
  uint64_t changed_elements;
  uint64_t records;
  uint64_t payloads;
  uint64_t payload_bytes;
  double fetch_seconds;
  double apply_seconds; /* decode + apply + digest verification */
  double total_seconds;
} refit_apply_stats_t;

/* "ok", "invalid argument", "not found", ... for a status code; never NULL. */
REFIT_API const char* refit_status_name(refit_status_t status);
/* The message of this thread's most recent refit_* call ("" if it succeeded); never NULL. */
REFIT_API const char* refit_last_error(void);

/* A sender for trainer rank `rank` of `world`, configured by a TOML file or TOML text (the same
 * keys as `refit send`, docs/config.md). */
REFIT_API refit_status_t refit_sender_new_from_file(const char* path, int32_t rank, int32_t world,
                                                    refit_sender_t** sender_p);
REFIT_API refit_status_t refit_sender_new_from_toml(const char* toml, int32_t rank, int32_t world,
                                                    refit_sender_t** sender_p);
/* Publishes the next version from the rank's weights: waits for every receiver's ack of the
 * previous one, diffs, encodes, sends, commits. `stats_p` may be NULL. */
REFIT_API refit_status_t refit_sender_publish(refit_sender_t* sender, const refit_tensor_t* tensors,
                                              size_t count, refit_sync_stats_t* stats_p);
/* The same with DLPack tensors; names[i] names tensors[i]. The caller keeps them alive. */
REFIT_API refit_status_t refit_sender_publish_dlpack(refit_sender_t* sender,
                                                     const struct DLManagedTensor* const* tensors,
                                                     const char* const* names, size_t count,
                                                     refit_sync_stats_t* stats_p);
/* Waits up to `timeout_seconds` for every receiver's ack of the published version, then advances
 * the baseline (REFIT_ERR_TIMEOUT when they did not all answer). */
REFIT_API refit_status_t refit_sender_wait(refit_sender_t* sender, double timeout_seconds);
/* The last published version (0: none). */
REFIT_API refit_status_t refit_sender_version(const refit_sender_t* sender, uint64_t* version_p);
REFIT_API const char* refit_sender_last_error(const refit_sender_t* sender);
REFIT_API void refit_sender_free(refit_sender_t* sender);

/* A receiver configured by a TOML file or text ([receiver], [transport], ...). */
REFIT_API refit_status_t refit_receiver_new_from_file(const char* path,
                                                      refit_receiver_t** receiver_p);
REFIT_API refit_status_t refit_receiver_new_from_toml(const char* toml,
                                                      refit_receiver_t** receiver_p);
/* Binds the receiver to the caller's memory: polls then copy full syncs into these tensors and
 * apply deltas in place. Attach refuses a tensor given twice or without memory; the poll that
 * brings a full sync checks the tensors against it by name, dtype and shape and fails naming the
 * one that does not match (nothing is written then). `loaded_version`: NULL, or the version the
 * caller already loaded into that memory (taken only if it is the receiver's committed version
 * and the bits hash to it; otherwise the receiver asks for a full sync). The memory must stay
 * valid until the next attach or the receiver's free. */
REFIT_API refit_status_t refit_receiver_attach(refit_receiver_t* receiver,
                                               const refit_tensor_t* tensors, size_t count,
                                               const uint64_t* loaded_version);
REFIT_API refit_status_t refit_receiver_attach_dlpack(refit_receiver_t* receiver,
                                                      const struct DLManagedTensor* const* tensors,
                                                      const char* const* names, size_t count,
                                                      const uint64_t* loaded_version);
/* Applies the next committed version if there is one: *applied_p = 1 and `stats_p` (may be NULL)
 * filled, or *applied_p = 0 when none is ready. Does not wait. */
REFIT_API refit_status_t refit_receiver_poll(refit_receiver_t* receiver, int32_t* applied_p,
                                             refit_apply_stats_t* stats_p);
/* Between two polls: returns once something may have arrived from the sender (*woke_p = 1; over
 * ucx at once when a commit lands) or after `timeout_ms` (*woke_p = 0; a transport that cannot
 * wake a receiver, such as disk or s3, just sleeps). A wake with nothing new is possible: poll
 * then, and wait again when it applied nothing. */
REFIT_API refit_status_t refit_receiver_wait(refit_receiver_t* receiver, uint32_t timeout_ms,
                                             int32_t* woke_p);
/* The receiver's committed version (0: none). */
REFIT_API refit_status_t refit_receiver_version(const refit_receiver_t* receiver,
                                                uint64_t* version_p);
REFIT_API const char* refit_receiver_last_error(const refit_receiver_t* receiver);
REFIT_API void refit_receiver_free(refit_receiver_t* receiver);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_H_ */
