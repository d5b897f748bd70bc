/* The C API (<refit.h>) from a program compiled as C99: a sender and a receiver over the disk
 * transport in a temporary directory; the receiver attached to its own malloc'd buffers. A full
 * sync and deltas whose changes include NaN payloads, signed zeros, infinities and subnormals
 * (published as refit_tensor_t and as DLPack) land bit for bit in the receiver's buffers; a
 * restarted receiver re-attaches with its loaded version; and the error paths a C caller meets.
 * Exit status 0 when every check passed; each failure prints one line.
 */
#define _POSIX_C_SOURCE 200809L

#include <dlpack/dlpack.h>
#include <refit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_failures = 0;
static int g_checks = 0;

#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    ++g_checks;                                                                \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
      ++g_failures;                                                            \
    }                                                                          \
  } while (0)

/* A call that must succeed: on failure, report refit's message and stop the test. */
#define MUST(call)                                                              \
  do {                                                                          \
    refit_status_t must_status_ = (call);                                       \
    if (must_status_ != REFIT_OK) {                                             \
      fprintf(stderr, "%s:%d: %s failed (%s): %s\n", __FILE__, __LINE__, #call, \
              refit_status_name(must_status_), refit_last_error());             \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

enum { kTensors = 5 };

/* The model: a few tensors of several dtypes, in sender memory and in receiver memory. */
typedef struct model {
  refit_tensor_t tensors[kTensors];
  int64_t shapes[kTensors][2];
  size_t nbytes[kTensors];
} model_t;

static const char* const kNames[kTensors] = {"layers.0.weight", "layers.0.bias", "embed.weight",
                                             "norm.scale", "step"};
static const int32_t kDTypes[kTensors] = {REFIT_DTYPE_BF16, REFIT_DTYPE_F32, REFIT_DTYPE_F16,
                                          REFIT_DTYPE_F64, REFIT_DTYPE_I32};
static const size_t kElemSize[kTensors] = {2, 4, 2, 8, 4};
static const int64_t kShapes[kTensors][2] = {{16, 32}, {32, 0}, {10, 8}, {7, 0}, {3, 0}};
static const int32_t kNDim[kTensors] = {2, 1, 2, 1, 1};

static void model_init(model_t* m, unsigned fill) {
  for (int t = 0; t < kTensors; ++t) {
    size_t elems = 1;
    for (int d = 0; d < kNDim[t]; ++d) {
      m->shapes[t][d] = kShapes[t][d];
      elems *= (size_t)kShapes[t][d];
    }
    m->nbytes[t] = elems * kElemSize[t];
    unsigned char* data = malloc(m->nbytes[t]);
    if (data == NULL) exit(1);
    for (size_t i = 0; i < m->nbytes[t]; ++i)
      data[i] = (unsigned char)(fill + i * 37u + (unsigned)t);
    m->tensors[t].name = kNames[t];
    m->tensors[t].data = data;
    m->tensors[t].dtype = kDTypes[t];
    m->tensors[t].ndim = kNDim[t];
    m->tensors[t].shape = m->shapes[t];
  }
}

static void model_free(model_t* m) {
  for (int t = 0; t < kTensors; ++t) free(m->tensors[t].data);
}

static void put16(model_t* m, int t, size_t i, uint16_t bits) {
  memcpy((unsigned char*)m->tensors[t].data + i * 2, &bits, 2);
}
static void put32(model_t* m, int t, size_t i, uint32_t bits) {
  memcpy((unsigned char*)m->tensors[t].data + i * 4, &bits, 4);
}
static void put64(model_t* m, int t, size_t i, uint64_t bits) {
  memcpy((unsigned char*)m->tensors[t].data + i * 8, &bits, 8);
}

/* Version 2: NaNs with payloads (quiet and signalling), signed zeros, infinities, subnormals. */
static void mutate_specials(model_t* m) {
  put16(m, 0, 3, 0x7fc1);                /* bf16 quiet NaN, payload 1 */
  put16(m, 0, 70, 0xff81);               /* bf16 negative signalling NaN */
  put16(m, 0, 71, 0x8000);               /* bf16 -0.0 */
  put16(m, 0, 300, 0x0001);              /* bf16 smallest subnormal */
  put16(m, 0, 511, 0xff80);              /* bf16 -inf */
  put32(m, 1, 0, 0x7fa00005u);           /* f32 signalling NaN, payload 5 */
  put32(m, 1, 5, 0x80000000u);           /* f32 -0.0 */
  put32(m, 1, 6, 0x7f800000u);           /* f32 +inf */
  put32(m, 1, 31, 0x00000003u);          /* f32 subnormal */
  put16(m, 2, 9, 0x7e01);                /* f16 NaN with payload */
  put16(m, 2, 40, 0x8001);               /* f16 negative subnormal */
  put64(m, 3, 2, 0xfff8000000000123ull); /* f64 negative NaN with payload */
  put64(m, 3, 6, 0x8000000000000000ull); /* f64 -0.0 */
  put32(m, 4, 1, 0xffffffffu);
}

/* Version 3: a few ordinary changes, and some specials turned back into numbers. */
static void mutate_values(model_t* m) {
  put16(m, 0, 3, 0x3f80); /* bf16 1.0 */
  put16(m, 0, 200, 0xc000);
  put32(m, 1, 0, 0x3f000000u);           /* f32 0.5 */
  put32(m, 1, 7, 0x00800000u);           /* f32 smallest normal */
  put16(m, 2, 79, 0xfc00);               /* f16 -inf */
  put64(m, 3, 0, 0x0000000000000001ull); /* f64 smallest subnormal */
  put32(m, 4, 2, 42u);
}

/* The model's tensors as DLPack tensors borrowing the same memory. */
typedef struct dl_model {
  DLManagedTensor tensors[kTensors];
  const DLManagedTensor* pointers[kTensors];
} dl_model_t;

static void dl_model_init(dl_model_t* dl, model_t* m) {
  static const uint8_t kCodes[kTensors] = {kDLBfloat, kDLFloat, kDLFloat, kDLFloat, kDLInt};
  memset(dl, 0, sizeof(*dl));
  for (int t = 0; t < kTensors; ++t) {
    DLTensor* x = &dl->tensors[t].dl_tensor;
    x->data = m->tensors[t].data;
    x->device.device_type = kDLCPU;
    x->ndim = m->tensors[t].ndim;
    x->dtype.code = kCodes[t];
    x->dtype.bits = (uint8_t)(kElemSize[t] * 8);
    x->dtype.lanes = 1;
    x->shape = m->shapes[t];
    dl->pointers[t] = &dl->tensors[t];
  }
}

/* The receiver's memory holds the sender's bits, every byte. */
static void check_equal(const model_t* sent, const model_t* got, uint64_t version) {
  for (int t = 0; t < kTensors; ++t) {
    const unsigned char* a = sent->tensors[t].data;
    const unsigned char* b = got->tensors[t].data;
    size_t i = 0;
    while (i < sent->nbytes[t] && a[i] == b[i]) ++i;
    CHECK(i == sent->nbytes[t], "version %llu: %s differs at byte %zu (%02x, sender %02x)",
          (unsigned long long)version, kNames[t], i, i < sent->nbytes[t] ? b[i] : 0,
          i < sent->nbytes[t] ? a[i] : 0);
  }
}

static char g_dir[64];

static void write_config(const char* path) {
  FILE* f = fopen(path, "w");
  if (f == NULL) exit(1);
  fprintf(f,
          "[sender]\nstate_dir = \"%s/sender\"\nreceivers = [\"r0\"]\nack_timeout_s = 30\n\n"
          "[receiver]\nid = \"r0\"\nstate_dir = \"%s/receiver\"\n\n"
          "[transport]\nname = \"disk\"\n\n[transport.disk]\ndir = \"%s/sync\"\nfsync = false\n",
          g_dir, g_dir, g_dir);
  fclose(f);
}

/* Publishes `m` (through DLPack when `dl` is set) as the next version, applies it on the
 * receiver and checks the receiver's attached memory `r` against it. */
static void sync_once(refit_sender_t* sender, refit_receiver_t* receiver, model_t* m,
                      const model_t* r, const dl_model_t* dl, uint64_t expect_version,
                      int expect_full) {
  refit_sync_stats_t sent;
  memset(&sent, 0, sizeof(sent));
  sent.struct_size = sizeof(sent);
  if (dl != NULL) {
    MUST(refit_sender_publish_dlpack(sender, dl->pointers, kNames, kTensors, &sent));
  } else {
    MUST(refit_sender_publish(sender, m->tensors, kTensors, &sent));
  }
  CHECK(sent.version == expect_version, "published version %llu", (unsigned long long)sent.version);
  CHECK(sent.full == expect_full, "published full=%d", (int)sent.full);
  CHECK(sent.tensors == kTensors, "published %llu tensors", (unsigned long long)sent.tensors);
  CHECK(sent.struct_size == sizeof(sent), "struct_size changed to %u", (unsigned)sent.struct_size);

  refit_apply_stats_t applied;
  memset(&applied, 0, sizeof(applied));
  applied.struct_size = sizeof(applied);
  int32_t got = 0;
  MUST(refit_receiver_poll(receiver, &got, &applied));
  CHECK(got == 1, "poll applied nothing after version %llu", (unsigned long long)expect_version);
  CHECK(applied.version == expect_version, "applied version %llu",
        (unsigned long long)applied.version);
  CHECK(applied.full == expect_full, "applied full=%d", (int)applied.full);
  if (!expect_full) {
    CHECK(applied.changed_elements == sent.changed_elements,
          "receiver changed %llu elements, sender %llu",
          (unsigned long long)applied.changed_elements, (unsigned long long)sent.changed_elements);
  }
  check_equal(m, r, expect_version);
  uint64_t version = 0;
  MUST(refit_receiver_version(receiver, &version));
  CHECK(version == expect_version, "receiver version %llu", (unsigned long long)version);
  MUST(refit_sender_version(sender, &version));
  CHECK(version == expect_version, "sender version %llu", (unsigned long long)version);
  got = 1;
  MUST(refit_receiver_poll(receiver, &got, NULL));
  CHECK(got == 0, "a second poll applied a version that was never published");
  /* The disk transport cannot wake a receiver: a wait is a sleep, and says it timed out. */
  int32_t woke = 7;
  MUST(refit_receiver_wait(receiver, 1, &woke));
  CHECK(woke == 0, "a wait over disk said it was woken (%d)", (int)woke);
  refit_status_t st = refit_receiver_wait(receiver, 1, NULL);
  CHECK(st == REFIT_ERR_INVALID, "a wait without woke_p gave %s", refit_status_name(st));
}

/* Memory of the wrong shape is refused with the tensor's name: when attached, or (the receiver
 * learns the tensors from a full sync) by the poll that brings one. A second receiver, made from
 * TOML text, that the sender does not wait for. */
static void check_wrong_shape(model_t* r) {
  char toml[512];
  snprintf(toml, sizeof(toml),
           "[receiver]\nid = \"r1\"\nstate_dir = \"%s/receiver1\"\n\n[transport]\n"
           "name = \"disk\"\n\n[transport.disk]\ndir = \"%s/sync\"\nfsync = false\n",
           g_dir, g_dir);
  refit_receiver_t* receiver = NULL;
  MUST(refit_receiver_new_from_toml(toml, &receiver));
  r->shapes[0][1] = 31;
  refit_status_t st = refit_receiver_attach(receiver, r->tensors, kTensors, NULL);
  int32_t applied = 0;
  if (st == REFIT_OK) st = refit_receiver_poll(receiver, &applied, NULL);
  r->shapes[0][1] = kShapes[0][1];
  CHECK(st == REFIT_ERR_INVALID, "a wrong shape gave %s", refit_status_name(st));
  CHECK(strstr(refit_last_error(), kNames[0]) != NULL, "message does not name the tensor: %s",
        refit_last_error());
  CHECK(strcmp(refit_receiver_last_error(receiver), refit_last_error()) == 0,
        "handle message differs: %s", refit_receiver_last_error(receiver));
  CHECK(applied == 0, "a version was applied into memory of the wrong shape");
  refit_receiver_free(receiver);
}

static void test_sync(const char* config_path) {
  refit_sender_t* sender = NULL;
  refit_receiver_t* receiver = NULL;
  MUST(refit_sender_new_from_file(config_path, 0, 1, &sender));
  MUST(refit_receiver_new_from_file(config_path, &receiver));
  model_t m, r;
  model_init(&m, 11);
  model_init(&r, 0xab); /* the receiver's own buffers start with other bits */
  dl_model_t dl;
  dl_model_init(&dl, &m);
  MUST(refit_receiver_attach(receiver, r.tensors, kTensors, NULL));
  sync_once(sender, receiver, &m, &r, NULL, 1, 1);
  check_wrong_shape(&r);
  mutate_specials(&m);
  sync_once(sender, receiver, &m, &r, NULL, 2, 0);
  mutate_values(&m);
  sync_once(sender, receiver, &m, &r, &dl, 3, 0);
  MUST(refit_sender_wait(sender, 30.0));

  /* A restarted engine re-attaches the memory that holds version 3: the next delta applies. */
  refit_receiver_free(receiver);
  MUST(refit_receiver_new_from_file(config_path, &receiver));
  const uint64_t loaded = 3;
  MUST(refit_receiver_attach(receiver, r.tensors, kTensors, &loaded));
  mutate_specials(&m);
  put16(&m, 0, 5, 0x7fff); /* bf16 NaN, all payload bits */
  sync_once(sender, receiver, &m, &r, &dl, 4, 0);
  model_free(&r);
  model_free(&m);
  refit_receiver_free(receiver);
  refit_sender_free(sender);
}

static void test_errors(void) {
  refit_sender_t* sender = (refit_sender_t*)&g_failures; /* must stay untouched on failure */
  char missing[128];
  snprintf(missing, sizeof(missing), "%s/no-such-dir/refit.toml", g_dir);
  refit_status_t st = refit_sender_new_from_file(missing, 0, 1, &sender);
  CHECK(st != REFIT_OK, "a missing config file was accepted");
  CHECK(strstr(refit_last_error(), missing) != NULL, "message does not name the file: %s",
        refit_last_error());
  CHECK(sender == (refit_sender_t*)&g_failures, "sender_p written on failure");

  refit_receiver_t* receiver = NULL;
  st = refit_receiver_new_from_toml("[receiver]\nstate_dir = 3\n", &receiver);
  CHECK(st == REFIT_ERR_INVALID, "bad TOML gave %s", refit_status_name(st));
  CHECK(strstr(refit_last_error(), "state_dir") != NULL, "message does not name the key: %s",
        refit_last_error());
  CHECK(receiver == NULL, "receiver_p written on failure");

  st = refit_sender_wait(NULL, 1.0);
  CHECK(st == REFIT_ERR_INVALID, "NULL sender gave %s", refit_status_name(st));
  int32_t woke = 0;
  st = refit_receiver_wait(NULL, 1, &woke);
  CHECK(st == REFIT_ERR_INVALID, "NULL receiver gave %s", refit_status_name(st));
  CHECK(strcmp(refit_status_name(REFIT_ERR_NOT_FOUND), "not found") == 0, "status name %s",
        refit_status_name(REFIT_ERR_NOT_FOUND));
}

/* A tensor the library cannot take is refused with its name, on the handle and the thread. */
static void test_bad_tensor(const char* config_path) {
  refit_sender_t* sender = NULL;
  MUST(refit_sender_new_from_file(config_path, 0, 1, &sender));
  model_t m;
  model_init(&m, 5);
  m.tensors[2].dtype = 99;
  refit_sync_stats_t stats;
  memset(&stats, 0, sizeof(stats));
  stats.struct_size = sizeof(stats);
  refit_status_t st = refit_sender_publish(sender, m.tensors, kTensors, &stats);
  CHECK(st == REFIT_ERR_INVALID, "dtype 99 gave %s", refit_status_name(st));
  CHECK(strstr(refit_last_error(), "embed.weight") != NULL, "message does not name the tensor: %s",
        refit_last_error());
  CHECK(strcmp(refit_sender_last_error(sender), refit_last_error()) == 0,
        "handle message differs: %s", refit_sender_last_error(sender));
  CHECK(stats.version == 0, "stats written on failure");
  m.tensors[2].dtype = REFIT_DTYPE_F16;
  stats.struct_size = 0;
  st = refit_sender_publish(sender, m.tensors, kTensors, &stats);
  CHECK(st == REFIT_ERR_INVALID && strstr(refit_last_error(), "struct_size") != NULL,
        "struct_size 0 gave %s: %s", refit_status_name(st), refit_last_error());
  uint64_t version = 7;
  MUST(refit_sender_version(sender, &version));
  CHECK(version == 0, "a refused publish published version %llu", (unsigned long long)version);
  CHECK(refit_last_error()[0] == '\0', "a call that succeeded left a message: %s",
        refit_last_error());
  model_free(&m);
  refit_sender_free(sender);
}

int main(void) {
  strcpy(g_dir, "/tmp/refit_capi_XXXXXX");
  if (mkdtemp(g_dir) == NULL) return 1;
  char config_path[128];
  snprintf(config_path, sizeof(config_path), "%s/refit.toml", g_dir);
  write_config(config_path);

  test_errors();
  test_bad_tensor(config_path);
  test_sync(config_path);

  char command[160];
  snprintf(command, sizeof(command), "rm -rf '%s'", g_dir);
  if (g_failures == 0 && system(command) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
  printf("capi_c99: %d checks, %d failed\n", g_checks, g_failures);
  if (g_failures != 0) fprintf(stderr, "%d check(s) failed; files kept in %s\n", g_failures, g_dir);
  return g_failures == 0 ? 0 : 1;
}
