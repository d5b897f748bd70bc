// The progress meter: its line, when it draws, and that a disabled one writes nothing.
#include "common/progress.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "scoped_env.h"
#include "temp_dir_util.h"

namespace refit::internal {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST(Progress, LineSaysBytesOfTotalPercentAndRate) {
  // 1.2 GiB in 1.2 * 1024 / 850 s is 850 MiB/s.
  const uint64_t done = (kGiB * 12 + 9) / 10;  // rounded up: 30% of 4 GiB, not 29.99...
  EXPECT_EQ(ProgressLine("diff", done, 4 * kGiB, 1.2 * 1024 / 850),
            "diff: 1.20 GiB of 4.00 GiB (30%), 850 MiB/s");
  EXPECT_EQ(ProgressLine("shard", 512, 0, 1.0), "shard: 512 B, 512 B/s");
  EXPECT_EQ(ProgressLine("send", 0, 10 * kMiB, 0.0), "send: 0 B of 10.0 MiB (0%), 0 B/s");
  // 100% only once everything is done.
  EXPECT_NE(ProgressLine("x", 999, 1000, 1).find("(99%)"), std::string::npos);
  EXPECT_NE(ProgressLine("x", 1000, 1000, 1).find("(100%)"), std::string::npos);
}

// Runs fn with stderr sent to a file and returns what was written to it.
template <typename Fn>
std::string CaptureStderr(const std::string& path, Fn fn) {
  std::fflush(stderr);
  const int saved = ::dup(STDERR_FILENO);
  const int file = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(file, STDERR_FILENO);
  ::close(file);
  fn();
  std::fflush(stderr);
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ProgressMeterTest : public ::testing::Test {
 protected:
  refit::testing::ScopedTempDir temp_{"refit-progress-test"};
  std::string capture_ = (temp_.path() / "stderr").string();
};

TEST_F(ProgressMeterTest, DrawsInPlaceAndEndsWithOneNewline) {
  const std::string err = CaptureStderr(capture_, [] {
    ProgressMeter meter("diff", 4 * kMiB, /*enabled=*/true);
    for (int i = 0; i < 4; ++i) meter.Add(kMiB);
    meter.Finish();
    meter.Finish();  // once only
  });
  ASSERT_FALSE(err.empty());
  EXPECT_EQ(err.front(), '\r');
  EXPECT_EQ(err.find('\n'), err.size() - 1) << err;
  // Redraws are limited: four quick adds draw the first and the final line, not four.
  EXPECT_LE(std::count(err.begin(), err.end(), '\r'), 3) << err;
  const std::string last = err.substr(err.rfind('\r') + 1);
  EXPECT_EQ(last.rfind("diff: 4.00 MiB of 4.00 MiB (100%), ", 0), 0u) << last;
}

TEST_F(ProgressMeterTest, DisabledOrNeverUpdatedWritesNothing) {
  EXPECT_EQ(CaptureStderr(capture_,
                          [] {
                            ProgressMeter meter("diff", kMiB, /*enabled=*/false);
                            meter.Add(kMiB);
                            EXPECT_FALSE(meter.Callback());
                          }),
            "");
  EXPECT_EQ(CaptureStderr(capture_, [] { ProgressMeter meter("diff", kMiB, true); }), "");
}

TEST_F(ProgressMeterTest, AddIsSafeFromManyThreads) {
  const std::string err = CaptureStderr(capture_, [] {
    ProgressMeter meter("send", 8 * 1000 * 64, true);
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 1000; ++i) meter.Add(64);
      });
    }
    for (std::thread& t : threads) t.join();
  });
  EXPECT_NE(err.find("(100%)"), std::string::npos) << err;
}

TEST_F(ProgressMeterTest, EraseBlanksTheLineForOtherOutput) {
  const std::string err = CaptureStderr(capture_, [] {
    ProgressMeter meter("shard", 100, true);
    meter.Add(50);
    meter.Erase();
  });
  const std::string line = "shard: 50 B of 100 B (50%), ";
  ASSERT_EQ(err.rfind("\r" + line, 0), 0u) << err;
  const size_t drawn = err.find('\r', 1) - 1;  // the first line's length
  // Blanked with as many spaces; Finish() then draws the final line again and a newline.
  const std::string blank = "\r" + std::string(drawn, ' ') + "\r";
  ASSERT_EQ(err.substr(drawn + 1, blank.size()), blank) << err;
  const std::string final_line = err.substr(drawn + 1 + blank.size());
  EXPECT_EQ(final_line.rfind("\r" + line, 0), 0u) << err;
  EXPECT_EQ(final_line.find('\n'), final_line.size() - 1) << err;
}

// REFIT_PROGRESS forces the meter on or off; otherwise it is on only when stderr is a terminal.
TEST_F(ProgressMeterTest, WantedOnATerminalOrWhenForced) {
  refit::testing::ScopedEnv progress("REFIT_PROGRESS", nullptr);
  CaptureStderr(capture_, [] { EXPECT_FALSE(ProgressWanted()); });
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  ASSERT_GE(master, 0);
  ASSERT_EQ(::grantpt(master), 0);
  ASSERT_EQ(::unlockpt(master), 0);
  const int terminal = ::open(::ptsname(master), O_RDWR | O_NOCTTY);
  ASSERT_GE(terminal, 0);
  const int saved_fd = ::dup(STDERR_FILENO);
  ::dup2(terminal, STDERR_FILENO);
  const bool on_terminal = ProgressWanted();
  progress.Set("0");
  const bool forced_off = ProgressWanted();
  ::dup2(saved_fd, STDERR_FILENO);
  ::close(saved_fd);
  ::close(terminal);
  ::close(master);
  EXPECT_TRUE(on_terminal);
  EXPECT_FALSE(forced_off);
  progress.Set("1");
  CaptureStderr(capture_, [] { EXPECT_TRUE(ProgressWanted()); });
}

}  // namespace
}  // namespace refit::internal
