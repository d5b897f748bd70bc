// Just enough XML for S3's answers (ListObjectsV2 pages, InitiateMultipartUpload, errors): the
// inner text of elements by name, entity-decoded. S3 answers are flat, attribute-free documents,
// so a scan for <Name>...</Name> is exact for the elements read here; anything malformed yields
// "not found", which the callers report as a protocol error rather than guess.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace refit::s3 {

// The decoded text of every <tag>...</tag> in xml, in document order (a self-closing <tag/> is "").
std::vector<std::string> XmlElements(std::string_view xml, std::string_view tag);
// The first element's decoded text, or nullopt.
std::optional<std::string> XmlFirst(std::string_view xml, std::string_view tag);
// The raw (still escaped) inner text of every <tag>...</tag>: for blocks like <Contents>.
std::vector<std::string_view> XmlBlocks(std::string_view xml, std::string_view tag);
// &amp; &lt; &gt; &quot; &apos; and numeric references (&#NN; &#xNN;) decoded; nullopt on a
// malformed or unknown entity.
std::optional<std::string> XmlUnescape(std::string_view text);
// The five XML special characters escaped, for request bodies.
std::string XmlEscape(std::string_view text);

struct ListPage {
  std::vector<std::pair<std::string, uint64_t>> objects;  // full S3 keys and sizes
  bool truncated = false;
  std::string next_token;
};
// A ListObjectsV2 result page; nullopt when it is not one (no ListBucketResult, a Contents entry
// without a Key or a numeric Size, a truncated page without a continuation token).
std::optional<ListPage> ParseListPage(std::string_view xml);

}  // namespace refit::s3
