// What a receiver that joins gets by push, so that its replay does not send it again: a put
// writing the spool as it joins, or one that took its receivers after it was ready.
#include "ucx_push_ledger.h"

#include <gtest/gtest.h>

namespace refit::ucx {
namespace {

TEST(PushLedger, APutWrittenAsAReceiverJoinsIsPushedToItNotReplayed) {
  PushLedger ledger;
  ledger.Begin("v1/old");
  ledger.Took("v1/old");                   // pushed to the receivers ready then
  ledger.Begin("v2/p0");                   // its spool write runs...
  const uint64_t joined = ledger.epoch();  // ...as a receiver becomes ready
  EXPECT_FALSE(ledger.PushedTo("v1/old", joined)) << "put before it joined: replayed";
  EXPECT_TRUE(ledger.PushedTo("v2/p0", joined)) << "under way: its push takes the receiver";
  ledger.Took("v2/p0");
  EXPECT_TRUE(ledger.PushedTo("v2/p0", joined)) << "its receivers were taken after it joined";
  EXPECT_FALSE(ledger.PushedTo("v0/left-by-an-earlier-sender", joined));
}

TEST(PushLedger, AFailedPutIsNotUnderWayAndARemovedKeyIsForgotten) {
  PushLedger ledger;
  ledger.Begin("k");
  ledger.Begin("k");  // overwritten by two puts at once
  ledger.Failed("k");
  EXPECT_TRUE(ledger.PushedTo("k", ledger.epoch())) << "the other put is still under way";
  ledger.Failed("k");
  EXPECT_FALSE(ledger.PushedTo("k", ledger.epoch()));
  ledger.Begin("k");
  ledger.Took("k");
  EXPECT_TRUE(ledger.PushedTo("k", 0));
  ledger.Forget("k");
  EXPECT_FALSE(ledger.PushedTo("k", 0)) << "removed, then put again by a later sender: replayed";
}

}  // namespace
}  // namespace refit::ucx
