#include "nccl_session.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <sstream>

namespace refit::nccl {
namespace {

constexpr uint64_t kMaxControlFile = 64 * 1024;

Status PutText(disk::DiskTransport& control, const std::string& key, const std::string& text) {
  return control.Put(key, reinterpret_cast<const uint8_t*>(text.data()), text.size());
}

Result<std::optional<std::string>> GetText(disk::DiskTransport& control, const std::string& key) {
  REFIT_ASSIGN_OR_RAISE(std::optional<uint64_t> size, control.Size(key));
  if (!size) return std::optional<std::string>();
  if (*size > kMaxControlFile) {
    return Status::Corrupt("nccl transport: control file '" + key + "' is too large");
  }
  std::string text(*size, '\0');
  Status st = control.Get(key, 0, reinterpret_cast<uint8_t*>(text.data()), text.size());
  // Replaced between size and get (a new session): the caller polls again.
  if (!st.ok() && st.code() != StatusCode::kNotFound && st.code() != StatusCode::kCorrupt) {
    return st;
  }
  if (!st.ok()) return std::optional<std::string>();
  return std::optional<std::string>(std::move(text));
}

std::map<std::string, std::string> ParseFields(const std::string& text) {
  std::map<std::string, std::string> fields;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) fields[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return fields;
}

std::string Hex(const char* data, size_t n) {
  std::string out;
  char buf[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof(buf), "%02x", static_cast<unsigned char>(data[i]));
    out += buf;
  }
  return out;
}

bool Unhex(const std::string& hex, char* out, size_t n) {
  if (hex.size() != 2 * n) return false;
  for (size_t i = 0; i < n; ++i) {
    unsigned value = 0;
    if (std::sscanf(hex.c_str() + 2 * i, "%2x", &value) != 1) return false;
    out[i] = static_cast<char>(value);
  }
  return true;
}

}  // namespace

std::string NewNonce() {
  std::random_device rd;
  const uint64_t hi = (uint64_t{rd()} << 32) | rd();
  const uint64_t lo = (uint64_t{rd()} << 32) | rd();
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

Status PublishSession(disk::DiskTransport& control, const Session& s) {
  // The old assignment must be gone before a receiver can read the new session next to it.
  REFIT_RETURN_NOT_OK(control.Remove("ranks"));
  std::string text = "nonce=" + s.nonce + "\nreceivers=" + std::to_string(s.receivers) +
                     "\nbucket_bytes=" + std::to_string(s.bucket_bytes) +
                     "\nid=" + Hex(s.id.internal, sizeof(s.id.internal)) + "\n";
  return PutText(control, "session", text);
}

Result<std::optional<Session>> ReadSession(disk::DiskTransport& control) {
  REFIT_ASSIGN_OR_RAISE(std::optional<std::string> text, GetText(control, "session"));
  if (!text) return std::optional<Session>();
  std::map<std::string, std::string> f = ParseFields(*text);
  Session s;
  s.nonce = f["nonce"];
  s.receivers = std::atoi(f["receivers"].c_str());
  s.bucket_bytes = std::strtoull(f["bucket_bytes"].c_str(), nullptr, 10);
  if (s.nonce.empty() || s.receivers < 0 || s.bucket_bytes == 0 ||
      !Unhex(f["id"], s.id.internal, sizeof(s.id.internal))) {
    return Status::Corrupt("nccl transport: the control directory's 'session' is malformed");
  }
  return std::optional<Session>(std::move(s));
}

Status Join(disk::DiskTransport& control, const std::string& peer, const std::string& nonce) {
  return PutText(control, "join/" + peer, "nonce=" + nonce + "\n");
}

Result<std::vector<std::string>> JoinedPeers(disk::DiskTransport& control,
                                             const std::string& nonce) {
  REFIT_ASSIGN_OR_RAISE(auto listed, control.List("join/"));
  std::vector<std::string> peers;
  for (const auto& [key, size] : listed) {
    REFIT_ASSIGN_OR_RAISE(std::optional<std::string> text, GetText(control, key));
    if (text && ParseFields(*text)["nonce"] == nonce) peers.push_back(key.substr(5));
  }
  std::sort(peers.begin(), peers.end());
  return peers;
}

Status PublishRanks(disk::DiskTransport& control, const std::string& nonce,
                    const std::vector<std::string>& peers) {
  std::string text = "nonce=" + nonce + "\n";
  for (size_t i = 0; i < peers.size(); ++i) text += peers[i] + "=" + std::to_string(i + 1) + "\n";
  return PutText(control, "ranks", text);
}

Result<std::optional<int>> ReadRank(disk::DiskTransport& control, const std::string& nonce,
                                    const std::string& peer) {
  REFIT_ASSIGN_OR_RAISE(std::optional<std::string> text, GetText(control, "ranks"));
  if (!text) return std::optional<int>();
  std::map<std::string, std::string> f = ParseFields(*text);
  if (f["nonce"] != nonce) return std::optional<int>();
  auto it = f.find(peer);
  if (it == f.end() || peer == "nonce") {
    return Status::NotFound("nccl transport: receiver '" + peer +
                            "' is not in the session's rank assignment");
  }
  return std::optional<int>(std::atoi(it->second.c_str()));
}

}  // namespace refit::nccl
