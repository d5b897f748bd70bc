// Internals of refit::Config shared with the host API table (registry). Never installed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "refit/config.h"
#include "refit/export.h"
#include "refit/plugin_abi.h"

// The opaque refit_config_t of the plugin ABI: one section of a Config, owned by that Config
// (see Config::SectionHandle). Plugins only ever see a pointer to it.
struct refit_config {
  const refit::Config* config;
  std::string section;
};

namespace refit::internal {

// The host API's config getters (refit_host_api_t::config_get_*), same signatures. They look up
// section + "." + key and return 1 when found (value written), 0 when absent (or cfg/key is
// null), -1 when the key holds another type. Strings are copied truncated at cap-1 and
// NUL-terminated; *len_p receives the full length. Sizes accept a non-negative integer or a
// string ParseSize accepts; doubles accept integers too. Exported only so unit tests can call
// them directly; plugins reach them through refit_host_api_t.
int ConfigGetString(const refit_config_t* cfg, const char* key, char* buf, size_t cap,
                    size_t* len_p);
int ConfigGetInt(const refit_config_t* cfg, const char* key, int64_t* value_p);
int ConfigGetBool(const refit_config_t* cfg, const char* key, int* value_p);
int ConfigGetDouble(const refit_config_t* cfg, const char* key, double* value_p);
int ConfigGetSize(const refit_config_t* cfg, const char* key, uint64_t* value_p);
// Element `index` of a string list; 0 past the end.
int ConfigGetListItem(const refit_config_t* cfg, const char* key, size_t index, char* buf,
                      size_t cap, size_t* len_p);

}  // namespace refit::internal
