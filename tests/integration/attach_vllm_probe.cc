// An inference engine in one process, for attach_vllm_test.cc: its parameters are a vLLM TP shard
// (as `refit shard --layout vllm` writes it) read into its own heap memory, attached to a
// Receiver whose layout is vllm. It polls until --until-version is applied, compares its memory
// bit for bit with the expected shard of every version given, and prints its peak resident set
// while deltas were applied.
//
//   refit_attach_vllm_probe --config FILE --shard FILE --until-version N
//                           [--expect V=FILE]... [--timeout SECONDS]
//
// Files are read with pread, never mapped, so that the process's resident set is the engine's
// memory plus what the receiver holds (a mapped file's touched pages count in it too).
//
// Output (stdout), one line each: "attached N bytes in T tensors", "version V (full|delta) applied
// ...", "version V bit-exact with FILE", and at the end "peak resident during deltas: N bytes
// (METHOD)". Exit status 0 when every expected version matched, 1 otherwise.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/file_util.h"
#include "refit/refit.h"

namespace {

using refit::Result;
using refit::Status;

// One tensor of a safetensors file: where its bytes are in the file.
struct FileTensor {
  std::string name;
  refit::DType dtype = refit::DType::kU8;
  refit::Shape shape;
  uint64_t offset = 0;  // in the file
  uint64_t nbytes = 0;
};

// One engine parameter: heap memory the receiver writes into.
struct Parameter {
  std::string name;
  refit::DType dtype = refit::DType::kU8;
  refit::Shape shape;
  std::vector<uint8_t> bytes;
};

Status ReadAt(int fd, uint64_t offset, uint8_t* out, uint64_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, out, n, static_cast<off_t>(offset));
    if (got <= 0) return Status::IoError("short read of " + path);
    out += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
  return Status::OK();
}

// The tensors of a safetensors file in file order (8-byte header length, JSON header, data).
Result<std::vector<FileTensor>> ReadHeader(int fd, const std::string& path) {
  uint8_t len_bytes[8];
  REFIT_RETURN_NOT_OK(ReadAt(fd, 0, len_bytes, 8, path));
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | len_bytes[i];
  if (len > (100ull << 20)) return Status::Invalid(path + ": header too large");
  std::string text(len, '\0');
  REFIT_RETURN_NOT_OK(ReadAt(fd, 8, reinterpret_cast<uint8_t*>(text.data()), len, path));
  const nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) return Status::Invalid(path + ": header is not a JSON object");
  std::vector<FileTensor> tensors;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    FileTensor t;
    t.name = name;
    REFIT_ASSIGN_OR_RAISE(t.dtype,
                          refit::DTypeFromSafetensors(entry.at("dtype").get<std::string>()));
    t.shape = entry.at("shape").get<refit::Shape>();
    const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
    t.offset = 8 + len + offsets.at(0);
    t.nbytes = offsets.at(1) - offsets.at(0);
    tensors.push_back(std::move(t));
  }
  std::sort(tensors.begin(), tensors.end(),
            [](const FileTensor& a, const FileTensor& b) { return a.offset < b.offset; });
  return tensors;
}

// The engine's parameters: every tensor of the shard file copied into heap memory.
Result<std::vector<Parameter>> LoadParameters(const std::string& path) {
  refit::internal::ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return Status::IoError("cannot open " + path);
  REFIT_ASSIGN_OR_RAISE(std::vector<FileTensor> tensors, ReadHeader(fd.get(), path));
  std::vector<Parameter> params;
  for (const FileTensor& t : tensors) {
    Parameter p{t.name, t.dtype, t.shape, std::vector<uint8_t>(t.nbytes)};
    REFIT_RETURN_NOT_OK(ReadAt(fd.get(), t.offset, p.bytes.data(), t.nbytes, path));
    params.push_back(std::move(p));
  }
  return params;
}

// Same names, dtypes, shapes and bits as the tensors of `path` (read 1 MiB at a time).
Status CompareWith(const std::string& path, const std::vector<Parameter>& params) {
  refit::internal::ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return Status::IoError("cannot open " + path);
  REFIT_ASSIGN_OR_RAISE(std::vector<FileTensor> tensors, ReadHeader(fd.get(), path));
  if (tensors.size() != params.size()) {
    return Status::Invalid(path + " has " + std::to_string(tensors.size()) +
                           " tensors, the engine " + std::to_string(params.size()));
  }
  std::map<std::string, const FileTensor*> by_name;
  for (const FileTensor& t : tensors) by_name[t.name] = &t;
  std::vector<uint8_t> buffer(1 << 20);
  for (const Parameter& p : params) {
    auto it = by_name.find(p.name);
    if (it == by_name.end()) return Status::Invalid(path + " has no '" + p.name + "'");
    const FileTensor& t = *it->second;
    if (t.dtype != p.dtype || t.shape != p.shape || t.nbytes != p.bytes.size()) {
      return Status::Invalid("dtype or shape of '" + p.name + "' differs from " + path);
    }
    for (uint64_t at = 0; at < t.nbytes; at += buffer.size()) {
      const uint64_t n = std::min<uint64_t>(buffer.size(), t.nbytes - at);
      REFIT_RETURN_NOT_OK(ReadAt(fd.get(), t.offset + at, buffer.data(), n, path));
      if (std::memcmp(buffer.data(), p.bytes.data() + at, n) != 0) {
        uint64_t i = 0;
        while (buffer[i] == p.bytes[at + i]) ++i;
        return Status::Invalid("'" + p.name + "' differs from " + path + " at byte " +
                               std::to_string(at + i));
      }
    }
  }
  return Status::OK();
}

// A field of /proc/self/status in bytes ("VmHWM", "VmRSS"); 0 where unavailable.
uint64_t ProcStatusBytes(const char* key) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  const size_t key_len = std::strlen(key);
  uint64_t kib = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, key, key_len) == 0 && line[key_len] == ':') {
      kib = std::strtoull(line + key_len + 1, nullptr, 10);
      break;
    }
  }
  std::fclose(f);
  return kib * 1024;
}

// Resets VmHWM to the current resident set (writing "5" to clear_refs, Linux >= 4.0). VmHWM is
// the peak since the last reset, so reading it after a delta gives the peak of that window
// exactly (the kernel tracks every page, a sampling thread could miss a short-lived buffer).
bool ResetPeakResident() {
  refit::internal::ScopedFd fd(::open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC));
  return fd.get() >= 0 && ::write(fd.get(), "5", 1) == 1;
}

struct Options {
  std::string config;
  std::string shard;
  uint64_t until_version = 0;
  std::map<uint64_t, std::string> expect;
  double timeout_s = 300;
};

Result<Options> ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--config") {
      o.config = value;
    } else if (key == "--shard") {
      o.shard = value;
    } else if (key == "--until-version") {
      o.until_version = std::strtoull(value.c_str(), nullptr, 10);
    } else if (key == "--timeout") {
      o.timeout_s = std::strtod(value.c_str(), nullptr);
    } else if (key == "--expect" && value.find('=') != std::string::npos) {
      const size_t eq = value.find('=');
      o.expect[std::strtoull(value.substr(0, eq).c_str(), nullptr, 10)] = value.substr(eq + 1);
    } else {
      return Status::Invalid("unknown argument " + key + " " + value);
    }
  }
  if (argc % 2 != 1 || o.config.empty() || o.shard.empty() || o.until_version == 0) {
    return Status::Invalid(
        "usage: refit_attach_vllm_probe --config FILE --shard FILE --until-version N "
        "[--expect V=FILE]... [--timeout S]");
  }
  return o;
}

// The peak resident set of the delta windows so far, and how it is measured.
struct PeakTracker {
  bool reset_failed = false;  // clear_refs refused once: VmHWM is the process-lifetime peak
  uint64_t delta_peak = 0;

  // Called after every applied version (the memory comparison that follows is not in a window:
  // it is reset again once the comparison is done, see Rearm).
  void Applied(const refit::ApplyStats& s) {
    const uint64_t hwm = ProcStatusBytes("VmHWM");
    if (!s.full) delta_peak = std::max(delta_peak, hwm);
    std::printf("version %" PRIu64 " (%s) applied: %" PRIu64 " payloads, %" PRIu64
                " payload bytes, %" PRIu64 " changed elements; window peak resident %" PRIu64
                " bytes, resident now %" PRIu64 " bytes\n",
                s.version, s.full ? "full" : "delta", s.payloads, s.payload_bytes,
                s.counters.changed_elements, hwm, ProcStatusBytes("VmRSS"));
  }
  void Rearm() { reset_failed = reset_failed || !ResetPeakResident(); }
  // Without clear_refs, VmHWM is the process-lifetime peak: the load, the full sync and the
  // comparisons included. It bounds the delta peak from above, so a check against it is sound
  // (if pessimistic); the method says which one was measured.
  const char* Method() const {
    return reset_failed ? "process-lifetime VmHWM, clear_refs refused: an upper bound"
                        : "VmHWM reset through /proc/self/clear_refs after each version";
  }
};

// Polls until o.until_version is applied; every version with an expected file is compared.
Status Follow(refit::Receiver& receiver, const Options& o, const std::vector<Parameter>& params,
              PeakTracker* peak) {
  const auto start = std::chrono::steady_clock::now();
  std::string last_error;
  peak->Rearm();
  while (receiver.version() < o.until_version) {
    Result<std::optional<refit::ApplyStats>> r = receiver.PollOnce();
    if (!r.ok()) {
      if (r.status().message() != last_error) {
        std::fprintf(stderr, "probe: %s; retrying\n", r.status().message().c_str());
        last_error = r.status().message();
      }
    } else if (r.value()) {
      peak->Applied(*r.value());
      const uint64_t v = r.value()->version;
      if (auto it = o.expect.find(v); it != o.expect.end()) {
        REFIT_RETURN_NOT_OK(
            CompareWith(it->second, params).WithContext("version " + std::to_string(v)));
        std::printf("version %" PRIu64 " bit-exact with %s\n", v, it->second.c_str());
      }
      std::fflush(stdout);
      peak->Rearm();
      continue;
    }
    const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
    if (waited.count() > o.timeout_s) {
      return Status::Timeout("gave up waiting for version " + std::to_string(o.until_version) +
                             " (at " + std::to_string(receiver.version()) + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return Status::OK();
}

Status Run(const Options& o) {
  REFIT_ASSIGN_OR_RAISE(refit::Config config, refit::Config::FromFile(o.config));
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<refit::Receiver> receiver, refit::Receiver::Make(config));
  REFIT_ASSIGN_OR_RAISE(std::vector<Parameter> params, LoadParameters(o.shard));
  std::vector<refit::TensorView> views;
  uint64_t attached = 0;
  for (Parameter& p : params) {
    views.push_back({p.name, p.dtype, p.shape, p.bytes.data()});
    attached += p.bytes.size();
  }
  REFIT_RETURN_NOT_OK(receiver->Attach(views));
  std::printf("attached %" PRIu64 " bytes in %zu tensors\n", attached, params.size());
  PeakTracker peak;
  REFIT_RETURN_NOT_OK(Follow(*receiver, o, params, &peak));
  std::printf("peak resident during deltas: %" PRIu64 " bytes (%s)\n", peak.delta_peak,
              peak.Method());
  return Status::OK();
}

}  // namespace

int main(int argc, char** argv) {
  Result<Options> options = ParseArgs(argc, argv);
  Status st = options.ok() ? Run(*options) : options.status();
  if (!st.ok()) {
    std::fprintf(stderr, "probe: error: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
