#include "common/transport_key.h"

#include <algorithm>

namespace refit {
namespace {

constexpr size_t kMaxKeyLength = 512;
}  // namespace

bool IsTransportKeyChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

namespace {

bool AllDigits(const std::string& s, size_t begin, size_t end) {
  if (begin >= end) return false;
  for (size_t i = begin; i < end; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
  }
  return true;
}

}  // namespace

bool IsReservedTmpName(const std::string& name) {
  size_t tag = name.rfind(".tmp.");
  if (tag == std::string::npos) return false;
  size_t digits = tag + 5;
  size_t dot = name.find('.', digits);
  return dot != std::string::npos && AllDigits(name, digits, dot) &&
         AllDigits(name, dot + 1, name.size());
}

namespace {

// Keys come from callers and from directory listings: quote them on one printable line.
std::string Printable(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// Checks the characters of text and its '/'-separated components inside [0, end): those are
// complete components (a list prefix's last, partial one lies past end).
Status ValidateComponents(const std::string& text, size_t end, const char* what) {
  auto bad = [&](const std::string& why) {
    return Status::Invalid(std::string("invalid transport ") + what + " '" + Printable(text) +
                           "': " + why);
  };
  if (text.size() > kMaxKeyLength) {
    // Quoting all of a huge key would drown the message: its start identifies it.
    return Status::Invalid(std::string("invalid transport ") + what + " '" +
                           Printable(text.substr(0, 64)) + "...': " + std::to_string(text.size()) +
                           " characters, longer than " + std::to_string(kMaxKeyLength));
  }
  if (!text.empty() && text[0] == '/') return bad("must be relative (no leading '/')");
  for (size_t start = 0; end > 0;) {
    size_t slash = std::min(text.find('/', start), end);
    std::string component = text.substr(start, slash - start);
    if (component.empty()) return bad("empty path component");
    if (component == "." || component == "..") return bad("'" + component + "' component");
    if (slash == end) break;
    start = slash + 1;
  }
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '/' && !IsTransportKeyChar(text[i])) {
      return bad("character '" + Printable(text.substr(i, 1)) + "' at offset " + std::to_string(i) +
                 " is outside [A-Za-z0-9._-]");
    }
  }
  return Status::OK();
}

}  // namespace

Status ValidateTransportKey(const std::string& key) {
  if (key.empty()) return Status::Invalid("invalid transport key '': empty");
  REFIT_RETURN_NOT_OK(ValidateComponents(key, key.size(), "key"));
  std::string last = key.substr(key.rfind('/') + 1);
  if (IsReservedTmpName(last)) {
    return Status::Invalid("invalid transport key '" + key +
                           "': names ending in .tmp.<digits>.<digits> are reserved for puts in "
                           "flight");
  }
  return Status::OK();
}

Status ValidateTransportPrefix(const std::string& prefix) {
  size_t last_slash = prefix.rfind('/');
  size_t complete_end = last_slash == std::string::npos ? 0 : last_slash;
  return ValidateComponents(prefix, complete_end, "list prefix");
}

}  // namespace refit
