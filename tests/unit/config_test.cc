#include "refit/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "config/config_internal.h"

namespace refit {
namespace {

template <typename T>
T Unwrap(Result<T> result) {
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  return result.ok() ? std::move(result).value() : T{};
}

Config Parse(const std::string& text) {
  Result<Config> config = Config::FromString(text, "test.toml");
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return config.ok() ? std::move(config).value() : Config();
}

std::string ParseError(const std::string& text) {
  Result<Config> config = Config::FromString(text, "test.toml");
  EXPECT_FALSE(config.ok());
  if (config.ok()) return "";
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(config.status().message().find('\n'), std::string::npos) << config.status().message();
  return config.status().message();
}

constexpr char kSample[] = R"(# refit sender
name = "demo"

[sender]
bucket_bytes = "64MiB"
threads = 4
verify = true
ratio = 0.25
peers = ["a", "b", "c"]

[sender.retry]
count = 3

[receivers.r1]
dir = "/tmp/r1"
)";

TEST(ConfigTest, TypesAndDottedKeys) {
  Config config = Parse(kSample);
  EXPECT_EQ(config.label(), "test.toml");
  EXPECT_EQ(Unwrap(config.GetString("name", "")), "demo");
  EXPECT_EQ(Unwrap(config.GetInt("sender.threads", 0)), 4);
  EXPECT_TRUE(Unwrap(config.GetBool("sender.verify", false)));
  EXPECT_EQ(Unwrap(config.GetDouble("sender.ratio", 0)), 0.25);
  EXPECT_EQ(Unwrap(config.GetDouble("sender.threads", 0)), 4.0);  // ints are numbers too
  EXPECT_EQ(Unwrap(config.GetSize("sender.bucket_bytes", 0)), 64u << 20);
  EXPECT_EQ(Unwrap(config.GetSize("sender.threads", 0)), 4u);
  EXPECT_EQ(Unwrap(config.GetStringList("sender.peers", {})),
            (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(Unwrap(config.GetInt("sender.retry.count", 0)), 3);
  EXPECT_EQ(Unwrap(config.RequireString("receivers.r1.dir")), "/tmp/r1");

  // Absent keys give the fallback.
  EXPECT_EQ(Unwrap(config.GetInt("sender.nope", 17)), 17);
  EXPECT_EQ(Unwrap(config.GetString("nope", "dflt")), "dflt");
  EXPECT_FALSE(config.Has("sender"));  // tables are not values
  EXPECT_TRUE(config.Has("sender.retry.count"));

  // Source lines.
  EXPECT_EQ(config.Find("sender.bucket_bytes")->line, 5);
  EXPECT_EQ(config.Where("sender.threads"), "test.toml:6");
  EXPECT_EQ(config.Where("receivers.r1.dir"), "test.toml:15");
  EXPECT_EQ(config.Where("missing"), "test.toml");

  EXPECT_EQ(config.KeysUnder("sender"),
            (std::vector<std::string>{"sender.bucket_bytes", "sender.peers", "sender.ratio",
                                      "sender.retry.count", "sender.threads", "sender.verify"}));
  EXPECT_EQ(config.KeysUnder("receivers.r1"), (std::vector<std::string>{"receivers.r1.dir"}));
  EXPECT_TRUE(config.KeysUnder("send").empty());  // a prefix is whole components
}

TEST(ConfigTest, GetterTypeErrorsNameFileLineAndKey) {
  Config config = Parse(kSample);
  Result<int64_t> i = config.GetInt("sender.verify", 0);
  ASSERT_FALSE(i.ok());
  EXPECT_EQ(i.status().message(),
            "test.toml:7: key 'sender.verify' must be an integer, got a boolean");
  Result<uint64_t> size = config.GetSize("sender.verify", 0);
  ASSERT_FALSE(size.ok());
  EXPECT_EQ(size.status().message(),
            "test.toml:7: key 'sender.verify' must be a size (bytes or \"64MiB\"), got a boolean");
  EXPECT_FALSE(config.GetString("sender.threads", "").ok());
  EXPECT_FALSE(config.GetBool("name", false).ok());
  EXPECT_FALSE(config.GetDouble("name", 0).ok());
  EXPECT_FALSE(config.GetStringList("name", {}).ok());
  EXPECT_FALSE(config.GetSize("name", 0).ok());  // "demo" is not a size
  Result<std::string> required = config.RequireString("sender.dir");
  ASSERT_FALSE(required.ok());
  EXPECT_EQ(required.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(required.status().message().find("test.toml"), std::string::npos);
  EXPECT_NE(required.status().message().find("'sender.dir'"), std::string::npos);
}

TEST(ConfigTest, UnsupportedValuesAreErrors) {
  EXPECT_EQ(ParseError("[a]\nx = [1, 2]\n"),
            "test.toml:2: key 'a.x': only arrays of strings are supported");
  EXPECT_EQ(ParseError("x = [\"a\", 1]\n"),
            "test.toml:1: key 'x': only arrays of strings are supported");
  EXPECT_EQ(ParseError("[[servers]]\nname = \"a\"\n").find("test.toml:"), 0u);
  EXPECT_NE(ParseError("[[servers]]\nname = \"a\"\n").find("only arrays of strings"),
            std::string::npos);
  EXPECT_EQ(ParseError("\n\nwhen = 1979-05-27T07:32:00Z\n"),
            "test.toml:3: key 'when': dates and times are not supported");
  EXPECT_NE(ParseError("\"a.b\" = 1\n").find("'a.b'"), std::string::npos);
  // An empty array is an empty list.
  EXPECT_TRUE(Parse("x = []\n").GetStringList("x", {"dflt"})->empty());
}

TEST(ConfigTest, SyntaxErrorsAreOneLineWithTheLine) {
  std::string message = ParseError("a = 1\nb = 2\nc d\n");
  EXPECT_EQ(message, "test.toml:3: missing key-value separator `=` (should be `=`)");
  message = ParseError("a = 1\n[t]\nx = \"unterminated\n");
  EXPECT_EQ(message.rfind("test.toml:3: ", 0), 0u) << message;
  message = ParseError("a = 1\na = 2\n");
  EXPECT_EQ(message.rfind("test.toml:", 0), 0u) << message;
  EXPECT_EQ(ParseError("a = 1\na = 2\n").rfind("test.toml:2: ", 0), 0u);
  // toml11 saturates integer overflow silently; refit does not.
  EXPECT_EQ(ParseError("x = 99999999999999999999999\n"),
            "test.toml:1: key 'x': integer out of range");
  EXPECT_EQ(ParseError("x = -9_223_372_036_854_775_809\n"),
            "test.toml:1: key 'x': integer out of range");
  EXPECT_EQ(ParseError("x = 0x1_0000_0000_0000_0000\n"),
            "test.toml:1: key 'x': integer out of range");
  Config extremes =
      Parse("a = 9223372036854775807\nb = -9223372036854775808\nc = 0x7FFFFFFFFFFFFFFF\n");
  EXPECT_EQ(Unwrap(extremes.GetInt("a", 0)), INT64_MAX);
  EXPECT_EQ(Unwrap(extremes.GetInt("b", 0)), INT64_MIN);
  EXPECT_EQ(Unwrap(extremes.GetInt("c", 0)), INT64_MAX);
  // Invalid UTF-8 is refused up front (toml11 3.7 reads out of bounds reporting it).
  EXPECT_EQ(ParseError("a = 1\nb = '\xb4'\n"), "test.toml:2: not valid UTF-8 (byte 0xb4)");
  EXPECT_EQ(ParseError("a = \"\xed\xa0\x80\"\n"), "test.toml:1: not valid UTF-8 (byte 0xed)");
  // Deep nesting is refused before toml11's recursive parser sees it.
  message = ParseError("\nx = " + std::string(100000, '[') + "\n");
  EXPECT_EQ(message.rfind("test.toml:2: ", 0), 0u) << message;
  // ... but brackets inside strings and comments do not count.
  Config ok = Parse("x = \"" + std::string(200, '[') + "\" # " + std::string(200, '{') +
                    "\ny = '''\n" + std::string(200, '[') + "'''\n");
  EXPECT_EQ(ok.GetString("x", "")->size(), 200u);
}

TEST(ConfigTest, FromFile) {
  const std::string path =
      ::testing::TempDir() + "refit_config_test_" + std::to_string(::getpid()) + ".toml";
  {
    std::ofstream out(path);
    out << "[sender]\nbucket_bytes = 12\n";
  }
  Result<Config> config = Config::FromFile(path);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->label(), path);
  EXPECT_EQ(config->Where("sender.bucket_bytes"), path + ":2");
  std::remove(path.c_str());

  Result<Config> missing = Config::FromFile(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(path), std::string::npos);
}

const std::vector<ConfigKeySpec> kSpecs = {
    {"sender.bucket_bytes", REFIT_CFG_SIZE, "\"64MiB\"", "bucket size"},
    {"sender.threads", REFIT_CFG_INT, "1", ""},
    {"sender.verify", REFIT_CFG_BOOL, "true", ""},
    {"sender.ratio", REFIT_CFG_DOUBLE, "", ""},
    {"sender.peers", REFIT_CFG_STRING_LIST, "", ""},
    {"sender.retry.count", REFIT_CFG_INT, "", ""},
    {"receivers.*.dir", REFIT_CFG_STRING, "", ""},
    {"name", REFIT_CFG_STRING, "", ""},
};

TEST(ConfigTest, ValidateAcceptsTheSchema) {
  Config config = Parse(kSample);
  EXPECT_TRUE(config.Validate(kSpecs).ok()) << config.Validate(kSpecs).ToString();
  EXPECT_TRUE(config.Validate(kSpecs, "sender").ok());
  // Keys outside the checked section are ignored.
  EXPECT_TRUE(config.Validate({{"dir", REFIT_CFG_STRING, "", ""}}, "receivers.r1").ok());
  // Spec names relative to the section work too (component schemas).
  EXPECT_TRUE(config.Validate({{"count", REFIT_CFG_INT, "", ""}}, "sender.retry").ok());
  // DOUBLE accepts an integer; SIZE accepts an integer or a size string.
  Config numbers = Parse("[sender]\nratio = 2\nbucket_bytes = 1024\n");
  EXPECT_TRUE(numbers.Validate(kSpecs).ok());
}

TEST(ConfigTest, ValidateUnknownKeyWithSuggestion) {
  Config config = Parse("name = \"x\"\n\n[sender]\nthreads = 2\nbucket_byts = \"1MiB\"\n");
  Status st = config.Validate(kSpecs, "sender");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "test.toml:5: unknown key 'sender.bucket_byts' (did you mean 'sender.bucket_bytes'?)");

  // Relative specs suggest the full key; a '*' takes the key's own component.
  Config relative = Parse("[encodings.indices]\nlevle = 3\n");
  st = relative.Validate({{"level", REFIT_CFG_INT, "", ""}}, "encodings.indices");
  EXPECT_EQ(st.message(),
            "test.toml:2: unknown key 'encodings.indices.levle' (did you mean "
            "'encodings.indices.level'?)");
  Config wildcard = Parse("[receivers.r7]\ndri = \"/x\"\n");
  st = wildcard.Validate(kSpecs);
  EXPECT_EQ(st.message(),
            "test.toml:2: unknown key 'receivers.r7.dri' (did you mean 'receivers.r7.dir'?)");

  // No close match: no suggestion.
  Config far = Parse("[sender]\ncompletely_different = 1\n");
  st = far.Validate(kSpecs, "sender");
  EXPECT_EQ(st.message(), "test.toml:2: unknown key 'sender.completely_different'");

  // A '*' matches exactly one component.
  Config deep = Parse("[receivers.a.b]\ndir = \"/x\"\n");
  EXPECT_FALSE(deep.Validate(kSpecs).ok());
}

TEST(ConfigTest, ValidateWrongType) {
  Config config = Parse("[sender]\n\n\n\n\n\n\n\n\n\n\nbucket_bytes = true\n");
  Status st = config.Validate(kSpecs, "sender");
  EXPECT_EQ(st.message(),
            "test.toml:12: key 'sender.bucket_bytes' must be a size (bytes or \"64MiB\"), got a "
            "boolean");
  st = Parse("[sender]\nbucket_bytes = \"12 parsecs\"\n").Validate(kSpecs);
  EXPECT_EQ(st.message(),
            "test.toml:2: key 'sender.bucket_bytes' must be a size (bytes or \"64MiB\"), got "
            "\"12 parsecs\"");
  st = Parse("[sender]\nbucket_bytes = -4\n").Validate(kSpecs);
  EXPECT_NE(st.message().find("got -4"), std::string::npos) << st.message();
  st = Parse("[sender]\nthreads = 1.5\n").Validate(kSpecs);
  EXPECT_EQ(st.message(), "test.toml:2: key 'sender.threads' must be an integer, got a float");
  st = Parse("[sender]\nverify = \"yes\"\n").Validate(kSpecs);
  EXPECT_EQ(st.message(), "test.toml:2: key 'sender.verify' must be a boolean, got a string");
  st = Parse("[sender]\npeers = \"a\"\n").Validate(kSpecs);
  EXPECT_EQ(st.message(),
            "test.toml:2: key 'sender.peers' must be a list of strings, got a string");
  st = Parse("sender = 3\n").Validate(kSpecs, "sender");
  EXPECT_NE(st.message().find("must be a table"), std::string::npos) << st.message();
}

TEST(ConfigTest, ParseSize) {
  struct Case {
    const char* text;
    uint64_t bytes;
  };
  const Case good[] = {
      {"512MiB", 536870912ull},
      {"1GB", 1000000000ull},
      {"1.5KiB", 1536},
      {"4096", 4096},
      {"64 KiB", 65536},
      {"1.5GiB", 1610612736ull},
      {"2mib", 2097152},
      {"0", 0},
      {"10B", 10},
      {"1k", 1000},
      {"1Ki", 1024},
      {"  7  ", 7},
      {"2.50MB", 2500000},
      {"1TiB", 1ull << 40},
      {"16", 16},
      {"3.0", 3},
      {"18446744073709551615", 18446744073709551615ull},
      {"000000000000000000000000001KB", 1000},
  };
  for (const Case& c : good) {
    Result<uint64_t> parsed = ParseSize(c.text);
    ASSERT_TRUE(parsed.ok()) << c.text << ": " << parsed.status().ToString();
    EXPECT_EQ(*parsed, c.bytes) << c.text;
  }
  const char* bad[] = {"",
                       "   ",
                       "-1",
                       "-1KiB",
                       "abc",
                       "12XB",
                       "1.5",
                       "0.3KiB",
                       "1.",
                       ".5KiB",
                       "KiB",
                       "1 2",
                       "18446744073709551616",
                       "16384PiB",
                       "17179869184GiB",
                       "1e6",
                       "0x10",
                       "+5",
                       "1.0000000000000000001KiB"};
  for (const char* text : bad) {
    Result<uint64_t> parsed = ParseSize(text);
    ASSERT_FALSE(parsed.ok()) << text << " parsed as " << parsed.ValueOr(0);
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(std::string("\"") + text + "\""), std::string::npos)
        << parsed.status().message();
  }
}

TEST(ConfigTest, SectionHandleAndInternalGetters) {
  Config config = Parse(kSample + std::string("\n[enc]\nlong = \"") + std::string(300, 'x') +
                        "\"\nsize_str = \"2KiB\"\nneg = -3\n");
  const refit_config_t* sender = config.SectionHandle("sender");
  EXPECT_EQ(config.SectionHandle("sender"), sender);  // cached
  ASSERT_NE(sender, nullptr);
  EXPECT_EQ(sender->config, &config);
  EXPECT_EQ(sender->section, "sender");

  using namespace internal;
  int64_t i = 0;
  EXPECT_EQ(ConfigGetInt(sender, "threads", &i), 1);
  EXPECT_EQ(i, 4);
  EXPECT_EQ(ConfigGetInt(sender, "retry.count", &i), 1);
  EXPECT_EQ(i, 3);
  EXPECT_EQ(ConfigGetInt(sender, "absent", &i), 0);
  EXPECT_EQ(ConfigGetInt(sender, "verify", &i), -1);
  EXPECT_EQ(ConfigGetInt(nullptr, "threads", &i), 0);

  int b = 0;
  EXPECT_EQ(ConfigGetBool(sender, "verify", &b), 1);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(ConfigGetBool(sender, "threads", &b), -1);

  double d = 0;
  EXPECT_EQ(ConfigGetDouble(sender, "ratio", &d), 1);
  EXPECT_EQ(d, 0.25);
  EXPECT_EQ(ConfigGetDouble(sender, "threads", &d), 1);
  EXPECT_EQ(d, 4.0);
  EXPECT_EQ(ConfigGetDouble(sender, "peers", &d), -1);

  uint64_t size = 0;
  EXPECT_EQ(ConfigGetSize(sender, "bucket_bytes", &size), 1);
  EXPECT_EQ(size, 64u << 20);
  EXPECT_EQ(ConfigGetSize(sender, "threads", &size), 1);
  EXPECT_EQ(size, 4u);
  const refit_config_t* enc = config.SectionHandle("enc");
  EXPECT_EQ(ConfigGetSize(enc, "size_str", &size), 1);
  EXPECT_EQ(size, 2048u);
  EXPECT_EQ(ConfigGetSize(enc, "neg", &size), -1);
  EXPECT_EQ(ConfigGetSize(enc, "long", &size), -1);

  char buf[8];
  size_t len = 0;
  EXPECT_EQ(ConfigGetString(enc, "long", buf, sizeof(buf), &len), 1);
  EXPECT_EQ(len, 300u);
  EXPECT_STREQ(buf, "xxxxxxx");  // truncated at cap-1 and terminated
  EXPECT_EQ(ConfigGetString(enc, "neg", buf, sizeof(buf), &len), -1);
  EXPECT_EQ(ConfigGetString(enc, "absent", buf, sizeof(buf), &len), 0);

  EXPECT_EQ(ConfigGetListItem(sender, "peers", 1, buf, sizeof(buf), &len), 1);
  EXPECT_STREQ(buf, "b");
  EXPECT_EQ(len, 1u);
  EXPECT_EQ(ConfigGetListItem(sender, "peers", 3, buf, sizeof(buf), &len), 0);
  EXPECT_EQ(ConfigGetListItem(sender, "threads", 0, buf, sizeof(buf), &len), -1);

  // The root section sees top-level keys.
  const refit_config_t* root = config.SectionHandle("");
  EXPECT_EQ(ConfigGetString(root, "name", buf, sizeof(buf), &len), 1);
  EXPECT_STREQ(buf, "demo");

  // Handles read live values.
  config.SetInt("sender.threads", 9);
  EXPECT_EQ(ConfigGetInt(sender, "threads", &i), 1);
  EXPECT_EQ(i, 9);
}

TEST(ConfigTest, CopiesGetTheirOwnHandles) {
  Config original = Parse(kSample);
  const refit_config_t* handle = original.SectionHandle("sender");

  Config copy(original);
  EXPECT_EQ(Unwrap(copy.GetInt("sender.threads", 0)), 4);
  EXPECT_EQ(copy.label(), "test.toml");
  const refit_config_t* copy_handle = copy.SectionHandle("sender");
  EXPECT_NE(copy_handle, handle);
  EXPECT_EQ(copy_handle->config, &copy);

  copy.SetInt("sender.threads", 8);  // a deep copy: the original is unchanged
  int64_t i = 0;
  EXPECT_EQ(internal::ConfigGetInt(handle, "threads", &i), 1);
  EXPECT_EQ(i, 4);
  EXPECT_EQ(internal::ConfigGetInt(copy_handle, "threads", &i), 1);
  EXPECT_EQ(i, 8);

  Config assigned;
  assigned = original;
  EXPECT_EQ(assigned.SectionHandle("sender")->config, &assigned);
  EXPECT_EQ(Unwrap(assigned.GetInt("sender.threads", 0)), 4);

  Config moved(std::move(copy));
  EXPECT_EQ(Unwrap(moved.GetInt("sender.threads", 0)), 8);
  EXPECT_EQ(moved.SectionHandle("sender")->config, &moved);
  Config move_assigned;
  move_assigned = std::move(moved);
  EXPECT_EQ(move_assigned.SectionHandle("sender")->config, &move_assigned);
  EXPECT_EQ(move_assigned.label(), "test.toml");

  ConfigValue v;
  v.type = REFIT_CFG_BOOL;
  v.bool_value = true;
  move_assigned.Set("x.flag", v);
  EXPECT_TRUE(Unwrap(move_assigned.GetBool("x.flag", false)));
  EXPECT_EQ(move_assigned.Where("x.flag"), "test.toml");  // set programmatically: no line
  move_assigned.SetString("x.s", "v");
  EXPECT_EQ(Unwrap(move_assigned.GetString("x.s", "")), "v");
}

}  // namespace
}  // namespace refit
