// Entry point of the builtin `disk` transport; the engine is
// framework/src/common/disk_transport.{h,cc} (the refit_disk_transport library, which the ucx
// transport's sender spool and the nccl transport's control path reuse).
#include "common/disk_transport.h"
#include "refit/sdk/plugin.hpp"

namespace {
const refit_config_key_t kDiskKeys[] = {
    {"dir", REFIT_CFG_STRING, nullptr,
     "Shared directory holding the objects (created if missing). Every sender and receiver of a "
     "channel points at the same directory."},
    {"fsync", REFIT_CFG_BOOL, "true",
     "fsync each object and its parent directory on put, so a committed version survives a host "
     "crash. false is for tests and tmpfs."},
};
}  // namespace

REFIT_PLUGIN("disk", "0.1.0",
             refit::sdk::MakeTransport<refit::disk::DiskTransport>(
                 "disk", "Objects as files in a shared directory: tmp + fsync + rename puts",
                 &kDiskKeys))
