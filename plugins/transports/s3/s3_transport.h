// The `s3` transport: a keyed blob channel over an S3 bucket (AWS S3 or any server speaking its
// REST API with SigV4). Key "v00000007/COMMIT" is the object "<prefix>v00000007/COMMIT" in the
// bucket. A put is one PutObject, or a multipart upload when it is larger than part_bytes (parts
// in parallel, aborted on failure); S3 makes either visible whole or not at all, which is the
// atomicity the transport contract asks for. Large gets are split into parallel ranged GETs.
//
// Thread safety: every method may be called concurrently; curl handles come from a pool.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "refit/plugin_abi.h"
#include "refit/sdk/plugin.hpp"
#include "refit/status.h"
#include "s3_credentials.h"
#include "s3_http.h"

namespace refit::s3 {

struct S3Options {
  std::string endpoint;  // "http://127.0.0.1:9000" or "https://s3.us-east-1.amazonaws.com"
  std::string region = "us-east-1";
  std::string bucket;
  std::string prefix;               // "" or "some/dir/": prepended to every key
  bool virtual_addressing = false;  // bucket.host/key instead of host/bucket/key
  uint64_t part_bytes = uint64_t{16} << 20;
  int concurrency = 4;
  int list_page_keys = 1000;  // max-keys of one ListObjectsV2 page (S3's own maximum is 1000)
  // SigV4's rule is '/' as %2F in query values; moto 5 verifies against a raw '/'.
  bool encode_slash_in_query = true;
  RetryPolicy retry;
  CredentialSettings credentials;
};

class S3Transport {
 public:
  // The SDK concept: reads [transport.s3] (docs/config.md). Role and peer are unused.
  static Result<std::unique_ptr<S3Transport>> Create(const sdk::ConfigView& cfg,
                                                     refit_transport_role_t role,
                                                     const std::string& peer_id);
  static Result<std::unique_ptr<S3Transport>> Open(S3Options options);

  Status Put(const std::string& key, const uint8_t* data, uint64_t len);
  // nullopt on 404.
  Result<std::optional<uint64_t>> Size(const std::string& key);
  // Exactly len bytes at offset: NotFound for a missing key, Corrupt for a range past the end.
  Status Get(const std::string& key, uint64_t offset, uint8_t* buf, uint64_t len);
  // Every key under prefix with its size (objects whose names are not keys are skipped).
  Result<std::vector<std::pair<std::string, uint64_t>>> List(const std::string& prefix);
  // A missing key is fine.
  Status Remove(const std::string& key);

 private:
  S3Transport(S3Options options, std::string scheme_host, Credentials credentials);
  std::string ObjectUrl(const std::string& key, const std::string& query = "") const;
  std::string BucketUrl(const std::string& query) const;
  std::string Name(const std::string& op, const std::string& key) const;
  Status Fail(const std::string& op, const std::string& key, const HttpResponse& resp) const;
  Status PutSingle(const std::string& key, const uint8_t* data, uint64_t len);
  Status PutMultipart(const std::string& key, const uint8_t* data, uint64_t len);
  Result<std::string> UploadParts(const std::string& key, const std::string& upload_id,
                                  const uint8_t* data, uint64_t len);
  Status CompleteUpload(const std::string& key, const std::string& upload_id,
                        const std::string& parts_xml);
  void AbortUpload(const std::string& key, const std::string& upload_id);
  Status GetRange(const std::string& key, uint64_t offset, uint8_t* buf, uint64_t len);
  Status RangePastEnd(const std::string& key, uint64_t offset, uint64_t len);

  S3Options options_;
  std::string scheme_host_;  // "http://127.0.0.1:9000" (virtual: with the bucket in front)
  std::unique_ptr<HttpClient> http_;
};

}  // namespace refit::s3
