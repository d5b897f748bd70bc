// The s3 transport's XML reading: ListObjectsV2 pages (escaped keys, continuation tokens) and
// error answers, including the malformed ones a broken server or proxy could send.
#include "s3_xml.h"

#include <gtest/gtest.h>

namespace refit::s3 {
namespace {

TEST(S3Xml, ListPageWithEscapedKeysAndAToken) {
  const std::string xml =
      "<?xml version=\"1.0\"?><ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
      "<Name>b</Name><KeyCount>2</KeyCount><IsTruncated>true</IsTruncated>"
      "<Contents><Key>p/a&amp;b&lt;c&gt;&quot;&apos;&#65;&#x42;</Key><Size>12</Size></Contents>"
      "<Contents><Key>p/v00000001/COMMIT</Key><LastModified>x</LastModified><Size>0</Size>"
      "</Contents><NextContinuationToken>1/a+b=</NextContinuationToken></ListBucketResult>";
  std::optional<ListPage> page = ParseListPage(xml);
  ASSERT_TRUE(page.has_value());
  ASSERT_EQ(page->objects.size(), 2u);
  EXPECT_EQ(page->objects[0].first, "p/a&b<c>\"'AB");
  EXPECT_EQ(page->objects[0].second, 12u);
  EXPECT_EQ(page->objects[1].first, "p/v00000001/COMMIT");
  EXPECT_EQ(page->objects[1].second, 0u);
  EXPECT_TRUE(page->truncated);
  EXPECT_EQ(page->next_token, "1/a+b=");
}

TEST(S3Xml, LastAndEmptyPages) {
  std::optional<ListPage> page =
      ParseListPage("<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>");
  ASSERT_TRUE(page.has_value());
  EXPECT_TRUE(page->objects.empty());
  EXPECT_FALSE(page->truncated);
}

TEST(S3Xml, MalformedPagesAreRejected) {
  for (const char* xml : {
           "",
           "<Error><Code>AccessDenied</Code></Error>",
           "<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>",
           "<ListBucketResult><Contents><Key>k</Key><Size>-1</Size></Contents></ListBucketResult>",
           "<ListBucketResult><Contents><Key>k</Key><Size>1x</Size></Contents></ListBucketResult>",
           "<ListBucketResult><Contents><Key>k&bogus;</Key><Size>1</Size></Contents>"
           "</ListBucketResult>",
           "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
       }) {
    EXPECT_FALSE(ParseListPage(xml).has_value()) << xml;
  }
}

TEST(S3Xml, ElementsByExactName) {
  const std::string xml = "<R><KeyCount>3</KeyCount><Key/><Key>a</Key><Key>b &amp; c</Key></R>";
  EXPECT_EQ(XmlElements(xml, "Key"), (std::vector<std::string>{"", "a", "b & c"}));
  EXPECT_EQ(XmlFirst(xml, "KeyCount"), std::optional<std::string>("3"));
  EXPECT_EQ(XmlFirst(xml, "Missing"), std::nullopt);
  EXPECT_EQ(XmlFirst("<Code>unterminated", "Code"), std::nullopt);
}

TEST(S3Xml, EscapeRoundTrips) {
  const std::string text = "\"etag-1\" & <x> 'y'";
  EXPECT_EQ(XmlEscape(text), "&quot;etag-1&quot; &amp; &lt;x&gt; &apos;y&apos;");
  EXPECT_EQ(XmlUnescape(XmlEscape(text)), std::optional<std::string>(text));
  EXPECT_EQ(XmlUnescape("&#x10FFFF;").value().size(), 4u);
  EXPECT_EQ(XmlUnescape("&#x110000;"), std::nullopt);
  EXPECT_EQ(XmlUnescape("&amp"), std::nullopt);
}

}  // namespace
}  // namespace refit::s3
