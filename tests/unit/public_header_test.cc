// The public header is safe to include next to other libraries' headers: a program that has its
// own RETURN_NOT_OK / ASSIGN_OR_RAISE (Arrow defines both) still compiles with refit/refit.h, and
// refit's own macros carry the REFIT_ prefix.
#define RETURN_NOT_OK(expr) static_cast<void>(expr)
#define ASSIGN_OR_RAISE(lhs, rexpr) lhs = (rexpr)

#include <gtest/gtest.h>

#include "refit/refit.h"

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

}  // namespace
