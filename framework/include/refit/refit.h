// refit's public C++ API in one include: the sender and receiver pipelines, offline and in-memory
// deltas, the plugin registry, configs, tensor views and the Status/Result error style.
//
// Everything declared through this header is exported from librefit.so; nothing else is. The
// plugin SDK (refit/sdk/plugin.hpp, refit/plugin_abi.h) is a separate audience: plugins never
// link librefit.
#pragma once

#include "refit/config.h"
#include "refit/delta.h"
#include "refit/delta_counters.h"
#include "refit/dtype.h"
#include "refit/export.h"
#include "refit/log.h"
#include "refit/metrics.h"
#include "refit/offline.h"
#include "refit/receiver.h"
#include "refit/registry.h"
#include "refit/sender.h"
#include "refit/status.h"
#include "refit/tensor.h"
