// Entry point of the `ucx` transport: its name, config keys and a vtable that forwards to the
// engine (ucx_transport.{h,cc}, the UCP plumbing in ucx_worker.{h,cc}), which lives in a second
// library, ucx/librefit-ucx-impl.so next to this one, linked against UCX and loaded only when a
// ucx transport is created. Every refit process loads every plugin to learn its components:
// loading libucp/libucs/libuct with this table cost each process ~7 ms even when it never used
// ucx (docs/benchmarks.md).
#include <dlfcn.h>

#include <string>

#include "refit/sdk/plugin.hpp"

namespace {
const refit_config_key_t kUcxKeys[] = {
    {"listen", REFIT_CFG_STRING, "\"\"",
     "Sender: \"host:port\" to listen on (port 0: any free port, published in rendezvous_file); "
     "unset with a rendezvous_file: 127.0.0.1, any free port"},
    {"connect", REFIT_CFG_STRING, "\"\"", "Receiver: \"host:port\" of the sender"},
    {"rendezvous_file", REFIT_CFG_STRING, "\"\"",
     "File the sender writes its bound \"host:port\" to (atomically); receivers without `connect` "
     "read it on every (re)connect"},
    {"tls", REFIT_CFG_STRING, "\"tcp\"",
     "UCX transports of this instance, as UCX_TLS (\"tcp\", \"posix,tcp\", \"sysv,tcp\", "
     "\"rc,dc\" where RDMA exists); \"\" keeps UCX's own choice"},
    {"spool_dir", REFIT_CFG_STRING, "\"\"",
     "Sender: directory holding every object (replayed to receivers that connect late); unset: "
     "<rendezvous_file>.spool, else /tmp/refit-ucx-spool-<port>"},
    {"spool_fsync", REFIT_CFG_BOOL, "true", "fsync spool writes (as the disk transport's fsync)"},
    {"max_inflight_bytes", REFIT_CFG_SIZE, "\"256MiB\"",
     "Sender: bytes pushed and not yet completed; a put waits while the window is full"},
    {"inbox_bytes", REFIT_CFG_SIZE, "\"2GiB\"",
     "Receiver: pushed bytes held in memory; the oldest objects past it are evicted (a read of "
     "one asks the sender)"},
    {"connect_timeout_ms", REFIT_CFG_INT, "5000",
     "Receiver: how long creating it waits for the sender before it goes on connecting in the "
     "background"},
    {"reconnect_max_ms", REFIT_CFG_INT, "1000", "Receiver: cap of the reconnect backoff"},
    {"send_timeout_ms", REFIT_CFG_INT, "30000",
     "A peer with sends pending and none completed for this long is dropped"},
    {"request_timeout_ms", REFIT_CFG_INT, "30000",
     "Receiver: how long a request to the sender (get, list, put of an ack) may take; a get "
     "waits this long for a sender when none is connected"},
    {"k", REFIT_CFG_INT, "0",
     "Relay fan-out (same value on sender and receivers): receivers form a k-ary tree in join "
     "order and forward each push to their children, so the sender sends k copies; 0: the "
     "sender pushes to every receiver itself"},
    {"await_receivers", REFIT_CFG_INT, "0",
     "Sender: wait (up to connect_timeout_ms) for this many receivers before the first put, so "
     "it goes down the tree instead of being replayed to each late receiver"},
    {"link_bandwidth", REFIT_CFG_SIZE, "0",
     "Benchmarks: bytes per second of each connection's pushes of puts (the sender's, and "
     "relays' forwards), as if every receiver had a link of its own; 0: unlimited"},
};

// The engine's vtable, from the library loaded on first use (kept loaded: UCX does not support
// being unloaded); null with *error set when it cannot be loaded.
const refit_transport_vtable_t* Engine(const refit_host_api_t* host, std::string* error) {
  static std::string load_error;
  static const refit_transport_vtable_t* const engine = [&]() -> const refit_transport_vtable_t* {
    Dl_info self{};
    if (::dladdr(reinterpret_cast<const void*>(&Engine), &self) == 0 || self.dli_fname == nullptr) {
      load_error = "ucx: cannot find this plugin's own path to load its engine";
      return nullptr;
    }
    std::string dir(self.dli_fname);
    dir = dir.substr(0, dir.find_last_of('/') + 1);
    const std::string path = dir + "ucx/librefit-ucx-impl.so";
    void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      load_error = "ucx: cannot load its engine " + path + ": " + ::dlerror();
      return nullptr;
    }
    using EntryFn = const refit_transport_vtable_t* (*)(const refit_host_api_t*);
    auto entry = reinterpret_cast<EntryFn>(::dlsym(lib, "refit_ucx_engine_v1"));
    if (entry == nullptr) {
      load_error = "ucx: " + path + " has no refit_ucx_engine_v1";
      return nullptr;
    }
    return entry(host);
  }();
  if (engine == nullptr) *error = load_error;
  return engine;
}

// An instance: the engine's vtable and its instance.
struct Forwarded {
  const refit_transport_vtable_t* engine;
  void* instance;
};

int Create(const refit_host_api_t* host, const refit_config_t* cfg, int32_t role,
           const char* peer_id, void** instance_p, refit_error_t* err) {
  std::string error;
  const refit_transport_vtable_t* engine = Engine(host, &error);
  if (engine == nullptr) {
    return refit::sdk::detail::Fail(err, refit::StatusCode::kUnsupported, error);
  }
  void* instance = nullptr;
  const int rc = engine->create(host, cfg, role, peer_id, &instance, err);
  if (rc != REFIT_OK) return rc;
  *instance_p = new Forwarded{engine, instance};
  return REFIT_OK;
}

void Destroy(void* instance) {
  auto* f = static_cast<Forwarded*>(instance);
  f->engine->destroy(f->instance);
  delete f;
}

int Put(void* instance, const char* key, const uint8_t* data, uint64_t len, refit_error_t* err) {
  auto* f = static_cast<Forwarded*>(instance);
  return f->engine->put(f->instance, key, data, len, err);
}

int Size(void* instance, const char* key, uint64_t* size_p, int* found_p, refit_error_t* err) {
  auto* f = static_cast<Forwarded*>(instance);
  return f->engine->size(f->instance, key, size_p, found_p, err);
}

int Get(void* instance, const char* key, uint64_t offset, uint8_t* buf, uint64_t len,
        refit_error_t* err) {
  auto* f = static_cast<Forwarded*>(instance);
  return f->engine->get(f->instance, key, offset, buf, len, err);
}

int List(void* instance, const char* prefix, refit_list_cb cb, void* ctx, refit_error_t* err) {
  auto* f = static_cast<Forwarded*>(instance);
  return f->engine->list(f->instance, prefix, cb, ctx, err);
}

int Remove(void* instance, const char* key, refit_error_t* err) {
  auto* f = static_cast<Forwarded*>(instance);
  return f->engine->remove(f->instance, key, err);
}

int Wait(void* instance, uint32_t timeout_ms, int* changed_p, refit_error_t* err) {
  auto* f = static_cast<Forwarded*>(instance);
  return f->engine->wait(f->instance, timeout_ms, changed_p, err);  // same build: it has one
}

const refit_transport_vtable_t kForwardingVtable = {sizeof(refit_transport_vtable_t),
                                                    0,
                                                    &Create,
                                                    &Destroy,
                                                    &Put,
                                                    &Size,
                                                    &Get,
                                                    &List,
                                                    &Remove,
                                                    &Wait};

}  // namespace

REFIT_PLUGIN("ucx", "0.1.0",
             refit::sdk::detail::Row(REFIT_KIND_TRANSPORT, "ucx",
                                     "Push channel over UCX active messages: the sender spools and "
                                     "pushes every object to its connected receivers",
                                     REFIT_TRANSPORT_CAP_LOCAL_SENDER_READS, kUcxKeys,
                                     sizeof(kUcxKeys) / sizeof(kUcxKeys[0]), &kForwardingVtable, 0))
