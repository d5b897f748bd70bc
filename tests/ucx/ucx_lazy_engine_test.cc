// The ucx plugin loads UCX only when a ucx transport is created (ucx_plugin.cc): loading the
// plugin maps no UCX library, creating an instance loads the engine from ucx/ next to the plugin,
// and a plugin whose engine is missing fails that creation with one error line.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "refit/config.h"
#include "refit/registry.h"

namespace refit {
namespace {

bool UcpMapped() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("libucp") != std::string::npos) return true;
  }
  return false;
}

Result<std::unique_ptr<Transport>> CreateReceiver(Registry& registry, const std::string& dir) {
  REFIT_ASSIGN_OR_RAISE(Config config,
                        Config::FromString("[transport.ucx]\nconnect = \"127.0.0.1:9\"\n"
                                           "connect_timeout_ms = 1\nspool_dir = \"" +
                                           dir + "\"\n"));
  return registry.CreateTransport("ucx", REFIT_ROLE_RECEIVER, "r0", &config, "transport.ucx");
}

// One test (a process loads the engine once): first the copy without its engine, then the real
// plugin, whose loading maps no UCX until an instance is created.
TEST(UcxLazyEngine, UcxIsLoadedOnlyForAnInstanceAndAMissingEngineIsOneLine) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ucx-lazy-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::filesystem::path lone = dir / "librefit-ucx.so";
  std::filesystem::copy_file(REFIT_UCX_PLUGIN, lone,
                             std::filesystem::copy_options::overwrite_existing);
  {
    Registry registry;
    ASSERT_TRUE(registry.LoadLibrary(lone.string()).ok());
    EXPECT_FALSE(UcpMapped()) << "loading the plugin mapped libucp";
    Result<std::unique_ptr<Transport>> made = CreateReceiver(registry, dir.string());
    ASSERT_FALSE(made.ok());
    EXPECT_EQ(made.status().code(), StatusCode::kUnsupported) << made.status().ToString();
    const std::string message = made.status().message();
    EXPECT_NE(message.find("ucx: cannot load its engine " + (dir / "ucx").string()),
              std::string::npos)
        << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  {
    Registry registry;
    ASSERT_TRUE(registry.LoadLibrary(REFIT_UCX_PLUGIN).ok());
    EXPECT_FALSE(UcpMapped()) << "loading the plugin mapped libucp";
    Result<std::unique_ptr<Transport>> made = CreateReceiver(registry, dir.string());
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    EXPECT_TRUE(UcpMapped()) << "a ucx instance exists but libucp is not mapped";
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace refit
