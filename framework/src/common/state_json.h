// The sender's and receiver's state files (JSON objects in their state_dir), parsed without
// exceptions: a file that is not a JSON object, or a key holding a value of the wrong type, is a
// Corrupt status naming the file (and the key), never an nlohmann exception escaping to abort the
// process.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "refit/status.h"

namespace refit::internal {

// The parsed object; Corrupt when `text` is not a JSON object.
Result<nlohmann::json> ParseStateObject(const std::string& text, const std::string& path);

// Reads `key` into *out when present; an absent key leaves *out as it is.
Status ReadStateField(const nlohmann::json& state, const std::string& path, const char* key,
                      uint64_t* out);
Status ReadStateField(const nlohmann::json& state, const std::string& path, const char* key,
                      bool* out);
Status ReadStateField(const nlohmann::json& state, const std::string& path, const char* key,
                      std::string* out);

}  // namespace refit::internal
