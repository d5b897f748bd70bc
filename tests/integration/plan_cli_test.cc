// `refit plan` reproduces the worked examples of the engineering note "When is delta all-gather
// (sharded diff) necessary?" (configs/plan-examples.toml) to the note's precision.
#include <gtest/gtest.h>

#include "cli_harness.h"

namespace refit::testing {
namespace {

TEST(PlanCli, WorkedExamples) {
  TempDir dir;
  auto r =
      RunRefit({"plan", "--config", std::string(REFIT_SOURCE_DIR) + "/configs/plan-examples.toml"},
               dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // NCCL, PP level: 1000 GB / 30 GB/s vs 100 GB / 30 GB/s.
  EXPECT_NE(r.out.find("full gather 33 s vs delta transfer 3.3 s"), std::string::npos) << r.out;
  // NCCL, TP level at 10% and 1%.
  EXPECT_NE(r.out.find("full gather 1 s vs delta transfer 1 s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("full gather 1 s vs delta transfer 0.1 s"), std::string::npos) << r.out;
  // Disk: 0.67 s local gather vs 40 s full write / 4 s delta write.
  EXPECT_NE(r.out.find("full gather 0.67 s vs delta transfer 4 s (full transfer 40 s"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("| NCCL: AllGather to one node -> broadcast | Required | Not required, but "
                       "recommended |"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("| Disk: PP nodes write in parallel | Required | Not required |"),
            std::string::npos)
      << r.out;
}

TEST(PlanCli, BadTopologyIsOneLine) {
  TempDir dir;
  WriteAll(dir / "t.toml",
           "[scenarios.a]\npath = \"nccl\"\nlevel = \"tp\"\nweights_gb = 10\n"
           "density = 2\ngather_gbps = 1\ntransfer_gbps = 1\n");
  auto r = RunRefit({"plan", "--config", dir / "t.toml"}, dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(LineCount(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("t.toml:5"), std::string::npos) << r.err;
  WriteAll(dir / "u.toml", "[scenarios.a]\npath = \"nccl\"\nlevl = \"tp\"\n");
  r = RunRefit({"plan", "--config", dir / "u.toml"}, dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("u.toml:3"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace refit::testing
