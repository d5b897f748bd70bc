// The CLI finds the .so plugins built (or installed) with it however it is started: from another
// directory, with argv[0] a bare "refit" (a shell's PATH lookup, or `refit demo` starting its
// receiver through /proc/self/exe), not only by its full path.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "cli_harness.h"

namespace refit::testing {
namespace {

TEST(PluginDirCli, BareArgv0FromAnotherDirectoryStillFindsTheBuildPlugins) {
  TempDir dir;
  const std::string out_path = dir.path() + "/plugins.out";
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::chdir(dir.path().c_str()) != 0) std::_Exit(126);
    int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out, 1);
    ::execl(REFIT_CLI_PATH, "refit", "plugins", static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  const std::string listing = ReadAll(out_path);
  // ctx and megatron are loadable plugins (not builtin): listed only if the plugin dir was found.
  EXPECT_NE(listing.find("ctx"), std::string::npos) << listing;
  EXPECT_NE(listing.find("megatron"), std::string::npos) << listing;
}

}  // namespace
}  // namespace refit::testing
