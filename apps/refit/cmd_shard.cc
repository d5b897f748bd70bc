// refit shard: cut a HuggingFace checkpoint into one safetensors file per rank of a layout
// (megatron, fsdp, vllm, or any layout plugin with list_local), so multi-rank syncs can be driven
// from real files. Every local tensor is filled through the layout's own map_tensor slices, so the
// files are exactly what the layout maps back; padding (vocab rows past the vocabulary) is zero.
// Tensors are written one at a time: the input stays mmap'd and at most one local tensor (plus one
// slice) is in memory.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "commands.h"
#include "common/box.h"
#include "common/file_util.h"
#include "common/progress.h"
#include "format/safetensors.h"
#include "layout/hf_names.h"
#include "refit/config.h"
#include "refit/registry.h"

namespace refit::cli {

namespace {

namespace fs = std::filesystem;

// The model description read off the checkpoint's names and shapes (keys of the layouts' config
// sections). num_heads cannot always be inferred: q_proj's rows are num_heads * head_dim, and only
// a q_norm (Qwen3) or a flag pins head_dim.
Result<std::map<std::string, int64_t>> InferModel(const SafetensorsFile& file,
                                                  const ShardOptions& options) {
  std::map<std::string, int64_t> keys;
  uint64_t layers = 0, q_rows = 0, kv_rows = 0, head_dim = 0, ffn = 0, moe_ffn = 0, experts = 0;
  bool has_layers = false;
  for (const TensorView& t : file.tensors()) {
    const std::optional<layouts::HfName> hf = layouts::ParseHfName(t.name);
    if (!hf) continue;
    if (layouts::IsPerLayer(hf->kind)) {
      layers = std::max(layers, hf->layer + 1);
      has_layers = true;
    }
    // Each size is read off the first tensor of its kind: the rows of its first dimension.
    uint64_t* rows = nullptr;
    switch (hf->kind) {
      case layouts::HfKind::kQ:
        rows = &q_rows;
        break;
      case layouts::HfKind::kK:
        rows = &kv_rows;
        break;
      case layouts::HfKind::kQNorm:
        rows = &head_dim;
        break;
      case layouts::HfKind::kRouter:
        rows = &experts;
        break;
      case layouts::HfKind::kExpertGate:
        rows = &moe_ffn;
        break;
      case layouts::HfKind::kGate:
        rows = &ffn;
        break;
      default:
        break;
    }
    if (rows != nullptr && *rows == 0 && !t.shape.empty()) *rows = t.shape[0];
  }
  if (const TensorView* embed = file.Find(layouts::HfTensorName(layouts::HfKind::kEmbed));
      embed != nullptr && embed->shape.size() == 2) {
    keys["vocab"] = static_cast<int64_t>(embed->shape[0]);
    keys["hidden"] = static_cast<int64_t>(embed->shape[1]);
    keys["tie_word_embeddings"] =
        file.Find(layouts::HfTensorName(layouts::HfKind::kLmHead)) == nullptr ? 1 : 0;
  }
  if (has_layers) keys["num_layers"] = static_cast<int64_t>(layers);
  if (options.head_dim > 0) head_dim = static_cast<uint64_t>(options.head_dim);
  uint64_t heads = options.num_heads > 0 ? static_cast<uint64_t>(options.num_heads) : 0;
  if (heads > 0 && head_dim == 0 && q_rows > 0) {
    if (q_rows % heads != 0) {
      return Status::Invalid(file.path() + ": q_proj has " + std::to_string(q_rows) +
                             " rows, not a multiple of num_heads " + std::to_string(heads) +
                             " (--num-heads or config.json)");
    }
    head_dim = q_rows / heads;
  }
  if (heads == 0 && head_dim > 0 && q_rows % head_dim == 0) heads = q_rows / head_dim;
  if (heads > 0) keys["num_heads"] = static_cast<int64_t>(heads);
  if (head_dim > 0) keys["head_dim"] = static_cast<int64_t>(head_dim);
  if (options.num_kv_heads > 0) {
    keys["num_kv_heads"] = options.num_kv_heads;
  } else if (head_dim > 0 && kv_rows > 0 && kv_rows % head_dim == 0) {
    keys["num_kv_heads"] = static_cast<int64_t>(kv_rows / head_dim);
  }
  if (ffn == 0) ffn = moe_ffn;  // an all-MoE model has no dense MLP
  if (ffn > 0) keys["ffn"] = static_cast<int64_t>(ffn);
  if (moe_ffn > 0) keys["moe_ffn"] = static_cast<int64_t>(moe_ffn);
  if (experts > 0) keys["num_experts"] = static_cast<int64_t>(experts);
  return keys;
}

bool Declares(const ComponentInfo& info, const std::string& key) {
  for (const ConfigKeySpec& spec : info.config_keys) {
    if (spec.name == key) return true;
  }
  return false;
}

// A parallel size from its flag (0: not given) or the config; both given must agree.
Result<int64_t> ParallelSize(const Config& config, const std::string& section,
                             const std::string& key, int flag) {
  const std::string full = section + "." + key;
  REFIT_ASSIGN_OR_RAISE(int64_t from_config, config.GetInt(full, 0));
  if (flag > 0 && from_config > 0 && flag != from_config) {
    return Status::Invalid("--" + key + " " + std::to_string(flag) + " contradicts " + full +
                           " = " + std::to_string(from_config) + " (" + config.Where(full) + ")");
  }
  if (flag < 0) return Status::Invalid("--" + key + " must be at least 1");
  return flag > 0 ? flag : (from_config > 0 ? from_config : 1);
}

// The local tensor's bits: zeros (padding), then every slice the layout maps copied in from the
// canonical tensor. The slices are checked against both tensors first: a layout plugin's output is
// not trusted to stay in bounds.
Status FillLocal(const SafetensorsFile& canonical, const TensorSpec& local,
                 const std::vector<SliceMap>& slices, std::vector<uint8_t>* out) {
  const uint32_t elem = SizeOf(local.dtype);
  REFIT_ASSIGN_OR_RAISE(uint64_t n, NumElements(local.shape));
  out->assign(n * elem, 0);
  std::vector<uint8_t> box_bits;
  for (const SliceMap& s : slices) {
    const TensorView* src = canonical.Find(s.canonical_name);
    const std::string what = "'" + local.name + "' <- '" + s.canonical_name + "'";
    if (src == nullptr) return Status::Internal(what + ": no such tensor in " + canonical.path());
    if (src->dtype != local.dtype) return Status::Internal(what + ": dtypes differ");
    if (s.map.ndim != src->shape.size() || s.map.ndim != local.shape.size()) {
      return Status::Internal(what + ": the slice has " + std::to_string(s.map.ndim) + " dims");
    }
    Box from, to;
    for (uint32_t d = 0; d < s.map.ndim; ++d) {
      const uint64_t extent = s.map.extent[d];
      if (s.map.canonical_shape[d] != src->shape[d] || extent > src->shape[d] ||
          s.map.canonical_offset[d] > src->shape[d] - extent || extent > local.shape[d] ||
          s.map.local_offset[d] > local.shape[d] - extent) {
        return Status::Internal(what + ": the slice is out of bounds in dim " + std::to_string(d));
      }
      from.offset.push_back(s.map.canonical_offset[d]);
      to.offset.push_back(s.map.local_offset[d]);
      from.extent.push_back(extent);
      to.extent.push_back(extent);
    }
    box_bits.resize(BoxElements(from) * elem);
    GatherBox(src->bytes(), src->shape, from, elem, box_bits.data());
    ScatterBox(box_bits.data(), local.shape, to, elem, out->data());
  }
  return Status::OK();
}

// The ABI view of a listed tensor (name points into t: valid while t lives).
refit_local_tensor_t ToLocal(const TensorSpec& t) {
  refit_local_tensor_t local{};
  local.struct_size = sizeof(local);
  local.dtype = static_cast<int32_t>(t.dtype);
  local.name = t.name.c_str();
  local.ndim = static_cast<uint32_t>(t.shape.size());
  for (size_t d = 0; d < t.shape.size() && d < REFIT_MAX_DIMS; ++d) local.shape[d] = t.shape[d];
  return local;
}

// Writes one rank's file atomically: a reader never sees half a shard.
Status WriteShard(const SafetensorsFile& canonical, const Layout& layout,
                  const std::vector<TensorSpec>& locals, const Metadata& metadata,
                  const std::string& path, internal::ProgressMeter& progress) {
  std::vector<TensorView> views;
  for (const TensorSpec& t : locals) views.push_back(TensorView{t.name, t.dtype, t.shape, nullptr});
  REFIT_ASSIGN_OR_RAISE(SafetensorsLayout plan, PlanSafetensors(views, metadata));
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<internal::AtomicFile> out,
                        internal::AtomicFile::Create(path));
  REFIT_RETURN_NOT_OK(
      out->Write(reinterpret_cast<const uint8_t*>(plan.header.data()), plan.header.size()));
  uint64_t written = 0;
  std::vector<uint8_t> bits;
  for (size_t i = 0; i < locals.size(); ++i) {
    const TensorSpec& t = locals[i];
    if (plan.offsets[i] != written) {
      return Status::Internal(path + ": tensors are not laid out back to back");
    }
    REFIT_ASSIGN_OR_RAISE(std::vector<SliceMap> slices, layout.MapTensor(ToLocal(t)));
    REFIT_RETURN_NOT_OK(
        FillLocal(canonical, t, slices, &bits).WithContext("layout '" + layout.name() + "'"));
    REFIT_RETURN_NOT_OK(out->Write(bits.data(), bits.size()));
    written += bits.size();
    progress.Add(bits.size());
  }
  return out->Commit();
}

Result<const ComponentInfo*> FindLayout(const Registry& registry, const std::string& name) {
  const ComponentInfo* info = registry.Find(REFIT_KIND_LAYOUT, name);
  if (info != nullptr) return info;
  std::string known;
  for (const ComponentInfo* c : registry.List()) {
    if (c->kind == REFIT_KIND_LAYOUT) known += (known.empty() ? "" : ", ") + c->name;
  }
  return Status::Invalid("unknown layout '" + name + "' (known: " + known + ")");
}

// How the ranks split the model: tp * pp * ep of them, or --world for layouts without a tp split.
struct ShardGrid {
  int64_t tp = 1, pp = 1, ep = 1;
  int64_t world = 1;
  bool rank_names = false;  // files named rank{r} (fsdp, hf), else tp{t}_pp{p}[_ep{e}]
};

// Parallel sizes: flags, else the config (which is updated to match). A layout without pp/ep keys
// has no such split.
Result<ShardGrid> ResolveGrid(const ComponentInfo& info, const ShardOptions& options,
                              const std::string& section, Config* config) {
  ShardGrid grid;
  int64_t* sizes[3] = {&grid.tp, &grid.pp, &grid.ep};
  const char* size_keys[3] = {"tp", "pp", "ep"};
  const int size_flags[3] = {options.tp, options.pp, options.ep};
  for (int i = 0; i < 3; ++i) {
    if (Declares(info, size_keys[i])) {
      REFIT_ASSIGN_OR_RAISE(*sizes[i], ParallelSize(*config, section, size_keys[i], size_flags[i]));
      config->SetInt(section + "." + size_keys[i], *sizes[i]);
    } else if (size_flags[i] > 1) {
      return Status::Invalid("layout '" + options.layout + "' has no " + size_keys[i] +
                             " split (--" + size_keys[i] + " must be 1)");
    }
  }
  grid.rank_names = !Declares(info, "tp");
  grid.world = grid.tp * grid.pp * grid.ep;
  if (options.world > 0) {
    if (!grid.rank_names && options.world != grid.world) {
      return Status::Invalid("--world " + std::to_string(options.world) +
                             " is not tp * pp * ep = " + std::to_string(grid.world));
    }
    grid.world = options.world;
  }
  if (grid.rank_names && options.world <= 0) {
    return Status::Invalid("layout '" + options.layout + "' needs --world N (the number of ranks)");
  }
  if (grid.world > 65536) {
    return Status::Invalid("world size " + std::to_string(grid.world) + " is too large");
  }
  return grid;
}

// A positive integer under `key` of a HuggingFace config.json (0: absent or null).
Result<int64_t> HfConfigInt(const nlohmann::json& j, const char* key, const std::string& path) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return 0;
  if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
    std::string got = it->dump();
    if (got.size() > 40) got = got.substr(0, 40) + "...";
    return Status::Invalid(path + ": " + key + " must be a positive integer, not " + got);
  }
  return it->get<int64_t>();
}

// The HuggingFace config.json beside the checkpoint; an empty object when there is none.
Result<nlohmann::json> ReadHfConfig(const std::string& input, std::string* path) {
  *path = (fs::path(input).parent_path() / "config.json").string();
  Result<std::string> text = internal::ReadSmallFile(*path, 16 << 20);
  if (text.status().code() == StatusCode::kNotFound) return nlohmann::json::object();
  REFIT_RETURN_NOT_OK(text.status());
  nlohmann::json j = nlohmann::json::parse(text.value(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Invalid(*path + ": not valid JSON");
  if (!j.is_object()) return Status::Invalid(*path + ": not a JSON object (a HuggingFace config)");
  return j;
}

// The options with the attention shape resolved: a flag, else the TOML config, else the
// config.json beside the checkpoint (num_attention_heads, num_key_value_heads, head_dim); shapes
// alone cannot tell heads from head_dim, nor so grouped-query kv heads. A flag that contradicts
// the TOML config is an error.
Result<ShardOptions> ResolveHeads(const ShardOptions& options, const Config& config,
                                  const std::string& section) {
  std::string path;
  REFIT_ASSIGN_OR_RAISE(nlohmann::json hf, ReadHfConfig(options.input, &path));
  ShardOptions out = options;
  const struct {
    const char* flag;
    const char* key;
    const char* hf_key;
    int64_t* value;
  } keys[] = {{"--num-heads", "num_heads", "num_attention_heads", &out.num_heads},
              {"--num-kv-heads", "num_kv_heads", "num_key_value_heads", &out.num_kv_heads},
              {"--head-dim", "head_dim", "head_dim", &out.head_dim}};
  for (const auto& k : keys) {
    const std::string full = section + "." + k.key;
    REFIT_ASSIGN_OR_RAISE(int64_t from_config, config.GetInt(full, 0));
    REFIT_ASSIGN_OR_RAISE(int64_t from_hf, HfConfigInt(hf, k.hf_key, path));
    if (*k.value > 0 && from_config > 0 && *k.value != from_config) {
      return Status::Invalid(std::string(k.flag) + " " + std::to_string(*k.value) +
                             " contradicts " + full + " = " + std::to_string(from_config) + " (" +
                             config.Where(full) + ")");
    }
    if (*k.value == 0) *k.value = from_config > 0 ? from_config : from_hf;
  }
  return out;
}

// The model description: what the config leaves unset is read off the checkpoint.
Status DescribeModel(const SafetensorsFile& file, const ComponentInfo& info,
                     const ShardOptions& options, const std::string& section, Config* config) {
  REFIT_ASSIGN_OR_RAISE(auto inferred, InferModel(file, options));
  for (const auto& [key, value] : inferred) {
    const std::string full = section + "." + key;
    if (!Declares(info, key) || config->Has(full)) continue;
    if (key == "tie_word_embeddings") {
      ConfigValue v;
      v.type = REFIT_CFG_BOOL;
      v.bool_value = value != 0;
      config->Set(full, v);
    } else {
      config->SetInt(full, value);
    }
  }
  if (Declares(info, "num_heads") && !config->Has(section + ".num_heads")) {
    return Status::Invalid(options.input +
                           ": cannot infer num_heads from the shapes (q_proj rows = "
                           "num_heads * head_dim) and no config.json beside it gives "
                           "num_attention_heads: pass --num-heads (and --num-kv-heads for "
                           "grouped-query attention) or set " +
                           section + ".num_heads");
  }
  if (Declares(info, "shapes_from") && !config->Has(section + ".shapes_from")) {
    config->SetString(section + ".shapes_from", options.input);
  }
  return Status::OK();
}

// Everything one run needs to make every rank's layout.
struct ShardRun {
  const ShardOptions& options;
  const Registry& registry;
  const Config& config;
  const std::string& section;
  const ShardGrid& grid;
  internal::ProgressMeter& progress;  // bytes of every rank's files

  Result<std::unique_ptr<Layout>> MakeLayout(int64_t rank) const {
    return registry.CreateLayout(options.layout, static_cast<int>(rank),
                                 static_cast<int>(grid.world), &config, section);
  }
};

// A dry run over every rank before any file is written: a canonical tensor no rank holds would
// make shards that can never reproduce the checkpoint. (Layouts are re-created and re-mapped when
// writing rather than kept: mapping is cheap, and all ranks' slices can be large.) Returns the
// bytes of tensors all the files will hold.
Result<uint64_t> CheckEveryTensorHeld(const ShardRun& run,
                                      const std::vector<TensorSpec>& canonical) {
  std::set<std::string> held;
  uint64_t bytes = 0;
  for (int64_t r = 0; r < run.grid.world; ++r) {
    REFIT_ASSIGN_OR_RAISE(std::unique_ptr<Layout> layout, run.MakeLayout(r));
    Result<std::vector<TensorSpec>> locals = layout->ListLocal(canonical);
    if (!locals.ok()) return locals.status().WithContext(run.options.input);
    for (const TensorSpec& t : locals.value()) {
      REFIT_ASSIGN_OR_RAISE(std::vector<SliceMap> slices, layout->MapTensor(ToLocal(t)));
      for (const SliceMap& s : slices) held.insert(s.canonical_name);
      REFIT_ASSIGN_OR_RAISE(uint64_t n, NumElements(t.shape));
      bytes += n * SizeOf(t.dtype);
    }
  }
  for (const TensorSpec& t : canonical) {
    REFIT_ASSIGN_OR_RAISE(uint64_t n, NumElements(t.shape));
    if (n > 0 && held.count(t.name) == 0) {
      return Status::Invalid(run.options.input + ": tensor '" + t.name +
                             "' is held by no rank of layout '" + run.options.layout + "'");
    }
  }
  return bytes;
}

// Writes rank r's file (named and labeled after its place in the grid) and prints a line for it.
Status WriteRank(const ShardRun& run, const SafetensorsFile& file,
                 const std::vector<TensorSpec>& canonical, int64_t r) {
  const int rank = static_cast<int>(r);
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<Layout> layout, run.MakeLayout(r));
  Result<std::vector<TensorSpec>> locals = layout->ListLocal(canonical);
  if (!locals.ok()) return locals.status().WithContext(run.options.input);
  Metadata metadata = {{"refit.layout", run.options.layout},
                       {"refit.rank", std::to_string(rank)},
                       {"refit.world", std::to_string(run.grid.world)},
                       {"refit.source", fs::path(run.options.input).filename().string()}};
  std::string name = "rank" + std::to_string(rank);
  if (!run.grid.rank_names) {
    const int64_t tp = run.grid.tp, ep = run.grid.ep;
    const int64_t t = r % tp, e = r / tp % ep, p = r / (tp * ep);
    name = "tp" + std::to_string(t) + "_pp" + std::to_string(p);
    if (ep > 1) name += "_ep" + std::to_string(e);
    metadata["refit.tp_rank"] = std::to_string(t);
    metadata["refit.pp_rank"] = std::to_string(p);
    metadata["refit.ep_rank"] = std::to_string(e);
  }
  const std::string path = (fs::path(run.options.out_dir) / (name + ".safetensors")).string();
  REFIT_RETURN_NOT_OK(WriteShard(file, *layout, locals.value(), metadata, path, run.progress));
  uint64_t bytes = 0;
  for (const TensorSpec& t : locals.value()) {
    REFIT_ASSIGN_OR_RAISE(uint64_t n, NumElements(t.shape));
    bytes += n * SizeOf(t.dtype);
  }
  run.progress.Erase();  // the line below goes to the same terminal
  std::printf("%s: rank %d, %zu tensors, %s\n", path.c_str(), rank, locals.value().size(),
              HumanBytes(bytes).c_str());
  return Status::OK();
}

// The outermost directory of `dir` that does not exist yet ("" when `dir` exists).
std::string FirstMissingDir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path missing;
  for (fs::path p = fs::absolute(dir, ec); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    missing = p;
    if (p == p.parent_path()) break;
  }
  return missing.string();
}

}  // namespace

Status RunShard(const ShardOptions& options) {
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<SafetensorsFile> file,
                        SafetensorsFile::Open(options.input));
  Config config;
  if (!options.config_path.empty()) {
    REFIT_ASSIGN_OR_RAISE(config, LoadConfigFile(options.config_path));
  }
  REFIT_ASSIGN_OR_RAISE(std::shared_ptr<Registry> registry, LoadRegistry(&config));
  REFIT_ASSIGN_OR_RAISE(const ComponentInfo* info, FindLayout(*registry, options.layout));
  const std::string section = "layout." + options.layout;
  REFIT_ASSIGN_OR_RAISE(ShardGrid grid, ResolveGrid(*info, options, section, &config));
  REFIT_ASSIGN_OR_RAISE(ShardOptions described, ResolveHeads(options, config, section));
  REFIT_RETURN_NOT_OK(DescribeModel(*file, *info, described, section, &config));

  std::vector<TensorSpec> canonical;
  for (const TensorView& t : file->tensors()) canonical.push_back({t.name, t.dtype, t.shape});
  // A failed run removes the directories it created, so a retry does not find a half-written (or
  // empty) output that looks like a result.
  const std::string created = FirstMissingDir(options.out_dir);
  REFIT_RETURN_NOT_OK(internal::MakeDirs(options.out_dir));
  internal::ProgressMeter progress("shard");
  const ShardRun run{options, *registry, config, section, grid, progress};
  Result<uint64_t> total = CheckEveryTensorHeld(run, canonical);
  Status written = total.status();
  if (written.ok()) progress.Update(0, total.value());
  for (int64_t r = 0; r < grid.world && written.ok(); ++r) {
    written = WriteRank(run, *file, canonical, r);
  }
  progress.Finish();
  if (!written.ok()) {
    std::error_code ec;
    if (!created.empty()) std::filesystem::remove_all(created, ec);
    return written;
  }
  std::printf("%s: %" PRId64 " shards (layout %s) in %s\n", options.input.c_str(), grid.world,
              options.layout.c_str(), options.out_dir.c_str());
  return Status::OK();
}

void RegisterShard(CLI::App& app, Commands& commands) {
  auto shard = std::make_shared<ShardOptions>();
  auto* cmd = app.add_subcommand(
      "shard", "Cut a HuggingFace checkpoint into one safetensors file per rank of a layout");
  cmd->add_option("HF", shard->input, "HuggingFace checkpoint (.safetensors)")->required();
  cmd->add_option("--layout", shard->layout, "megatron, fsdp or vllm (docs/layouts.md)")
      ->required();
  // 0 stands for "not given" in ShardOptions, so a 0 the user typed must be refused here.
  cmd->add_option("--tp", shard->tp, "tensor-parallel size (default: config, else 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--pp", shard->pp, "pipeline-parallel size (megatron)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--ep", shard->ep, "expert-parallel size (megatron MoE)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--world", shard->world, "number of ranks (fsdp)")->check(CLI::PositiveNumber);
  cmd->add_option("--num-heads", shard->num_heads, "attention heads, when not inferable");
  cmd->add_option("--num-kv-heads", shard->num_kv_heads, "key/value heads (default: inferred)");
  cmd->add_option("--head-dim", shard->head_dim, "rows per head (default: inferred)");
  cmd->add_option("--config", shard->config_path,
                  "TOML with [layout.<name>] model description keys and [plugins]");
  cmd->add_option("-o,--output", shard->out_dir, "directory for the shard files")->required();
  cmd->footer(
      "Files: tp{t}_pp{p}[_ep{e}].safetensors (rank = pp*tp*ep + ep*tp + tp), fsdp: "
      "rank{r}.safetensors.\nThe model description (num_layers, hidden, ffn, vocab, experts, "
      "heads) is read off the checkpoint;\nheads, kv heads and head_dim from the config.json "
      "beside it when present (flags and --config win);\nelse num_heads needs --num-heads unless "
      "a q_norm gives head_dim.");
  commands.push_back({cmd, [shard] { return RunShard(*shard); }});
}

}  // namespace refit::cli
