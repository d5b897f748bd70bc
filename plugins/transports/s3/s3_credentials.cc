#include "s3_credentials.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>

namespace refit::s3 {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

std::string Trim(const std::string& text) {
  const char* space = " \t\r\n";
  size_t begin = text.find_first_not_of(space);
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(space) - begin + 1);
}

// The `name = value` pairs of [profile] in an INI file; nullopt when the section is absent.
Result<std::optional<std::map<std::string, std::string>>> ReadProfile(const std::string& path,
                                                                      const std::string& profile) {
  std::ifstream in(path);
  if (!in) return std::optional<std::map<std::string, std::string>>();
  std::optional<std::map<std::string, std::string>> found;
  bool inside = false;
  std::string line;
  for (int line_no = 0; std::getline(in, line) && line_no < 100000; ++line_no) {
    std::string text = Trim(line);
    if (text.empty() || text[0] == '#' || text[0] == ';') continue;
    if (text.front() == '[' && text.back() == ']') {
      inside = Trim(text.substr(1, text.size() - 2)) == profile;
      if (inside && !found) found.emplace();
      continue;
    }
    size_t eq = text.find('=');
    if (inside && eq != std::string::npos) {
      (*found)[Trim(text.substr(0, eq))] = Trim(text.substr(eq + 1));
    }
  }
  if (in.bad()) return Status::IoError("s3 transport: cannot read credentials file '" + path + "'");
  return found;
}

Result<std::optional<Credentials>> FromSharedFile(const std::string& profile_setting) {
  std::string path = Env("AWS_SHARED_CREDENTIALS_FILE");
  if (path.empty()) {
    std::string home = Env("HOME");
    if (home.empty()) return std::optional<Credentials>();
    path = home + "/.aws/credentials";
  }
  std::string profile = profile_setting;
  if (profile.empty()) profile = Env("AWS_PROFILE");
  if (profile.empty()) profile = "default";
  REFIT_ASSIGN_OR_RAISE(auto values, ReadProfile(path, profile));
  const std::string where = "profile '" + profile + "' in '" + path + "'";
  if (!values) {
    // A profile named explicitly must exist; the implicit default may be absent.
    if (!profile_setting.empty() || !Env("AWS_PROFILE").empty()) {
      return Status::Invalid("s3 transport: no " + where);
    }
    return std::optional<Credentials>();
  }
  Credentials c;
  c.access_key_id = (*values)["aws_access_key_id"];
  c.secret_access_key = (*values)["aws_secret_access_key"];
  c.session_token = (*values)["aws_session_token"];
  c.source = where;
  if (c.access_key_id.empty() || c.secret_access_key.empty()) {
    return Status::Invalid("s3 transport: " + where +
                           " lacks aws_access_key_id or aws_secret_access_key");
  }
  return std::optional<Credentials>(std::move(c));
}

}  // namespace

Result<Credentials> ResolveCredentials(const CredentialSettings& settings) {
  if (!settings.access_key_id.empty() || !settings.secret_access_key.empty()) {
    if (settings.access_key_id.empty() || settings.secret_access_key.empty()) {
      return Status::Invalid(
          "s3 transport: config keys 'access_key_id' and 'secret_access_key' go together: set "
          "both or neither");
    }
    return Credentials{settings.access_key_id, settings.secret_access_key, settings.session_token,
                       "config"};
  }
  std::string env_id = Env("AWS_ACCESS_KEY_ID");
  std::string env_secret = Env("AWS_SECRET_ACCESS_KEY");
  if (!env_id.empty() && !env_secret.empty()) {
    return Credentials{env_id, env_secret, Env("AWS_SESSION_TOKEN"), "environment"};
  }
  REFIT_ASSIGN_OR_RAISE(std::optional<Credentials> from_file, FromSharedFile(settings.profile));
  if (from_file) return std::move(*from_file);
  return Status::Invalid(
      "s3 transport: no credentials: set access_key_id and secret_access_key in [transport.s3], "
      "or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in AWS_SHARED_CREDENTIALS_FILE "
      "or ~/.aws/credentials");
}

}  // namespace refit::s3
