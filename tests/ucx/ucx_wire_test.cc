// The ucx transport's message header: round trips, and every malformed header a peer could send
// is one clear error (the receiving side drops that peer), never a crash or an overread.
#include "ucx_wire.h"

#include <gtest/gtest.h>

#include <string>

namespace refit::ucx {
namespace {

TEST(UcxWire, HeaderRoundTrips) {
  MsgHeader h;
  h.type = MsgType::kGet;
  h.id = 0x0102030405060708ull;
  h.a = 1ull << 40;
  h.b = 7;
  h.c = 9;
  h.d = 1ull << 50;
  h.key = "v00000007/payload.r0.000003.st";
  const std::string wire = EncodeHeader(h);
  ASSERT_EQ(wire.size(), kFixedHeaderBytes + h.key.size());
  Result<MsgHeader> back = DecodeHeader(wire.data(), wire.size());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->type, h.type);
  EXPECT_EQ(back->id, h.id);
  EXPECT_EQ(back->a, h.a);
  EXPECT_EQ(back->b, h.b);
  EXPECT_EQ(back->c, h.c);
  EXPECT_EQ(back->d, h.d);
  EXPECT_EQ(back->key, h.key);
}

TEST(UcxWire, MalformedHeadersAreErrors) {
  MsgHeader h;
  h.type = MsgType::kPush;
  h.key = "v00000001/COMMIT";
  const std::string wire = EncodeHeader(h);
  EXPECT_FALSE(DecodeHeader(nullptr, 0).ok());
  EXPECT_FALSE(DecodeHeader(wire.data(), kFixedHeaderBytes - 1).ok());
  EXPECT_FALSE(DecodeHeader(wire.data(), wire.size() - 1).ok());  // key shorter than it says
  std::string longer = wire + "x";
  EXPECT_FALSE(DecodeHeader(longer.data(), longer.size()).ok());
  for (uint8_t type : {uint8_t{0}, uint8_t{13}, uint8_t{255}}) {
    std::string bad = wire;
    bad[0] = static_cast<char>(type);
    Result<MsgHeader> r = DecodeHeader(bad.data(), bad.size());
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("unknown message type"), std::string::npos);
  }
}

TEST(UcxWire, LongKeysAreCut) {
  MsgHeader h;
  h.type = MsgType::kReply;
  h.key = std::string(kMaxHeaderKey + 100, 'e');  // an error message
  const std::string wire = EncodeHeader(h);
  Result<MsgHeader> back = DecodeHeader(wire.data(), wire.size());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->key.size(), kMaxHeaderKey);
}

}  // namespace
}  // namespace refit::ucx
