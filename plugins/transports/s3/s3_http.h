// The s3 transport's HTTP layer: SigV4-signed requests through libcurl (CURLOPT_AWS_SIGV4), a
// small pool of reused curl handles (their connections stay open), and retries with exponential
// backoff and jitter on what is worth retrying: 5xx answers, timeouts and refused or reset
// connections. A 4xx answer is returned at once: it is the request or the credentials that are
// wrong, and repeating it changes nothing.
//
// Credentials go to curl as the user name and password of the signature only; curl's verbose
// trace is never enabled (it would print the signed headers), and no message built here contains
// them.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/sha256.h"
#include "refit/status.h"
#include "s3_credentials.h"

namespace refit::s3 {

struct RetryPolicy {
  int max_retries = 5;        // attempts after the first
  int timeout_s = 30;         // connect timeout, and the longest a transfer may move no byte
  int base_backoff_ms = 100;  // first retry waits ~this (jittered), doubling per retry
  int max_backoff_ms = 5000;
};

struct HttpRequest {
  const char* method = "GET";  // GET PUT POST DELETE HEAD
  std::string url;             // complete, query included (already encoded and sorted)
  std::string what;            // "put 'v00000001/COMMIT'": how messages name the operation
  const uint8_t* body = nullptr;
  uint64_t body_len = 0;
  std::string content_type;  // for a body
  std::string range;         // "bytes=a-b" or empty
  // GET into a caller buffer: a 2xx body goes to sink[0, sink_len); more bytes than that fail the
  // transfer. With a 200 (a server that ignored Range) the first skip_on_200 bytes are dropped.
  uint8_t* sink = nullptr;
  uint64_t sink_len = 0;
  uint64_t skip_on_200 = 0;
};

struct HttpResponse {
  long status = 0;
  std::string body;  // non-2xx answers, and 2xx answers of requests without a sink (capped)
  std::string etag;
  uint64_t content_length = 0;
  bool has_content_length = false;
  uint64_t sink_received = 0;
  int attempts = 0;
};

class HttpClient {
 public:
  HttpClient(Credentials credentials, std::string region, RetryPolicy policy);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Sends req, retrying as described above. OK with the last answer whatever its status (the
  // caller decides what a 404 means); IoError when no answer came back after the retries, or
  // after a failure not worth retrying (naming the operation and the curl error).
  Result<HttpResponse> Send(const HttpRequest& req);

 private:
  struct Attempt;
  Attempt SendOnce(void* curl, const HttpRequest& req);
  void* AcquireHandle();
  void ReleaseHandle(void* curl);

  Credentials credentials_;
  std::string sigv4_;  // "aws:amz:REGION:s3"
  RetryPolicy policy_;
  std::mutex pool_mutex_;
  std::vector<void*> idle_handles_;
};

// Lowercase hex SHA-256 of the bytes (the x-amz-content-sha256 of a signed payload).
using internal::Sha256Hex;
// Percent-encodes everything but the unreserved characters (A-Z a-z 0-9 - . _ ~), as SigV4's
// canonical query wants; with keep_slash, '/' stays as is.
std::string UriEncode(const std::string& text, bool keep_slash);
// "SignatureDoesNotMatch: The request signature ..." from an S3 error body, else "HTTP <status>".
std::string DescribeError(const HttpResponse& response);

}  // namespace refit::s3
