#include "layout/safetensors_shapes.h"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

namespace refit::layouts {

namespace {
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the safetensors spec's bound
}  // namespace

Result<std::map<std::string, Shape>> ReadSafetensorsShapes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(path + ": cannot open (" + std::strerror(errno) + ")");
  in.seekg(0, std::ios::end);
  const auto file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  uint8_t prefix[8] = {};
  if (file_size < 8 || !in.read(reinterpret_cast<char*>(prefix), 8)) {
    return Status::Corrupt(path + ": too short for a safetensors header");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | prefix[i];
  if (header_len > kMaxHeaderBytes || header_len > file_size - 8) {
    return Status::Corrupt(path + ": safetensors header length " + std::to_string(header_len) +
                           " exceeds the file or the 100 MiB bound");
  }
  std::string header(header_len, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header_len))) {
    return Status::IoError(path + ": cannot read the safetensors header");
  }
  nlohmann::json j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::Corrupt(path + ": safetensors header is not a JSON object");
  }
  std::map<std::string, Shape> shapes;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const nlohmann::json& entry = it.value();
    const std::string where = path + ": tensor '" + it.key() + "'";
    if (!entry.is_object() || !entry.contains("shape") || !entry["shape"].is_array()) {
      return Status::Corrupt(where + " has no shape array");
    }
    const nlohmann::json& dims = entry["shape"];
    if (dims.size() > REFIT_MAX_DIMS) return Status::Corrupt(where + " has more than 8 dims");
    Shape shape;
    for (const nlohmann::json& d : dims) {
      if (!d.is_number_unsigned()) return Status::Corrupt(where + " has a bad dimension");
      shape.push_back(d.get<uint64_t>());
    }
    shapes[it.key()] = std::move(shape);
  }
  return shapes;
}

}  // namespace refit::layouts
