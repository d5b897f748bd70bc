// Where the s3 transport's credentials come from, in order: the config keys, the standard
// environment variables, a shared credentials file profile (docs/transports.md, "s3"). The values
// are held only to sign requests: no message, log line or error ever contains them; errors name
// where a credential was looked for, never what was found.
#pragma once

#include <string>

#include "refit/status.h"

namespace refit::s3 {

struct Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty: none
  std::string source;         // "config", "environment" or "profile 'x' in FILE": for messages
};

struct CredentialSettings {
  // From [transport.s3]; empty when not set.
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;
  std::string profile;
};

Result<Credentials> ResolveCredentials(const CredentialSettings& settings);

}  // namespace refit::s3
