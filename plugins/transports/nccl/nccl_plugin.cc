// Entry point of the `nccl` transport (a loadable plugin that links neither NCCL nor the CUDA
// runtime: nccl_runtime.cc loads them when the first instance is created).
#include "nccl_transport.h"
#include "refit/sdk/plugin.hpp"

namespace {
const refit_config_key_t kNcclKeys[] = {
    {"control_dir", REFIT_CFG_STRING, nullptr,
     "Shared directory for the small objects (manifests, commits, acks) and the session files "
     "through which the ranks find each other; every sender and receiver names the same one"},
    {"receivers", REFIT_CFG_INT, "1",
     "Sender: how many receivers form the communicator with it; it waits for all of them to join"},
    {"bucket_bytes", REFIT_CFG_SIZE, "\"64MiB\"",
     "Sender: size of one broadcast (and of each of the two device staging buffers on every "
     "rank); receivers use the sender's"},
    {"device", REFIT_CFG_INT, "-1", "CUDA device of this rank; -1: rank % visible devices"},
    {"inbox_bytes", REFIT_CFG_SIZE, "\"8GiB\"",
     "Receiver: host memory holding broadcast payloads until they are read; older versions are "
     "evicted first; a payload of the newest version that does not fit fails the sender's put"},
    {"connect_timeout_s", REFIT_CFG_DOUBLE, "120",
     "How long a sender waits for its receivers to join, and a receiver for its rank"},
    {"op_timeout_s", REFIT_CFG_DOUBLE, "300",
     "How long one broadcast may make no progress before the session is aborted"},
    {"fsync", REFIT_CFG_BOOL, "true",
     "fsync the control directory's objects as the disk transport does; false for tests and tmpfs"},
};
}  // namespace

REFIT_PLUGIN("nccl", "0.1.0",
             refit::sdk::MakeTransport<refit::nccl::NcclTransport>(
                 "nccl",
                 "Payloads broadcast over NCCL from the sender's GPU to the receivers', small "
                 "objects in a shared control directory",
                 &kNcclKeys))
