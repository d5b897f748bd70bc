// Broadcast throughput of the nccl transport per bucket size: one sender (device 0) and one
// receiver per other visible GPU, all in this process, through the real loader. Each put of a
// `--payload-mib` payload is timed from the sender's put until every receiver holds it (the
// bytes checked once per bucket size). With one GPU there is no receiver (NCCL allows one rank
// per GPU): the numbers are then the sender's upload + one-rank broadcast path only, and say so.
//
// usage: refit_nccl_bench [--payload-mib N] [--reps N] [--buckets-mib 4,16,64,256]
// Exit 77 without a GPU.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <vector>

#include "nccl_test_util.h"

namespace refit::nccl_test {
namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  uint64_t payload_mib = 1024;
  int reps = 3;
  std::vector<uint64_t> buckets_mib = {4, 16, 64, 256};
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    std::string value = argv[i + 1];
    if (flag == "--payload-mib") a.payload_mib = std::stoull(value);
    if (flag == "--reps") a.reps = std::max(1, std::stoi(value));
    if (flag == "--buckets-mib") {
      a.buckets_mib.clear();
      std::stringstream in(value);
      for (std::string item; std::getline(in, item, ',');)
        a.buckets_mib.push_back(std::stoull(item));
    }
  }
  return a;
}

// Waits (bounded by the transport's own op timeout inside Size) until r holds key, then
// optionally compares its bytes.
Status Check(Transport& r, const std::string& key, const std::vector<uint8_t>& want, bool bytes) {
  REFIT_ASSIGN_OR_RAISE(std::optional<uint64_t> size, r.Size(key));
  if (size != std::optional<uint64_t>(want.size())) {
    return Status::Corrupt("receiver lacks " + key);
  }
  if (!bytes) return Status::OK();
  std::vector<uint8_t> got(want.size());
  REFIT_RETURN_NOT_OK(r.Get(key, 0, got.data(), got.size()));
  return got == want ? Status::OK() : Status::Corrupt("bytes of " + key + " differ");
}

Status RunBucket(const Registry& registry, const Args& args, int receivers, uint64_t bucket_mib,
                 const std::vector<uint8_t>& payload) {
  ScratchDir scratch;
  std::ostringstream extra;
  extra << "receivers = " << receivers << "\nbucket_bytes = \"" << bucket_mib << "MiB\"\n"
        << "inbox_bytes = \"" << 3 * args.payload_mib << "MiB\"\n";
  REFIT_ASSIGN_OR_RAISE(Config config, NcclConfig(scratch.path(), extra.str()));
  std::vector<std::unique_ptr<Transport>> rx;
  for (int r = 0; r < receivers; ++r) {
    REFIT_ASSIGN_OR_RAISE(
        auto t, registry.CreateTransport("nccl", REFIT_ROLE_RECEIVER, "r" + std::to_string(r),
                                         &config, "transport.nccl"));
    rx.push_back(std::move(t));
  }
  const Clock::time_point setup_start = Clock::now();
  REFIT_ASSIGN_OR_RAISE(auto tx, registry.CreateTransport("nccl", REFIT_ROLE_SENDER, "sender-r0",
                                                          &config, "transport.nccl"));
  const double setup_s = std::chrono::duration<double>(Clock::now() - setup_start).count();
  std::vector<double> seconds;
  for (int rep = 0; rep < args.reps; ++rep) {
    char key[64];
    std::snprintf(key, sizeof(key), "v%08d/payload.r0.000000.st", rep + 1);
    const Clock::time_point start = Clock::now();
    REFIT_RETURN_NOT_OK(tx->Put(key, payload.data(), payload.size()));
    for (auto& r : rx) REFIT_RETURN_NOT_OK(Check(*r, key, payload, false));
    seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    if (rep == 0) {
      for (auto& r : rx) REFIT_RETURN_NOT_OK(Check(*r, key, payload, true));
    }
  }
  std::sort(seconds.begin(), seconds.end());
  const double gbs = static_cast<double>(payload.size()) / seconds[seconds.size() / 2] / 1e9;
  std::printf("%10llu  %9d  %12.2f  %10.3f  %9.2f  %s\n",
              static_cast<unsigned long long>(bucket_mib), receivers, seconds.front() * 1e3,
              seconds[seconds.size() / 2] * 1e3, gbs, receivers > 0 ? "bit-exact" : "-");
  std::printf("            (communicator setup %.2f s)\n", setup_s);
  return Status::OK();
}

int Main(int argc, char** argv) {
  Args args = Parse(argc, argv);
  std::string why;
  const int gpus = GpuCount(&why);
  if (gpus < 1) {
    std::printf("refit_nccl_bench: skipped: %s\n", why.c_str());
    return 77;
  }
  auto registry = LoadNcclRegistry();
  if (!registry.ok()) {
    std::fprintf(stderr, "%s\n", registry.status().ToString().c_str());
    return 1;
  }
  const int receivers = std::min(gpus - 1, 7);
  std::printf("nccl broadcast: %s, payload %llu MiB, %d reps, %d receiver(s)%s\n", why.c_str(),
              static_cast<unsigned long long>(args.payload_mib), args.reps, receivers,
              receivers == 0 ? " (one GPU: sender path only, nothing leaves the GPU)" : "");
  std::vector<uint8_t> payload(args.payload_mib << 20);
  for (size_t i = 0; i < payload.size(); ++i)
    payload[i] = static_cast<uint8_t>(i * 2654435761u >> 7);
  std::printf("%10s  %9s  %12s  %10s  %9s  %s\n", "bucket_MiB", "receivers", "best_ms", "median_ms",
              "GB/s", "check");
  for (uint64_t bucket : args.buckets_mib) {
    Status st = RunBucket(*registry.value(), args, receivers, bucket, payload);
    if (!st.ok()) {
      std::fprintf(stderr, "bucket %llu MiB: %s\n", static_cast<unsigned long long>(bucket),
                   st.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace refit::nccl_test

int main(int argc, char** argv) { return refit::nccl_test::Main(argc, argv); }
