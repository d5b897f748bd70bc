// TOML config: parse once with toml11 into a flat map of dotted keys, validate against schemas.
//
// The only translation unit that includes <toml.hpp> (it costs seconds to compile). toml11 throws
// on syntax errors: the exceptions are caught here and never leave this file.
#include "refit/config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <toml.hpp>
#include <utility>
#include <vector>

#include "common/text_util.h"
#include "config/config_internal.h"

namespace refit {
namespace {

using internal::Printable;
using TomlValue = toml::basic_value<toml::discard_comments, std::map, std::vector>;

// toml11's parser recurses once per nested array / inline table; bound the nesting before handing
// it untrusted text so a "[[[[[[..." config is an error, not a stack overflow.
constexpr int kMaxNesting = 64;

std::string Trim(std::string_view text) {
  const char* ws = " \t\r\n";
  const size_t first = text.find_first_not_of(ws);
  if (first == std::string_view::npos) return "";
  const size_t last = text.find_last_not_of(ws);
  return std::string(text.substr(first, last - first + 1));
}

// Scans TOML text for bracket nesting outside strings and comments. Returns the 1-based line
// where the nesting first exceeds kMaxNesting, or 0.
int FindExcessiveNesting(std::string_view text) {
  int depth = 0;
  int line = 1;
  size_t i = 0;
  auto starts = [&](std::string_view s) { return text.substr(i, s.size()) == s; };
  while (i < text.size()) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      ++i;
    } else if (c == '#') {
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (starts("\"\"\"") || starts("'''")) {
      const char quote = c;
      const bool escapes = quote == '"';
      i += 3;
      while (i < text.size()) {
        if (escapes && text[i] == '\\') {
          if (i + 1 < text.size() && text[i + 1] == '\n') ++line;
          i += 2;
          continue;
        }
        if (text[i] == '\n') ++line;
        if (text[i] == quote) {
          size_t run = 0;
          while (i + run < text.size() && text[i + run] == quote) ++run;
          i += run;
          if (run >= 3) break;  // up to two extra quotes belong to the content
          continue;
        }
        ++i;
      }
    } else if (c == '"' || c == '\'') {
      const bool escapes = c == '"';
      ++i;
      while (i < text.size() && text[i] != c && text[i] != '\n') {
        i += (escapes && text[i] == '\\') ? 2 : 1;
      }
      if (i < text.size() && text[i] == c) ++i;
    } else {
      if (c == '[' || c == '{') {
        if (++depth > kMaxNesting) return line;
      } else if ((c == ']' || c == '}') && depth > 0) {
        --depth;
      }
      ++i;
    }
  }
  return 0;
}

// toml11 messages look like
//   [error] toml::parse_key_value_pair: missing key-value separator `=`
//    --> file.toml
//      |
//    2 | a b
//      |  ^--- should be `=`
// Condensed to "missing key-value separator `=` (should be `=`)"; *line gets the line number.
std::string CondenseTomlError(const std::string& what, int* line) {
  std::istringstream lines(what);
  std::string first;
  std::getline(lines, first);
  std::string hint;
  std::string text;
  while (std::getline(lines, text)) {
    const size_t bar = text.find(" | ");
    if (bar == std::string::npos) continue;
    const std::string number = Trim(std::string_view(text).substr(0, bar));
    // With several locations (e.g. "defined twice"), the last one is where the error is.
    if (!number.empty() && number.size() < 9 &&
        std::all_of(number.begin(), number.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      *line = std::stoi(number);
    }
    const size_t caret = number.empty() ? text.find('^', bar) : std::string::npos;
    if (caret != std::string::npos) {
      const size_t after = text.find_first_not_of("^-~ ", caret);
      if (after != std::string::npos) hint = Trim(std::string_view(text).substr(after));
    }
  }
  std::string_view head = first;
  if (head.substr(0, 8) == "[error] ") head.remove_prefix(8);
  // Drop the "toml::function_name: " prefix: it names toml11 internals, not the problem.
  if (head.substr(0, 6) == "toml::") {
    const size_t colon = head.find(": ");
    if (colon != std::string_view::npos) head.remove_prefix(colon + 2);
  }
  std::string out = Trim(head);
  if (out.empty()) out = "syntax error";
  if (!hint.empty() && hint != "here" && out.find(hint) == std::string::npos) {
    out += " (" + hint + ")";
  }
  return Printable(out);
}

std::string Describe(const ConfigValue& value) {
  switch (value.type) {
    case REFIT_CFG_STRING:
      return "a string";
    case REFIT_CFG_INT:
      return "an integer";
    case REFIT_CFG_BOOL:
      return "a boolean";
    case REFIT_CFG_DOUBLE:
      return "a float";
    case REFIT_CFG_STRING_LIST:
      return "a list of strings";
    case REFIT_CFG_SIZE:
      break;
  }
  return "an unknown type";
}

const char* Expected(refit_config_type_t type) {
  switch (type) {
    case REFIT_CFG_STRING:
      return "a string";
    case REFIT_CFG_INT:
      return "an integer";
    case REFIT_CFG_BOOL:
      return "a boolean";
    case REFIT_CFG_DOUBLE:
      return "a number";
    case REFIT_CFG_SIZE:
      return "a size (bytes or \"64MiB\")";
    case REFIT_CFG_STRING_LIST:
      return "a list of strings";
  }
  return "an unknown type";
}

// A size value: a non-negative integer or a string ParseSize accepts.
Result<uint64_t> SizeOfValue(const ConfigValue& value) {
  if (value.type == REFIT_CFG_INT) {
    if (value.int_value < 0) return Status::Invalid("got " + std::to_string(value.int_value));
    return static_cast<uint64_t>(value.int_value);
  }
  if (value.type == REFIT_CFG_STRING) {
    Result<uint64_t> parsed = ParseSize(value.string_value);
    if (!parsed.ok()) return Status::Invalid("got \"" + Printable(value.string_value) + "\"");
    return parsed;
  }
  return Status::Invalid("got " + Describe(value));
}

bool HasType(const ConfigValue& value, refit_config_type_t type) {
  switch (type) {
    case REFIT_CFG_SIZE:
      return SizeOfValue(value).ok();
    case REFIT_CFG_DOUBLE:
      return value.type == REFIT_CFG_DOUBLE || value.type == REFIT_CFG_INT;
    default:
      return value.type == type;
  }
}

std::vector<std::string_view> SplitDots(std::string_view key) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return parts;
}

bool SpecMatches(std::string_view spec, std::string_view key) {
  const auto spec_parts = SplitDots(spec);
  const auto key_parts = SplitDots(key);
  if (spec_parts.size() != key_parts.size()) return false;
  for (size_t i = 0; i < spec_parts.size(); ++i) {
    if (spec_parts[i] != "*" && spec_parts[i] != key_parts[i]) return false;
  }
  return true;
}

// The spec name with each '*' replaced by the key's component at that place (for suggestions).
std::string Instantiate(std::string_view spec, std::string_view key) {
  const auto spec_parts = SplitDots(spec);
  const auto key_parts = SplitDots(key);
  std::string out;
  for (size_t i = 0; i < spec_parts.size(); ++i) {
    if (i > 0) out += '.';
    const bool wildcard = spec_parts[i] == "*" && spec_parts.size() == key_parts.size();
    out += wildcard ? key_parts[i] : spec_parts[i];
  }
  return out;
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// Spec names are matched as written and, when a section is given, also relative to it (component
// schemas name keys relative to their section).
std::vector<std::string> SpecForms(const ConfigKeySpec& spec, const std::string& section) {
  std::vector<std::string> forms = {spec.name};
  if (!section.empty()) forms.push_back(section + "." + spec.name);
  return forms;
}

// toml11 3.7 saturates out-of-range integers to INT64_MAX/MIN without an error: re-read the
// literal of a saturated value from the source line to tell a real extreme from an overflow.
bool LiteralOverflows(const TomlValue& value) {
  const int64_t v = value.as_integer();
  if (v != std::numeric_limits<int64_t>::max() && v != std::numeric_limits<int64_t>::min()) {
    return false;
  }
  const toml::source_location loc = value.location();
  const std::string& source = loc.line_str();
  if (loc.column() == 0 || loc.column() - 1 >= source.size()) return false;
  std::string literal;
  for (char c : std::string_view(source).substr(loc.column() - 1, loc.region())) {
    if (c != '_') literal += c;
  }
  std::string_view digits = literal;
  bool negative = false;
  if (!digits.empty() && (digits[0] == '+' || digits[0] == '-')) {
    negative = digits[0] == '-';
    digits.remove_prefix(1);
  }
  int base = 10;
  if (digits.size() > 2 && digits[0] == '0') {
    const char kind = digits[1];
    base = kind == 'x' ? 16 : kind == 'o' ? 8 : kind == 'b' ? 2 : 10;
    if (base != 10) digits.remove_prefix(2);
  }
  // Parse the magnitude as unsigned: INT64_MIN's magnitude does not fit int64.
  uint64_t magnitude = 0;
  const auto [end, ec] =
      std::from_chars(digits.data(), digits.data() + digits.size(), magnitude, base);
  if (ec == std::errc::result_out_of_range) return true;
  if (ec != std::errc() || end != digits.data() + digits.size()) return false;  // unknown form
  const uint64_t limit = negative ? (1ull << 63) : (1ull << 63) - 1;
  return magnitude > limit;
}

class Flattener {
 public:
  Flattener(const std::string& label, std::map<std::string, ConfigValue>* out)
      : label_(label), out_(out) {}

  Status Table(const TomlValue& table, const std::string& prefix) {
    for (const auto& [name, value] : table.as_table()) {
      const int line = static_cast<int>(value.location().line());
      const std::string key = prefix.empty() ? name : prefix + "." + name;
      if (name.empty() || name.find('.') != std::string::npos) {
        return Error(line, key, "key names must be non-empty and contain no '.'");
      }
      ConfigValue v;
      v.line = line;
      switch (value.type()) {
        case toml::value_t::table:
          REFIT_RETURN_NOT_OK(Table(value, key));
          continue;
        case toml::value_t::boolean:
          v.type = REFIT_CFG_BOOL;
          v.bool_value = value.as_boolean();
          break;
        case toml::value_t::integer:
          v.type = REFIT_CFG_INT;
          v.int_value = value.as_integer();
          if (LiteralOverflows(value)) return Error(line, key, "integer out of range");
          break;
        case toml::value_t::floating:
          v.type = REFIT_CFG_DOUBLE;
          v.double_value = value.as_floating();
          break;
        case toml::value_t::string:
          v.type = REFIT_CFG_STRING;
          v.string_value = value.as_string().str;
          break;
        case toml::value_t::array:
          v.type = REFIT_CFG_STRING_LIST;
          for (const TomlValue& item : value.as_array()) {
            if (!item.is_string()) return Error(line, key, "only arrays of strings are supported");
            v.list_value.push_back(item.as_string().str);
          }
          break;
        case toml::value_t::offset_datetime:
        case toml::value_t::local_datetime:
        case toml::value_t::local_date:
        case toml::value_t::local_time:
          return Error(line, key, "dates and times are not supported");
        default:
          return Error(line, key, "unsupported value");
      }
      (*out_)[key] = std::move(v);
    }
    return Status::OK();
  }

 private:
  Status Error(int line, const std::string& key, const std::string& what) const {
    return Status::Invalid(label_ + ":" + std::to_string(line) + ": key '" + Printable(key) +
                           "': " + what);
  }
  const std::string& label_;
  std::map<std::string, ConfigValue>* out_;
};

}  // namespace

// -------------------------------------------------------------------------------- ParseSize

Result<uint64_t> ParseSize(std::string_view text) {
  auto invalid = [&](const std::string& why) {
    return Status::Invalid("invalid size \"" + Printable(text) + "\": " + why);
  };
  const std::string trimmed = Trim(text);
  if (trimmed.empty()) return invalid("empty");
  if (trimmed[0] == '-') return invalid("negative");
  std::string_view rest = trimmed;

  auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  size_t pos = 0;
  while (pos < rest.size() && is_digit(rest[pos])) ++pos;
  std::string_view integral = rest.substr(0, pos);
  std::string_view fraction;
  if (integral.empty()) return invalid("no number");
  if (pos < rest.size() && rest[pos] == '.') {
    const size_t start = ++pos;
    while (pos < rest.size() && is_digit(rest[pos])) ++pos;
    fraction = rest.substr(start, pos - start);
    if (fraction.empty()) return invalid("no digits after '.'");
  }
  std::string unit = Trim(rest.substr(pos));
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));

  // "k"/"kb" are decimal (1000), "ki"/"kib" binary (1024); "b" alone or nothing means bytes.
  static const std::pair<std::string_view, uint64_t> kUnits[] = {
      {"", 1},
      {"b", 1},
      {"k", 1000ull},
      {"kb", 1000ull},
      {"m", 1000ull * 1000},
      {"mb", 1000ull * 1000},
      {"g", 1000ull * 1000 * 1000},
      {"gb", 1000ull * 1000 * 1000},
      {"t", 1000ull * 1000 * 1000 * 1000},
      {"tb", 1000ull * 1000 * 1000 * 1000},
      {"ki", 1ull << 10},
      {"kib", 1ull << 10},
      {"mi", 1ull << 20},
      {"mib", 1ull << 20},
      {"gi", 1ull << 30},
      {"gib", 1ull << 30},
      {"ti", 1ull << 40},
      {"tib", 1ull << 40},
  };
  uint64_t multiplier = 0;
  for (const auto& [name, factor] : kUnits) {
    if (unit == name) multiplier = factor;
  }
  if (multiplier == 0) return invalid("unknown unit '" + Printable(unit) + "'");

  // Exact integer arithmetic: bytes = integral * m + fraction * m / 10^digits, which must divide.
  while (integral.size() > 1 && integral[0] == '0') integral.remove_prefix(1);
  while (!fraction.empty() && fraction.back() == '0') fraction.remove_suffix(1);
  if (integral.size() > 20) return invalid("too large");
  if (fraction.size() > 18) return invalid("too many decimal digits");
  uint64_t whole = 0;
  for (char c : integral) {
    if (__builtin_mul_overflow(whole, 10, &whole) ||
        __builtin_add_overflow(whole, static_cast<uint64_t>(c - '0'), &whole)) {
      return invalid("too large");
    }
  }
  uint64_t frac = 0;  // < 10^18
  uint64_t scale = 1;
  for (char c : fraction) {
    frac = frac * 10 + static_cast<uint64_t>(c - '0');
    scale *= 10;
  }
  // frac / scale * multiplier is whole iff scale / gcd divides frac; the result is < multiplier.
  const uint64_t common = std::gcd(scale, multiplier);
  if (frac % (scale / common) != 0) return invalid("not a whole number of bytes");
  const uint64_t frac_bytes = frac / (scale / common) * (multiplier / common);
  uint64_t total = 0;
  if (__builtin_mul_overflow(whole, multiplier, &total) ||
      __builtin_add_overflow(total, frac_bytes, &total)) {
    return invalid("too large");
  }
  return total;
}

// -------------------------------------------------------------------------------- Config

Config::Config(const Config& other) : label_(other.label_), values_(other.values_) {}

// Handles already given out point at this object and stay valid; the other's are not copied.
Config& Config::operator=(const Config& other) {
  if (this != &other) {
    label_ = other.label_;
    values_ = other.values_;
  }
  return *this;
}

Config::Config(Config&& other) noexcept
    : label_(std::move(other.label_)), values_(std::move(other.values_)) {}

Config& Config::operator=(Config&& other) noexcept {
  if (this != &other) {
    label_ = std::move(other.label_);
    values_ = std::move(other.values_);
  }
  return *this;
}

Result<Config> Config::FromFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::NotFound(path + ": no such config file");
    return Status::IoError(path + ": cannot stat: " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return Status::Invalid(path + ": not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IoError(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::IoError(path + ": read failed");
  return FromString(text.str(), path);
}

Result<Config> Config::FromString(std::string_view text, std::string label) {
  // TOML documents are UTF-8; toml11 3.7 also misbehaves (reads out of bounds) when reporting
  // invalid UTF-8 inside strings, so it never sees any.
  if (size_t bad = 0; !internal::IsValidUtf8(text, &bad)) {
    const auto line =
        1 + std::count(text.begin(), text.begin() + static_cast<ptrdiff_t>(bad), '\n');
    char byte[8];
    std::snprintf(byte, sizeof(byte), "0x%02x", static_cast<unsigned char>(text[bad]));
    return Status::Invalid(label + ":" + std::to_string(line) + ": not valid UTF-8 (byte " + byte +
                           ")");
  }
  if (const int line = FindExcessiveNesting(text); line != 0) {
    return Status::Invalid(label + ":" + std::to_string(line) +
                           ": arrays/tables nested deeper than " + std::to_string(kMaxNesting) +
                           " levels");
  }
  Config config;
  config.label_ = std::move(label);
  try {
    std::istringstream stream{std::string(text)};
    const TomlValue root =
        toml::parse<toml::discard_comments, std::map, std::vector>(stream, config.label_);
    REFIT_RETURN_NOT_OK(Flattener(config.label_, &config.values_).Table(root, ""));
  } catch (const toml::exception& e) {
    int line = 0;
    std::string message = CondenseTomlError(e.what(), &line);
    if (line == 0) line = static_cast<int>(e.location().line());
    return Status::Invalid(config.label_ + ":" + std::to_string(line) + ": " + message);
  } catch (const std::exception& e) {
    int line = 0;
    return Status::Invalid(config.label_ + ": " + CondenseTomlError(e.what(), &line));
  }
  return config;
}

std::string Config::Where(const std::string& key) const {
  const ConfigValue* value = Find(key);
  if (value == nullptr || value->line <= 0) return label_;
  return label_ + ":" + std::to_string(value->line);
}

const ConfigValue* Config::Find(const std::string& key) const {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

std::vector<std::string> Config::KeysUnder(const std::string& prefix) const {
  std::vector<std::string> keys;
  if (prefix.empty()) {
    for (const auto& [key, value] : values_) keys.push_back(key);
    return keys;
  }
  const std::string start = prefix + ".";
  for (auto it = values_.lower_bound(start);
       it != values_.end() && it->first.compare(0, start.size(), start) == 0; ++it) {
    keys.push_back(it->first);
  }
  return keys;
}

void Config::Set(const std::string& key, ConfigValue value) { values_[key] = std::move(value); }

void Config::SetString(const std::string& key, std::string value) {
  ConfigValue v;
  v.type = REFIT_CFG_STRING;
  v.string_value = std::move(value);
  Set(key, std::move(v));
}

void Config::SetInt(const std::string& key, int64_t value) {
  ConfigValue v;
  v.type = REFIT_CFG_INT;
  v.int_value = value;
  Set(key, std::move(v));
}

namespace {
Status WrongType(const Config& config, const std::string& key, refit_config_type_t want,
                 const std::string& got) {
  return Status::Invalid(config.Where(key) + ": key '" + Printable(key) + "' must be " +
                         Expected(want) + ", " + got);
}
}  // namespace

Result<std::string> Config::GetString(const std::string& key, const std::string& fallback) const {
  const ConfigValue* v = Find(key);
  if (v == nullptr) return fallback;
  if (v->type != REFIT_CFG_STRING)
    return WrongType(*this, key, REFIT_CFG_STRING, "got " + Describe(*v));
  return v->string_value;
}

Result<int64_t> Config::GetInt(const std::string& key, int64_t fallback) const {
  const ConfigValue* v = Find(key);
  if (v == nullptr) return fallback;
  if (v->type != REFIT_CFG_INT) return WrongType(*this, key, REFIT_CFG_INT, "got " + Describe(*v));
  return v->int_value;
}

Result<bool> Config::GetBool(const std::string& key, bool fallback) const {
  const ConfigValue* v = Find(key);
  if (v == nullptr) return fallback;
  if (v->type != REFIT_CFG_BOOL)
    return WrongType(*this, key, REFIT_CFG_BOOL, "got " + Describe(*v));
  return v->bool_value;
}

Result<double> Config::GetDouble(const std::string& key, double fallback) const {
  const ConfigValue* v = Find(key);
  if (v == nullptr) return fallback;
  if (v->type == REFIT_CFG_DOUBLE) return v->double_value;
  if (v->type == REFIT_CFG_INT) return static_cast<double>(v->int_value);
  return WrongType(*this, key, REFIT_CFG_DOUBLE, "got " + Describe(*v));
}

Result<uint64_t> Config::GetSize(const std::string& key, uint64_t fallback) const {
  const ConfigValue* v = Find(key);
  if (v == nullptr) return fallback;
  Result<uint64_t> size = SizeOfValue(*v);
  if (!size.ok()) return WrongType(*this, key, REFIT_CFG_SIZE, size.status().message());
  return size;
}

Result<std::vector<std::string>> Config::GetStringList(const std::string& key,
                                                       std::vector<std::string> fallback) const {
  const ConfigValue* v = Find(key);
  if (v == nullptr) return fallback;
  if (v->type != REFIT_CFG_STRING_LIST) {
    return WrongType(*this, key, REFIT_CFG_STRING_LIST, "got " + Describe(*v));
  }
  return v->list_value;
}

Result<std::string> Config::RequireString(const std::string& key) const {
  if (Find(key) == nullptr) {
    // A config error like a bad value (the CLI's exit code 2), not a missing file or object.
    return Status::Invalid(label_ + ": missing required key '" + Printable(key) + "'");
  }
  return GetString(key, "");
}

Status Config::Validate(const std::vector<ConfigKeySpec>& specs, const std::string& section) const {
  const std::string prefix = section.empty() ? "" : section + ".";
  for (const auto& [key, value] : values_) {
    if (!section.empty()) {
      if (key == section) {
        return Status::Invalid(Where(key) + ": key '" + Printable(key) + "' must be a table");
      }
      if (key.compare(0, prefix.size(), prefix) != 0) continue;
    }
    const ConfigKeySpec* match = nullptr;
    std::string suggestion;
    size_t best_distance = 3;  // suggest only close matches (edit distance <= 2)
    for (const ConfigKeySpec& spec : specs) {
      for (const std::string& form : SpecForms(spec, section)) {
        if (SpecMatches(form, key)) {
          match = &spec;
          break;
        }
        const std::string candidate = Instantiate(form, key);
        const size_t distance = EditDistance(candidate, key);
        if (distance < best_distance) {
          best_distance = distance;
          suggestion = candidate;
        }
      }
      if (match != nullptr) break;
    }
    if (match == nullptr) {
      std::string message = Where(key) + ": unknown key '" + Printable(key) + "'";
      if (!suggestion.empty()) message += " (did you mean '" + Printable(suggestion) + "'?)";
      return Status::Invalid(message);
    }
    if (!HasType(value, match->type)) {
      std::string got = "got " + Describe(value);
      if (match->type == REFIT_CFG_SIZE) got = SizeOfValue(value).status().message();
      return WrongType(*this, key, match->type, got);
    }
  }
  return Status::OK();
}

const refit_config_t* Config::SectionHandle(const std::string& section) const {
  auto it = handles_.find(section);
  if (it == handles_.end()) {
    it = handles_.emplace(section, std::make_shared<refit_config_t>(refit_config_t{this, section}))
             .first;
  }
  return it->second.get();
}

// -------------------------------------------------------------------------------- host API

namespace internal {
namespace {

const ConfigValue* Lookup(const refit_config_t* cfg, const char* key) {
  if (cfg == nullptr || cfg->config == nullptr || key == nullptr) return nullptr;
  if (cfg->section.empty()) return cfg->config->Find(key);
  return cfg->config->Find(cfg->section + "." + key);
}

void CopyOut(const std::string& text, char* buf, size_t cap, size_t* len_p) {
  if (len_p != nullptr) *len_p = text.size();
  if (buf == nullptr || cap == 0) return;
  const size_t n = std::min(text.size(), cap - 1);
  std::memcpy(buf, text.data(), n);
  buf[n] = '\0';
}

}  // namespace

int ConfigGetString(const refit_config_t* cfg, const char* key, char* buf, size_t cap,
                    size_t* len_p) {
  const ConfigValue* v = Lookup(cfg, key);
  if (v == nullptr) return 0;
  if (v->type != REFIT_CFG_STRING) return -1;
  CopyOut(v->string_value, buf, cap, len_p);
  return 1;
}

int ConfigGetInt(const refit_config_t* cfg, const char* key, int64_t* value_p) {
  const ConfigValue* v = Lookup(cfg, key);
  if (v == nullptr) return 0;
  if (v->type != REFIT_CFG_INT) return -1;
  if (value_p != nullptr) *value_p = v->int_value;
  return 1;
}

int ConfigGetBool(const refit_config_t* cfg, const char* key, int* value_p) {
  const ConfigValue* v = Lookup(cfg, key);
  if (v == nullptr) return 0;
  if (v->type != REFIT_CFG_BOOL) return -1;
  if (value_p != nullptr) *value_p = v->bool_value ? 1 : 0;
  return 1;
}

int ConfigGetDouble(const refit_config_t* cfg, const char* key, double* value_p) {
  const ConfigValue* v = Lookup(cfg, key);
  if (v == nullptr) return 0;
  if (v->type != REFIT_CFG_DOUBLE && v->type != REFIT_CFG_INT) return -1;
  if (value_p != nullptr) {
    *value_p = v->type == REFIT_CFG_DOUBLE ? v->double_value : static_cast<double>(v->int_value);
  }
  return 1;
}

int ConfigGetSize(const refit_config_t* cfg, const char* key, uint64_t* value_p) {
  const ConfigValue* v = Lookup(cfg, key);
  if (v == nullptr) return 0;
  Result<uint64_t> size = SizeOfValue(*v);
  if (!size.ok()) return -1;
  if (value_p != nullptr) *value_p = *size;
  return 1;
}

int ConfigGetListItem(const refit_config_t* cfg, const char* key, size_t index, char* buf,
                      size_t cap, size_t* len_p) {
  const ConfigValue* v = Lookup(cfg, key);
  if (v == nullptr) return 0;
  if (v->type != REFIT_CFG_STRING_LIST) return -1;
  if (index >= v->list_value.size()) return 0;
  CopyOut(v->list_value[index], buf, cap, len_p);
  return 1;
}

}  // namespace internal
}  // namespace refit
