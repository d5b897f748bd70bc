#include "protocol/auth.h"

#include <cstdlib>

#include "common/crypto.h"
#include "common/file_util.h"

namespace refit::internal {

namespace {

Result<std::string> CheckedKey(std::string key, const std::string& source) {
  if (!key.empty() && key.back() == '\n') key.pop_back();
  if (!key.empty() && key.back() == '\r') key.pop_back();
  if (key.size() < kMinAuthKeyBytes) {
    return Status::Invalid(source + ": the key is " + std::to_string(key.size()) +
                           " bytes; at least " + std::to_string(kMinAuthKeyBytes) +
                           " are required");
  }
  return key;
}

// Every object a signed manifest or commit names carries its SHA-256.
Status RequireSha256(const std::vector<PayloadRef>& refs, const std::string& label) {
  for (const PayloadRef& ref : refs) {
    if (ref.sha256.empty()) {
      return Status::Corrupt(label + ": signed, but names " + ref.key + " without its sha256");
    }
  }
  return Status::OK();
}

// One message for every failed check: what is wrong, never what the right MAC would be.
Status CheckMac(const std::string& key, const std::string& mac, const std::string& unsigned_text,
                const std::string& label) {
  if (mac.empty()) {
    return Status::Corrupt(label + ": refused: unsigned, and [auth] requires signed versions");
  }
  if (!ConstantTimeEqual(HmacSha256Hex(key, unsigned_text), mac)) {
    return Status::Corrupt(label + ": refused: its signature does not verify with this key");
  }
  return Status::OK();
}

}  // namespace

Result<std::optional<std::string>> LoadAuthKey(const Config& config) {
  REFIT_ASSIGN_OR_RAISE(std::string key_file, config.GetString("auth.key_file", ""));
  if (!key_file.empty()) {
    const std::string where = config.Where("auth.key_file") + ": auth.key_file " + key_file;
    auto text = ReadSmallFile(key_file, 64 << 10);
    if (!text.ok()) return Status::Invalid(where + ": " + text.status().message());
    REFIT_ASSIGN_OR_RAISE(std::string key, CheckedKey(text.value(), where));
    return std::optional<std::string>(std::move(key));
  }
  const char* env = std::getenv(kAuthKeyEnv);
  if (env == nullptr || *env == '\0') return std::optional<std::string>();
  REFIT_ASSIGN_OR_RAISE(std::string key, CheckedKey(env, kAuthKeyEnv));
  return std::optional<std::string>(std::move(key));
}

void SignManifest(const std::string& key, Manifest* manifest) {
  manifest->mac.clear();
  manifest->mac = HmacSha256Hex(key, SerializeManifest(*manifest));
}

void SignCommit(const std::string& key, Commit* commit) {
  commit->mac.clear();
  commit->mac = HmacSha256Hex(key, SerializeCommit(*commit));
}

Status VerifyManifest(const std::optional<std::string>& key, const Manifest& manifest,
                      const std::string& label) {
  if (!key) return Status::OK();
  Manifest unsigned_copy = manifest;
  unsigned_copy.mac.clear();
  REFIT_RETURN_NOT_OK(CheckMac(*key, manifest.mac, SerializeManifest(unsigned_copy), label));
  return RequireSha256(manifest.payloads, label);
}

Status VerifyCommit(const std::optional<std::string>& key, const Commit& commit,
                    const std::string& label) {
  if (!key) return Status::OK();
  Commit unsigned_copy = commit;
  unsigned_copy.mac.clear();
  REFIT_RETURN_NOT_OK(CheckMac(*key, commit.mac, SerializeCommit(unsigned_copy), label));
  return RequireSha256(commit.manifests, label);
}

}  // namespace refit::internal
