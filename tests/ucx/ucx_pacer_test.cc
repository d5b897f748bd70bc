// link_bandwidth's emulated links: an object crosses a link after the ones handed to it before,
// a link that idled banks nothing, and the posting thread keeps the objects' order.
#include "ucx_pacer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace refit::ucx {
namespace {

using std::chrono::milliseconds;

TEST(LinkSchedule, ObjectsQueueOnTheirLinkAndAnIdleLinkBanksNothing) {
  LinkSchedule links(1e6);  // 1 MB/s: 1000 bytes take 1 ms
  const PaceClock::time_point t0{};
  // Handed at t0: crosses by t0 + 100 ms.
  EXPECT_EQ(links.Arrival({1}, 100000, t0), t0 + milliseconds(100));
  // Handed 10 ms later, while the first is on the link: behind it.
  EXPECT_EQ(links.Arrival({1}, 50000, t0 + milliseconds(10)), t0 + milliseconds(150));
  // Another connection is a link of its own.
  EXPECT_EQ(links.Arrival({2}, 50000, t0 + milliseconds(10)), t0 + milliseconds(60));
  // To both: when the slower one (busy until 150 ms) has carried it.
  EXPECT_EQ(links.Arrival({1, 2}, 10000, t0 + milliseconds(20)), t0 + milliseconds(160));
  // Idle from 160 ms to 1 s: no credit, the object takes its full time from when it is handed.
  EXPECT_EQ(links.Arrival({1}, 20000, t0 + milliseconds(1000)), t0 + milliseconds(1020));
  // A forgotten link starts free.
  links.Forget(1);
  EXPECT_EQ(links.Arrival({1}, 1000, t0 + milliseconds(1000)), t0 + milliseconds(1001));
  // Nothing to carry: at once.
  EXPECT_EQ(links.Arrival({2}, 0, t0 + milliseconds(2000)), t0 + milliseconds(2000));
}

TEST(DelayedRunner, RunsJobsInPostOrderNotBeforeTheirTime) {
  DelayedRunner runner;
  std::vector<int> ran;
  std::vector<PaceClock::time_point> at;
  const PaceClock::time_point start = PaceClock::now();
  // The second job's time is earlier than the first's: it still runs after it.
  const std::vector<PaceClock::time_point> due = {start + milliseconds(30), start,
                                                  start + milliseconds(40)};
  for (int i = 0; i < 3; ++i) {
    runner.Post(due[i], [&, i] {
      ran.push_back(i);
      at.push_back(PaceClock::now());
    });
  }
  runner.Drain();
  ASSERT_EQ(ran, (std::vector<int>{0, 1, 2}));
  for (int i = 0; i < 3; ++i) EXPECT_GE(at[i], due[i]) << i;
}

TEST(DelayedRunner, DropsWhatHasNotRunWhenDestroyed) {
  std::atomic<int> ran{0};
  {
    DelayedRunner runner;
    runner.Post(PaceClock::now(), [&] { ++ran; });
    runner.Drain();
    runner.Post(PaceClock::now() + std::chrono::hours(1), [&] { ++ran; });
  }  // returns at once, the hour-late job dropped
  EXPECT_EQ(ran.load(), 1);
}

}  // namespace
}  // namespace refit::ucx
