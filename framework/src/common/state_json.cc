#include "common/state_json.h"

namespace refit::internal {
namespace {

// What an operator can do about it; a fresh state_dir costs one full sync, never correctness.
constexpr char kRemedy[] =
    " (fix the value, or remove the state_dir to start over with a full sync)";

Status WrongType(const nlohmann::json& value, const std::string& path, const char* key,
                 const char* expected) {
  // The value as JSON, cut short so one line stays readable whatever the file holds.
  std::string shown =
      value.dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
  if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
  return Status::Corrupt(path + ": key '" + key + "' is " + value.type_name() + " " + shown +
                         ", expected " + expected + kRemedy);
}

}  // namespace

Result<nlohmann::json> ParseStateObject(const std::string& text, const std::string& path) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Corrupt(path + ": not valid JSON" + kRemedy);
  if (!j.is_object()) return Status::Corrupt(path + ": not a JSON object" + kRemedy);
  return j;
}

Status ReadStateField(const nlohmann::json& state, const std::string& path, const char* key,
                      uint64_t* out) {
  auto it = state.find(key);
  if (it == state.end()) return Status::OK();
  if (!it->is_number_unsigned()) return WrongType(*it, path, key, "an unsigned integer");
  *out = it->get<uint64_t>();
  return Status::OK();
}

Status ReadStateField(const nlohmann::json& state, const std::string& path, const char* key,
                      bool* out) {
  auto it = state.find(key);
  if (it == state.end()) return Status::OK();
  if (!it->is_boolean()) return WrongType(*it, path, key, "a boolean");
  *out = it->get<bool>();
  return Status::OK();
}

Status ReadStateField(const nlohmann::json& state, const std::string& path, const char* key,
                      std::string* out) {
  auto it = state.find(key);
  if (it == state.end()) return Status::OK();
  if (!it->is_string()) return WrongType(*it, path, key, "a string");
  *out = it->get<std::string>();
  return Status::OK();
}

}  // namespace refit::internal
