// refit bench e2e: the whole sync measured end to end. This process is the sender; N receivers are
// real `refit recv --follow` child processes, each with its own state dir; every transport
// instance (the sender's and each receiver's: one connection each) may be held to a bandwidth by
// the link emulation ([transport] bandwidth). Per sync: the time from the start of the publish
// until the last receiver acknowledged (watched through the sender's own transport instance),
// and each stage measured alone (the codec, a put and a get of the payload's bytes through a
// fresh link, on a channel of its own over ucx, the receivers' apply); at the end every
// receiver's model is checked bit for bit against the sender's weights.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "commands.h"
#include "common/progress.h"
#include "common/stopwatch.h"
#include "format/model_file.h"
#include "format/safetensors.h"
#include "format/wire.h"
#include "link/link.h"
#include "offline/delta_internal.h"
#include "refit/delta.h"
#include "refit/refit.h"
#include "synthetic/synthetic.h"

namespace refit::cli {

namespace {

using internal::Stopwatch;
using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

struct BenchE2eOptions {
  uint64_t size_bytes = 1ull << 30;  // synthetic model (bf16)
  double lr = 1e-6;
  std::vector<std::string> weights;  // a trajectory of safetensors files instead
  int receivers = 1;
  std::string transport;  // empty: the config's, else disk
  std::string config_path;
  std::optional<uint64_t> bandwidth;  // bytes per second per connection; unset: the config's
  std::string encoding;               // empty: the config's, else the sender's default
  int syncs = 4;                      // the first one full
  std::string dir;
  int threads = 0;  // sender and receiver threads; 0: their defaults
  double timeout_s = 600;
  bool json = false;
  uint64_t seed = 1;
  // Receivers hold the model in memory, attached as an engine's parameters are, not in a file.
  bool in_memory = false;
};

// ------------------------------------------------------------------ the weights

// What the sender publishes, version after version: the synthetic model stepped at lr, or the
// files of a trajectory. previous() is the version before current(), for the codec alone.
class Trajectory {
 public:
  static Result<std::unique_ptr<Trajectory>> Make(const BenchE2eOptions& o) {
    auto t = std::unique_ptr<Trajectory>(new Trajectory());
    t->lr_ = o.lr;
    if (o.weights.empty()) {
      t->model_ = std::make_unique<SyntheticModel>(
          SyntheticModelSpec::ForParams(std::max<uint64_t>(o.size_bytes / 2, 1), o.seed));
    } else {
      t->paths_ = o.weights;
      REFIT_ASSIGN_OR_RAISE(t->current_file_, SafetensorsFile::Open(t->paths_[0]));
    }
    return t;
  }

  const std::vector<TensorView>& current() const {
    return model_ ? model_->bf16() : current_file_->tensors();
  }
  const std::vector<TensorView>& previous() const {
    return model_ ? previous_views_ : previous_file_->tensors();
  }
  uint64_t model_bytes() const {
    uint64_t bytes = 0;
    for (const TensorView& t : current()) bytes += t.nbytes();
    return bytes;
  }
  std::string Describe() const {
    char lr[32];
    std::snprintf(lr, sizeof(lr), "%g", lr_);
    return model_ ? "synthetic, lr " + std::string(lr)
                  : std::to_string(paths_.size()) + " safetensors files";
  }

  // Moves to the next version, keeping the current one as previous().
  Status Advance() {
    if (!model_) {
      if (index_ + 1 >= paths_.size()) return Status::Internal("the trajectory has no more files");
      previous_file_ = std::move(current_file_);
      REFIT_ASSIGN_OR_RAISE(current_file_, SafetensorsFile::Open(paths_[++index_]));
      return Status::OK();
    }
    const std::vector<TensorView>& now = model_->bf16();
    previous_storage_.resize(now.size());
    previous_views_ = now;
    for (size_t i = 0; i < now.size(); ++i) {
      previous_storage_[i].assign(now[i].bytes(), now[i].bytes() + now[i].nbytes());
      previous_views_[i].data = previous_storage_[i].data();
    }
    model_->Step(lr_);
    return Status::OK();
  }

 private:
  Trajectory() = default;
  double lr_ = 0;
  std::unique_ptr<SyntheticModel> model_;
  std::vector<std::vector<uint8_t>> previous_storage_;
  std::vector<TensorView> previous_views_;
  std::vector<std::string> paths_;
  size_t index_ = 0;
  std::unique_ptr<SafetensorsFile> current_file_, previous_file_;
};

// ------------------------------------------------------------------ the configs

std::string TomlString(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\u%04x", c);
      out += esc;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string TomlKey(const std::string& component) {
  const bool bare =
      !component.empty() && std::all_of(component.begin(), component.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
      });
  return bare ? component : TomlString(component);
}

std::string TomlValue(const ConfigValue& v) {
  switch (v.type) {
    case REFIT_CFG_INT:
      return std::to_string(v.int_value);
    case REFIT_CFG_BOOL:
      return v.bool_value ? "true" : "false";
    case REFIT_CFG_DOUBLE: {
      char buf[40];
      std::snprintf(buf, sizeof(buf), "%.17g", v.double_value);
      std::string text = buf;
      if (text.find_first_of(".eni") == std::string::npos) text += ".0";  // stays a float
      return text;
    }
    case REFIT_CFG_STRING_LIST: {
      std::string out = "[";
      for (const std::string& item : v.list_value)
        out += (out.size() > 1 ? ", " : "") + TomlString(item);
      return out + "]";
    }
    default:
      return TomlString(v.string_value);
  }
}

// The config as a TOML file: each table once, its keys below it.
std::string ConfigToToml(const Config& config) {
  std::map<std::string, std::string> tables;  // "transport.disk" -> its "key = value" lines
  for (const auto& [key, value] : config.values()) {
    const size_t dot = key.rfind('.');
    std::string table;
    for (size_t at = 0, next; at < dot; at = next + 1) {
      next = std::min(key.find('.', at), dot);
      table += (table.empty() ? "" : ".") + TomlKey(key.substr(at, next - at));
    }
    tables[table] += TomlKey(key.substr(dot + 1)) + " = " + TomlValue(value) + "\n";
  }
  std::string text = "# written by `refit bench e2e`\n";
  for (const auto& [table, lines] : tables) text += "\n[" + table + "]\n" + lines;
  return text;
}

void SetValue(Config& config, const std::string& key, refit_config_type_t type, int64_t number) {
  ConfigValue v;
  v.type = type;
  v.int_value = number;
  v.bool_value = number != 0;
  config.Set(key, std::move(v));
}

// [plugins] paths are relative to the config file: the receivers' copies live elsewhere.
void AbsolutePluginPaths(Config& config, const std::string& config_path) {
  const fs::path base = fs::absolute(config_path).parent_path();
  for (const char* key : {"plugins.paths", "plugins.load"}) {
    const ConfigValue* found = config.Find(key);
    if (found == nullptr || found->type != REFIT_CFG_STRING_LIST) continue;
    ConfigValue v = *found;
    for (std::string& p : v.list_value) {
      if (!p.empty() && fs::path(p).is_relative()) p = (base / p).lexically_normal().string();
    }
    config.Set(key, std::move(v));
  }
}

std::string ReceiverId(int index) { return "r" + std::to_string(index); }

// The config of the stage probes' links. Over ucx a probe link of the sync's channel would be a
// second sender of its spool (taking its rendezvous file from the sender): the probes get a
// channel of their own, on any free port, with no receivers to wait for.
Config ProbeConfig(const Config& config, const std::string& transport, const std::string& dir) {
  Config probe = config;
  if (transport != "ucx") return probe;
  probe.SetString("transport.ucx.listen", "127.0.0.1:0");
  probe.SetString("transport.ucx.connect", "");
  probe.SetString("transport.ucx.rendezvous_file", dir + "/probe.addr");
  probe.SetString("transport.ucx.spool_dir", dir + "/probe-spool");
  SetValue(probe, "transport.ucx.await_receivers", REFIT_CFG_INT, 0);
  return probe;
}

// The sender's config: --config (its transport section, plugins, encodings, any [sender] or
// [receiver] setting) with the bench's directories, receivers and flags on top.
Result<Config> BenchConfig(const BenchE2eOptions& o, const std::string& dir) {
  REFIT_ASSIGN_OR_RAISE(Config config, Config::FromString("", "refit bench e2e"));
  if (!o.config_path.empty()) {
    REFIT_ASSIGN_OR_RAISE(config, LoadConfigFile(o.config_path));
    AbsolutePluginPaths(config, o.config_path);
  }
  if (!o.transport.empty()) config.SetString("transport.name", o.transport);
  REFIT_ASSIGN_OR_RAISE(std::string transport, config.GetString("transport.name", "disk"));
  if (transport == "disk" && !config.Has("transport.disk.dir")) {
    config.SetString("transport.disk.dir", dir + "/sync");
  }
  if (o.bandwidth) SetValue(config, "transport.bandwidth", REFIT_CFG_INT, *o.bandwidth);
  // Over ucx the full sync goes down the paced links to every receiver, not by replay to the
  // ones that connect after its first put (replays are not paced).
  if (transport == "ucx" && !config.Has("transport.ucx.await_receivers")) {
    SetValue(config, "transport.ucx.await_receivers", REFIT_CFG_INT, o.receivers);
  }
  config.SetString("sender.state_dir", dir + "/sender");
  ConfigValue ids;
  ids.type = REFIT_CFG_STRING_LIST;
  for (int i = 0; i < o.receivers; ++i) ids.list_value.push_back(ReceiverId(i));
  config.Set("sender.receivers", std::move(ids));
  if (!o.encoding.empty()) config.SetString("sender.encoding", o.encoding);
  if (o.threads > 0) {
    SetValue(config, "sender.threads", REFIT_CFG_INT, o.threads);
    SetValue(config, "receiver.threads", REFIT_CFG_INT, o.threads);
  }
  // Receivers poll for commits: a short interval keeps the polling out of what is measured.
  if (!config.Has("receiver.poll_interval_ms")) {
    SetValue(config, "receiver.poll_interval_ms", REFIT_CFG_INT, 5);
  }
  return config;
}

// ------------------------------------------------------------------ the receivers

struct BenchReceiver {
  std::string id;
  std::string state_dir;
  std::string model_path;  // its model file, or where an in-memory one writes its model at exit
  ChildProcess process;
  bool finished = false;  // exited 0: it applied the last version
};

// `tensors`: the model's tensor list (JSON), for receivers holding it in memory.
Result<std::vector<BenchReceiver>> StartReceivers(const BenchE2eOptions& o, const Config& base,
                                                  const std::string& dir,
                                                  const std::string& tensors) {
  std::vector<BenchReceiver> receivers;
  for (int i = 0; i < o.receivers; ++i) {
    BenchReceiver r;
    r.id = ReceiverId(i);
    r.state_dir = dir + "/" + r.id;
    Config config = base;
    config.SetString("receiver.id", r.id);
    config.SetString("receiver.state_dir", r.state_dir);
    const std::string path = dir + "/" + r.id + ".toml";
    REFIT_RETURN_NOT_OK(WriteText(path, ConfigToToml(config)));
    // Bounded even if this process is stopped without killing it: every sync's wait, and some.
    const double lifetime = o.timeout_s * (o.syncs + 1);
    std::vector<std::string> args = {"recv",
                                     "--config",
                                     path,
                                     "--follow",
                                     "--until-version",
                                     std::to_string(o.syncs),
                                     "--timeout",
                                     std::to_string(static_cast<int64_t>(lifetime)),
                                     "--quiet"};
    r.model_path = r.state_dir + "/model.safetensors";
    if (o.in_memory) {
      r.model_path = dir + "/" + r.id + ".model.safetensors";
      args.insert(args.end(), {"--in-memory", tensors, "--write-model", r.model_path});
    }
    REFIT_ASSIGN_OR_RAISE(r.process, ChildProcess::SpawnSelf(args, /*quiet_stdout=*/true));
    receivers.push_back(std::move(r));
  }
  return receivers;
}

// A receiver process that ended before it should have is the bench's failure, named.
Status CheckAlive(BenchReceiver& r, uint64_t version) {
  if (r.finished) return Status::OK();
  std::optional<int> status = r.process.Poll();
  if (!status) return Status::OK();
  if (*status == 0) {
    r.finished = true;  // --until-version reached: it acknowledged the last version first
    return Status::OK();
  }
  return Status::IoError("receiver " + r.id + " exited with status " + std::to_string(*status) +
                         " before acknowledging version " + std::to_string(version) +
                         " (its state: " + r.state_dir + ")");
}

// Waits until every receiver answered `version` (its ack, or a need-full request), watched
// through the sender's own transport instance (a second instance of a push transport, ucx, is a
// second sender: the receivers would connect to it and the sender would push to nobody), and
// the receiver processes.
Status AwaitAcks(Sender& sender, std::vector<BenchReceiver>& receivers, uint64_t version,
                 double timeout_s) {
  Stopwatch clock;
  while (true) {
    const std::vector<std::string> pending = sender.Unanswered();
    if (pending.empty()) return Status::OK();
    for (BenchReceiver& r : receivers) {
      if (std::find(pending.begin(), pending.end(), r.id) == pending.end()) continue;
      REFIT_RETURN_NOT_OK(CheckAlive(r, version));
    }
    if (clock.Seconds() > timeout_s) {
      return Status::Timeout("version " + std::to_string(version) + " not acknowledged by " +
                             pending.front() + " within " +
                             std::to_string(static_cast<int64_t>(timeout_s)) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// A receiver that answered with a need-full request instead of an ack: the bench's failure.
Status CheckAcked(const Sender& sender, const std::vector<BenchReceiver>& receivers,
                  uint64_t version) {
  for (const BenchReceiver& r : receivers) {
    const auto& acks = sender.acks();
    if (std::any_of(acks.begin(), acks.end(), [&](const Ack& a) { return a.receiver == r.id; })) {
      continue;
    }
    return Status::VersionMismatch("receiver " + r.id +
                                   " asked for a full sync instead of applying version " +
                                   std::to_string(version));
  }
  return Status::OK();
}

// ------------------------------------------------------------------ one sync

// Each stage of a delta sync measured alone, in seconds.
struct StagesAlone {
  double encode_s = 0;  // the codec on the sender's two versions, in memory
  double link_s = 0;    // payload bytes / bandwidth (computed; 0 when unlimited)
  double put_s = 0;     // the payload's bytes put through a fresh link, as a sender
  double get_s = 0;     // and got through another, as a receiver
  double apply_s = 0;   // the payload applied in memory to a copy of the previous version
  std::string slowest;
  double slowest_s = 0;
};

struct SyncRow {
  SyncStats stats;
  double ack_s = 0;      // publish start -> the last receiver's ack exists
  double publish_s = 0;  // Publish() alone: diff, encode, put, verify, commit
  double advance_s = 0;  // the sender's baseline advance once every ack was in
  uint64_t sender_put_bytes = 0, sender_get_bytes = 0;
  std::vector<double> apply_s;  // per receiver, from its ack
  std::optional<StagesAlone> alone;
};

// The objects one run shares: plugins, config, the sender, the receivers.
struct Bench {
  BenchE2eOptions options;
  Config config;
  std::shared_ptr<Registry> registry;
  std::string transport;
  uint64_t bandwidth = 0;        // [transport] bandwidth: every put and get metered
  uint64_t paced_bandwidth = 0;  // [transport.<name>] link_bandwidth: the plugin paces its pushes
  std::string encoding;
  std::unique_ptr<Sender> sender;
  Config probe_config;  // the stage probes' links (FreshLink)
  std::vector<BenchReceiver> receivers;
};

// The rate the link stage is computed at: the metered link's, else the plugin's own pacing (a
// ucx push crosses each link of its tree once); 0: unlimited.
uint64_t LinkStageBandwidth(const Bench& b) {
  return b.bandwidth > 0 ? b.bandwidth : b.paced_bandwidth;
}

// The header's words for the link.
std::string DescribeLink(const Bench& b) {
  if (b.bandwidth > 0) return "at " + HumanBytes(b.bandwidth) + "/s per connection";
  if (b.paced_bandwidth > 0) {
    return "with pushes paced at " + HumanBytes(b.paced_bandwidth) + "/s per link ([transport." +
           b.transport + "] link_bandwidth)";
  }
  return "with no bandwidth limit";
}

Result<SyncRow> PublishAndAwait(Bench& b, const std::vector<TensorView>& weights) {
  SyncRow row;
  internal::LinkTraffic& traffic = internal::ProcessLinkTraffic(REFIT_ROLE_SENDER);
  const uint64_t put_before = traffic.put_bytes, get_before = traffic.get_bytes;
  Stopwatch clock;
  REFIT_ASSIGN_OR_RAISE(row.stats, b.sender->Publish(weights));
  row.publish_s = clock.Seconds();
  REFIT_RETURN_NOT_OK(AwaitAcks(*b.sender, b.receivers, row.stats.version, b.options.timeout_s));
  row.ack_s = clock.Seconds();
  row.sender_put_bytes = traffic.put_bytes - put_before;
  row.sender_get_bytes = traffic.get_bytes - get_before;
  Stopwatch advance;
  REFIT_RETURN_NOT_OK(b.sender->WaitAndAdvance(b.options.timeout_s));
  row.advance_s = advance.Seconds();
  REFIT_RETURN_NOT_OK(CheckAcked(*b.sender, b.receivers, row.stats.version));
  for (const Ack& ack : b.sender->acks()) row.apply_s.push_back(ack.apply_seconds);
  return row;
}

// A link of the configured transport as a fresh connection (its own bucket, full).
Result<std::unique_ptr<Transport>> FreshLink(const Bench& b, refit_transport_role_t role) {
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<Transport> plain,
                        b.registry->CreateTransport(b.transport, role, "bench-link-probe",
                                                    &b.probe_config, "transport." + b.transport));
  std::shared_ptr<internal::TokenBucket> bucket;
  if (b.bandwidth > 0) {
    bucket = std::make_shared<internal::TokenBucket>(b.bandwidth,
                                                     internal::DefaultBurstBytes(b.bandwidth));
  }
  return internal::WrapTransportWithLink(std::move(plain), std::move(bucket), nullptr);
}

Status MeasureLinkAlone(const Bench& b, uint64_t bytes, StagesAlone& s) {
  const std::string key = "bench-e2e/link-probe";
  std::vector<uint8_t> data(bytes, 0x5a);
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<Transport> out, FreshLink(b, REFIT_ROLE_SENDER));
  Stopwatch put;
  REFIT_RETURN_NOT_OK(out->Put(key, data.data(), data.size()));
  s.put_s = put.Seconds();
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<Transport> in, FreshLink(b, REFIT_ROLE_RECEIVER));
  Stopwatch get;
  REFIT_RETURN_NOT_OK(in->Get(key, 0, data.data(), data.size()));
  s.get_s = get.Seconds();
  return out->Remove(key);
}

// The receivers' apply alone, as encode_s is the codec alone: the same payload applied in memory
// to a copy of the previous version (records decoded, digest-verified and written) on the
// receivers' threads. A receiver's own apply time (its ack) is not the stage alone: with
// receiver.early_bytes part of it runs before the commit, while the sender still diffs.
Result<double> MeasureApplyAlone(const Bench& b, const Trajectory& t,
                                 const std::vector<uint8_t>& payload) {
  uint64_t total = 0;
  for (const TensorView& v : t.previous()) total += v.nbytes();
  std::unique_ptr<uint8_t[]> copy(new uint8_t[std::max<uint64_t>(total, 1)]);
  std::vector<TensorView> views;
  uint64_t at = 0;
  for (const TensorView& v : t.previous()) {
    TensorView c = v;
    c.data = copy.get() + at;
    if (v.nbytes() > 0) std::memcpy(c.data, v.data, v.nbytes());
    at += v.nbytes();
    views.push_back(std::move(c));
  }
  const unsigned threads = static_cast<unsigned>(std::max(b.options.threads, 0));
  REFIT_ASSIGN_OR_RAISE(ApplyStats applied, internal::ApplyDeltaOnThreads(
                                                payload, views, *b.registry, &b.config, threads));
  return applied.apply_seconds;
}

Result<StagesAlone> MeasureStagesAlone(const Bench& b, const Trajectory& t, const SyncRow& row) {
  StagesAlone s;
  DeltaOptions options;
  options.encoding = b.encoding;
  options.threads = static_cast<unsigned>(std::max(b.options.threads, 0));
  REFIT_ASSIGN_OR_RAISE(options.chunk_bytes, internal::SenderChunkBytes(b.config));
  DeltaEncodeStats encoded;
  REFIT_ASSIGN_OR_RAISE(
      std::vector<uint8_t> payload,
      EncodeDelta(t.previous(), t.current(), options, *b.registry, &b.config, &encoded));
  s.encode_s = encoded.seconds;
  if (const uint64_t link = LinkStageBandwidth(b); link > 0) {
    s.link_s = static_cast<double>(row.stats.payload_bytes) / static_cast<double>(link);
  }
  REFIT_RETURN_NOT_OK(MeasureLinkAlone(b, row.stats.payload_bytes, s));
  REFIT_ASSIGN_OR_RAISE(s.apply_s, MeasureApplyAlone(b, t, payload));
  for (const auto& [name, seconds] : {std::pair<const char*, double>{"encode", s.encode_s},
                                      {"link", s.link_s},
                                      {"put", s.put_s},
                                      {"get", s.get_s},
                                      {"apply", s.apply_s}}) {
    if (seconds > s.slowest_s) {
      s.slowest = name;
      s.slowest_s = seconds;
    }
  }
  return s;
}

// ------------------------------------------------------------------ the report

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];  // the lower middle
}

double Ratio(double a, double b) { return b > 0 ? a / b : 0; }

// Issue 14's overlap target for a delta: its time to the last ack is at most 1.25x its slowest
// stage measured alone + 50 ms (the stages overlap rather than add up).
bool WithinOverlapTarget(const SyncRow& r) {
  return r.alone && r.ack_s <= 1.25 * r.alone->slowest_s + 0.05;
}

json RowJson(const SyncRow& r, uint64_t model_bytes) {
  json j = {{"version", r.stats.version},
            {"kind", r.stats.full ? "full" : "delta"},
            {"density", r.stats.counters.density()},
            {"payload_bytes", r.stats.payload_bytes},
            {"payloads", r.stats.payloads},
            {"sender_put_bytes", r.sender_put_bytes},
            {"sender_get_bytes", r.sender_get_bytes},
            {"time_to_last_ack_s", r.ack_s},
            {"model_bytes_per_s", Ratio(static_cast<double>(model_bytes), r.ack_s)},
            {"payload_bytes_per_s", Ratio(static_cast<double>(r.stats.payload_bytes), r.ack_s)},
            {"publish_s", r.publish_s},
            {"sender_diff_s", r.stats.diff_seconds},
            {"sender_encode_s", r.stats.encode_seconds},
            {"sender_send_s", r.stats.send_seconds},
            {"sender_commit_s", r.stats.commit_seconds},
            {"advance_s", r.advance_s},
            {"apply_s", r.apply_s}};
  if (r.alone) {
    const StagesAlone& s = *r.alone;
    j["stages_alone"] = {{"encode_s", s.encode_s},
                         {"link_s", s.link_s},
                         {"put_s", s.put_s},
                         {"get_s", s.get_s},
                         {"apply_s", s.apply_s}};
    j["slowest_stage"] = s.slowest;
    j["slowest_stage_s"] = s.slowest_s;
    j["ack_over_slowest_stage"] = Ratio(r.ack_s, s.slowest_s);
    j["within_overlap_target"] = WithinOverlapTarget(r);
  }
  return j;
}

void PrintHeader(const Bench& b, const Trajectory& t, const std::string& dir) {
  const std::vector<TensorView>& w = t.current();
  std::printf(
      "bench e2e: %zu tensors, %s (%s); %d receiver%s over %s %s; encoding %s; work dir %s\n\n",
      w.size(), HumanBytes(t.model_bytes()).c_str(), t.Describe().c_str(), b.options.receivers,
      b.options.receivers == 1 ? "" : "s", b.transport.c_str(), DescribeLink(b).c_str(),
      b.encoding.c_str(), dir.c_str());
  std::printf("%7s  %-5s  %8s  %10s  %10s  %9s  %8s  %8s  %8s  %7s  %7s  %7s  %7s  %-7s  %7s\n",
              "version", "kind", "density", "payload", "sender out", "to ack s", "model/s",
              "payld/s", "encode s", "link s", "put s", "get s", "apply s", "slowest", "ack/slw");
}

void PrintRow(const SyncRow& r, uint64_t model_bytes) {
  const StagesAlone s = r.alone.value_or(StagesAlone{});
  double apply = 0;
  for (double a : r.apply_s) apply = std::max(apply, a);
  auto stage = [&](double v) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "%.3f", v);
    return r.alone ? std::string(buf) : std::string("-");
  };
  std::printf(
      "%7" PRIu64
      "  %-5s  %7.3f%%  %10s  %10s  %9.3f  %8s  %8s  %8s  %7s  %7s  %7s  "
      "%7.3f  %-7s  %7s\n",
      r.stats.version, r.stats.full ? "full" : "delta", 100 * r.stats.counters.density(),
      HumanBytes(r.stats.payload_bytes).c_str(), HumanBytes(r.sender_put_bytes).c_str(), r.ack_s,
      HumanBytes(static_cast<uint64_t>(Ratio(static_cast<double>(model_bytes), r.ack_s))).c_str(),
      HumanBytes(static_cast<uint64_t>(Ratio(static_cast<double>(r.stats.payload_bytes), r.ack_s)))
          .c_str(),
      stage(s.encode_s).c_str(), stage(s.link_s).c_str(), stage(s.put_s).c_str(),
      stage(s.get_s).c_str(), apply, r.alone ? s.slowest.c_str() : "-",
      r.alone ? (stage(Ratio(r.ack_s, s.slowest_s)) + "x").c_str() : "-");
  std::fflush(stdout);
}

json Summary(const std::vector<SyncRow>& rows) {
  double full_s = 0;
  std::vector<double> delta_s, ack_over_slowest;
  int within = 0;
  for (const SyncRow& r : rows) {
    if (r.stats.full && full_s == 0) full_s = r.ack_s;
    if (r.stats.full) continue;
    delta_s.push_back(r.ack_s);
    if (!r.alone) continue;
    ack_over_slowest.push_back(Ratio(r.ack_s, r.alone->slowest_s));
    within += WithinOverlapTarget(r) ? 1 : 0;
  }
  return {{"full_sync_s", full_s},
          {"delta_sync_s_median", Median(delta_s)},
          {"full_over_delta", Ratio(full_s, Median(delta_s))},
          {"ack_over_slowest_stage_median", Median(ack_over_slowest)},
          {"deltas_within_overlap_target", within},
          {"deltas_with_stages_alone", ack_over_slowest.size()}};
}

// ------------------------------------------------------------------ the run

Result<Bench> SetUp(const BenchE2eOptions& o, const std::string& dir) {
  Bench b;
  b.options = o;
  REFIT_ASSIGN_OR_RAISE(b.config, BenchConfig(o, dir));
  REFIT_ASSIGN_OR_RAISE(b.registry, LoadRegistry(&b.config));
  // The flags' values are not in any file: name the flag, not a file line.
  if (!o.transport.empty() && b.registry->Find(REFIT_KIND_TRANSPORT, o.transport) == nullptr) {
    return Status::Invalid("--transport: unknown transport '" + o.transport +
                           "' (refit plugins lists them)");
  }
  if (!o.encoding.empty() && o.encoding != "auto" &&
      b.registry->Find(REFIT_KIND_ENCODING, o.encoding) == nullptr) {
    return Status::Invalid("--encoding: unknown encoding '" + o.encoding +
                           "' (refit plugins lists them)");
  }
  REFIT_RETURN_NOT_OK(ValidateConfig(b.config, *b.registry));
  REFIT_ASSIGN_OR_RAISE(b.transport, b.config.GetString("transport.name", "disk"));
  REFIT_ASSIGN_OR_RAISE(b.bandwidth, b.config.GetSize("transport.bandwidth", 0));
  REFIT_ASSIGN_OR_RAISE(b.paced_bandwidth, internal::PluginLinkBandwidth(b.config));
  REFIT_ASSIGN_OR_RAISE(b.encoding, b.config.GetString("sender.encoding", "auto"));
  REFIT_ASSIGN_OR_RAISE(b.sender, Sender::Make(b.config, 0, 1, b.registry));
  if (b.sender->published_version() != 0) {
    // A new sender goes on after stored versions; the receivers would stop at --syncs.
    return Status::Invalid("the transport already holds versions up to " +
                           std::to_string(b.sender->published_version()) +
                           " (left by another run): give the bench an empty store (its disk "
                           "dir or ucx spool_dir)");
  }
  b.probe_config = ProbeConfig(b.config, b.transport, dir);
  return b;
}

// Every receiver's model (its file, or what an in-memory one wrote at exit) against the sender's
// last weights, bit for bit.
Status CheckReceivers(Bench& b, const Trajectory& t) {
  for (BenchReceiver& r : b.receivers) {
    REFIT_ASSIGN_OR_RAISE(int status, r.process.Wait(b.options.timeout_s));
    if (status != 0 && !r.finished) {
      return Status::IoError("receiver " + r.id + " exited with status " + std::to_string(status));
    }
    REFIT_ASSIGN_OR_RAISE(uint64_t mismatched, CountMismatchedTensors(r.model_path, t.current()));
    if (mismatched != 0) {
      return Status::Corrupt("receiver " + r.id + ": " + std::to_string(mismatched) +
                             " tensors differ from the sender's weights after the last sync");
    }
  }
  return Status::OK();
}

Status RunSyncs(Bench& b, Trajectory& t, std::vector<SyncRow>& rows) {
  internal::ProgressMeter progress("bench e2e", t.model_bytes() * b.options.syncs);
  for (int v = 1; v <= b.options.syncs; ++v) {
    if (v > 1) REFIT_RETURN_NOT_OK(t.Advance());
    progress.Add(0);
    REFIT_ASSIGN_OR_RAISE(SyncRow row, PublishAndAwait(b, t.current()));
    if (!row.stats.full) {
      REFIT_ASSIGN_OR_RAISE(StagesAlone alone, MeasureStagesAlone(b, t, row));
      row.alone = alone;
    }
    progress.Erase();  // the row goes to the same terminal
    if (!b.options.json) PrintRow(row, t.model_bytes());
    rows.push_back(std::move(row));
    progress.Add(t.model_bytes());
  }
  progress.Finish();
  return Status::OK();
}

Status Validate(const BenchE2eOptions& o) {
  if (o.receivers < 1) return Status::Invalid("--receivers must be at least 1");
  if (o.syncs < 2) return Status::Invalid("--syncs must be at least 2 (a full sync, then deltas)");
  if (o.weights.size() == 1) {
    return Status::Invalid("--weights needs at least two files (a full sync, then deltas)");
  }
  if (o.weights.empty() && o.size_bytes < 2) return Status::Invalid("--size must be at least 2B");
  // A kept directory of an earlier run holds its versions: the sender would go on from them.
  std::error_code ec;
  if (!o.dir.empty() && fs::exists(o.dir, ec) && !fs::is_empty(o.dir, ec)) {
    return Status::Invalid("--dir " + o.dir + " is not empty (the bench starts from nothing)");
  }
  return Status::OK();
}

Status RunBenchE2e(const BenchE2eOptions& o) {
  REFIT_RETURN_NOT_OK(Validate(o));
  REFIT_ASSIGN_OR_RAISE(const std::string dir, MakeWorkDir(o.dir, "refit-bench-e2e"));
  RemoveDirOnExit cleanup{dir, o.dir.empty()};
  REFIT_ASSIGN_OR_RAISE(Bench b, SetUp(o, dir));
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<Trajectory> t, Trajectory::Make(o));
  const std::string tensors = dir + "/tensors.json";  // for receivers holding it in memory
  if (o.in_memory) {
    REFIT_RETURN_NOT_OK(WriteText(tensors, SerializeTensorSpecs(internal::SpecsOf(t->current()))));
  }
  REFIT_ASSIGN_OR_RAISE(b.receivers, StartReceivers(o, b.config, dir, tensors));
  if (!o.json) PrintHeader(b, *t, dir);
  std::vector<SyncRow> rows;
  REFIT_RETURN_NOT_OK(RunSyncs(b, *t, rows));
  REFIT_RETURN_NOT_OK(CheckReceivers(b, *t));
  json summary = Summary(rows);
  summary["bit_exact"] = true;
  summary["receivers_checked"] = o.receivers;
  if (o.json) {
    json report = {{"model",
                    {{"tensors", t->current().size()},
                     {"bytes", t->model_bytes()},
                     {"source", t->Describe()}}},
                   {"transport", b.transport},
                   {"bandwidth_bytes_per_s", b.bandwidth},
                   {"link_bandwidth_bytes_per_s", b.paced_bandwidth},
                   {"receivers", o.receivers},
                   {"receivers_in_memory", o.in_memory},
                   {"encoding", b.encoding},
                   {"syncs", json::array()},
                   {"summary", summary}};
    for (const SyncRow& r : rows) report["syncs"].push_back(RowJson(r, t->model_bytes()));
    std::printf("%s\n", report.dump(2).c_str());
    return Status::OK();
  }
  std::printf(
      "\nfull sync %.3f s, delta sync %.3f s (median): full/delta %.1fx; time to last "
      "ack / slowest stage alone %.2fx (median); deltas acknowledged within 1.25x their slowest "
      "stage + 50 ms: %d of %d\n",
      summary["full_sync_s"].get<double>(), summary["delta_sync_s_median"].get<double>(),
      summary["full_over_delta"].get<double>(),
      summary["ack_over_slowest_stage_median"].get<double>(),
      summary["deltas_within_overlap_target"].get<int>(),
      summary["deltas_with_stages_alone"].get<int>());
  std::printf("bit-exact: yes (%d receiver%s, %zu tensors, %s each, against the sender's bits)\n",
              o.receivers, o.receivers == 1 ? "" : "s", t->current().size(),
              HumanBytes(t->model_bytes()).c_str());
  return Status::OK();
}

Result<uint64_t> FlagSize(const char* flag, const std::string& text) {
  Result<uint64_t> size = ParseSize(text);
  if (!size.ok()) return Status::Invalid(std::string(flag) + ": " + size.status().message());
  return size;
}

}  // namespace

void RegisterBenchE2e(CLI::App& bench, Commands& commands) {
  struct Flags {
    BenchE2eOptions o;
    std::string size = "1GiB";
    std::string bandwidth;
  };
  auto f = std::make_shared<Flags>();
  auto* cmd = bench.add_subcommand(
      "e2e",
      "Sender and N receiver processes over a (bandwidth-limited) transport: time to the "
      "last ack per sync vs each stage alone, bit-exact");
  cmd->add_option("--size", f->size, "synthetic bf16 model size")->capture_default_str();
  cmd->add_option("--lr", f->o.lr, "learning rate of the synthetic steps")->capture_default_str();
  auto* weights = cmd->add_option("--weights", f->o.weights,
                                  "safetensors files, one version each (instead of --size)");
  auto* syncs = cmd->add_option("--syncs", f->o.syncs, "versions to publish (the first is full)")
                    ->capture_default_str()
                    ->check(CLI::Range(2, 1000));
  weights->excludes(syncs);
  cmd->add_option("--receivers", f->o.receivers, "receiver processes")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--transport", f->o.transport, "transport (default: the config's, else disk)");
  cmd->add_option("--config", f->o.config_path,
                  "TOML config: the transport's section, [plugins], [encoding.*], [sender] / "
                  "[receiver] settings");
  cmd->add_option("--bandwidth", f->bandwidth,
                  "bytes per second per connection, e.g. 200MB (0: unlimited)");
  cmd->add_option("--encoding", f->o.encoding, "encoding (default: the sender's)");
  cmd->add_option("--threads", f->o.threads, "sender and receiver threads (0: their defaults)")
      ->capture_default_str()
      ->check(CLI::Range(0, 256));
  cmd->add_option("--dir", f->o.dir,
                  "new or empty work directory to keep (default: a temp dir, removed)");
  cmd->add_option("--timeout", f->o.timeout_s, "longest wait for one sync's acks, seconds")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--json", f->o.json, "print one JSON object on stdout instead of the table");
  cmd->add_flag("--in-memory", f->o.in_memory,
                "receivers hold the model in their memory, attached as an inference engine's "
                "parameters are (`refit recv --in-memory`), instead of a model file");
  cmd->add_option("--seed", f->o.seed, "random seed")->capture_default_str();
  commands.push_back({cmd, [f]() -> Status {
                        REFIT_ASSIGN_OR_RAISE(f->o.size_bytes, FlagSize("--size", f->size));
                        if (!f->bandwidth.empty()) {
                          REFIT_ASSIGN_OR_RAISE(f->o.bandwidth,
                                                FlagSize("--bandwidth", f->bandwidth));
                        }
                        if (!f->o.weights.empty()) {
                          f->o.syncs = static_cast<int>(f->o.weights.size());
                        }
                        return RunBenchE2e(f->o);
                      }});
}

}  // namespace refit::cli
