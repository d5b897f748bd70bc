// The public header is safe to include next to other libraries' headers: a program that has its
// own RETURN_NOT_OK / ASSIGN_OR_RAISE (Arrow defines both) still compiles with refit/refit.h, and
// refit's own macros carry the REFIT_ prefix.
#define RETURN_NOT_OK(expr) static_cast<void>(expr)
#define ASSIGN_OR_RAISE(lhs, rexpr) lhs = (rexpr)

#include <gtest/gtest.h>

#include "refit/refit.h"
#include "temp_dir_util.h"

namespace {

refit::Status FailWith(bool fail) {
  return fail ? refit::Status::Invalid("asked to fail") : refit::Status::OK();
}

refit::Result<int> Twice(int x) {
  if (x < 0) return refit::Status::Invalid("negative");
  return 2 * x;
}

refit::Status UseRefitMacros(bool fail, int x, int* out) {
  REFIT_RETURN_NOT_OK(FailWith(fail));
  REFIT_ASSIGN_OR_RAISE(*out, Twice(x));
  return refit::Status::OK();
}

int UseForeignMacros() {
  int y = 0;
  RETURN_NOT_OK(y);
  ASSIGN_OR_RAISE(y, 3);
  return y;
}

TEST(PublicHeader, CoexistsWithUnprefixedMacrosOfOtherLibraries) {
  EXPECT_EQ(UseForeignMacros(), 3);
  int out = 0;
  EXPECT_TRUE(UseRefitMacros(false, 4, &out).ok());
  EXPECT_EQ(out, 8);
  EXPECT_EQ(UseRefitMacros(true, 4, &out).message(), "asked to fail");
  EXPECT_EQ(UseRefitMacros(false, -1, &out).message(), "negative");
}

TEST(PublicHeader, LogSinkReceivesLinesInsteadOfStderr) {
  std::vector<std::string> lines;
  refit::SetLogLevel(refit::LogLevel::kInfo);
  refit::SetLogSink([&](refit::LogLevel level, std::string_view component, std::string_view msg) {
    lines.push_back(std::to_string(static_cast<int>(level)) + " " + std::string(component) + " " +
                    std::string(msg));
  });
  refit::Log(refit::LogLevel::kWarn, "test", "one line");
  refit::Log(refit::LogLevel::kDebug, "test", "dropped below the default level");
  refit::SetLogSink(nullptr);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "2 test one line");
}

// An embedding program hands the sender and receiver the registry it built: only the plugins in
// it exist for them (here the builtins, without the build tree's .so plugins that LoadRegistry
// would add), and one registry serves both.
TEST(PublicHeader, SenderAndReceiverUseTheRegistryTheCallerHandsThem) {
  refit::testing::ScopedTempDir dir("refit-embed");
  const std::string root = dir.path().string();
  auto make_config = [&](const std::string& encoding) {
    return refit::Config::FromString("[sender]\nstate_dir = \"" + root + "/s\"\nencoding = \"" +
                                         encoding + "\"\n[receiver]\nstate_dir = \"" + root +
                                         "/r\"\n[transport]\nname = \"disk\"\n[transport.disk]\n"
                                         "dir = \"" +
                                         root + "/sync\"\n",
                                     "embed.toml");
  };
  refit::Result<std::unique_ptr<refit::Registry>> builtins = refit::Registry::WithBuiltins();
  ASSERT_TRUE(builtins.ok()) << builtins.status().message();
  std::shared_ptr<refit::Registry> registry = std::move(builtins).value();

  refit::Result<refit::Config> with_ctx = make_config("ctx");  // a .so plugin, not builtin
  ASSERT_TRUE(with_ctx.ok()) << with_ctx.status().message();
  auto refused = refit::Sender::Make(*with_ctx, 0, 1, registry);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("unknown encoding 'ctx'"), std::string::npos)
      << refused.status().message();

  refit::Result<refit::Config> config = make_config("indices");
  ASSERT_TRUE(config.ok()) << config.status().message();
  auto sender = refit::Sender::Make(*config, 0, 1, registry);
  ASSERT_TRUE(sender.ok()) << sender.status().message();
  auto receiver = refit::Receiver::Make(*config, registry);
  ASSERT_TRUE(receiver.ok()) << receiver.status().message();
  std::vector<uint16_t> bits = {1, 2, 3, 4};
  refit::TensorView weight;
  weight.name = "w";
  weight.dtype = refit::DType::kBF16;
  weight.shape = {4};
  weight.data = bits.data();
  auto published = (*sender)->Publish({weight});
  ASSERT_TRUE(published.ok()) << published.status().message();
  auto applied = (*receiver)->PollOnce();
  ASSERT_TRUE(applied.ok()) << applied.status().message();
  ASSERT_TRUE(applied->has_value());
  EXPECT_EQ((*receiver)->version(), 1u);
}

}  // namespace
