#include "s3_xml.h"

#include <charconv>
#include <cstdint>

namespace refit::s3 {
namespace {

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool DecodeEntity(std::string_view entity, std::string* out) {
  if (entity == "amp")
    *out += '&';
  else if (entity == "lt")
    *out += '<';
  else if (entity == "gt")
    *out += '>';
  else if (entity == "quot")
    *out += '"';
  else if (entity == "apos")
    *out += '\'';
  else if (entity.size() >= 2 && entity[0] == '#') {
    const bool hex = entity[1] == 'x' || entity[1] == 'X';
    std::string_view digits = entity.substr(hex ? 2 : 1);
    uint32_t cp = 0;
    auto [end, ec] =
        std::from_chars(digits.data(), digits.data() + digits.size(), cp, hex ? 16 : 10);
    if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() ||
        cp > 0x10FFFF) {
      return false;
    }
    AppendUtf8(cp, out);
  } else {
    return false;
  }
  return true;
}

}  // namespace

std::optional<std::string> XmlUnescape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '&') {
      out += text[i];
      continue;
    }
    size_t semi = text.find(';', i);
    if (semi == std::string_view::npos || semi - i > 12) return std::nullopt;
    if (!DecodeEntity(text.substr(i + 1, semi - i - 1), &out)) return std::nullopt;
    i = semi;
  }
  return out;
}

std::string XmlEscape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::vector<std::string_view> XmlBlocks(std::string_view xml, std::string_view tag) {
  std::vector<std::string_view> blocks;
  const std::string open = "<" + std::string(tag);
  const std::string close = "</" + std::string(tag) + ">";
  size_t pos = 0;
  while ((pos = xml.find(open, pos)) != std::string_view::npos) {
    size_t after = pos + open.size();
    if (after >= xml.size()) break;
    // <Key> or <Key/>; <KeyCount> is another element.
    if (xml.compare(after, 2, "/>") == 0) {
      blocks.emplace_back();
      pos = after + 2;
      continue;
    }
    if (xml[after] != '>') {
      pos = after;
      continue;
    }
    size_t end = xml.find(close, after + 1);
    if (end == std::string_view::npos) break;
    blocks.push_back(xml.substr(after + 1, end - after - 1));
    pos = end + close.size();
  }
  return blocks;
}

std::vector<std::string> XmlElements(std::string_view xml, std::string_view tag) {
  std::vector<std::string> out;
  for (std::string_view raw : XmlBlocks(xml, tag)) {
    std::optional<std::string> text = XmlUnescape(raw);
    if (text) out.push_back(std::move(*text));
  }
  return out;
}

std::optional<std::string> XmlFirst(std::string_view xml, std::string_view tag) {
  std::vector<std::string_view> blocks = XmlBlocks(xml, tag);
  if (blocks.empty()) return std::nullopt;
  return XmlUnescape(blocks.front());
}

std::optional<ListPage> ParseListPage(std::string_view xml) {
  if (xml.find("<ListBucketResult") == std::string_view::npos) return std::nullopt;
  ListPage page;
  for (std::string_view contents : XmlBlocks(xml, "Contents")) {
    std::optional<std::string> key = XmlFirst(contents, "Key");
    std::optional<std::string> size_text = XmlFirst(contents, "Size");
    if (!key || !size_text) return std::nullopt;
    uint64_t size = 0;
    const char* end = size_text->data() + size_text->size();
    auto [ptr, ec] = std::from_chars(size_text->data(), end, size);
    if (size_text->empty() || ec != std::errc() || ptr != end) return std::nullopt;
    page.objects.emplace_back(std::move(*key), size);
  }
  page.truncated = XmlFirst(xml, "IsTruncated").value_or("false") == "true";
  if (page.truncated) {
    std::optional<std::string> token = XmlFirst(xml, "NextContinuationToken");
    if (!token || token->empty()) return std::nullopt;
    page.next_token = std::move(*token);
  }
  return page;
}

}  // namespace refit::s3
