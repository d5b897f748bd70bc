// refit diff / apply / inspect / plugins, and the small formatting helpers.
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "commands.h"
#include "common/progress.h"
#include "format/safetensors.h"
#include "format/wire.h"
#include "refit/refit.h"

namespace refit::cli {

Result<uint64_t> ParseCount(const std::string& text) {
  if (text.empty()) return Status::Invalid("empty count");
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  std::string suffix(end);
  double scale = 1;
  if (suffix == "k" || suffix == "K")
    scale = 1e3;
  else if (suffix == "M" || suffix == "m")
    scale = 1e6;
  else if (suffix == "G" || suffix == "g" || suffix == "B")
    scale = 1e9;
  else if (!suffix.empty())
    return Status::Invalid("count '" + text + "': unknown suffix '" + suffix + "'");
  if (end == text.c_str() || !(value > 0) || value * scale > 1e13) {
    return Status::Invalid("count '" + text + "' must be a positive number like 100M");
  }
  return static_cast<uint64_t>(value * scale);
}

Result<Config> LoadConfigFile(const std::string& path) {
  Result<Config> config = Config::FromFile(path);
  if (!config.ok() && (config.status().code() == StatusCode::kNotFound ||
                       config.status().code() == StatusCode::kIoError)) {
    return Status::Invalid(config.status().message());
  }
  return config;
}

int ReportExit(const Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "refit: error: %s\n", status.message().c_str());
  return status.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

std::string HumanBytes(uint64_t bytes) {
  char buf[32];
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1000 && u < 4) {
    v /= 1000;
    ++u;
  }
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

std::string HumanCount(uint64_t n) {
  char buf[32];
  if (n >= 1000000000)
    std::snprintf(buf, sizeof(buf), "%.2fG", n / 1e9);
  else if (n >= 1000000)
    std::snprintf(buf, sizeof(buf), "%.2fM", n / 1e6);
  else if (n >= 1000)
    std::snprintf(buf, sizeof(buf), "%.1fk", n / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%" PRIu64, n);
  return buf;
}

namespace {

Result<std::unique_ptr<Config>> LoadOptionalConfig(const std::string& path) {
  if (path.empty()) return std::unique_ptr<Config>();
  REFIT_ASSIGN_OR_RAISE(Config config, LoadConfigFile(path));
  return std::make_unique<Config>(std::move(config));
}

// The optional --config, the registry it selects, and the config checked against that registry.
struct ValidatedConfig {
  std::unique_ptr<Config> config;  // null without --config
  std::shared_ptr<Registry> registry;
};

Result<ValidatedConfig> LoadValidatedConfig(const std::string& config_path) {
  ValidatedConfig setup;
  REFIT_ASSIGN_OR_RAISE(setup.config, LoadOptionalConfig(config_path));
  REFIT_ASSIGN_OR_RAISE(setup.registry, LoadRegistry(setup.config.get()));
  if (setup.config) REFIT_RETURN_NOT_OK(ValidateConfig(*setup.config, *setup.registry));
  return setup;
}

// A directory reaches mmap as "No such device"; name the mistake instead.
Status RequireFile(const std::string& role, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return Status::Invalid(role + " " + path + " is a directory, not a file");
  }
  return Status::OK();
}

// Writing the output replaces its file atomically, so an output that is also an input would
// silently destroy the input: refuse it, whether named by the same path or another link to it.
Status RefuseOutputIsInput(const std::string& out, const std::string& role,
                           const std::string& input) {
  namespace fs = std::filesystem;
  std::error_code out_ec, input_ec;
  const fs::path out_path = fs::weakly_canonical(out, out_ec);
  const fs::path input_path = fs::weakly_canonical(input, input_ec);
  bool same = !out_ec && !input_ec && out_path == input_path;
  struct stat a {
  }, b{};
  if (::stat(out.c_str(), &a) == 0 && ::stat(input.c_str(), &b) == 0) {
    same = same || (a.st_dev == b.st_dev && a.st_ino == b.st_ino);
  }
  if (same) {
    return Status::Invalid("output " + out + " is the " + role + " " + input +
                           "; write it to another file");
  }
  return Status::OK();
}

}  // namespace

Status RunDiff(const std::string& base, const std::string& next, const std::string& out,
               const std::string& encoding, const std::string& config_path) {
  REFIT_RETURN_NOT_OK(RequireFile("base", base));
  REFIT_RETURN_NOT_OK(RequireFile("new checkpoint", next));
  REFIT_RETURN_NOT_OK(RefuseOutputIsInput(out, "base", base));
  REFIT_RETURN_NOT_OK(RefuseOutputIsInput(out, "new checkpoint", next));
  REFIT_ASSIGN_OR_RAISE(ValidatedConfig setup, LoadValidatedConfig(config_path));
  internal::ProgressMeter progress("diff");
  REFIT_ASSIGN_OR_RAISE(DiffStats s, DiffFiles(base, next, out, encoding, *setup.registry,
                                               setup.config.get(), progress.Callback()));
  progress.Finish();
  const DeltaCounters& c = s.counters;
  std::printf("%s: %" PRIu64
              " tensors, %s of %s elements changed (%.3f%%), delta %s (%.4fx dense), "
              "%" PRIu64 " records\n",
              out.c_str(), s.tensors, HumanCount(c.changed_elements).c_str(),
              HumanCount(c.total_elements).c_str(), 100 * c.density(),
              HumanBytes(s.delta_bytes).c_str(),
              c.model_bytes ? static_cast<double>(s.delta_bytes) / c.model_bytes : 0.0, c.records);
  return Status::OK();
}

Status RunApply(const std::string& base, const std::string& delta, const std::string& out,
                const std::string& config_path) {
  REFIT_RETURN_NOT_OK(RequireFile("base", base));
  REFIT_RETURN_NOT_OK(RequireFile("delta", delta));
  REFIT_RETURN_NOT_OK(RefuseOutputIsInput(out, "base", base));
  REFIT_RETURN_NOT_OK(RefuseOutputIsInput(out, "delta", delta));
  REFIT_ASSIGN_OR_RAISE(ValidatedConfig setup, LoadValidatedConfig(config_path));
  internal::ProgressMeter progress("apply");
  REFIT_ASSIGN_OR_RAISE(ApplyStats s, ApplyFile(base, delta, out, *setup.registry,
                                                setup.config.get(), progress.Callback()));
  progress.Finish();
  std::printf("%s: applied %" PRIu64 " records (%s changed elements), digests verified\n",
              out.c_str(), s.counters.records, HumanCount(s.counters.changed_elements).c_str());
  return Status::OK();
}

Status RunInspect(const std::string& path, bool records) {
  REFIT_RETURN_NOT_OK(RequireFile("file", path));
  // JSON control objects (manifest, commit) are printed as they are after validation.
  std::ifstream probe(path, std::ios::binary);
  if (!probe) return Status::NotFound(path + ": cannot open");
  int first = probe.peek();
  if (first == '{') {
    std::stringstream ss;
    ss << probe.rdbuf();
    std::string text = ss.str();
    const auto* data = reinterpret_cast<const uint8_t*>(text.data());
    if (text.find(kManifestFormat) != std::string::npos) {
      REFIT_ASSIGN_OR_RAISE(Manifest m, ParseManifest(data, text.size(), path));
      std::printf("%s: manifest of version %" PRIu64
                  " (%s), rank %d/%d, %zu payloads, %s, "
                  "%s of %s elements changed\n",
                  path.c_str(), m.version, m.full ? "full" : "delta", m.rank, m.world,
                  m.payloads.size(), HumanBytes(m.payload_bytes).c_str(),
                  HumanCount(m.changed_elements).c_str(), HumanCount(m.total_elements).c_str());
      return Status::OK();
    }
    REFIT_ASSIGN_OR_RAISE(Commit c, ParseCommit(data, text.size(), path));
    std::printf("%s: commit of version %" PRIu64 " (%s), world %d\n", path.c_str(), c.version,
                c.full ? "full" : "delta", c.world);
    return Status::OK();
  }
  probe.close();
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
  auto fmt = file->metadata().find("refit.format");
  if (fmt == file->metadata().end()) {
    uint64_t elements = 0, bytes = 0;
    for (const TensorView& t : file->tensors()) {
      elements += t.num_elements();
      bytes += t.nbytes();
    }
    std::printf("%s: safetensors checkpoint, %zu tensors, %s elements, %s\n", path.c_str(),
                file->tensors().size(), HumanCount(elements).c_str(), HumanBytes(bytes).c_str());
    for (const TensorView& t : file->tensors()) {
      std::printf("  %-60s %-8s %s\n", t.name.c_str(), std::string(NameOf(t.dtype)).c_str(),
                  ShapeToString(t.shape).c_str());
    }
    return Status::OK();
  }
  // Delta or payload: reparse the same bytes as a payload (validates every record).
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  REFIT_ASSIGN_OR_RAISE(Payload p, Payload::Parse(bytes.data(), bytes.size(), path));
  uint64_t changed = 0;
  for (const RecordHeader& r : p.records()) changed += r.changed;
  std::printf("%s: %s, %zu records, %s changed elements, %s\n", path.c_str(), fmt->second.c_str(),
              p.records().size(), HumanCount(changed).c_str(), HumanBytes(bytes.size()).c_str());
  for (const auto& [key, value] : p.metadata()) {
    if (key == "refit.records" || key == "refit.tensors") continue;
    std::printf("  %s = %s\n", key.c_str(), value.c_str());
  }
  if (records) {
    for (size_t i = 0; i < p.records().size(); ++i) {
      const RecordHeader& r = p.records()[i];
      std::printf(
          "  [%zu] %s %s%s box+%s%s %s/%s changed=%" PRIu64 " bytes=%" PRIu64 " digest=%s\n", i,
          r.tensor.c_str(), std::string(NameOf(r.dtype)).c_str(), ShapeToString(r.shape).c_str(),
          ShapeToString(r.box_offset).c_str(), ShapeToString(r.box_extent).c_str(),
          r.encoding.c_str(), r.op == REFIT_OP_OVERWRITE ? "overwrite" : "xor", r.changed,
          r.data_end - r.data_begin, HexDigest(r.digest).c_str());
    }
  }
  return Status::OK();
}

namespace {

void PrintKeys(const char* kind, const std::string& name, const std::vector<ConfigKeySpec>& keys) {
  for (const ConfigKeySpec& k : keys) {
    std::printf("%-10s   [%s.%s] %s = %s  %s\n", "", kind, name.c_str(), k.name.c_str(),
                k.default_value.empty() ? "(required)" : k.default_value.c_str(),
                k.description.c_str());
  }
}

}  // namespace

Status RunPlugins(const std::string& config_path) {
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<Config> config, LoadOptionalConfig(config_path));
  REFIT_ASSIGN_OR_RAISE(std::shared_ptr<Registry> registry, LoadRegistry(config.get()));
  std::printf("%-10s %-16s %-10s %-24s %s\n", "kind", "name", "version", "origin", "description");
  for (const ComponentInfo* c : registry->List()) {
    std::printf("%-10s %-16s %-10s %-24s %s\n", KindName(c->kind), c->name.c_str(),
                c->plugin_version.c_str(), c->origin.c_str(), c->description.c_str());
    PrintKeys(KindName(c->kind), c->name, c->config_keys);
  }
  // `auto` lives in the framework (it runs the other encodings), not in a plugin.
  std::printf("%-10s %-16s %-10s %-24s %s\n", "encoding", "auto", "-", "framework",
              "per record, the smallest, the fastest within a budget, or (mode link) the "
              "predicted cheapest over the link of its candidates");
  std::vector<ConfigKeySpec> auto_keys;
  const std::string prefix = "encoding.auto.";
  for (ConfigKeySpec k : FrameworkConfigSpecs()) {
    if (k.name.rfind(prefix, 0) != 0) continue;
    k.name = k.name.substr(prefix.size());
    auto_keys.push_back(std::move(k));
  }
  PrintKeys("encoding", "auto", auto_keys);
  return Status::OK();
}

void RegisterOffline(CLI::App& app, Commands& commands) {
  // One set of values: only one subcommand runs.
  struct Flags {
    std::string base, next, out, delta, encoding = "auto", config_path, inspect_path;
    bool inspect_records = false;
  };
  auto f = std::make_shared<Flags>();
  auto* diff_cmd = app.add_subcommand("diff", "Write the delta from BASE to NEW (safetensors)");
  diff_cmd->add_option("BASE", f->base, "base checkpoint")->required();
  diff_cmd->add_option("NEW", f->next, "new checkpoint")->required();
  diff_cmd->add_option("-o,--output", f->out, "delta file to write")->required();
  diff_cmd->add_option("--encoding", f->encoding, "encoding of changed records")
      ->capture_default_str();
  diff_cmd->add_option("--config", f->config_path, "TOML config (plugins, encoding settings)");
  commands.push_back(
      {diff_cmd, [f] { return RunDiff(f->base, f->next, f->out, f->encoding, f->config_path); }});

  auto* apply_cmd = app.add_subcommand("apply", "Apply DELTA to BASE, writing OUT atomically");
  apply_cmd->add_option("BASE", f->base, "base checkpoint")->required();
  apply_cmd->add_option("DELTA", f->delta, "delta from `refit diff`")->required();
  apply_cmd->add_option("-o,--output", f->out, "checkpoint to write")->required();
  apply_cmd->add_option("--config", f->config_path, "TOML config (plugins)");
  commands.push_back(
      {apply_cmd, [f] { return RunApply(f->base, f->delta, f->out, f->config_path); }});

  auto* inspect_cmd =
      app.add_subcommand("inspect", "Describe a checkpoint, delta, payload or manifest");
  inspect_cmd->add_option("FILE", f->inspect_path, "file to describe")->required();
  inspect_cmd->add_flag("--records", f->inspect_records, "list every record of a delta/payload");
  commands.push_back(
      {inspect_cmd, [f] { return RunInspect(f->inspect_path, f->inspect_records); }});

  auto* plugins_cmd = app.add_subcommand("plugins", "List encodings, transports and layouts");
  plugins_cmd->add_option("--config", f->config_path, "TOML config whose [plugins] to load too");
  commands.push_back({plugins_cmd, [f] { return RunPlugins(f->config_path); }});
}

}  // namespace refit::cli
