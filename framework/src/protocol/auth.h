// Signed versions: with a key ([auth] key_file, or REFIT_AUTH_KEY), every manifest and commit
// carries an HMAC-SHA256, and every object they name its SHA-256, so a writer of the transport
// without the key can neither forge nor alter a version (docs/reliability.md, "Trust boundary").
#pragma once

#include <optional>
#include <string>

#include "format/wire.h"
#include "refit/config.h"
#include "refit/status.h"

namespace refit::internal {

// The shortest key accepted: a shorter one is guessable.
constexpr size_t kMinAuthKeyBytes = 16;
constexpr const char* kAuthKeyEnv = "REFIT_AUTH_KEY";

// The key of [auth] key_file (the file's bytes, one trailing newline dropped), else of the
// environment variable REFIT_AUTH_KEY, else none. The key itself never appears in a message.
Result<std::optional<std::string>> LoadAuthKey(const Config& config);

void SignManifest(const std::string& key, Manifest* manifest);
void SignCommit(const std::string& key, Commit* commit);
// Without a key, anything passes (the chain still applies). With one, an unsigned or wrongly
// signed object, or one naming an object without its SHA-256, is refused with one line.
Status VerifyManifest(const std::optional<std::string>& key, const Manifest& manifest,
                      const std::string& label);
Status VerifyCommit(const std::optional<std::string>& key, const Commit& commit,
                    const std::string& label);

}  // namespace refit::internal
