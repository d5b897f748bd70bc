#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>

#include "commands.h"
#include "plan.h"

namespace refit::cli {

std::vector<ConfigKeySpec> PlanConfigSpecs() {
  return {
      {"scenarios.*.path", REFIT_CFG_STRING, "",
       "\"nccl\" (gather to one node, broadcast) or \"disk\""},
      {"scenarios.*.level", REFIT_CFG_STRING, "",
       "\"pp\" (across pipeline nodes) or \"tp\" (inside a node)"},
      {"scenarios.*.weights_gb", REFIT_CFG_DOUBLE, "", "GB of weights the gather would move"},
      {"scenarios.*.density", REFIT_CFG_DOUBLE, "", "changed fraction per sync (0..1]"},
      {"scenarios.*.gather_gbps", REFIT_CFG_DOUBLE, "", "bandwidth of that gather (GB/s)"},
      {"scenarios.*.transfer_gbps", REFIT_CFG_DOUBLE, "",
       "bandwidth of the delta transfer after it: network or storage write (GB/s)"},
      {"scenarios.*.node_ram_gb", REFIT_CFG_DOUBLE, "0",
       "host RAM of the gathering node (0: unknown)"},
  };
}

std::string Seconds(double s) {
  char buf[32];
  // Two significant digits below 10 ("3.3", "0.67"), whole numbers above ("33", "2000").
  std::snprintf(buf, sizeof(buf), s >= 10 ? "%.0f" : "%.2g", s);
  return buf;
}

std::string PlanScenario::Verdict(std::string* why) const {
  const double gather = full_gather_s();
  const double delta = delta_transfer_s();
  if (level == "pp") {
    // A full cross-node gather puts the whole model plus its baseline on one node, and costs
    // 1/density times the delta transfer on a network of similar speed.
    *why = "a full gather moves " + Seconds(1 / density) + "x the delta and needs " +
           Seconds(2 * weights_gb) + " GB of host RAM on one node (weights + baseline)";
    return "required";
  }
  // TP level: the node-local full all-gather is worth removing when it, not the delta transfer,
  // is the bottleneck. Within 1.5x either way the two stages are balanced.
  if (gather > 1.5 * delta) {
    *why = "the full local gather (" + Seconds(gather) + " s) is the bottleneck, " +
           Seconds(gather / delta) + "x the delta transfer";
    return "recommended";
  }
  if (gather * 1.5 >= delta) {
    *why = "the full local gather and the delta transfer are balanced";
    return "not required";
  }
  *why = "the delta transfer (" + Seconds(delta) +
         " s) dominates; a faster gather would save at "
         "most " +
         Seconds(gather - delta_gather_s()) + " s";
  return "not required";
}

Result<std::vector<PlanScenario>> LoadPlan(const Config& config) {
  REFIT_RETURN_NOT_OK(config.Validate(PlanConfigSpecs()));
  std::set<std::string> names;
  for (const auto& [key, value] : config.values()) {
    size_t first = key.find('.');
    size_t second = key.find('.', first + 1);
    if (key.compare(0, first, "scenarios") != 0 || second == std::string::npos) {
      return Status::Invalid(config.Where(key) + ": unknown key '" + key + "'");
    }
    names.insert(key.substr(first + 1, second - first - 1));
  }
  if (names.empty()) return Status::Invalid(config.label() + ": no [scenarios.<name>] tables");
  std::vector<PlanScenario> out;
  for (const std::string& name : names) {
    const std::string p = "scenarios." + name + ".";
    PlanScenario s;
    s.name = name;
    REFIT_ASSIGN_OR_RAISE(s.path, config.RequireString(p + "path"));
    REFIT_ASSIGN_OR_RAISE(s.level, config.RequireString(p + "level"));
    if (s.path != "nccl" && s.path != "disk") {
      return Status::Invalid(config.Where(p + "path") + ": path must be \"nccl\" or \"disk\"");
    }
    if (s.level != "pp" && s.level != "tp") {
      return Status::Invalid(config.Where(p + "level") + ": level must be \"pp\" or \"tp\"");
    }
    for (auto [key, dst] : {std::pair<const char*, double*>{"weights_gb", &s.weights_gb},
                            {"density", &s.density},
                            {"gather_gbps", &s.gather_gbps},
                            {"transfer_gbps", &s.transfer_gbps}}) {
      if (!config.Has(p + key)) {
        return Status::Invalid(config.label() + ": scenario '" + name + "' needs '" + key + "'");
      }
      REFIT_ASSIGN_OR_RAISE(*dst, config.GetDouble(p + key, 0));
      if (!(*dst > 0) || (std::string(key) == "density" && *dst > 1)) {
        return Status::Invalid(config.Where(p + key) + ": '" + p + key + "' must be " +
                               (std::string(key) == "density" ? "in (0, 1]" : "positive"));
      }
    }
    REFIT_ASSIGN_OR_RAISE(s.node_ram_gb, config.GetDouble(p + "node_ram_gb", 0));
    out.push_back(s);
  }
  return out;
}

Status RunPlan(const std::string& config_path) {
  REFIT_ASSIGN_OR_RAISE(Config config, LoadConfigFile(config_path));
  REFIT_ASSIGN_OR_RAISE(std::vector<PlanScenario> plan, LoadPlan(config));
  // verdicts[path][level]
  std::map<std::string, std::map<std::string, std::set<std::string>>> verdicts;
  for (const PlanScenario& s : plan) {
    std::string why;
    std::string verdict = s.Verdict(&why);
    verdicts[s.path][s.level].insert(verdict);
    const char* path = s.path == "nccl" ? "NCCL" : "Disk";
    const char* level = s.level == "pp" ? "PP" : "TP";
    std::printf("%s: %s path, %s level, %g GB at density %g%%\n", s.name.c_str(), path, level,
                s.weights_gb, 100 * s.density);
    std::printf(
        "  full gather %s s vs delta transfer %s s (full transfer %s s, delta gather %s s)\n",
        Seconds(s.full_gather_s()).c_str(), Seconds(s.delta_transfer_s()).c_str(),
        Seconds(s.full_transfer_s()).c_str(), Seconds(s.delta_gather_s()).c_str());
    std::printf("  -> %s-level sharded diff %s: %s\n", level, verdict.c_str(), why.c_str());
    if (s.node_ram_gb > 0 && 2 * s.weights_gb > s.node_ram_gb) {
      std::printf("  -> a full gather needs %s GB on one node, more than its %s GB of RAM\n",
                  Seconds(2 * s.weights_gb).c_str(), Seconds(s.node_ram_gb).c_str());
    }
  }
  // One row per path, merging the verdicts of its scenarios.
  auto merge = [](const std::set<std::string>& v) -> std::string {
    if (v.empty()) return "-";
    if (v.count("required")) return "Required";
    if (v.count("recommended")) {
      return v.count("not required") ? "Not required, but recommended" : "Recommended";
    }
    return "Not required";
  };
  std::printf("\n| Path | PP-level sharded diff | TP-level sharded diff |\n|---|---|---|\n");
  for (const char* path : {"nccl", "disk"}) {
    if (!verdicts.count(path)) continue;
    std::printf("| %s | %s | %s |\n",
                std::string(path) == "nccl" ? "NCCL: AllGather to one node -> broadcast"
                                            : "Disk: PP nodes write in parallel",
                merge(verdicts[path]["pp"]).c_str(), merge(verdicts[path]["tp"]).c_str());
  }
  return Status::OK();
}

void RegisterPlan(CLI::App& app, Commands& commands) {
  auto config = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand(
      "plan", "Recommend PP-level/TP-level sharded diff per path from a bandwidth model");
  cmd->add_option("--config", *config, "topology TOML (e.g. configs/plan-examples.toml)")
      ->required();
  commands.push_back({cmd, [config] { return RunPlan(*config); }});
}

}  // namespace refit::cli
