// Entry point of the `ucx` transport (a loadable plugin: it links UCX, the core does not); the
// engine is in ucx_transport.{h,cc}, the UCP plumbing in ucx_worker.{h,cc}.
#include "refit/sdk/plugin.hpp"
#include "ucx_transport.h"

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
}  // namespace

REFIT_PLUGIN("ucx", "0.1.0",
             refit::sdk::MakeTransport<refit::ucx::UcxTransport>(
                 "ucx",
                 "Push channel over UCX active messages: the sender spools and pushes every object "
                 "to its connected receivers",
                 &kUcxKeys))
