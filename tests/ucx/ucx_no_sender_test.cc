// A ucx receiver while no sender runs (between two `refit send` processes, or before the first
// one), with sender and receiver instances in this process, compiled from the plugin's sources.
// Found by the soak over ucx (refit_soak --transport ucx): a receiver restarted mid-apply while
// no sender ran answered "not found" for the commit it was applying, and one that re-read a
// payload it had already consumed failed at once; both made the receiver ask for a full sync.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "ucx_transport.h"

namespace refit::ucx {
namespace {

namespace fs = std::filesystem;

class UcxNoSenderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("refit-ucx-nosender-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  UcxOptions Options() const {
    UcxOptions o;
    o.listen = "127.0.0.1:0";
    o.rendezvous_file = (dir_ / "sender.addr").string();
    o.spool_dir = (dir_ / "spool").string();
    o.spool_fsync = false;
    o.connect_timeout = std::chrono::milliseconds(200);
    o.reconnect_max = std::chrono::milliseconds(50);
    o.request_timeout = std::chrono::milliseconds(60000);  // bounds the waits below
    return o;
  }
  std::unique_ptr<UcxTransport> Sender() {
    auto s = UcxTransport::Open(Options(), REFIT_ROLE_SENDER, "sender");
    EXPECT_TRUE(s.ok()) << s.status().message();
    return s.ok() ? std::move(s).value() : nullptr;
  }
  std::unique_ptr<UcxTransport> Receiver(const UcxOptions& o) {
    auto r = UcxTransport::Open(o, REFIT_ROLE_RECEIVER, "r0");
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? std::move(r).value() : nullptr;
  }

  fs::path dir_;
};

const std::string kCommit = "v00000001/COMMIT";
const std::string kPayload = "v00000001/payload.r0.000000.st";

// A receiver that never reached a sender knows nothing: it must not say that an object the
// spool holds is missing (the restarted receiver took "no commit" for "version gone").
TEST_F(UcxNoSenderTest, AReceiverThatNeverConnectedDoesNotSayAnObjectIsMissing) {
  {
    auto sender = Sender();
    ASSERT_NE(sender, nullptr);
    const std::string commit = "committed";
    ASSERT_TRUE(
        sender->Put(kCommit, reinterpret_cast<const uint8_t*>(commit.data()), commit.size()).ok());
  }  // the sender exits
  auto receiver = Receiver(Options());
  ASSERT_NE(receiver, nullptr);
  Result<std::optional<uint64_t>> size = receiver->Size(kCommit);
  EXPECT_TRUE(!size.ok() || size.value().has_value())
      << "the commit the spool holds was reported missing";
  auto listed = receiver->List("v");
  EXPECT_TRUE(!listed.ok() || !listed.value().empty())
      << "an empty listing while the spool holds " << kCommit;
  // Once a sender is up, the same receiver reads the commit.
  auto sender = Sender();
  ASSERT_NE(sender, nullptr);
  std::vector<uint8_t> buf(9);
  ASSERT_TRUE(receiver->Get(kCommit, 0, buf.data(), buf.size()).ok());
  EXPECT_EQ(std::string(buf.begin(), buf.end()), "committed");
}

// A payload read to its end leaves the inbox; reading it again (a retry after a checksum
// mismatch) while the sender is away waits for the next sender instead of failing at once
// (three such failures abandoned the version).
TEST_F(UcxNoSenderTest, ARereadWhileNoSenderRunsWaitsForTheNextSender) {
  std::vector<uint8_t> payload(300 << 10);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7 + 1);
  auto sender = Sender();
  ASSERT_NE(sender, nullptr);
  auto receiver = Receiver(Options());
  ASSERT_NE(receiver, nullptr);
  ASSERT_TRUE(sender->Put(kPayload, payload.data(), payload.size()).ok());
  std::vector<uint8_t> got(payload.size());
  ASSERT_TRUE(receiver->Get(kPayload, 0, got.data(), got.size()).ok());  // consumed
  ASSERT_EQ(got, payload);
  sender.reset();  // this `refit send` exits; the next one comes later
  std::thread next([this, &sender] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    sender = Sender();
  });
  std::fill(got.begin(), got.end(), 0);
  Status reread = receiver->Get(kPayload, 0, got.data(), got.size());
  next.join();
  ASSERT_TRUE(reread.ok()) << reread.message();
  EXPECT_EQ(got, payload);
}

}  // namespace
}  // namespace refit::ucx
