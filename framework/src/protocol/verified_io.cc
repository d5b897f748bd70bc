#include "protocol/verified_io.h"

#include <algorithm>
#include <cstring>

#include "refit/kernels/buffer.h"
#include "refit/kernels/diff.h"

namespace refit::internal {

Status PutVerified(Transport& transport, const std::string& key, const uint8_t* data, uint64_t len,
                   int attempts) {
  std::string last;
  for (int i = 0; i < attempts; ++i) {
    REFIT_RETURN_NOT_OK(transport.Put(key, data, len));
    // Read back: a put may report success and store nothing, a prefix or other bytes.
    Result<std::optional<uint64_t>> size = transport.Size(key);
    if (!size.ok()) {
      last = size.status().message();
      continue;
    }
    if (!size.value().has_value()) {
      last = "the object is missing after the put";
      continue;
    }
    if (*size.value() != len) {
      last = "the object holds " + std::to_string(*size.value()) + " bytes after a put of " +
             std::to_string(len);
      continue;
    }
    // Compared in slices: a read-back costs 1 MiB of memory, not another payload.
    std::vector<uint8_t> stored(std::min<uint64_t>(len, 1 << 20));
    bool same = true;
    for (uint64_t at = 0; at < len && same; at += stored.size()) {
      const uint64_t n = std::min<uint64_t>(stored.size(), len - at);
      Status got = transport.Get(key, at, stored.data(), n);
      if (!got.ok()) {
        last = got.message();
        same = false;
      } else if (std::memcmp(stored.data(), data + at, n) != 0) {
        last = "the stored bytes differ from those put";
        same = false;
      }
    }
    if (same) return Status::OK();
  }
  return Status::IoError("put '" + key + "' could not be verified after " +
                         std::to_string(attempts) + " attempts: " + last);
}

Status GetVerified(Transport& transport, const std::string& key, uint64_t size, uint64_t xxh3,
                   std::vector<uint8_t>& out, int attempts) {
  kernels::ReserveWithHugePages(out, size);
  out.resize(size);
  Status last;
  for (int i = 0; i < attempts; ++i) {
    last = size == 0 ? Status::OK() : transport.Get(key, 0, out.data(), size);
    if (last.ok()) {
      if (kernels::Digest64(out.data(), size) == xxh3) return Status::OK();
      last = Status::Corrupt(key + ": checksum mismatch (corrupted in transit or in storage)");
    }
  }
  return last;
}

Result<std::vector<uint8_t>> GetStable(Transport& transport, const std::string& key,
                                       uint64_t max_bytes, int attempts) {
  Status last;
  for (int i = 0; i < attempts; ++i) {
    Result<std::vector<uint8_t>> a = transport.GetAll(key, max_bytes);
    if (!a.ok()) {
      if (a.status().code() == StatusCode::kNotFound) return a.status();
      last = a.status();
      continue;
    }
    Result<std::vector<uint8_t>> b = transport.GetAll(key, max_bytes);
    if (!b.ok()) {
      if (b.status().code() == StatusCode::kNotFound) return b.status();
      last = b.status();
      continue;
    }
    if (a.value() == b.value()) return std::move(a).value();
    last = Status::Corrupt(key + ": two reads returned different bytes");
  }
  return last;
}

Result<std::vector<uint64_t>> ListCommits(Transport& transport, uint64_t after) {
  REFIT_ASSIGN_OR_RAISE(auto keys, transport.List("v"));
  std::vector<uint64_t> out;
  for (const auto& entry : keys) {
    const std::string& key = entry.first;
    if (key.size() < 7 || key.compare(key.size() - 7, 7, "/COMMIT") != 0) continue;
    std::optional<uint64_t> v = VersionOfKey(key);
    if (v && *v > after) out.push_back(*v);
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

std::optional<Ack> ReadValidAck(Transport& transport, const std::string& receiver, uint64_t version,
                                const std::string& commit_sha256) {
  const std::string key = AckKey(receiver, version);
  auto bytes = GetStable(transport, key, kMaxControlBytes);
  if (!bytes.ok()) return std::nullopt;
  auto ack = ParseAck(bytes.value().data(), bytes.value().size(), key);
  if (!ack.ok() || ack->receiver != receiver || ack->version != version) return std::nullopt;
  if (!commit_sha256.empty() && !ack->commit_sha256.empty() && ack->commit_sha256 != commit_sha256)
    return std::nullopt;
  return std::move(ack).value();
}

}  // namespace refit::internal
