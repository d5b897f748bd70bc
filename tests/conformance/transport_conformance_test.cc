// The transport conformance suite (refit/conformance/transport_suite.h) over every transport the
// conformance registry knows. A transport needs a config: a new transport adds its setup below.
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "refit/conformance/transport_suite.h"

namespace refit::conformance {
namespace {

// The S3 server the `s3_conformance` test's fixture started (tests/s3/moto_server.py): a file of
// name=value lines named by REFIT_S3_TEST_SERVER. Unset, or a server that could not start: no
// setup, so the s3 cases are skipped with the reason.
std::map<std::string, std::string> S3TestServer() {
  std::map<std::string, std::string> settings;
  const char* path = std::getenv("REFIT_S3_TEST_SERVER");
  std::ifstream in(path == nullptr ? "" : path);
  std::string line;
  for (int n = 0; n < 100 && std::getline(in, line); ++n) {
    size_t eq = line.find('=');
    if (eq != std::string::npos) settings[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return settings;
}

void RegisterS3Setup() {
  std::map<std::string, std::string> server = S3TestServer();
  if (server.count("skip")) std::fprintf(stderr, "s3 cases skipped: %s\n", server["skip"].c_str());
  if (!server.count("endpoint")) return;
  RegisterTransportSetup(
      "s3", {[server](const fs::path& scratch) {
               Config config;
               const std::string s = "transport.s3.";
               for (const char* key :
                    {"endpoint", "region", "bucket", "access_key_id", "secret_access_key"}) {
                 config.SetString(s + key, server.at(key));
               }
               // One prefix per test: listing "" sees only its own objects.
               config.SetString(s + "prefix", "conf/" + scratch.filename().string());
               ConfigValue raw_slash;  // moto 5's signature check
               raw_slash.type = REFIT_CFG_BOOL;
               config.Set(s + "encode_slash_in_query", raw_slash);
               // Small pages: every listing follows continuation tokens.
               config.SetInt(s + "list_page_keys", 3);
               return config;
             },
             "", ""});
}

// UCX on loopback: the sender instance listens on a free port and publishes it in a rendezvous
// file in the scratch directory, which the receiver instance reads (no fixed port to clash).
void RegisterUcxSetup() {
  RegisterTransportSetup(
      "ucx", {[](const fs::path& scratch) {
                Config config;
                const std::string s = "transport.ucx.";
                config.SetString(s + "listen", "127.0.0.1:0");
                config.SetString(s + "rendezvous_file", (scratch / "sender.addr").string());
                config.SetString(s + "spool_dir", (scratch / "spool").string());
                config.SetString(s + "tls", "tcp");
                ConfigValue no_fsync;  // a test spool need not survive a host crash
                no_fsync.type = REFIT_CFG_BOOL;
                config.Set(s + "spool_fsync", no_fsync);
                return config;
              },
              "sender-r0", "r0"});
}

// Registered before main() runs the tests (gtest instantiates suites at RUN_ALL_TESTS).
[[maybe_unused]] const bool kSetupsRegistered = [] {
  RegisterTransportSetup("disk", {[](const fs::path& scratch) {
                                    Config config;
                                    config.SetString("transport.disk.dir",
                                                     (scratch / "channel").string());
                                    return config;
                                  },
                                  "", ""});
  RegisterS3Setup();
  RegisterUcxSetup();
  return true;
}();

INSTANTIATE_TEST_SUITE_P(AllTransports, TransportConformanceTest,
                         ::testing::ValuesIn(ComponentNames(REFIT_KIND_TRANSPORT)),
                         TransportParamName);

}  // namespace
}  // namespace refit::conformance
