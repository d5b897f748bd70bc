// The plugin loader and registry, through the real dlopen path with real .so fixtures
// (tests/loader/fixtures, built by tests/loader/CMakeLists.txt into REFIT_LOADER_FIXTURE_DIR).
#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "refit/config.h"
#include "refit/log.h"
#include "refit/registry.h"
#include "refit/sdk/plugin.hpp"

namespace refit {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

#define ASSERT_OK(expr)                     \
  do {                                      \
    const ::refit::Status _st = (expr);     \
    ASSERT_TRUE(_st.ok()) << _st.message(); \
  } while (0)

std::string Fixture(const std::string& name) {
  return std::string(REFIT_LOADER_FIXTURE_DIR) + "/lib" + name + ".so";
}

// Whether the dynamic linker still has the library mapped (RTLD_NOLOAD never loads it).
bool IsLoaded(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return false;
  dlclose(handle);  // NOLOAD still took a reference
  return true;
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "refit-loader-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  // A symlink at dir/name pointing at target (directories created as needed).
  std::string Link(const std::string& name, const std::string& target) const {
    fs::path link = path_ / name;
    fs::create_directories(link.parent_path());
    fs::create_symlink(target, link);
    return link.string();
  }
  std::string Write(const std::string& name, const std::string& text) const {
    fs::path file = path_ / name;
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text;
    return file.string();
  }

 private:
  fs::path path_;
};

// Encodes 4 bf16 elements with a full-sync copy encoding and decodes them onto other bits.
void ExpectCopyRoundTrip(const Encoding& encoding) {
  const std::vector<uint16_t> new_bits = {0x0001, 0x7fc1, 0xffff, 0x8000};  // NaN payload, -0
  std::vector<uint16_t> target_bits = {0x1111, 0x2222, 0x3333, 0x4444};
  refit_encode_input_t in{};
  in.struct_size = sizeof(in);
  in.dtype = REFIT_DTYPE_BF16;
  in.elem_size = 2;
  in.n_elems = new_bits.size();
  in.new_bits = new_bits.data();
  in.n_changed = new_bits.size();
  Result<uint64_t> bound = encoding.MaxEncodedSize(in);
  ASSERT_TRUE(bound.ok()) << bound.status().message();
  const uint64_t cap = *bound;
  ASSERT_EQ(cap, 8u);
  std::vector<uint8_t> payload(cap);
  Result<uint64_t> size = encoding.Encode(in, payload.data(), payload.size());
  ASSERT_TRUE(size.ok()) << size.status().message();
  refit_decode_target_t target{};
  target.struct_size = sizeof(target);
  target.dtype = REFIT_DTYPE_BF16;
  target.elem_size = 2;
  target.n_elems = target_bits.size();
  target.bits = target_bits.data();
  ASSERT_OK(encoding.Decode(payload.data(), *size, target));
  EXPECT_EQ(std::memcmp(target_bits.data(), new_bits.data(), 8), 0);
  Status short_payload = encoding.Decode(payload.data(), 3, target);
  EXPECT_EQ(short_payload.code(), StatusCode::kCorrupt);
  EXPECT_THAT(short_payload.message(), StartsWith("encoding '" + encoding.name() + "': decode: "));
}

// ------------------------------------------------------------------ loading good plugins

TEST(Loader, LoadsAnSdkPluginAndRunsIt) {
  const std::string path = Fixture("fixture_good");
  Registry registry;
  ASSERT_OK(registry.LoadLibrary(path));
  const ComponentInfo* info = registry.Find(REFIT_KIND_ENCODING, "fixture_copy");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->origin, path);
  EXPECT_EQ(info->plugin_name, "fixture-good");
  EXPECT_EQ(info->plugin_version, "1.2.3");
  EXPECT_EQ(info->description, "copies every element");
  EXPECT_EQ(info->capabilities, REFIT_ENC_CAP_FULL_SYNC);
  ASSERT_EQ(info->config_keys.size(), 1u);
  EXPECT_EQ(info->config_keys[0].name, "fail_create");
  EXPECT_EQ(info->config_keys[0].type, REFIT_CFG_BOOL);
  EXPECT_EQ(info->config_keys[0].default_value, "false");

  Result<std::unique_ptr<Encoding>> encoding = registry.CreateEncoding("fixture_copy");
  ASSERT_TRUE(encoding.ok()) << encoding.status().message();
  EXPECT_EQ((*encoding)->op(), REFIT_OP_OVERWRITE);
  ExpectCopyRoundTrip(**encoding);
}

TEST(Loader, LoadsAPlainCPlugin) {
  Registry registry;
  ASSERT_OK(registry.LoadLibrary(Fixture("fixture_c_good")));
  Result<std::unique_ptr<Encoding>> encoding = registry.CreateEncoding("c_copy");
  ASSERT_TRUE(encoding.ok()) << encoding.status().message();
  ExpectCopyRoundTrip(**encoding);
}

// Plugins built for ABI 1.0, 1.1 and 1.2 (older component and plugin tables, max_encoded_size
// returning the bound) load and run next to 1.3 ones.
TEST(Loader, LoadsPluginsOfEveryOlderMinor) {
  for (const char* name : {"fixture_c_minor0", "fixture_c_minor1", "fixture_c_minor2"}) {
    SCOPED_TRACE(name);
    Registry registry;
    ASSERT_OK(registry.LoadLibrary(Fixture(name)));
    const ComponentInfo* info = registry.Find(REFIT_KIND_ENCODING, "c_copy");
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->apply_cost, 0u);  // not in tables before 1.3
    ASSERT_EQ(info->config_keys.size(), 2u);
    EXPECT_EQ(info->config_keys[0].name, "level");
    EXPECT_EQ(info->config_keys[1].name, "label");
    Result<std::unique_ptr<Encoding>> encoding = registry.CreateEncoding("c_copy");
    ASSERT_TRUE(encoding.ok()) << encoding.status().message();
    ExpectCopyRoundTrip(**encoding);
  }
}

// A 1.3 table: config keys read with the row size the plugin declares, its apply cost kept.
TEST(Loader, ReadsTheFieldsOfMinor3) {
  Registry registry;
  ASSERT_OK(registry.LoadLibrary(Fixture("fixture_c_good")));
  const ComponentInfo* info = registry.Find(REFIT_KIND_ENCODING, "c_copy");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->apply_cost, 5u);
  ASSERT_EQ(info->config_keys.size(), 2u);
  EXPECT_EQ(info->config_keys[0].name, "level");
  EXPECT_EQ(info->config_keys[1].name, "label");
  EXPECT_EQ(info->config_keys[1].type, REFIT_CFG_STRING);
}

// The plugin's fini runs once, when the last object made from the library is gone.
TEST(Loader, FiniRunsAfterTheLastObjectIsGone) {
  std::vector<std::string> lines;
  SetLogSink([&](LogLevel, std::string_view component, std::string_view message) {
    if (component == "c-fixture") lines.emplace_back(message);
  });
  {
    auto registry = std::make_unique<Registry>();
    ASSERT_OK(registry->LoadLibrary(Fixture("fixture_c_good")));
    Result<std::unique_ptr<Encoding>> encoding = registry->CreateEncoding("c_copy");
    ASSERT_TRUE(encoding.ok()) << encoding.status().message();
    registry.reset();
    EXPECT_TRUE(lines.empty());  // the encoding still holds the library
  }
  EXPECT_EQ(lines, std::vector<std::string>{"fini"});
  // Tables of older minors have no fini: nothing to call.
  lines.clear();
  {
    Registry registry;
    ASSERT_OK(registry.LoadLibrary(Fixture("fixture_c_minor2")));
  }
  EXPECT_TRUE(lines.empty());
  SetLogSink(nullptr);
}

TEST(Loader, LoadingTheSameFileTwiceIsANoOp) {
  TempDir dir;
  const std::string path = Fixture("fixture_good");
  const std::string link = dir.Link("alias.so", path);
  Registry registry;
  ASSERT_OK(registry.LoadLibrary(path));
  ASSERT_OK(registry.LoadLibrary(path));
  ASSERT_OK(registry.LoadLibrary(link));  // same file under another name
  ASSERT_EQ(registry.List().size(), 1u);
  EXPECT_EQ(registry.List()[0]->origin, path);
}

// ------------------------------------------------------------------ precise load errors

// Loads a fixture that must be refused: checks code and exact message, that nothing was
// registered and that the library was unloaded again.
void ExpectRefused(const std::string& path, StatusCode code, const std::string& message) {
  Registry registry;
  Status st = registry.LoadLibrary(path);
  EXPECT_EQ(st.code(), code) << st.message();
  EXPECT_EQ(st.message(), message);
  EXPECT_TRUE(registry.List().empty());
  EXPECT_FALSE(IsLoaded(path));
}

TEST(LoaderErrors, MissingFile) {
  const std::string path = std::string(REFIT_LOADER_FIXTURE_DIR) + "/libnope.so";
  ExpectRefused(path, StatusCode::kNotFound, "plugin " + path + ": no such file");
}

TEST(LoaderErrors, RelativePathIsMadeAbsolute) {
  Registry registry;
  Status st = registry.LoadLibrary("libsurely-not-here.so");
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_EQ(st.message(),
            "plugin " + (fs::current_path() / "libsurely-not-here.so").string() + ": no such file");
}

TEST(LoaderErrors, DirectoryInsteadOfFile) {
  TempDir dir;
  Registry registry;
  Status st = registry.LoadLibrary(dir.path().string());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "plugin " + dir.path().string() + ": is a directory (use plugins.paths for those)");
}

TEST(LoaderErrors, NotASharedLibrary) {
  TempDir dir;
  const std::string path = dir.Write("junk.so", "this is not an ELF file\n");
  Registry registry;
  Status st = registry.LoadLibrary(path);
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_THAT(st.message(), StartsWith("plugin " + path + ": dlopen failed: "));
  EXPECT_THAT(st.message(), HasSubstr("junk.so"));  // dlerror() names the file too
  EXPECT_EQ(st.message().find('\n'), std::string::npos);
}

TEST(LoaderErrors, MissingEntrySymbol) {
  const std::string path = Fixture("fixture_no_entry");
  ExpectRefused(path, StatusCode::kNotFound,
                "plugin " + path +
                    ": no symbol refit_plugin_entry_v1 (not a refit plugin, or the entry is not "
                    "exported)");
}

TEST(LoaderErrors, EntryReturnsNull) {
  const std::string path = Fixture("fixture_c_null_table");
  ExpectRefused(path, StatusCode::kInternal,
                "plugin " + path + ": refit_plugin_entry_v1 returned null");
}

TEST(LoaderErrors, WrongAbiMajor) {
  const std::string path = Fixture("fixture_c_abi2");
  ExpectRefused(path, StatusCode::kUnsupported,
                "plugin " + path + ": built for plugin ABI 2, this refit speaks ABI 1");
}

TEST(LoaderErrors, PluginTableTooSmall) {
  const std::string path = Fixture("fixture_c_small_table");
  ExpectRefused(path, StatusCode::kUnsupported,
                "plugin " + path + ": plugin table struct_size 16 is smaller than the ABI 1 size " +
                    std::to_string(offsetof(refit_plugin_t, fini)));
}

TEST(LoaderErrors, NullVtable) {
  const std::string path = Fixture("fixture_c_null_vtable");
  ExpectRefused(path, StatusCode::kInternal,
                "plugin " + path + ": encoding 'c_copy' has a null vtable");
}

TEST(LoaderErrors, VtableTooSmall) {
  const std::string path = Fixture("fixture_c_small_vtable");
  ExpectRefused(path, StatusCode::kUnsupported,
                "plugin " + path + ": encoding 'c_copy': vtable struct_size 8 is smaller than " +
                    "the ABI 1 size " +
                    std::to_string(offsetof(refit_encoding_vtable_t, decode_changes)));
}

TEST(LoaderErrors, UnknownKind) {
  const std::string path = Fixture("fixture_c_unknown_kind");
  ExpectRefused(path, StatusCode::kInternal,
                "plugin " + path + ": component 0 has unknown kind 42");
}

TEST(LoaderErrors, NullComponentName) {
  const std::string path = Fixture("fixture_c_null_name");
  ExpectRefused(path, StatusCode::kInternal,
                "plugin " + path + ": component 0 (encoding) has a null name");
}

TEST(LoaderErrors, DuplicateAcrossLibrariesRegistersNothingOfTheSecond) {
  const std::string good = Fixture("fixture_good");
  const std::string dup = Fixture("fixture_dup");
  Registry registry;
  ASSERT_OK(registry.LoadLibrary(good));
  Status st = registry.LoadLibrary(dup);
  EXPECT_EQ(st.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(st.message(),
            "encoding 'fixture_copy' from " + dup + " is already registered by " + good);
  // fixture_dup declares fixture_dup_extra before the clash: all or nothing.
  EXPECT_EQ(registry.Find(REFIT_KIND_ENCODING, "fixture_dup_extra"), nullptr);
  EXPECT_EQ(registry.List().size(), 1u);
  EXPECT_FALSE(IsLoaded(dup));
  EXPECT_EQ(registry.Find(REFIT_KIND_ENCODING, "fixture_copy")->origin, good);
}

TEST(LoaderErrors, DuplicateOfABuiltin) {
  Result<std::unique_ptr<Registry>> registry = Registry::WithBuiltins();
  ASSERT_TRUE(registry.ok()) << registry.status().message();
  ASSERT_NE((*registry)->Find(REFIT_KIND_ENCODING, "dense"), nullptr) << "dense must be builtin";
  const std::string path = Fixture("fixture_dup_builtin");
  Status st = (*registry)->LoadLibrary(path);
  EXPECT_EQ(st.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(st.message(), "encoding 'dense' from " + path + " is already registered by builtin");
  EXPECT_EQ((*registry)->Find(REFIT_KIND_ENCODING, "dense")->origin, "builtin");
  EXPECT_FALSE(IsLoaded(path));
}

// ------------------------------------------------------------------ lifetime

TEST(LoaderLifetime, InstanceOutlivesRegistryAndKeepsTheLibraryMapped) {
  const std::string path = Fixture("fixture_good");
  ASSERT_FALSE(IsLoaded(path));
  std::unique_ptr<Encoding> first;
  std::unique_ptr<Encoding> second;
  {
    Registry registry;
    ASSERT_OK(registry.LoadLibrary(path));
    ASSERT_TRUE(IsLoaded(path));
    Result<std::unique_ptr<Encoding>> a = registry.CreateEncoding("fixture_copy");
    Result<std::unique_ptr<Encoding>> b = registry.CreateEncoding("fixture_copy");
    ASSERT_TRUE(a.ok() && b.ok());
    first = std::move(a).value();
    second = std::move(b).value();
  }
  // The registry (and its ComponentInfo list) is gone; the instances still work.
  EXPECT_TRUE(IsLoaded(path));
  EXPECT_EQ(first->name(), "fixture_copy");
  EXPECT_EQ(first->capabilities(), REFIT_ENC_CAP_FULL_SYNC);
  ExpectCopyRoundTrip(*first);
  first.reset();
  EXPECT_TRUE(IsLoaded(path)) << "unloaded while an instance was alive";
  ExpectCopyRoundTrip(*second);
  second.reset();
  EXPECT_FALSE(IsLoaded(path)) << "still mapped after the last instance died";
}

TEST(LoaderLifetime, RegistryAloneUnloadsOnDestruction) {
  const std::string path = Fixture("fixture_c_good");
  {
    Registry registry;
    ASSERT_OK(registry.LoadLibrary(path));
    EXPECT_TRUE(IsLoaded(path));
  }
  EXPECT_FALSE(IsLoaded(path));
}

// ------------------------------------------------------------------ instance creation

TEST(Create, UnknownNameListsTheKnownOnes) {
  Registry registry;
  ASSERT_OK(registry.LoadLibrary(Fixture("fixture_good")));
  ASSERT_OK(registry.LoadLibrary(Fixture("fixture_c_good")));
  Result<std::unique_ptr<Encoding>> encoding = registry.CreateEncoding("foo");
  EXPECT_EQ(encoding.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(encoding.status().message(), "unknown encoding 'foo' (known: c_copy, fixture_copy)");
  Result<std::unique_ptr<Transport>> transport =
      registry.CreateTransport("disk", REFIT_ROLE_SENDER, "r0");
  EXPECT_EQ(transport.status().message(), "unknown transport 'disk' (known: none)");
}

TEST(Create, ThrowingFactoryBecomesAnError) {
  Registry registry;
  ASSERT_OK(registry.LoadLibrary(Fixture("fixture_throw")));
  Result<std::unique_ptr<Encoding>> encoding = registry.CreateEncoding("fixture_throw");
  EXPECT_EQ(encoding.status().code(), StatusCode::kInternal);
  EXPECT_EQ(encoding.status().message(),
            "encoding 'fixture_throw': create: plugin threw: factory exploded");
}

TEST(Create, ConfigReachesThePluginThroughTheHostApi) {
  Registry registry;
  ASSERT_OK(registry.LoadLibrary(Fixture("fixture_good")));
  Result<Config> config =
      Config::FromString("[encoding.fixture_copy]\nfail_create = true\n", "t.toml");
  ASSERT_TRUE(config.ok()) << config.status().message();
  Result<std::unique_ptr<Encoding>> encoding =
      registry.CreateEncoding("fixture_copy", &*config, "encoding.fixture_copy");
  EXPECT_EQ(encoding.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(encoding.status().message(),
            "encoding 'fixture_copy': create: asked to fail by config");

  // The same config without a section: the plugin sees no keys and succeeds.
  EXPECT_TRUE(registry.CreateEncoding("fixture_copy", &*config, "").ok());
  // A section absent from the file is fine too.
  EXPECT_TRUE(registry.CreateEncoding("fixture_copy", &*config, "encoding.other").ok());
}

TEST(Create, SectionIsValidatedAgainstTheDeclaredKeys) {
  Registry registry;
  ASSERT_OK(registry.LoadLibrary(Fixture("fixture_good")));
  Result<Config> typo =
      Config::FromString("[encoding.fixture_copy]\nfail_creat = true\n", "t.toml");
  ASSERT_TRUE(typo.ok());
  Result<std::unique_ptr<Encoding>> encoding =
      registry.CreateEncoding("fixture_copy", &*typo, "encoding.fixture_copy");
  EXPECT_EQ(encoding.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(encoding.status().message(),
              StartsWith("encoding 'fixture_copy': t.toml:2: unknown key "
                         "'encoding.fixture_copy.fail_creat'"));

  Result<Config> wrong_type =
      Config::FromString("[encoding.fixture_copy]\nfail_create = 3\n", "t.toml");
  ASSERT_TRUE(wrong_type.ok());
  encoding = registry.CreateEncoding("fixture_copy", &*wrong_type, "encoding.fixture_copy");
  EXPECT_EQ(encoding.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(encoding.status().message(), StartsWith("encoding 'fixture_copy': t.toml:2: "));
  EXPECT_THAT(encoding.status().message(), HasSubstr("fail_create"));
}

// ------------------------------------------------------------------ directories and config

TEST(LoadDirectory, LoadsEverySoDirectlyInside) {
  TempDir dir;
  dir.Link("b_good.so", Fixture("fixture_good"));
  dir.Link("a_c.so", Fixture("fixture_c_good"));
  dir.Link("nested/libthrow.so", Fixture("fixture_throw"));  // not recursed into
  dir.Link("libthrow.so.1", Fixture("fixture_throw"));       // not a *.so name
  dir.Write("README.txt", "not a plugin\n");
  Registry registry;
  ASSERT_OK(registry.LoadDirectory(dir.path().string()));
  std::vector<const ComponentInfo*> all = registry.List();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0]->name, "c_copy");
  EXPECT_EQ(all[0]->origin, (dir.path() / "a_c.so").string());
  EXPECT_EQ(all[1]->name, "fixture_copy");
}

TEST(LoadDirectory, LoadsInSortedOrderAndStopsAtTheFirstError) {
  TempDir dir;
  dir.Link("b.so", Fixture("fixture_dup"));
  dir.Link("a.so", Fixture("fixture_good"));
  dir.Link("c.so", Fixture("fixture_c_good"));
  Registry registry;
  Status st = registry.LoadDirectory(dir.path().string());
  EXPECT_EQ(st.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(st.message(), "encoding 'fixture_copy' from " + (dir.path() / "b.so").string() +
                              " is already registered by " + (dir.path() / "a.so").string());
  EXPECT_EQ(registry.Find(REFIT_KIND_ENCODING, "c_copy"), nullptr);
}

TEST(LoadDirectory, MissingDirectoryIsNotAnErrorButAFileIs) {
  TempDir dir;
  Registry registry;
  ASSERT_OK(registry.LoadDirectory((dir.path() / "absent").string()));
  const std::string file = dir.Write("plain", "x");
  Status st = registry.LoadDirectory(file);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "plugin directory " + file + ": not a directory");
}

TEST(LoadPlugins, FromConfigResolvesRelativeToTheConfigFile) {
  TempDir dir;
  dir.Link("libs/libgood.so", Fixture("fixture_good"));
  dir.Link("plugdir/libc.so", Fixture("fixture_c_good"));
  dir.Write("cfg.toml",
            "[plugins]\n"
            "paths = [\"plugdir\"]\n"
            "load = [\"libs/libgood.so\"]\n");
  Result<Config> config = Config::FromFile((dir.path() / "cfg.toml").string());
  ASSERT_TRUE(config.ok()) << config.status().message();
  Registry registry;
  ASSERT_OK(LoadPluginsFromConfig(registry, *config));
  ASSERT_NE(registry.Find(REFIT_KIND_ENCODING, "fixture_copy"), nullptr);
  EXPECT_EQ(registry.Find(REFIT_KIND_ENCODING, "fixture_copy")->origin,
            (dir.path() / "libs/libgood.so").string());
  ASSERT_NE(registry.Find(REFIT_KIND_ENCODING, "c_copy"), nullptr);
  EXPECT_EQ(registry.Find(REFIT_KIND_ENCODING, "c_copy")->origin,
            (dir.path() / "plugdir/libc.so").string());
}

TEST(LoadPlugins, FromConfigErrorsNameTheFileAndLine) {
  TempDir dir;
  Registry registry;
  const std::string missing_so = dir.Write("a.toml", "[plugins]\n\nload = [\"nope.so\"]\n");
  Result<Config> config = Config::FromFile(missing_so);
  ASSERT_TRUE(config.ok()) << config.status().message();
  Status st = LoadPluginsFromConfig(registry, *config);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_EQ(st.message(),
            missing_so + ":3: plugin " + (dir.path() / "nope.so").string() + ": no such file");

  const std::string missing_dir = dir.Write("b.toml", "[plugins]\npaths = [\"nodir\"]\n");
  config = Config::FromFile(missing_dir);
  ASSERT_TRUE(config.ok());
  st = LoadPluginsFromConfig(registry, *config);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_EQ(st.message(), missing_dir + ":2: plugins.paths: " + (dir.path() / "nodir").string() +
                              " is not a directory");

  const std::string typo = dir.Write("c.toml", "[plugins]\nlod = []\n");
  config = Config::FromFile(typo);
  ASSERT_TRUE(config.ok());
  st = LoadPluginsFromConfig(registry, *config);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), StartsWith(typo + ":2: unknown key 'plugins.lod'"));
  EXPECT_TRUE(registry.List().empty());
}

TEST(LoadPlugins, PluginConfigSpecsDeclareBothKeys) {
  std::vector<ConfigKeySpec> specs = PluginConfigSpecs();
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].name, "plugins.paths");
  EXPECT_EQ(specs[1].name, "plugins.load");
  EXPECT_EQ(specs[0].type, REFIT_CFG_STRING_LIST);
  EXPECT_EQ(specs[1].type, REFIT_CFG_STRING_LIST);
}

TEST(LoadPlugins, FromEnvironmentSkipsEmptyAndMissingEntries) {
  TempDir dir;
  dir.Link("plugins/libgood.so", Fixture("fixture_good"));
  const std::string value =
      ":" + (dir.path() / "absent").string() + "::" + (dir.path() / "plugins").string() + ":";
  ASSERT_EQ(setenv("REFIT_PLUGIN_PATH", value.c_str(), 1), 0);
  Registry registry;
  Status st = LoadPluginsFromEnv(registry);
  unsetenv("REFIT_PLUGIN_PATH");
  ASSERT_OK(st);
  EXPECT_NE(registry.Find(REFIT_KIND_ENCODING, "fixture_copy"), nullptr);

  Registry empty;
  ASSERT_OK(LoadPluginsFromEnv(empty));  // unset: nothing to do
  EXPECT_TRUE(empty.List().empty());
}

TEST(LoadPlugins, LoadRegistryCombinesBuiltinsEnvAndConfig) {
  TempDir dir;
  dir.Link("env/libc.so", Fixture("fixture_c_good"));
  dir.Link("libgood.so", Fixture("fixture_good"));
  const std::string cfg = dir.Write("cfg.toml", "[plugins]\nload = [\"libgood.so\"]\n");
  Result<Config> config = Config::FromFile(cfg);
  ASSERT_TRUE(config.ok());
  ASSERT_EQ(setenv("REFIT_PLUGIN_PATH", (dir.path() / "env").c_str(), 1), 0);
  Result<std::shared_ptr<Registry>> registry = LoadRegistry(&*config);
  unsetenv("REFIT_PLUGIN_PATH");
  ASSERT_TRUE(registry.ok()) << registry.status().message();
  EXPECT_EQ((*registry)->Find(REFIT_KIND_LAYOUT, "hf")->origin, "builtin");
  EXPECT_NE((*registry)->Find(REFIT_KIND_ENCODING, "c_copy"), nullptr);
  EXPECT_NE((*registry)->Find(REFIT_KIND_ENCODING, "fixture_copy"), nullptr);
}

TEST(LoadPlugins, DefaultPluginDirOfTheBuildTree) {
  // This test binary runs against the build tree's librefit.
  EXPECT_EQ(fs::path(DefaultPluginDir()).filename(), "plugins-out");
}

// ------------------------------------------------------------------ host API and errors

TEST(HostApi, DescribesThisHost) {
  const refit_host_api_t* host = HostApi();
  EXPECT_EQ(host->struct_size, sizeof(refit_host_api_t));
  EXPECT_EQ(host->abi_major, REFIT_ABI_MAJOR);
  EXPECT_EQ(host->abi_minor, REFIT_ABI_MINOR);
  ASSERT_NE(host->log, nullptr);
  ASSERT_NE(host->config_get_list_item, nullptr);
}

TEST(HostApi, LogWritesOnePrefixedLine) {
  testing::internal::CaptureStderr();
  HostApi()->log(REFIT_LOG_WARN, "fixture", "disk is slow");
  HostApi()->log(REFIT_LOG_INFO, nullptr, "hello");
  HostApi()->log(REFIT_LOG_DEBUG, "fixture", "noise");
  std::string out = testing::internal::GetCapturedStderr();
  const char* level = std::getenv("REFIT_LOG");
  std::string expected = "refit[fixture]: warning: disk is slow\nrefit[plugin]: hello\n";
  if (level != nullptr && std::strcmp(level, "debug") == 0) {
    expected += "refit[fixture]: debug: noise\n";
  }
  EXPECT_EQ(out, expected);
}

TEST(HostApi, ConfigGettersReadTheSection) {
  Result<Config> config = Config::FromString(
      "[encoding.x]\nn = 7\nname = \"abc\"\nlist = [\"p\", \"q\"]\nbytes = \"2KiB\"\n", "t.toml");
  ASSERT_TRUE(config.ok()) << config.status().message();
  const refit_config_t* section = config->SectionHandle("encoding.x");
  const refit_host_api_t* host = HostApi();
  int64_t n = 0;
  EXPECT_EQ(host->config_get_int(section, "n", &n), 1);
  EXPECT_EQ(n, 7);
  EXPECT_EQ(host->config_get_int(section, "absent", &n), 0);
  EXPECT_EQ(host->config_get_int(section, "name", &n), -1);
  uint64_t bytes = 0;
  EXPECT_EQ(host->config_get_size(section, "bytes", &bytes), 1);
  EXPECT_EQ(bytes, 2048u);
  char buf[8];
  size_t len = 0;
  EXPECT_EQ(host->config_get_list_item(section, "list", 1, buf, sizeof(buf), &len), 1);
  EXPECT_EQ(std::string(buf, len), "q");
  EXPECT_EQ(host->config_get_list_item(section, "list", 2, buf, sizeof(buf), &len), 0);
}

TEST(SdkConfigView, GetStringListReadsEveryItem) {
  const std::string long_item(300, 'z');  // longer than the first buffer the SDK tries
  Result<Config> config = Config::FromString(
      "[encoding.x]\nlist = [\"p\", \"" + long_item + "\", \"\"]\nempty = []\nn = 7\n", "t.toml");
  ASSERT_TRUE(config.ok()) << config.status().message();
  sdk::ConfigView view(HostApi(), config->SectionHandle("encoding.x"));
  Result<std::vector<std::string>> list = view.GetStringList("list", {"fallback"});
  ASSERT_TRUE(list.ok()) << list.status().message();
  EXPECT_EQ(*list, (std::vector<std::string>{"p", long_item, ""}));
  Result<std::vector<std::string>> absent = view.GetStringList("absent", {"d"});
  ASSERT_TRUE(absent.ok());
  EXPECT_EQ(*absent, std::vector<std::string>{"d"});
  Result<std::vector<std::string>> empty = view.GetStringList("empty", {"d"});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, std::vector<std::string>{"d"});
  EXPECT_EQ(view.GetStringList("n", {}).status().message(),
            "config key 'n' must be a list of strings");
}

// The SDK's requirements on plugin classes are concepts: checkable without instantiating a row.
struct NotAPlugin {};
static_assert(!sdk::EncodingImpl<NotAPlugin>);
static_assert(!sdk::TransportImpl<NotAPlugin>);
static_assert(!sdk::LayoutImpl<NotAPlugin>);

TEST(StatusFromPlugin, KeepsCodeAndAddsContext) {
  refit_error_t err{};
  EXPECT_TRUE(StatusFromPlugin(REFIT_OK, err, "ctx").ok());
  std::snprintf(err.message, sizeof(err.message), "bad\nrecord");
  Status st = StatusFromPlugin(REFIT_ERR_CORRUPT, err, "encoding 'x': decode");
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_EQ(st.message(), "encoding 'x': decode: bad record");  // kept on one line

  st = StatusFromPlugin(77, err, "ctx");
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_EQ(st.message(), "ctx: bad record (unknown status code 77)");

  refit_error_t empty{};
  EXPECT_EQ(StatusFromPlugin(REFIT_ERR_IO, empty, "ctx").message(),
            "ctx: failed with status 3 and no message");

  refit_error_t unterminated;
  std::memset(unterminated.message, 'x', sizeof(unterminated.message));
  st = StatusFromPlugin(REFIT_ERR_INVALID, unterminated, "ctx");
  EXPECT_EQ(st.message(), "ctx: " + std::string(sizeof(unterminated.message), 'x'));
}

TEST(KindName, NamesEachKind) {
  EXPECT_STREQ(KindName(REFIT_KIND_ENCODING), "encoding");
  EXPECT_STREQ(KindName(REFIT_KIND_TRANSPORT), "transport");
  EXPECT_STREQ(KindName(REFIT_KIND_LAYOUT), "layout");
}

// ------------------------------------------------------------------ wrappers over in-test plugins

// An in-memory transport listing its keys in reverse order (the wrapper must sort).
class MemTransport {
 public:
  static Result<std::unique_ptr<MemTransport>> Create(const sdk::ConfigView&,
                                                      refit_transport_role_t, const std::string&) {
    return std::make_unique<MemTransport>();
  }
  Status Put(const std::string& key, const uint8_t* data, uint64_t len) {
    objects_[key].assign(data, data + len);
    return Status::OK();
  }
  Result<std::optional<uint64_t>> Size(const std::string& key) {
    auto it = objects_.find(key);
    if (it == objects_.end()) return std::optional<uint64_t>();
    return std::optional<uint64_t>(it->second.size());
  }
  Status Get(const std::string& key, uint64_t offset, uint8_t* buf, uint64_t len) {
    auto it = objects_.find(key);
    if (it == objects_.end()) return Status::NotFound("no such key");
    if (offset + len > it->second.size()) return Status::Corrupt("short object");
    std::memcpy(buf, it->second.data() + offset, len);
    return Status::OK();
  }
  Result<std::vector<std::pair<std::string, uint64_t>>> List(const std::string& prefix) {
    std::vector<std::pair<std::string, uint64_t>> out;
    for (auto it = objects_.rbegin(); it != objects_.rend(); ++it) {
      if (it->first.compare(0, prefix.size(), prefix) == 0) {
        out.emplace_back(it->first, it->second.size());
      }
    }
    return out;
  }
  Status Remove(const std::string& key) {
    objects_.erase(key);
    return Status::OK();
  }

 private:
  std::map<std::string, std::vector<uint8_t>> objects_;
};

// A layout that breaks the contract: a slice with more dims than the ABI allows.
class BadLayout {
 public:
  static Result<std::unique_ptr<BadLayout>> Create(const sdk::ConfigView&, int, int) {
    return std::make_unique<BadLayout>();
  }
  Result<std::vector<sdk::Slice>> MapTensor(const refit_local_tensor_t& local) const {
    sdk::Slice slice;
    slice.canonical_name = local.name;
    slice.map.ndim = REFIT_MAX_DIMS + 1;
    return std::vector<sdk::Slice>{slice};
  }
};

// An encoding that claims to have written more than the buffer holds.
class LyingEncoding {
 public:
  static constexpr refit_op_t kOp = REFIT_OP_OVERWRITE;
  static Result<std::unique_ptr<LyingEncoding>> Create(const sdk::ConfigView&) {
    return std::make_unique<LyingEncoding>();
  }
  uint64_t MaxEncodedSize(const refit_encode_input_t&) const { return 4; }
  Result<uint64_t> Encode(const refit_encode_input_t&, uint8_t*, uint64_t cap) const {
    return cap + 1;
  }
  Status Decode(const uint8_t*, uint64_t, const refit_decode_target_t&) const {
    return Status::OK();
  }
};

const refit_component_t kInTestRows[] = {
    sdk::MakeTransport<MemTransport>("mem", "in memory"),
    sdk::MakeLayout<BadLayout>("bad_slices", "emits an invalid slice"),
    sdk::MakeEncoding<LyingEncoding>("liar", "overreports its output size"),
};
const refit_plugin_t kInTestPlugin = {
    sizeof(refit_plugin_t), REFIT_ABI_MAJOR, REFIT_ABI_MINOR, "in-test", "0", kInTestRows, 3};

TEST(Wrappers, TransportListIsSortedAndGetAllIsBounded) {
  Registry registry;
  ASSERT_OK(registry.RegisterPlugin(&kInTestPlugin, nullptr, "in-test"));
  Result<std::unique_ptr<Transport>> made = registry.CreateTransport("mem", REFIT_ROLE_SENDER, "");
  ASSERT_TRUE(made.ok()) << made.status().message();
  Transport& transport = **made;
  const uint8_t abc[] = {'a', 'b', 'c'};
  for (const char* key : {"v1/b", "v1/a", "v2/c", "v1/c"}) ASSERT_OK(transport.Put(key, abc, 3));

  Result<std::vector<std::pair<std::string, uint64_t>>> listed = transport.List("v1/");
  ASSERT_TRUE(listed.ok());
  std::vector<std::pair<std::string, uint64_t>> expected = {{"v1/a", 3}, {"v1/b", 3}, {"v1/c", 3}};
  EXPECT_EQ(*listed, expected);

  Result<std::vector<uint8_t>> all = transport.GetAll("v1/a", 3);
  ASSERT_TRUE(all.ok()) << all.status().message();
  EXPECT_EQ(*all, std::vector<uint8_t>(abc, abc + 3));
  all = transport.GetAll("v1/a", 2);
  EXPECT_EQ(all.status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(all.status().message(),
            "transport 'mem': key 'v1/a' holds 3 bytes, more than the limit of 2");
  all = transport.GetAll("v9/none", 100);
  EXPECT_EQ(all.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(all.status().message(), "transport 'mem': no key 'v9/none'");

  Result<std::optional<uint64_t>> size = transport.Size("v9/none");
  ASSERT_TRUE(size.ok());
  EXPECT_FALSE(size->has_value());
  uint8_t buf[4];
  Status st = transport.Get("v1/a", 1, buf, 4);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_EQ(st.message(), "transport 'mem': get 'v1/a': short object");
  ASSERT_OK(transport.Remove("v1/a"));
  EXPECT_FALSE(transport.Size("v1/a")->has_value());
}

TEST(Wrappers, LayoutSliceOutsideTheAbiIsAnError) {
  Registry registry;
  ASSERT_OK(registry.RegisterPlugin(&kInTestPlugin, nullptr, "in-test"));
  Result<std::unique_ptr<Layout>> layout = registry.CreateLayout("bad_slices", 0, 1);
  ASSERT_TRUE(layout.ok());
  refit_local_tensor_t local{};
  local.struct_size = sizeof(local);
  local.name = "w";
  Result<std::vector<SliceMap>> slices = (*layout)->MapTensor(local);
  EXPECT_EQ(slices.status().code(), StatusCode::kInternal);
  EXPECT_EQ(slices.status().message(),
            "layout 'bad_slices': map 'w': emitted a slice of 'w' with 9 dims");
}

TEST(Wrappers, EncodeOverreportingItsSizeIsAnError) {
  Registry registry;
  ASSERT_OK(registry.RegisterPlugin(&kInTestPlugin, nullptr, "in-test"));
  Result<std::unique_ptr<Encoding>> encoding = registry.CreateEncoding("liar");
  ASSERT_TRUE(encoding.ok());
  refit_encode_input_t in{};
  uint8_t out[4];
  Result<uint64_t> size = (*encoding)->Encode(in, out, sizeof(out));
  EXPECT_EQ(size.status().code(), StatusCode::kInternal);
  EXPECT_EQ(size.status().message(),
            "encoding 'liar': encode reported 5 bytes written into a buffer of 4");
}

// An encoding whose decode_changes claims one change more than the room it was given.
class OverListingEncoding : public LyingEncoding {
 public:
  static Result<std::unique_ptr<OverListingEncoding>> Create(const sdk::ConfigView&) {
    return std::make_unique<OverListingEncoding>();
  }
  Result<uint64_t> DecodeChanges(const uint8_t*, uint64_t, const refit_decode_target_t&, uint64_t*,
                                 uint8_t*, uint64_t capacity) const {
    return capacity + 1;
  }
};

int NeverCalledDecodeChanges(void*, const uint8_t*, uint64_t, const refit_decode_target_t*,
                             refit_decoded_changes_t*, refit_error_t*) {
  std::abort();
}

// The over-lister's vtable cut to its ABI 1.3 size, a non-null pointer left past the end: the
// host must not read the slot.
const refit_encoding_vtable_t* VtableOfAbi13() {
  static refit_encoding_vtable_t vt = [] {
    refit_encoding_vtable_t v = *static_cast<const refit_encoding_vtable_t*>(
        sdk::MakeEncoding<OverListingEncoding>("x", "x").vtable);
    v.struct_size = offsetof(refit_encoding_vtable_t, decode_changes);
    v.decode_changes = &NeverCalledDecodeChanges;
    return v;
  }();
  return &vt;
}

TEST(Wrappers, DecodeChangesIsOfferedOnlyWhereTheVtableHasIt) {
  static refit_component_t rows[3] = {
      sdk::MakeEncoding<LyingEncoding>("plain", "no DecodeChanges member"),
      sdk::MakeEncoding<OverListingEncoding>("overlister", "lists more than its room"),
      sdk::MakeEncoding<OverListingEncoding>("abi13", "a 1.3-sized vtable")};
  rows[2].vtable = VtableOfAbi13();
  static const refit_plugin_t plugin = {
      sizeof(refit_plugin_t), REFIT_ABI_MAJOR, REFIT_ABI_MINOR, "listing", "0", rows, 3};
  Registry registry;
  ASSERT_OK(registry.RegisterPlugin(&plugin, nullptr, "listing"));
  uint8_t old_bits[8] = {};
  refit_decode_target_t old{};
  old.struct_size = sizeof(old);
  old.dtype = REFIT_DTYPE_U8;
  old.elem_size = 1;
  old.n_elems = 8;
  old.bits = old_bits;
  uint64_t positions[4];
  uint8_t values[4];
  refit_decoded_changes_t listed{};
  listed.struct_size = sizeof(listed);
  listed.capacity = 4;
  listed.positions = positions;
  listed.values = values;
  for (const char* name : {"plain", "abi13"}) {
    Result<std::unique_ptr<Encoding>> enc = registry.CreateEncoding(name);
    ASSERT_TRUE(enc.ok()) << enc.status().ToString();
    EXPECT_FALSE((*enc)->can_decode_changes()) << name;
    EXPECT_EQ((*enc)->DecodeChanges(old_bits, 0, old, &listed).code(), StatusCode::kUnsupported)
        << name;
  }
  Result<std::unique_ptr<Encoding>> over = registry.CreateEncoding("overlister");
  ASSERT_TRUE(over.ok());
  ASSERT_TRUE((*over)->can_decode_changes());
  Status st = (*over)->DecodeChanges(old_bits, 0, old, &listed);
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_EQ(st.message(), "encoding 'overlister': decode_changes listed 5 changes into room for 4");
}

// A transport that waits (ABI 1.6): MemTransport, woken by nothing but its own puts.
class WaitingMemTransport : public MemTransport {
 public:
  static Result<std::unique_ptr<WaitingMemTransport>> Create(const sdk::ConfigView&,
                                                             refit_transport_role_t,
                                                             const std::string&) {
    return std::make_unique<WaitingMemTransport>();
  }
  Status Put(const std::string& key, const uint8_t* data, uint64_t len) {
    ++puts_;
    return MemTransport::Put(key, data, len);
  }
  Result<bool> Wait(uint32_t /*timeout_ms*/) {
    const bool arrived = puts_ != waited_;
    waited_ = puts_;
    return arrived;
  }

 private:
  uint64_t puts_ = 0;
  uint64_t waited_ = 0;
};

int NeverCalledWait(void*, uint32_t, int*, refit_error_t*) { std::abort(); }

// WaitingMemTransport's table cut to its ABI 1.5 size: `wait` lies past struct_size.
const refit_transport_vtable_t* TransportVtableOfAbi15() {
  static refit_transport_vtable_t vt = [] {
    refit_transport_vtable_t v = *static_cast<const refit_transport_vtable_t*>(
        sdk::MakeTransport<WaitingMemTransport>("x", "x").vtable);
    v.struct_size = offsetof(refit_transport_vtable_t, wait);
    v.wait = &NeverCalledWait;
    return v;
  }();
  return &vt;
}

TEST(Wrappers, WaitIsCalledOnlyWhereTheVtableHasIt) {
  static refit_component_t rows[3] = {
      sdk::MakeTransport<MemTransport>("plain", "no Wait member"),
      sdk::MakeTransport<WaitingMemTransport>("waiting", "wakes on its puts"),
      sdk::MakeTransport<WaitingMemTransport>("abi15", "a 1.5-sized vtable")};
  rows[2].vtable = TransportVtableOfAbi15();
  static const refit_plugin_t plugin = {
      sizeof(refit_plugin_t), REFIT_ABI_MAJOR, REFIT_ABI_MINOR, "waiting", "0", rows, 3};
  Registry registry;
  ASSERT_OK(registry.RegisterPlugin(&plugin, nullptr, "waiting"));
  const uint8_t byte = 1;
  for (const char* name : {"plain", "abi15"}) {
    Result<std::unique_ptr<Transport>> t = registry.CreateTransport(name, REFIT_ROLE_RECEIVER, "");
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_FALSE((*t)->can_wait()) << name;
    ASSERT_OK((*t)->Put("k", &byte, 1));
    Result<bool> woke = (*t)->Wait(1);  // a sleep
    ASSERT_TRUE(woke.ok()) << woke.status().ToString();
    EXPECT_FALSE(*woke) << name;
  }
  Result<std::unique_ptr<Transport>> t =
      registry.CreateTransport("waiting", REFIT_ROLE_RECEIVER, "");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE((*t)->can_wait());
  ASSERT_OK((*t)->Put("k", &byte, 1));
  Result<bool> woke = (*t)->Wait(60000);
  ASSERT_TRUE(woke.ok());
  EXPECT_TRUE(*woke);
  woke = (*t)->Wait(1);
  ASSERT_TRUE(woke.ok());
  EXPECT_FALSE(*woke);
}

TEST(Wrappers, RegisterPluginIsAllOrNothing) {
  refit_component_t rows[2] = {kInTestRows[0], kInTestRows[1]};
  rows[1].name = "bad.name";
  const refit_plugin_t plugin = {
      sizeof(refit_plugin_t), REFIT_ABI_MAJOR, REFIT_ABI_MINOR, "broken", "0", rows, 2};
  Registry registry;
  Status st = registry.RegisterPlugin(&plugin, nullptr, "in-test");
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_EQ(st.message(),
            "plugin in-test: component 1: layout name 'bad.name' must be non-empty [A-Za-z0-9_-]");
  EXPECT_TRUE(registry.List().empty());
}

TEST(Wrappers, ListIsSortedByKindThenName) {
  Registry registry;
  ASSERT_OK(registry.RegisterPlugin(&kInTestPlugin, nullptr, "in-test"));
  ASSERT_OK(registry.LoadLibrary(Fixture("fixture_good")));
  std::vector<std::string> names;
  for (const ComponentInfo* info : registry.List()) {
    names.push_back(std::string(KindName(info->kind)) + ":" + info->name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"encoding:fixture_copy", "encoding:liar",
                                             "transport:mem", "layout:bad_slices"}));
}

// ------------------------------------------------------------------ the builtin hf layout

TEST(HfLayout, MapsEachTensorOntoItself) {
  Result<std::unique_ptr<Registry>> registry = Registry::WithBuiltins();
  ASSERT_TRUE(registry.ok()) << registry.status().message();
  const ComponentInfo* info = (*registry)->Find(REFIT_KIND_LAYOUT, "hf");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->origin, "builtin");
  Result<std::unique_ptr<Layout>> layout = (*registry)->CreateLayout("hf", 1, 2);
  ASSERT_TRUE(layout.ok()) << layout.status().message();

  refit_local_tensor_t local{};
  local.struct_size = sizeof(local);
  local.dtype = REFIT_DTYPE_BF16;
  local.name = "model.layers.0.mlp.up_proj.weight";
  local.ndim = 2;
  local.shape[0] = 6;
  local.shape[1] = 4;
  Result<std::vector<SliceMap>> slices = (*layout)->MapTensor(local);
  ASSERT_TRUE(slices.ok()) << slices.status().message();
  ASSERT_EQ(slices->size(), 1u);
  const SliceMap& slice = (*slices)[0];
  EXPECT_EQ(slice.canonical_name, local.name);
  EXPECT_EQ(slice.map.canonical_name, nullptr);
  EXPECT_EQ(slice.map.ndim, 2u);
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(slice.map.canonical_shape[d], local.shape[d]);
    EXPECT_EQ(slice.map.extent[d], local.shape[d]);
    EXPECT_EQ(slice.map.canonical_offset[d], 0u);
    EXPECT_EQ(slice.map.local_offset[d], 0u);
  }
  EXPECT_EQ(slice.map.replicated, 0);
  EXPECT_EQ(slice.map.owner_rank, 1);

  local.ndim = 0;  // a scalar is a 0-d box
  slices = (*layout)->MapTensor(local);
  ASSERT_TRUE(slices.ok());
  ASSERT_EQ(slices->size(), 1u);
  EXPECT_EQ((*slices)[0].map.ndim, 0u);

  local.ndim = REFIT_MAX_DIMS + 1;
  slices = (*layout)->MapTensor(local);
  EXPECT_EQ(slices.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(slices.status().message(),
            "layout 'hf': map 'model.layers.0.mlp.up_proj.weight': "
            "tensor 'model.layers.0.mlp.up_proj.weight' has 9 dims "
            "(max 8)");
}

TEST(HfLayout, RejectsARankOutsideTheWorld) {
  Result<std::unique_ptr<Registry>> registry = Registry::WithBuiltins();
  ASSERT_TRUE(registry.ok()) << registry.status().message();
  Result<std::unique_ptr<Layout>> layout = (*registry)->CreateLayout("hf", 2, 2);
  EXPECT_EQ(layout.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(layout.status().message(), "layout 'hf': create: rank 2 is outside world size 2");
}

}  // namespace
}  // namespace refit
