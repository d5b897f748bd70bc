#include "protocol/chain_bridge.h"

#include <nlohmann/json.hpp>

namespace refit::internal {

namespace {

constexpr const char* kBridgeFormat = "refit-chain-bridge-v1";

bool IsSha256Hex(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

std::string ChainBridgeKey(const std::string& receiver) { return kChainBridgePrefix + receiver; }

std::string SerializeChainBridge(const ChainBridge& bridge) {
  nlohmann::json j = {{"format", kBridgeFormat}, {"receiver", bridge.receiver},
                      {"from", bridge.from},     {"from_sha256", bridge.from_sha256},
                      {"to", bridge.to},         {"to_sha256", bridge.to_sha256}};
  return j.dump();
}

Result<ChainBridge> ParseChainBridge(const uint8_t* data, uint64_t size, const std::string& label) {
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  auto bad = [&](const std::string& why) { return Status::Corrupt(label + ": " + why); };
  if (!j.is_object()) return bad("chain bridge is not a JSON object");
  auto format = j.find("format");
  if (format == j.end() || !format->is_string() || format->get<std::string>() != kBridgeFormat) {
    return bad("not a " + std::string(kBridgeFormat) + " object");
  }
  ChainBridge b;
  for (const char* key : {"receiver", "from_sha256", "to_sha256"}) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string()) return bad(std::string("'") + key + "' is not a string");
  }
  for (const char* key : {"from", "to"}) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_unsigned()) {
      return bad(std::string("'") + key + "' is not a version number");
    }
  }
  b.receiver = j["receiver"].get<std::string>();
  b.from_sha256 = j["from_sha256"].get<std::string>();
  b.to_sha256 = j["to_sha256"].get<std::string>();
  b.from = j["from"].get<uint64_t>();
  b.to = j["to"].get<uint64_t>();
  if (b.from >= b.to) return bad("'from' must be below 'to'");
  if (!IsSha256Hex(b.from_sha256) || !IsSha256Hex(b.to_sha256)) {
    return bad("'from_sha256' and 'to_sha256' must be 64 lowercase hex digits");
  }
  return b;
}

}  // namespace refit::internal
