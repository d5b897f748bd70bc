#include "common/prometheus.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace refit::internal {

namespace {

bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }

// The name at the front of `rest` (metric names may hold ':', label names may not), consumed.
std::string_view TakeName(std::string_view& rest, bool allow_colon) {
  size_t n = 0;
  while (n < rest.size() && IsNameChar(rest[n]) && (allow_colon || rest[n] != ':') &&
         (n > 0 || IsNameStart(rest[n]))) {
    ++n;
  }
  std::string_view name = rest.substr(0, n);
  rest.remove_prefix(n);
  return name;
}

// A quoted label value at the front of `rest` (after its opening quote), unescaped and consumed
// with its closing quote; false when it is not closed or holds an unknown escape.
bool TakeLabelValue(std::string_view& rest, std::string* value) {
  for (size_t i = 0; i < rest.size(); ++i) {
    const char c = rest[i];
    if (c == '"') {
      rest.remove_prefix(i + 1);
      return true;
    }
    if (c == '\n') return false;
    if (c != '\\') {
      value->push_back(c);
      continue;
    }
    if (++i == rest.size()) return false;
    switch (rest[i]) {
      case '\\':
        value->push_back('\\');
        break;
      case '"':
        value->push_back('"');
        break;
      case 'n':
        value->push_back('\n');
        break;
      default:
        return false;
    }
  }
  return false;
}

// `{name="value",...}` at the front of `rest`, consumed (a trailing comma is allowed).
Status TakeLabels(std::string_view& rest, MetricLabels* labels) {
  rest.remove_prefix(1);  // '{'
  while (!rest.empty() && rest.front() != '}') {
    std::string_view name = TakeName(rest, /*allow_colon=*/false);
    if (name.empty() || rest.size() < 2 || rest[0] != '=' || rest[1] != '"') {
      return Status::Corrupt("expected label=\"value\"");
    }
    rest.remove_prefix(2);
    std::string value;
    if (!TakeLabelValue(rest, &value))
      return Status::Corrupt("bad label value of " + std::string(name));
    labels->emplace_back(std::string(name), std::move(value));
    if (!rest.empty() && rest.front() == ',') rest.remove_prefix(1);
  }
  if (rest.empty()) return Status::Corrupt("labels not closed by '}'");
  rest.remove_prefix(1);
  return Status::OK();
}

Result<double> ParseValue(std::string_view text) {
  if (text == "NaN") return std::nan("");
  if (text == "+Inf") return HUGE_VAL;
  if (text == "-Inf") return -HUGE_VAL;
  double value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end) {
    return Status::Corrupt("bad value '" + std::string(text) + "'");
  }
  return value;
}

}  // namespace

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char text[64];
  auto [end, ec] = std::to_chars(text, text + sizeof(text), value);
  return ec == std::errc() ? std::string(text, end) : "NaN";
}

Result<ParsedSample> ParseSampleLine(std::string_view line) {
  ParsedSample sample;
  std::string_view rest = line;
  sample.name = std::string(TakeName(rest, /*allow_colon=*/true));
  if (sample.name.empty()) return Status::Corrupt("no metric name");
  if (!rest.empty() && rest.front() == '{') REFIT_RETURN_NOT_OK(TakeLabels(rest, &sample.labels));
  if (rest.empty() || rest.front() != ' ') return Status::Corrupt("no value after the name");
  rest.remove_prefix(1);
  // An optional timestamp follows the value; refit never writes one, and it is not needed here.
  const size_t space = rest.find(' ');
  REFIT_ASSIGN_OR_RAISE(sample.value, ParseValue(rest.substr(0, space)));
  return sample;
}

MetricSet::MetricSet(std::vector<MetricFamilySpec> families, MetricLabels constant_labels)
    : constant_labels_(std::move(constant_labels)) {
  for (MetricFamilySpec& spec : families) {
    Family& f = families_.emplace_back(Family{std::move(spec), {}});
    if (f.spec.type == MetricType::kCounter && f.spec.label.empty()) f.samples[{}] = 0;
  }
}

MetricSet::Family* MetricSet::Find(std::string_view name) {
  for (Family& f : families_) {
    if (f.spec.name == name) return &f;
  }
  return nullptr;
}

const MetricSet::Family* MetricSet::Find(std::string_view name) const {
  return const_cast<MetricSet*>(this)->Find(name);
}

void MetricSet::Add(std::string_view family, double delta, const MetricLabels& labels) {
  if (Family* f = Find(family)) f->samples[labels] += delta;
}

void MetricSet::Set(std::string_view family, double value, const MetricLabels& labels) {
  if (Family* f = Find(family)) f->samples[labels] = value;
}

double MetricSet::Get(std::string_view family, const MetricLabels& labels) const {
  const Family* f = Find(family);
  if (f == nullptr) return 0;
  auto it = f->samples.find(labels);
  return it == f->samples.end() ? 0 : it->second;
}

double MetricSet::Sum(std::string_view family) const {
  const Family* f = Find(family);
  double sum = 0;
  if (f != nullptr) {
    for (const auto& [labels, value] : f->samples) sum += value;
  }
  return sum;
}

std::string MetricSet::Text() const {
  std::string out;
  for (const Family& f : families_) {
    out += "# HELP " + f.spec.name + " " + EscapeHelp(f.spec.help) + "\n";
    out += "# TYPE " + f.spec.name + (f.spec.type == MetricType::kCounter ? " counter" : " gauge");
    out += "\n";
    for (const auto& [labels, value] : f.samples) {
      out += f.spec.name;
      std::string joined;
      for (const MetricLabels* set : {&constant_labels_, &labels}) {
        for (const auto& [name, label_value] : *set) {
          joined +=
              (joined.empty() ? "" : ",") + name + "=\"" + EscapeLabelValue(label_value) + "\"";
        }
      }
      if (!joined.empty()) out += "{" + joined + "}";
      out += " " + FormatMetricValue(value) + "\n";
    }
  }
  return out;
}

Status MetricSet::Load(std::string_view text, const std::string& origin) {
  int line_number = 0;
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
    ++line_number;
    if (line.empty() || line.front() == '#') continue;
    const std::string where = origin + ":" + std::to_string(line_number);
    Result<ParsedSample> parsed = ParseSampleLine(line);
    if (!parsed.ok()) return Status::Corrupt(where + ": " + parsed.status().message());
    Family* f = Find(parsed->name);
    if (f == nullptr) continue;
    // The constant labels come first, as Text() writes them.
    MetricLabels& labels = parsed->labels;
    if (labels.size() < constant_labels_.size() ||
        !std::equal(constant_labels_.begin(), constant_labels_.end(), labels.begin())) {
      return Status::Corrupt(where + ": a sample of other labels than this writer's");
    }
    labels.erase(labels.begin(), labels.begin() + static_cast<long>(constant_labels_.size()));
    f->samples[labels] = parsed->value;
  }
  return Status::OK();
}

}  // namespace refit::internal
