// The framework's config keys (docs/config.md documents each) and whole-file validation.
#include <set>

#include "faults/faults.h"
#include "link/link.h"
#include "plugins/encoding_cache.h"
#include "refit/offline.h"
#include "refit/receiver.h"
#include "refit/sender.h"
#include "send/auto_policy.h"

namespace refit {

namespace {

// When the model file (receiver) and the baseline file (sender) are synced and their redo logs
// emptied (receive/journal.h).
std::vector<ConfigKeySpec> CheckpointSpecs() {
  return {
      {"sender.checkpoint_versions", REFIT_CFG_INT, "8",
       "sync the baseline file and empty its redo log every this many versions"},
      {"sender.checkpoint_bytes", REFIT_CFG_SIZE, "0",
       "... or once the redo log holds this many bytes (0: the baseline file's size)"},
      {"receiver.checkpoint_versions", REFIT_CFG_INT, "8",
       "sync the model file and empty its redo log every this many versions"},
      {"receiver.checkpoint_bytes", REFIT_CFG_SIZE, "0",
       "... or once the redo log holds this many bytes (0: the model file's size)"},
  };
}

// How many versions stay on the transport (send/retention.h).
std::vector<ConfigKeySpec> RetentionSpecs() {
  return {
      {"sender.keep_versions", REFIT_CFG_INT, "3",
       "committed versions kept on the transport; older ones are deleted (0: keep all)"},
  };
}

// The framework's layer over every transport (link/link.h).
std::vector<ConfigKeySpec> LinkSpecs() {
  return {
      {"transport.bandwidth", REFIT_CFG_SIZE, "0",
       "bytes per second each transport instance (one per process: a connection) may put and "
       "get, to emulate a slower link (0: unlimited)"},
  };
}

// [serve]: `refit serve` (docs/serve.md).
std::vector<ConfigKeySpec> ServeConfigSpecs() {
  return {
      {"serve.listen", REFIT_CFG_STRING, "\"127.0.0.1:8470\"",
       "`refit serve`: HOST:PORT to listen on (port 0: any free port)"},
      {"serve.token_file", REFIT_CFG_STRING, "\"\"",
       "`refit serve`: file holding the bearer token every request must carry; unset: the "
       "environment variable REFIT_SERVE_TOKEN, else no token"},
      {"serve.poll_interval_ms", REFIT_CFG_INT, "0",
       "`refit serve`: also poll for committed versions this often (0: only on POST /v1/sync)"},
      {"serve.sync_timeout_s", REFIT_CFG_DOUBLE, "600",
       "`refit serve`: a POST /v1/sync stops applying further versions after this long"},
  };
}

// [receiver]'s own keys (its checkpoint policy is in CheckpointSpecs).
std::vector<ConfigKeySpec> ReceiverSpecs() {
  return {
      {"receiver.id", REFIT_CFG_STRING, "\"r0\"", "this receiver's id (acks/<id>/...)"},
      {"receiver.state_dir", REFIT_CFG_STRING, "", "directory holding the receiver's model"},
      {"receiver.apply_bytes", REFIT_CFG_SIZE, "\"256MiB\"",
       "memory cap for one payload plus one record's scratch while applying"},
      {"receiver.poll_interval_ms", REFIT_CFG_INT, "100", "commit polling interval"},
      {"receiver.durable", REFIT_CFG_BOOL, "true",
       "sync the redo log once per window of records before they touch the model (survives "
       "power loss, not only process death)"},
      {"receiver.verify_payloads_first", REFIT_CFG_BOOL, "false",
       "fetch and verify every payload of a delta before touching the model (reads each twice: "
       "for storage that may rot after a verified put)"},
      {"receiver.early_bytes", REFIT_CFG_SIZE, "\"256MiB\"",
       "while the next version's commit is not there, decode and verify its payloads already "
       "present against the model (nothing is written before the commit): at most this many "
       "bytes of computed changes plus the payloads held; 0: off"},
      {"receiver.write_early", REFIT_CFG_BOOL, "false",
       "attached memory only: write each payload computed early into the memory at once (for an "
       "engine that does not read its weights during a sync), put back if its commit does not "
       "name those bytes"},
      {"receiver.rank", REFIT_CFG_INT, "0", "this receiver's shard rank in its layout"},
      {"receiver.world", REFIT_CFG_INT, "1", "number of receiver shards (ranks) of the layout"},
      {"receiver.threads", REFIT_CFG_INT, "0",
       "threads applying a payload's records (0: hardware concurrency, 1: inline); the next "
       "payload is fetched while one is applied"},
      {"receiver.max_model_bytes", REFIT_CFG_SIZE, "0",
       "largest model a full sync may declare (0: no bound but the free space of state_dir)"},
      {"receiver.max_apply_failures", REFIT_CFG_INT, "3",
       "a version that fails to apply the same way this many times is abandoned: the receiver "
       "asks for a full sync"},
  };
}

}  // namespace

std::vector<ConfigKeySpec> FrameworkConfigSpecs() {
  std::vector<ConfigKeySpec> specs = {
      {"sender.state_dir", REFIT_CFG_STRING, "",
       "directory holding the sender's baseline and state"},
      {"sender.encoding", REFIT_CFG_STRING, "\"auto\"",
       "encoding of changed records (\"auto\": the best of [encoding.auto] candidates per record)"},
      {"sender.threads", REFIT_CFG_INT, "0",
       "threads diffing and encoding chunks (0: hardware concurrency, 1: inline); the payload "
       "bytes do not depend on it"},
      {"sender.bucket_bytes", REFIT_CFG_SIZE, "\"64MiB\"", "payload size cap (one flush)"},
      {"sender.stream_bytes", REFIT_CFG_SIZE, "\"128MiB\"",
       "also flush a payload once its records cover this many bytes of the model, so receivers "
       "compute it while the rest is diffed (0: flush on bucket_bytes alone)"},
      {"sender.chunk_bytes", REFIT_CFG_SIZE, "\"16MiB\"",
       "tensors are cut into records of at most this many dense bytes"},
      {"sender.receivers", REFIT_CFG_STRING_LIST, "[]",
       "receiver ids that must acknowledge a version before the baseline advances"},
      {"sender.ack_timeout_s", REFIT_CFG_DOUBLE, "600", "seconds to wait for acknowledgements"},
      {"sender.full_every", REFIT_CFG_INT, "0", "send a full sync every N versions (0: never)"},
      {"sender.weights", REFIT_CFG_STRING, "", "safetensors file `refit send` publishes"},
      {"sender.poll_interval_ms", REFIT_CFG_INT, "50", "ack polling interval"},
      {"sender.mode", REFIT_CFG_STRING, "\"tp\"",
       "\"tp\": every rank publishes its own deltas; \"pp\": each stage of stage_ranks ranks "
       "gathers its deltas node-locally (stage_dir) and its first rank publishes them"},
      {"sender.stage_ranks", REFIT_CFG_INT, "1", "mode pp: consecutive ranks per stage"},
      {"sender.stage_dir", REFIT_CFG_STRING, "",
       "mode pp: node-local directory where stage members hand their payloads to the leader"},
      {"sender.stage_transport", REFIT_CFG_STRING, "\"disk\"",
       "mode pp: transport the stage members hand their payloads through; it is given "
       "dir = stage_dir, and fsync = false when it declares an fsync key"},
      {"sender.receiver_layout", REFIT_CFG_STRING, "\"\"",
       "layout of sharded receivers (e.g. \"vllm\", configured in [layout.<name>]): records are "
       "cut at their shard boundaries (empty: receivers hold canonical tensors)"},
      {"sender.receiver_world", REFIT_CFG_INT, "1", "number of receiver shards of receiver_layout"},
      {"sender.verify_puts", REFIT_CFG_BOOL, "true",
       "read every put object back (size and bytes) and redo puts that stored something else; "
       "the commit is written only once every object it names is verified"},
      {"sender.metrics_file", REFIT_CFG_STRING, "\"\"",
       "Prometheus text file rewritten (temp + rename) after every publish, for node_exporter's "
       "textfile collector; \"{rank}\" is replaced by the rank (docs/serve.md)"},
      {"auth.key_file", REFIT_CFG_STRING, "\"\"",
       "file holding the key (>= 16 bytes) that signs versions (HMAC-SHA256); unset: the "
       "environment variable REFIT_AUTH_KEY, else unsigned versions"},
      {"transport.name", REFIT_CFG_STRING, "\"disk\"", "transport plugin"},
      {"layout.name", REFIT_CFG_STRING, "\"hf\"",
       "layout plugin of this process's weights (sender: its shards; receiver: its shards)"},
      {"plugins.paths", REFIT_CFG_STRING_LIST, "[]", "directories of plugin .so files to load"},
      {"plugins.load", REFIT_CFG_STRING_LIST, "[]", "plugin .so files to load"},
  };
  for (const auto& more :
       {ReceiverSpecs(), ServeConfigSpecs(), CheckpointSpecs(), LinkSpecs(), RetentionSpecs()}) {
    specs.insert(specs.end(), more.begin(), more.end());
  }
  for (ConfigKeySpec spec : internal::FaultConfigSpecs()) {
    spec.name = "faults." + spec.name;
    specs.push_back(std::move(spec));
  }
  for (ConfigKeySpec spec : internal::AutoConfigSpecs()) {
    spec.name = std::string("encoding.") + internal::kAutoEncoding + "." + spec.name;
    specs.push_back(std::move(spec));
  }
  return specs;
}

namespace {

// A number below `min` would not fail later but misbehave (a poll interval of 0 busy-loops, a
// negative timeout never waits), so it is refused where the file says it.
Status RequireAtLeast(const Config& config, const std::string& key, int64_t min, const char* why) {
  if (!config.Has(key)) return Status::OK();
  REFIT_ASSIGN_OR_RAISE(double value, config.GetDouble(key, 0));
  if (value >= static_cast<double>(min)) return Status::OK();
  return Status::Invalid(config.Where(key) + ": '" + key + "' must be at least " +
                         std::to_string(min) + " (" + why + ")");
}

// An encoding's own error names its key ('level'); prefix the file:line of that key.
std::string WhereNamed(const Config& config, const std::string& section,
                       const std::string& message) {
  const std::vector<std::string> keys = config.KeysUnder(section);
  std::string where = keys.empty() ? section : config.Where(keys.front());
  for (const std::string& key : keys) {
    if (message.find("'" + key.substr(section.size() + 1) + "'") != std::string::npos) {
      where = config.Where(key);
      break;
    }
  }
  return where + ": [" + section + "] " + message;
}

Status ValidateRanges(const Config& config) {
  REFIT_RETURN_NOT_OK(RequireAtLeast(config, "sender.poll_interval_ms", 1, "milliseconds"));
  REFIT_RETURN_NOT_OK(RequireAtLeast(config, "receiver.poll_interval_ms", 1, "milliseconds"));
  REFIT_RETURN_NOT_OK(RequireAtLeast(config, "sender.ack_timeout_s", 0, "seconds"));
  REFIT_RETURN_NOT_OK(
      RequireAtLeast(config, "sender.threads", 0, "0: hardware concurrency, 1: inline"));
  REFIT_RETURN_NOT_OK(
      RequireAtLeast(config, "receiver.threads", 0, "0: hardware concurrency, 1: inline"));
  REFIT_RETURN_NOT_OK(RequireAtLeast(config, "sender.full_every", 0, "0: never"));
  REFIT_RETURN_NOT_OK(RequireAtLeast(config, "sender.checkpoint_versions", 1, "versions"));
  REFIT_RETURN_NOT_OK(RequireAtLeast(config, "receiver.checkpoint_versions", 1, "versions"));
  REFIT_RETURN_NOT_OK(RequireAtLeast(config, "serve.poll_interval_ms", 0, "0: no polling"));
  REFIT_RETURN_NOT_OK(RequireAtLeast(config, "serve.sync_timeout_s", 0, "seconds"));
  REFIT_RETURN_NOT_OK(RequireAtLeast(config, "sender.keep_versions", 0, "0: keep every version"));
  REFIT_RETURN_NOT_OK(
      RequireAtLeast(config, "receiver.max_apply_failures", 1, "attempts before abandoning"));
  // A payload smaller than this is all header and round trips.
  constexpr uint64_t kMinBucketBytes = 4096;
  REFIT_ASSIGN_OR_RAISE(uint64_t bucket, config.GetSize("sender.bucket_bytes", 64ull << 20));
  if (bucket < kMinBucketBytes) {
    return Status::Invalid(config.Where("sender.bucket_bytes") +
                           ": 'sender.bucket_bytes' must be at least 4KiB, not " +
                           std::to_string(bucket) + " bytes");
  }
  // Left unset, chunk_bytes shrinks to the bucket; set, it must fit in one.
  REFIT_ASSIGN_OR_RAISE(uint64_t chunk, config.GetSize("sender.chunk_bytes", 16ull << 20));
  if (config.Has("sender.chunk_bytes") && chunk > bucket) {
    return Status::Invalid(config.Where("sender.chunk_bytes") + ": 'sender.chunk_bytes' (" +
                           std::to_string(chunk) + " bytes) must not exceed sender.bucket_bytes (" +
                           std::to_string(bucket) + " bytes)");
  }
  if (config.Has("sender.chunk_bytes") && chunk == 0) {
    return Status::Invalid(config.Where("sender.chunk_bytes") +
                           ": 'sender.chunk_bytes' must be at least 1 byte");
  }
  return Status::OK();
}

}  // namespace

Status ValidateConfig(const Config& config, const Registry& registry) {
  // Framework sections first, then the plugin sections [kind.name].
  const std::vector<ConfigKeySpec> specs = FrameworkConfigSpecs();
  for (const char* section : {"sender", "receiver", "plugins", "faults", "auth", "serve"}) {
    REFIT_RETURN_NOT_OK(config.Validate(specs, section));
  }
  const std::set<std::string> known_roots = {"sender",    "receiver", "plugins",
                                             "transport", "layout",   "encoding",
                                             "faults",    "auth",     "serve"};
  for (const auto& [key, value] : config.values()) {
    std::string root = key.substr(0, key.find('.'));
    if (known_roots.count(root) == 0) {
      return Status::Invalid(config.Where(key) + ": unknown key '" + key + "'");
    }
  }
  struct Kind {
    const char* root;
    refit_component_kind_t kind;
  };
  for (Kind k : {Kind{"transport", REFIT_KIND_TRANSPORT}, Kind{"layout", REFIT_KIND_LAYOUT},
                 Kind{"encoding", REFIT_KIND_ENCODING}}) {
    std::set<std::string> validated;
    for (const std::string& key : config.KeysUnder(k.root)) {
      std::string rest = key.substr(std::string(k.root).size() + 1);
      size_t dot = rest.find('.');
      if (dot == std::string::npos) {
        if (k.kind == REFIT_KIND_TRANSPORT && rest == "bandwidth") {
          REFIT_RETURN_NOT_OK(internal::LinkOptionsFromConfig(config).status());
          continue;
        }
        if (k.kind != REFIT_KIND_ENCODING && rest == "name") {
          REFIT_ASSIGN_OR_RAISE(std::string name, config.GetString(key, ""));
          if (registry.Find(k.kind, name) == nullptr) {
            return Status::Invalid(config.Where(key) + ": unknown " + k.root + " '" + name + "'");
          }
          continue;
        }
        return Status::Invalid(config.Where(key) + ": unknown key '" + key + "'");
      }
      std::string name = rest.substr(0, dot);
      if (!validated.insert(name).second) continue;
      if (k.kind == REFIT_KIND_ENCODING && name == internal::kAutoEncoding) {
        // The framework's own `auto` encoding: its keys, then its candidates.
        REFIT_RETURN_NOT_OK(config.Validate(specs, "encoding.auto"));
        internal::EncodingCache cache(registry, &config);
        REFIT_RETURN_NOT_OK(cache.Auto().status());
        continue;
      }
      const ComponentInfo* info = registry.Find(k.kind, name);
      if (info == nullptr) {
        return Status::Invalid(config.Where(key) + ": section [" + std::string(k.root) + "." +
                               name + "] names an unknown " + k.root + " '" + name + "'");
      }
      std::vector<ConfigKeySpec> plugin_specs;
      std::string section = std::string(k.root) + "." + name;
      for (ConfigKeySpec spec : info->config_keys) {
        spec.name = section + "." + spec.name;
        plugin_specs.push_back(std::move(spec));
      }
      REFIT_RETURN_NOT_OK(config.Validate(plugin_specs, section));
      if (k.kind == REFIT_KIND_ENCODING) {
        // Values of the right type may still be out of the encoding's range (a zstd level);
        // the receiver never builds the sender's encoder, so build it here for both sides.
        internal::EncodingCache cache(registry, &config);
        Status built = cache.Get(name).status();
        if (!built.ok()) return Status::Invalid(WhereNamed(config, section, built.message()));
      }
    }
  }
  REFIT_RETURN_NOT_OK(ValidateRanges(config));
  REFIT_RETURN_NOT_OK(internal::FaultOptionsFromConfig(config).status());
  REFIT_ASSIGN_OR_RAISE(std::string encoding,
                        config.GetString("sender.encoding", internal::kAutoEncoding));
  if (encoding != internal::kAutoEncoding &&
      registry.Find(REFIT_KIND_ENCODING, encoding) == nullptr) {
    return Status::Invalid(config.Where("sender.encoding") + ": unknown encoding '" + encoding +
                           "'");
  }
  return Status::OK();
}

}  // namespace refit
