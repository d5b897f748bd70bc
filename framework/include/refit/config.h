// TOML configuration with schema validation.
//
// The file is parsed once into a flat map of dotted keys ("sender.bucket_bytes") that remember
// their source line, so every error names file:line and key. toml11 is confined to config.cc.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "refit/export.h"
#include "refit/plugin_abi.h"
#include "refit/status.h"

namespace refit {

// "512MiB", "64 KiB", "1GB", "1.5GiB", "4096" -> bytes. Binary (KiB/MiB/GiB/TiB) and decimal
// (KB/MB/GB/TB) suffixes, "B" optional, case-insensitive suffix. Overflow and negatives are errors.
REFIT_API Result<uint64_t> ParseSize(std::string_view text);

struct ConfigValue {
  refit_config_type_t type = REFIT_CFG_STRING;  // SIZE is never stored: sizes are INT or STRING
  std::string string_value;
  int64_t int_value = 0;
  double double_value = 0;
  bool bool_value = false;
  std::vector<std::string> list_value;
  int line = 0;  // 1-based source line, 0 if set programmatically
};

// One accepted key of the schema. name is dotted; a '*' component matches any one name
// (e.g. "receivers.*.dir").
struct ConfigKeySpec {
  std::string name;
  refit_config_type_t type;
  std::string default_value;  // TOML text for docs; empty = no default
  std::string description;
};

class REFIT_API Config {
 public:
  static Result<Config> FromFile(const std::string& path);
  static Result<Config> FromString(std::string_view text, std::string label = "<string>");
  Config() = default;
  Config(const Config& other);
  Config& operator=(const Config& other);
  Config(Config&& other) noexcept;
  Config& operator=(Config&& other) noexcept;

  const std::string& label() const { return label_; }
  // "file.toml:12" for a key, or the file label if the key has no line.
  std::string Where(const std::string& key) const;

  bool Has(const std::string& key) const { return values_.count(key) != 0; }
  const ConfigValue* Find(const std::string& key) const;
  // Keys starting with prefix + "." (direct and nested), sorted.
  std::vector<std::string> KeysUnder(const std::string& prefix) const;
  const std::map<std::string, ConfigValue>& values() const { return values_; }

  // Programmatic overrides (CLI flags, tests, the demo).
  void Set(const std::string& key, ConfigValue value);
  void SetString(const std::string& key, std::string value);
  void SetInt(const std::string& key, int64_t value);

  // Typed getters: the default when absent, an error naming file:line:key on a wrong type.
  Result<std::string> GetString(const std::string& key, const std::string& fallback) const;
  Result<int64_t> GetInt(const std::string& key, int64_t fallback) const;
  Result<bool> GetBool(const std::string& key, bool fallback) const;
  Result<double> GetDouble(const std::string& key, double fallback) const;
  Result<uint64_t> GetSize(const std::string& key, uint64_t fallback) const;
  Result<std::vector<std::string>> GetStringList(const std::string& key,
                                                 std::vector<std::string> fallback) const;
  // Required variants: missing key is an error naming the file and key.
  Result<std::string> RequireString(const std::string& key) const;

  // Checks every key under `section` (or every key when section is empty) against specs:
  // unknown key -> "file.toml:12: unknown key 'sender.bucket_byts'"; wrong type likewise.
  // Keys outside the checked section are ignored.
  Status Validate(const std::vector<ConfigKeySpec>& specs, const std::string& section = "") const;

  // A C handle over the keys under `section` for plugin create() (the host API getters read it).
  // Valid while this Config lives.
  const refit_config_t* SectionHandle(const std::string& section) const;

 private:
  std::string label_;
  std::map<std::string, ConfigValue> values_;
  // Handles point back at this object: copies and moves start with none (see config.cc).
  mutable std::map<std::string, std::shared_ptr<refit_config_t>> handles_;
};

}  // namespace refit
