// `refit plan`: the bandwidth model of the engineering note "When is delta all-gather (sharded
// diff) necessary?" (verl; full gather vs delta transfer per path and parallelism level) that
// recommends PP-level / TP-level sharded diff and predicts stage seconds.
#pragma once

#include <string>
#include <vector>

#include "refit/config.h"
#include "refit/status.h"

namespace refit::cli {

struct PlanScenario {
  std::string name;
  std::string path;   // "nccl" or "disk"
  std::string level;  // "pp" or "tp"
  double weights_gb = 0;
  double density = 0;
  double gather_gbps = 0;
  double transfer_gbps = 0;
  double node_ram_gb = 0;  // 0: unknown

  double full_gather_s() const { return weights_gb / gather_gbps; }
  double delta_gather_s() const { return weights_gb * density / gather_gbps; }
  double full_transfer_s() const { return weights_gb / transfer_gbps; }
  double delta_transfer_s() const { return weights_gb * density / transfer_gbps; }
  // "required", "recommended" or "not required", with the reason.
  std::string Verdict(std::string* why) const;
};

std::vector<ConfigKeySpec> PlanConfigSpecs();
Result<std::vector<PlanScenario>> LoadPlan(const Config& config);
// "33", "3.3", "0.67", "2000": two significant digits below 10, whole numbers above.
std::string Seconds(double s);
Status RunPlan(const std::string& config_path);

}  // namespace refit::cli
