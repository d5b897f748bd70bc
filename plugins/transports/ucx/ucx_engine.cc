// The ucx transport's engine library (ucx/librefit-ucx-impl.so): the UcxTransport vtable, handed
// to the plugin's forwarding table (ucx_plugin.cc) when the first ucx transport is created, with
// the host API this library's SDK logs through.
#include "refit/sdk/plugin.hpp"
#include "ucx_transport.h"

extern "C" REFIT_PLUGIN_EXPORT const refit_transport_vtable_t* refit_ucx_engine_v1(
    const refit_host_api_t* host) {
  refit::sdk::detail::HostSlot() = host;
  return static_cast<const refit_transport_vtable_t*>(
      refit::sdk::MakeTransport<refit::ucx::UcxTransport>("ucx", "engine").vtable);
}
