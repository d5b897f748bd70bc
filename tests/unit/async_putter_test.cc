// The sender's background writer (send/async_putter.h): payloads in order, a job run first
// without holding up the payload handed over meanwhile, errors returned once.
#include "send/async_putter.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <vector>

namespace refit::internal {
namespace {

TEST(AsyncPutter, AJobRunsBeforeThePutsSubmittedAfterItWhileAPayloadIsHandedOver) {
  std::vector<std::string> order;  // written by the putter's thread only
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  bool released_by_the_test = false;
  AsyncPutter putter([&](const std::string& key, const std::vector<uint8_t>& bytes) {
    order.push_back(key + ":" + std::to_string(bytes.size()));
    return Status::OK();
  });
  putter.RunFirst([&] {
    // A slow delete. Were Submit waiting for the job, only the timeout would end it.
    released_by_the_test = released.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
    order.push_back("job");
    return Status::OK();
  });
  // Handed over while the job still runs: Submit does not wait for it.
  ASSERT_TRUE(putter.Submit("p0", std::vector<uint8_t>(3)).ok());
  release.set_value();
  ASSERT_TRUE(putter.Submit("p1", std::vector<uint8_t>(5)).ok());
  ASSERT_TRUE(putter.Drain().ok());
  EXPECT_TRUE(released_by_the_test) << "Submit waited for the job";
  EXPECT_EQ(order, (std::vector<std::string>{"job", "p0:3", "p1:5"}));
}

// A long job (deleting a full sync's objects) that calls PutWaiting between its steps puts the
// payloads handed over meanwhile there: the next Submit does not wait for the job's end.
TEST(AsyncPutter, AJobsStepsLetThePayloadsHandedOverMeanwhileGoFirst) {
  std::vector<std::string> order;  // written by the putter's thread only
  std::promise<void> first_handed, second_handed;
  std::future<void> first = first_handed.get_future(), second = second_handed.get_future();
  bool handed_in_time = true;
  AsyncPutter putter([&](const std::string& key, const std::vector<uint8_t>&) {
    order.push_back(key);
    return Status::OK();
  });
  putter.RunFirst([&] {
    for (std::future<void>* handed : {&first, &second}) {
      // Were the second Submit waiting for the job, only the timeout would end this wait.
      handed_in_time &= handed->wait_for(std::chrono::seconds(20)) == std::future_status::ready;
      order.push_back("step");
      putter.PutWaiting();
    }
    order.push_back("end");
    return Status::OK();
  });
  ASSERT_TRUE(putter.Submit("p0", std::vector<uint8_t>(3)).ok());
  first_handed.set_value();
  ASSERT_TRUE(putter.Submit("p1", std::vector<uint8_t>(5)).ok());  // once p0 went, mid-job
  second_handed.set_value();
  ASSERT_TRUE(putter.Submit("p2", std::vector<uint8_t>(7)).ok());
  ASSERT_TRUE(putter.Drain().ok());
  EXPECT_TRUE(handed_in_time) << "a Submit waited for the job's end";
  EXPECT_EQ(order, (std::vector<std::string>{"step", "p0", "step", "p1", "end", "p2"}));
}

// A payload's buffer, once put, is kept (emptied) for the next payload to be built in; one at a
// time, the largest.
TEST(AsyncPutter, APutPayloadsBufferIsKeptForTheNext) {
  std::vector<std::string> seen;
  AsyncPutter putter([&](const std::string& key, const std::vector<uint8_t>& bytes) {
    seen.push_back(key + ":" + std::to_string(bytes.size()) + ":" + std::to_string(bytes[0]));
    return Status::OK();
  });
  EXPECT_EQ(putter.TakeSpare().capacity(), 0u);
  std::vector<uint8_t> first(1000, 1);
  const uint8_t* storage = first.data();
  ASSERT_TRUE(putter.Submit("p0", std::move(first)).ok());
  ASSERT_TRUE(putter.Submit("p1", std::vector<uint8_t>(10, 2)).ok());
  ASSERT_TRUE(putter.Drain().ok());
  std::vector<uint8_t> spare = putter.TakeSpare();
  EXPECT_TRUE(spare.empty());
  EXPECT_GE(spare.capacity(), 1000u);
  EXPECT_EQ(spare.data(), storage) << "the larger of the two buffers is the one kept";
  EXPECT_EQ(putter.TakeSpare().capacity(), 0u) << "handed out once";
  spare.assign(20, 3);
  ASSERT_TRUE(putter.Submit("p2", std::move(spare)).ok());
  ASSERT_TRUE(putter.Drain().ok());
  EXPECT_EQ(seen, (std::vector<std::string>{"p0:1000:1", "p1:10:2", "p2:20:3"}));
}

TEST(AsyncPutter, AJobsErrorIsReturnedByDrainAndStopsLaterPuts) {
  int puts = 0;
  AsyncPutter putter([&](const std::string&, const std::vector<uint8_t>&) {
    ++puts;
    return Status::OK();
  });
  putter.RunFirst([] { return Status::IoError("retention: cannot delete"); });
  ASSERT_TRUE(putter.Drain().code() == StatusCode::kIoError);
  EXPECT_EQ(putter.Submit("p0", std::vector<uint8_t>(1)).code(), StatusCode::kIoError);
  EXPECT_EQ(puts, 0);
}

TEST(AsyncPutter, APendingJobRunsBeforeTheWriterStops) {
  bool ran = false;
  {
    AsyncPutter putter(
        [](const std::string&, const std::vector<uint8_t>&) { return Status::OK(); });
    putter.RunFirst([&] {
      ran = true;
      return Status::OK();
    });
  }
  EXPECT_TRUE(ran);
}

}  // namespace
}  // namespace refit::internal
