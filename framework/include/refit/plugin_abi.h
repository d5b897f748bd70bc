/* refit plugin ABI, version 1 (minor 3). Plain C: no STL, no C++ classes, no exceptions cross it.
 *
 * A plugin is a shared library exporting exactly one symbol:
 *
 *   const refit_plugin_t* refit_plugin_entry_v1(const refit_host_api_t* host);
 *
 * The returned table (and everything it points to) must stay valid until the library is unloaded.
 * The host checks struct_size and abi_major before reading anything else. Tables only ever grow at
 * their end: a newer host reads a field only when struct_size says it is there (UCX's field_mask
 * idea, done with sizes).
 *
 * Ownership: whatever a plugin allocates it frees (instances through their destroy function);
 * buffers the host passes in are owned by the host and valid only for the duration of the call.
 * Errors: every fallible function returns 0 on success or a refit_status_code_t, and fills the
 * host-owned refit_error_t with one line of text. Output parameters are set only on success.
 */
#ifndef REFIT_PLUGIN_ABI_H_
#define REFIT_PLUGIN_ABI_H_

#include <stddef.h>
#include <stdint.h>

#include "refit/c_types.h" /* status and dtype codes, shared with the C API <refit.h> */

#ifdef __cplusplus
extern "C" {
#endif

#define REFIT_ABI_MAJOR 1
#define REFIT_ABI_MINOR 7
#define REFIT_ENTRY_SYMBOL "refit_plugin_entry_v1"
#define REFIT_MAX_DIMS 8

typedef struct refit_error {
  int32_t code;
  char message[1024]; /* NUL-terminated, truncated if longer */
} refit_error_t;

typedef enum refit_component_kind {
  REFIT_KIND_ENCODING = 1,
  REFIT_KIND_TRANSPORT = 2,
  REFIT_KIND_LAYOUT = 3
} refit_component_kind_t;

/* How a record changes the receiver's bits. Overwrite is idempotent; xor/step are not and are
 * applied exactly once (journaled). */
typedef enum refit_op { REFIT_OP_OVERWRITE = 0, REFIT_OP_XOR = 1, REFIT_OP_STEP = 2 } refit_op_t;

typedef enum refit_config_type {
  REFIT_CFG_STRING = 1,
  REFIT_CFG_INT = 2,
  REFIT_CFG_BOOL = 3,
  REFIT_CFG_DOUBLE = 4,
  REFIT_CFG_SIZE = 5, /* integer bytes or a string like "512MiB" */
  REFIT_CFG_STRING_LIST = 6
} refit_config_type_t;

/* A config key a component accepts in its section [<kind>.<name>]. Unknown keys are errors.
 * Rows may grow at their end: the host steps through a component's array by the row size the
 * component declares (refit_component_t.config_key_size, ABI 1.3), and reads these four fields
 * of every row. */
typedef struct refit_config_key {
  const char* name;
  int32_t type;              /* refit_config_type_t */
  const char* default_value; /* as TOML text, documentation only; NULL if required */
  const char* description;
} refit_config_key_t;

/* Opaque view of one component's config section, valid during create(). */
typedef struct refit_config refit_config_t;

typedef enum refit_log_level {
  REFIT_LOG_DEBUG = 0,
  REFIT_LOG_INFO = 1,
  REFIT_LOG_WARN = 2,
  REFIT_LOG_ERROR = 3
} refit_log_level_t;

/* Services the host offers a plugin. Config getters return 1 if the key is set (value written),
 * 0 if absent, -1 if present with another type. Strings are copied into buf (truncated at cap-1);
 * *len_p receives the full length so a caller can retry with a larger buffer. */
typedef struct refit_host_api {
  uint32_t struct_size;
  uint16_t abi_major;
  uint16_t abi_minor;
  void (*log)(int32_t level, const char* component, const char* message);
  int (*config_get_string)(const refit_config_t* cfg, const char* key, char* buf, size_t cap,
                           size_t* len_p);
  int (*config_get_int)(const refit_config_t* cfg, const char* key, int64_t* value_p);
  int (*config_get_bool)(const refit_config_t* cfg, const char* key, int* value_p);
  int (*config_get_double)(const refit_config_t* cfg, const char* key, double* value_p);
  /* Sizes are normalized to bytes by the host ("512MiB" -> 536870912). */
  int (*config_get_size)(const refit_config_t* cfg, const char* key, uint64_t* value_p);
  /* Element index of a string list; returns 0 past the end. */
  int (*config_get_list_item)(const refit_config_t* cfg, const char* key, size_t index, char* buf,
                              size_t cap, size_t* len_p);
} refit_host_api_t;

/* ---------------------------------------------------------------- encodings */

/* One contiguous run of elements to encode (a record's box, row-major). */
typedef struct refit_encode_input {
  uint32_t struct_size;
  int32_t dtype;      /* refit_dtype_t */
  uint32_t elem_size; /* bytes per element: 1, 2, 4 or 8 */
  uint32_t reserved;
  uint64_t n_elems;
  const void* old_bits; /* receiver's current bits; NULL for a full (dense) sync */
  const void* new_bits; /* sender's new bits */
  const uint64_t*
      positions;      /* sorted indices where old != new bitwise; NULL when old_bits is NULL */
  uint64_t n_changed; /* number of positions (n_elems when old_bits is NULL) */
  /* ABI 1.2 (read only when struct_size covers them; each may be NULL): the old and the new bits
   * of the n_changed changed elements, packed in position order (n_changed * elem_size bytes).
   * The host gathers them during its diff, while the elements are in cache; an encoding reads
   * them instead of gathering old_bits / new_bits at the positions (a cache miss per change). */
  const void* old_values;
  const void* new_values;
} refit_encode_input_t;

/* Where a record is applied: a contiguous run holding the receiver's current bits, updated in
 * place. A decoder must never write outside [bits, bits + n_elems * elem_size). */
typedef struct refit_decode_target {
  uint32_t struct_size;
  int32_t dtype;
  uint32_t elem_size;
  uint32_t reserved;
  uint64_t n_elems;
  void* bits;
} refit_decode_target_t;

/* ABI 1.4: where decode_changes lists a record's changes. */
typedef struct refit_decoded_changes {
  uint32_t struct_size;
  uint32_t reserved;
  uint64_t capacity;   /* room in positions and values, in changes */
  uint64_t* positions; /* out: the changed elements' indices, strictly ascending */
  void* values;        /* out: their new bits, packed in position order (elem_size each) */
  uint64_t count;      /* out: how many were listed */
  /* ABI 1.7 (read only when struct_size covers them; progress may be NULL): the host verifies a
   * record while it is being listed. A decoder may call progress(progress_user, done, listed)
   * whenever every change below element `done` is among the first `listed` it has stored, with
   * arguments that never decrease; the host then digests those elements while they are still
   * in its cache. Calls are optional: what no call covered is verified once decode_changes
   * returns. */
  void (*progress)(void* user, uint64_t done, uint64_t listed);
  void* progress_user;
} refit_decoded_changes_t;

/* Capability flags of an encoding. */
#define REFIT_ENC_CAP_FULL_SYNC 0x1u /* can encode with old_bits == NULL (dense) */
/* ABI 1.3: the `auto` encoding does not try it unless a config names it as a candidate (an
 * encoding that never wins on size, such as a plain copy of every element). */
#define REFIT_ENC_CAP_NOT_AUTO 0x2u

/* The max_encoded_size of plugins built for ABI 1.0 to 1.2, which returned the bound directly
 * (0: cannot encode). The host calls a plugin's max_encoded_size through this type when the
 * plugin table's abi_minor is below 3. */
typedef uint64_t (*refit_max_encoded_size_v1_fn)(void* instance, const refit_encode_input_t* in);

/* Instances must be safe to call concurrently from several threads (encode/decode are
 * stateless per call; any scratch is per call). */
typedef struct refit_encoding_vtable {
  uint32_t struct_size;
  int32_t op; /* refit_op_t its records carry */
  int (*create)(const refit_host_api_t* host, const refit_config_t* cfg, void** instance_p,
                refit_error_t* err);
  void (*destroy)(void* instance);
  /* Upper bound of encode()'s output for this input, in *size_p. ABI 1.3 signature; a plugin
   * whose table says abi_minor < 3 has a refit_max_encoded_size_v1_fn in this slot. */
  int (*max_encoded_size)(void* instance, const refit_encode_input_t* in, uint64_t* size_p,
                          refit_error_t* err);
  int (*encode)(void* instance, const refit_encode_input_t* in, uint8_t* out, uint64_t cap,
                uint64_t* size_p, refit_error_t* err);
  /* payload is untrusted: validate every length/count/position before touching target. */
  int (*decode)(void* instance, const uint8_t* payload, uint64_t len,
                const refit_decode_target_t* target, refit_error_t* err);
  /* ABI 1.4, optional (NULL, or past the vtable's struct_size: not offered). Decodes like decode
   * but writes nothing to target, whose bits are the old bits, read only: the changes decode
   * would make are listed in *changes. A payload of more than changes->capacity changes is
   * REFIT_ERR_CORRUPT; REFIT_ERR_UNSUPPORTED means this payload must be decoded in place (the
   * host then calls decode on a copy of the old bits). */
  int (*decode_changes)(void* instance, const uint8_t* payload, uint64_t len,
                        const refit_decode_target_t* old, refit_decoded_changes_t* changes,
                        refit_error_t* err);
} refit_encoding_vtable_t;

/* ---------------------------------------------------------------- transports */

/* A transport is a keyed blob channel: the framework runs the sync protocol (payloads, manifest,
 * commit marker, acks) over put/get/list of keys like "v00000007/COMMIT". Keys are relative,
 * '/'-separated, [A-Za-z0-9._-] per component. A put is atomic: readers see all bytes or no key.
 * Role: 0 = sender, 1 = receiver (a transport may connect differently per role).
 * Instances must accept concurrent calls from several threads on distinct keys (the sender puts
 * payload k from a writer thread while it encodes k+1). */
typedef enum refit_transport_role {
  REFIT_ROLE_SENDER = 0,
  REFIT_ROLE_RECEIVER = 1
} refit_transport_role_t;

typedef void (*refit_list_cb)(void* ctx, const char* key, uint64_t size);

/* Capability flags of a transport (ABI 1.5; older hosts ignore them). */
/* A sender instance reads the keys it put from a copy of its own (a local spool), never across
 * the network: the link emulation ([transport] bandwidth) does not charge those reads to the
 * sender's link (a sender verifying its puts reads each payload back). */
#define REFIT_TRANSPORT_CAP_LOCAL_SENDER_READS 0x1u

typedef struct refit_transport_vtable {
  uint32_t struct_size;
  uint32_t reserved;
  int (*create)(const refit_host_api_t* host, const refit_config_t* cfg, int32_t role,
                const char* peer_id, void** instance_p, refit_error_t* err);
  void (*destroy)(void* instance);
  int (*put)(void* instance, const char* key, const uint8_t* data, uint64_t len,
             refit_error_t* err);
  /* *found_p = 0 and REFIT_OK when the key does not exist. */
  int (*size)(void* instance, const char* key, uint64_t* size_p, int* found_p, refit_error_t* err);
  /* Reads exactly len bytes at offset into buf (ranged read); a short object is REFIT_ERR_CORRUPT.
   */
  int (*get)(void* instance, const char* key, uint64_t offset, uint8_t* buf, uint64_t len,
             refit_error_t* err);
  /* Calls cb once per key starting with prefix (any order). */
  int (*list)(void* instance, const char* prefix, refit_list_cb cb, void* ctx, refit_error_t* err);
  int (*remove)(void* instance, const char* key, refit_error_t* err);
  /* ABI 1.6, optional (NULL, or absent from a table whose struct_size ends before it): blocks
   * until an object may have arrived since this instance's previous call to wait (the first call:
   * since the instance was made), or until timeout_ms elapse; *changed_p = 1 when it woke for an
   * arrival, 0 at the timeout. A wake with nothing new is allowed, a missed arrival is not: a
   * receiver waits here between polls instead of sleeping. Without it the host sleeps. */
  int (*wait)(void* instance, uint32_t timeout_ms, int* changed_p, refit_error_t* err);
} refit_transport_vtable_t;

/* ---------------------------------------------------------------- layouts */

/* One piece of a local shard tensor mapped onto a canonical tensor: the box
 * local[local_offset : local_offset + extent] equals canonical[canonical_offset : ... + extent]. */
typedef struct refit_slice_map {
  uint32_t struct_size;
  uint32_t ndim;
  const char* canonical_name;
  uint64_t canonical_shape[REFIT_MAX_DIMS];
  uint64_t canonical_offset[REFIT_MAX_DIMS];
  uint64_t local_offset[REFIT_MAX_DIMS];
  uint64_t extent[REFIT_MAX_DIMS];
  int32_t replicated; /* 1: the same slice lives on other ranks; only rank owner_rank sends it */
  int32_t owner_rank;
} refit_slice_map_t;

typedef void (*refit_slice_cb)(void* ctx, const refit_slice_map_t* slice);

typedef struct refit_local_tensor {
  uint32_t struct_size;
  int32_t dtype;
  const char* name;
  uint32_t ndim;
  uint64_t shape[REFIT_MAX_DIMS];
} refit_local_tensor_t;

typedef void (*refit_local_cb)(void* ctx, const refit_local_tensor_t* local);

typedef struct refit_layout_vtable {
  uint32_t struct_size;
  uint32_t reserved;
  /* cfg holds the model description and parallel config of this rank. */
  int (*create)(const refit_host_api_t* host, const refit_config_t* cfg, int32_t rank,
                int32_t world, void** instance_p, refit_error_t* err);
  void (*destroy)(void* instance);
  /* Emits every canonical slice the local tensor covers (possibly none, e.g. padding only). */
  int (*map_tensor)(void* instance, const refit_local_tensor_t* local, refit_slice_cb cb, void* ctx,
                    refit_error_t* err);
  /* ABI 1.1, optional: NULL, or absent when struct_size is the ABI 1.0 size. Given canonical
   * tensors (name, dtype, shape), calls cb once per local tensor of this rank cut from them, in
   * the order a shard file stores them, so a caller can cut or allocate shards without having
   * any. The tensors may be a subset of the checkpoint (one sender rank's); a canonical tensor the
   * layout does not know, a shape that contradicts its config, or a fused tensor given only in
   * part is an error. A layout without it cannot be used by `refit shard`. */
  int (*list_local)(void* instance, const refit_local_tensor_t* canonical, size_t n_canonical,
                    refit_local_cb cb, void* ctx, refit_error_t* err);
} refit_layout_vtable_t;

/* ---------------------------------------------------------------- plugin table */

typedef struct refit_component {
  uint32_t struct_size;
  int32_t kind; /* refit_component_kind_t */
  const char* name;
  const char* description;
  uint64_t capabilities;
  const refit_config_key_t* config_keys;
  size_t n_config_keys;
  const void*
      vtable; /* refit_encoding_vtable_t*, refit_transport_vtable_t* or refit_layout_vtable_t* */
  /* ABI 1.3 (read only when struct_size covers them). */
  /* sizeof the rows of config_keys, at least sizeof(refit_config_key_t) of ABI 1.0; 0 means that
   * size. Lets the key row grow without breaking older hosts. */
  uint32_t config_key_size;
  /* Encodings: relative cost of applying one of its records on a receiver (1 cheapest; 0 not
   * declared, ordered after every declared cost). `auto` tries candidates in increasing cost,
   * equal costs by name. Other kinds set 0. */
  uint32_t apply_cost;
} refit_component_t;

typedef struct refit_plugin {
  uint32_t struct_size;
  uint16_t abi_major;
  uint16_t abi_minor;
  const char* name;
  const char* version;
  const refit_component_t* components;
  size_t n_components;
  /* ABI 1.3, optional (NULL, or absent when struct_size ends before it): called once when the
   * host no longer needs anything of this table, after every instance is destroyed and before
   * the library is unloaded. Releases what the entry point set up; it may still log through the
   * host API. */
  void (*fini)(void);
} refit_plugin_t;

typedef const refit_plugin_t* (*refit_plugin_entry_fn)(const refit_host_api_t* host);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_PLUGIN_ABI_H_ */
