// Fuzzes the TOML config: parsing never crashes and errors are one line naming the file; every
// accepted config answers all typed getters, validation and the plugin host getters consistently.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/text_util.h"
#include "config/config_internal.h"
#include "fuzz_check.h"
#include "refit/config.h"

namespace {

using refit::Config;
using refit::ConfigValue;

void CheckError(const refit::Status& st, const std::string& label) {
  FUZZ_CHECK(!st.ok(), "expected an error");
  FUZZ_CHECK(st.message().rfind(label, 0) == 0, "error does not name %s: %s", label.c_str(),
             st.message().c_str());
  FUZZ_CHECK(st.message().find('\n') == std::string::npos, "multi-line error: %s",
             st.message().c_str());
}

const std::vector<refit::ConfigKeySpec>& Specs() {
  static const std::vector<refit::ConfigKeySpec> specs = {
      {"a", REFIT_CFG_STRING, "", ""},
      {"b", REFIT_CFG_INT, "", ""},
      {"c", REFIT_CFG_BOOL, "", ""},
      {"d", REFIT_CFG_DOUBLE, "", ""},
      {"e", REFIT_CFG_SIZE, "", ""},
      {"f", REFIT_CFG_STRING_LIST, "", ""},
      {"sender.bucket_bytes", REFIT_CFG_SIZE, "", ""},
      {"sender.threads", REFIT_CFG_INT, "", ""},
      {"receivers.*.dir", REFIT_CFG_STRING, "", ""},
      {"*.*.level", REFIT_CFG_INT, "", ""},
  };
  return specs;
}

// Every getter either succeeds with the stored type or fails naming the key.
void ExerciseGetters(const Config& config, const std::string& key, const ConfigValue& value) {
  auto check = [&](const refit::Status& st, bool expect_ok) {
    FUZZ_CHECK(st.ok() == expect_ok, "getter for '%s' type %d: %s", key.c_str(),
               static_cast<int>(value.type), st.ToString().c_str());
    if (!st.ok()) {
      CheckError(st, config.label());
      FUZZ_CHECK(st.message().find(refit::internal::Printable(key)) != std::string::npos,
                 "error does not name key: %s", st.message().c_str());
    }
  };
  check(config.GetString(key, "").status(), value.type == REFIT_CFG_STRING);
  check(config.GetInt(key, 0).status(), value.type == REFIT_CFG_INT);
  check(config.GetBool(key, false).status(), value.type == REFIT_CFG_BOOL);
  check(config.GetDouble(key, 0).status(),
        value.type == REFIT_CFG_DOUBLE || value.type == REFIT_CFG_INT);
  check(config.GetStringList(key, {}).status(), value.type == REFIT_CFG_STRING_LIST);
  auto size = config.GetSize(key, 0);
  if (value.type == REFIT_CFG_STRING) {
    FUZZ_CHECK(size.ok() == refit::ParseSize(value.string_value).ok(), "size of '%s'", key.c_str());
  }
  if (!size.ok()) CheckError(size.status(), config.label());
  (void)config.Where(key);

  // The plugin host getters, through the handle of the key's first component.
  const size_t dot = key.find('.');
  const std::string section = dot == std::string::npos ? "" : key.substr(0, dot);
  const std::string rest = dot == std::string::npos ? key : key.substr(dot + 1);
  const refit_config_t* handle = config.SectionHandle(section);
  FUZZ_CHECK(handle == config.SectionHandle(section), "handle not cached");
  char buf[16];
  size_t len = 0;
  int64_t i = 0;
  int b = 0;
  double d = 0;
  uint64_t u = 0;
  using namespace refit::internal;
  FUZZ_CHECK(ConfigGetString(handle, rest.c_str(), buf, sizeof(buf), &len) ==
                 (value.type == REFIT_CFG_STRING ? 1 : -1),
             "host string getter");
  FUZZ_CHECK(ConfigGetInt(handle, rest.c_str(), &i) == (value.type == REFIT_CFG_INT ? 1 : -1),
             "host int getter");
  FUZZ_CHECK(ConfigGetBool(handle, rest.c_str(), &b) == (value.type == REFIT_CFG_BOOL ? 1 : -1),
             "host bool getter");
  FUZZ_CHECK(ConfigGetDouble(handle, rest.c_str(), &d) != 0, "host double getter");
  FUZZ_CHECK(ConfigGetSize(handle, rest.c_str(), &u) == (size.ok() ? 1 : -1), "host size getter");
  for (size_t item = 0; item < 3; ++item) {
    const int rc = ConfigGetListItem(handle, rest.c_str(), item, buf, sizeof(buf), &len);
    if (value.type != REFIT_CFG_STRING_LIST) {
      FUZZ_CHECK(rc == -1, "host list getter on a non-list");
    } else {
      FUZZ_CHECK(rc == (item < value.list_value.size() ? 1 : 0), "host list getter");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  // Sizes: any string is accepted or rejected with its text quoted, never crashes.
  auto parsed_size = refit::ParseSize(text.substr(0, 64));
  if (!parsed_size.ok()) {
    FUZZ_CHECK(parsed_size.status().message().rfind("invalid size \"", 0) == 0, "size error: %s",
               parsed_size.status().message().c_str());
  }

  auto config = Config::FromString(text, "fuzz.toml");
  if (!config.ok()) {
    CheckError(config.status(), "fuzz.toml");
  } else {
    for (const auto& [key, value] : config->values()) {
      ExerciseGetters(*config, key, value);
      const size_t dot = key.find('.');
      if (dot != std::string::npos) (void)config->KeysUnder(key.substr(0, dot));
    }
    for (const std::string& section : {"", "sender", "receivers"}) {
      refit::Status st = config->Validate(Specs(), section);
      if (!st.ok()) CheckError(st, "fuzz.toml");
    }
    // Copies and moves carry the values, and hand out their own handles.
    Config copy(*config);
    FUZZ_CHECK(copy.values().size() == config->values().size(), "copy lost values");
    FUZZ_CHECK(copy.SectionHandle("x")->config == &copy, "copy handle");
    Config moved(std::move(copy));
    Config assigned;
    assigned = moved;
    assigned = std::move(moved);
    FUZZ_CHECK(assigned.values().size() == config->values().size(), "move lost values");
  }

  // The file path agrees with the string path (tmpfs keeps it cheap).
  static const std::string path = "/dev/shm/refit_fuzz_" + std::to_string(::getpid()) + ".toml";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
  }
  auto from_file = Config::FromFile(path);
  FUZZ_CHECK(from_file.ok() == config.ok(), "FromFile and FromString disagree: %s",
             from_file.status().ToString().c_str());
  if (from_file.ok()) {
    FUZZ_CHECK(from_file->values().size() == config->values().size(), "FromFile differs");
  }
  ::unlink(path.c_str());
  return 0;
}
