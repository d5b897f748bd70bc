#include "ucx_wire.h"

#include <cstring>

namespace refit::ucx {
namespace {

void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

std::string EncodeHeader(const MsgHeader& h) {
  std::string out;
  const size_t key_len = std::min(h.key.size(), kMaxHeaderKey);
  out.reserve(kFixedHeaderBytes + key_len);
  out.push_back(static_cast<char>(h.type));
  PutU64(out, h.id);
  PutU64(out, h.a);
  PutU64(out, h.b);
  PutU64(out, h.c);
  PutU64(out, h.d);
  out.push_back(static_cast<char>(key_len & 0xFF));
  out.push_back(static_cast<char>(key_len >> 8));
  out.append(h.key, 0, key_len);
  return out;
}

Result<MsgHeader> DecodeHeader(const void* data, size_t len) {
  if (data == nullptr || len < kFixedHeaderBytes) {
    return Status::Invalid("ucx transport: message header of " + std::to_string(len) +
                           " bytes (at least " + std::to_string(kFixedHeaderBytes) + " expected)");
  }
  const auto* p = static_cast<const uint8_t*>(data);
  MsgHeader h;
  if (p[0] < static_cast<uint8_t>(MsgType::kHello) ||
      p[0] > static_cast<uint8_t>(MsgType::kReport)) {
    return Status::Invalid("ucx transport: unknown message type " + std::to_string(p[0]));
  }
  h.type = static_cast<MsgType>(p[0]);
  h.id = GetU64(p + 1);
  h.a = GetU64(p + 9);
  h.b = GetU64(p + 17);
  h.c = GetU64(p + 25);
  h.d = GetU64(p + 33);
  const size_t key_len = p[41] | (static_cast<size_t>(p[42]) << 8);
  if (key_len > kMaxHeaderKey || kFixedHeaderBytes + key_len != len) {
    return Status::Invalid("ucx transport: message header key length " + std::to_string(key_len) +
                           " disagrees with its " + std::to_string(len) + " bytes");
  }
  h.key.assign(reinterpret_cast<const char*>(p + kFixedHeaderBytes), key_len);
  return h;
}

}  // namespace refit::ucx
