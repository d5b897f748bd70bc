// The ucx transport under the link emulation ([transport] bandwidth): its sender reads what it put
// from its own spool (REFIT_TRANSPORT_CAP_LOCAL_SENDER_READS), so a verified put crosses the
// sender's link once; the receiver's reads still pay theirs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "link/link.h"
#include "refit/config.h"
#include "refit/registry.h"

namespace refit {
namespace {

TEST(UcxLink, ASendersReadBackOfItsOwnSpoolIsNotChargedToItsLink) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ucx-link-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  Registry registry;
  ASSERT_TRUE(registry.LoadLibrary(REFIT_UCX_PLUGIN).ok());
  const ComponentInfo* info = registry.Find(REFIT_KIND_TRANSPORT, "ucx");
  ASSERT_NE(info, nullptr);
  EXPECT_NE(info->capabilities & REFIT_TRANSPORT_CAP_LOCAL_SENDER_READS, 0u);

  // 1 MB/s: a 64 KiB burst. The 60 KiB put fits in it; reading it back twice would not.
  auto config = Config::FromString(
      "[transport]\nname = \"ucx\"\nbandwidth = \"1MB\"\n[transport.ucx]\nlisten = "
      "\"127.0.0.1:0\"\nspool_dir = \"" +
      dir.string() + "\"\nspool_fsync = false\nrendezvous_file = \"" + (dir / "rdv").string() +
      "\"\n");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  internal::LinkTraffic& traffic = internal::ProcessLinkTraffic(REFIT_ROLE_SENDER);
  {
    auto sender =
        internal::CreateConfiguredTransport(registry, config.value(), REFIT_ROLE_SENDER, "");
    ASSERT_TRUE(sender.ok()) << sender.status().ToString();
    const std::vector<uint8_t> data(60 << 10, 9);
    ASSERT_TRUE(sender.value()->Put("v00000001/payload", data.data(), data.size()).ok());
    std::vector<uint8_t> back(data.size());
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(sender.value()->Get("v00000001/payload", 0, back.data(), back.size()).ok());
      EXPECT_EQ(back, data);
    }
  }
  EXPECT_EQ(traffic.get_bytes.load(), 2u * (60 << 10));  // counted
  EXPECT_EQ(traffic.throttled_ns.load(), 0u);            // never waited for the link
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace refit
