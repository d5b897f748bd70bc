#include "s3_http.h"

#include <curl/curl.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "refit/sdk/plugin.hpp"
#include "s3_xml.h"

namespace refit::s3 {
namespace {

// Error bodies are small XML documents; anything past this is not read.
constexpr size_t kMaxCapturedBody = size_t{1} << 20;

// libcurl is loaded when the first S3 client is made, not with the plugin: every refit process
// loads every plugin it finds, and libcurl's dependency closure would cost each one ~5 ms at start
// (measured: `refit plugins` 15.9 ms with libcurl linked, 10.8 ms without).
struct CurlApi {
  CURLcode (*global_init)(long) = nullptr;
  CURL* (*easy_init)() = nullptr;
  void (*easy_cleanup)(CURL*) = nullptr;
  void (*easy_reset)(CURL*) = nullptr;
  CURLcode (*easy_setopt)(CURL*, CURLoption, ...) = nullptr;
  CURLcode (*easy_perform)(CURL*) = nullptr;
  CURLcode (*easy_getinfo)(CURL*, CURLINFO, ...) = nullptr;
  const char* (*easy_strerror)(CURLcode) = nullptr;
  curl_slist* (*slist_append)(curl_slist*, const char*) = nullptr;
  void (*slist_free_all)(curl_slist*) = nullptr;
  std::string error;  // why libcurl is not usable; empty when it is
};

template <typename Fn>
void Bind(void* lib, const char* name, Fn* fn, std::string* error) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*fn == nullptr && error->empty()) *error = std::string("libcurl.so.4 has no ") + name;
}

// Loaded once (a function-local static: thread-safe), curl_global_init included, which must run
// once before any handle exists.
const CurlApi& Curl() {
  static const CurlApi api = [] {
    CurlApi a;
    void* lib = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      a.error = std::string("cannot load libcurl.so.4: ") + (why != nullptr ? why : "?");
      return a;
    }
    Bind(lib, "curl_global_init", &a.global_init, &a.error);
    Bind(lib, "curl_easy_init", &a.easy_init, &a.error);
    Bind(lib, "curl_easy_cleanup", &a.easy_cleanup, &a.error);
    Bind(lib, "curl_easy_reset", &a.easy_reset, &a.error);
    Bind(lib, "curl_easy_setopt", &a.easy_setopt, &a.error);
    Bind(lib, "curl_easy_perform", &a.easy_perform, &a.error);
    Bind(lib, "curl_easy_getinfo", &a.easy_getinfo, &a.error);
    Bind(lib, "curl_easy_strerror", &a.easy_strerror, &a.error);
    Bind(lib, "curl_slist_append", &a.slist_append, &a.error);
    Bind(lib, "curl_slist_free_all", &a.slist_free_all, &a.error);
    if (a.error.empty() && a.global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
      a.error = "curl_global_init failed";
    }
    return a;
  }();
  return api;
}

struct TransferState {
  const HttpRequest* req;
  HttpResponse* resp;
  CURL* curl;
  bool overflow = false;
  uint64_t skipped = 0;
};

bool IsSuccess(long status) { return status >= 200 && status < 300; }

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  auto* state = static_cast<TransferState*>(user);
  size_t n = size * count;
  long status = 0;
  Curl().easy_getinfo(state->curl, CURLINFO_RESPONSE_CODE, &status);
  if (state->req->sink == nullptr || !IsSuccess(status)) {
    size_t room = kMaxCapturedBody - std::min(kMaxCapturedBody, state->resp->body.size());
    state->resp->body.append(data, std::min(n, room));
    return n;
  }
  size_t offset = 0;
  if (status == 200 && state->skipped < state->req->skip_on_200) {
    offset = static_cast<size_t>(std::min<uint64_t>(n, state->req->skip_on_200 - state->skipped));
    state->skipped += offset;
  }
  uint64_t& received = state->resp->sink_received;
  size_t take = n - offset;
  if (status == 200 && received + take > state->req->sink_len) {
    take = static_cast<size_t>(state->req->sink_len - received);  // a whole object: stop at len
  }
  if (received + take > state->req->sink_len) {
    state->overflow = true;
    return 0;  // aborts the transfer: the server sent more than the range asked for
  }
  std::memcpy(state->req->sink + received, data + offset, take);
  received += take;
  return n;
}

bool HeaderIs(const std::string& line, const char* name) {
  size_t len = std::strlen(name);
  return line.size() > len && line[len] == ':' && strncasecmp(line.c_str(), name, len) == 0;
}

std::string HeaderValue(const std::string& line) {
  size_t begin = line.find(':') + 1;
  size_t end = line.find_last_not_of(" \t\r\n");
  begin = line.find_first_not_of(" \t", begin);
  return begin == std::string::npos || end < begin ? "" : line.substr(begin, end - begin + 1);
}

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* resp = static_cast<TransferState*>(user)->resp;
  std::string line(data, size * count);
  if (line.rfind("HTTP/", 0) == 0) {  // a new response (after a 100 Continue): forget the last
    resp->etag.clear();
    resp->has_content_length = false;
  } else if (HeaderIs(line, "ETag")) {
    resp->etag = HeaderValue(line);
  } else if (HeaderIs(line, "Content-Length")) {
    std::string value = HeaderValue(line);
    char* end = nullptr;
    unsigned long long n = std::strtoull(value.c_str(), &end, 10);
    resp->has_content_length = !value.empty() && end != nullptr && *end == '\0';
    resp->content_length = n;
  }
  return size * count;
}

bool IsRetryableCurlError(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

int BackoffMs(const RetryPolicy& policy, int retry) {
  // Full doubling up to the cap, then a uniform pick in [d/2, d]: retries of many parallel parts
  // that failed together do not arrive together.
  int64_t delay = policy.base_backoff_ms;
  for (int i = 0; i < retry && delay < policy.max_backoff_ms; ++i) delay *= 2;
  delay = std::min<int64_t>(delay, policy.max_backoff_ms);
  thread_local std::mt19937 rng{std::random_device{}()};
  std::uniform_int_distribution<int64_t> pick(delay / 2, delay);
  return static_cast<int>(pick(rng));
}

}  // namespace

struct HttpClient::Attempt {
  CURLcode code = CURLE_OK;
  bool overflow = false;
  HttpResponse response;
};

HttpClient::HttpClient(Credentials credentials, std::string region, RetryPolicy policy)
    : credentials_(std::move(credentials)), sigv4_("aws:amz:" + region + ":s3"), policy_(policy) {}

HttpClient::~HttpClient() {
  for (void* curl : idle_handles_) Curl().easy_cleanup(static_cast<CURL*>(curl));
}

void* HttpClient::AcquireHandle() {
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    if (!idle_handles_.empty()) {
      void* curl = idle_handles_.back();
      idle_handles_.pop_back();
      return curl;
    }
  }
  return Curl().error.empty() ? Curl().easy_init() : nullptr;
}

void HttpClient::ReleaseHandle(void* curl) {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  idle_handles_.push_back(curl);
}

HttpClient::Attempt HttpClient::SendOnce(void* handle, const HttpRequest& req) {
  CURL* curl = static_cast<CURL*>(handle);
  Attempt attempt;
  TransferState state{&req, &attempt.response, curl};
  Curl().easy_reset(curl);  // keeps the handle's open connections
  Curl().easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  Curl().easy_setopt(curl, CURLOPT_URL, req.url.c_str());
  Curl().easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4_.c_str());
  Curl().easy_setopt(curl, CURLOPT_USERNAME, credentials_.access_key_id.c_str());
  Curl().easy_setopt(curl, CURLOPT_PASSWORD, credentials_.secret_access_key.c_str());
  Curl().easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, static_cast<long>(policy_.timeout_s));
  Curl().easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  Curl().easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, static_cast<long>(policy_.timeout_s));
  Curl().easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
  Curl().easy_setopt(curl, CURLOPT_WRITEDATA, &state);
  Curl().easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
  Curl().easy_setopt(curl, CURLOPT_HEADERDATA, &state);

  const bool has_body = req.body != nullptr || std::strcmp(req.method, "PUT") == 0 ||
                        std::strcmp(req.method, "POST") == 0;
  // SigV4 for S3 signs this header's value as the payload hash: the real SHA-256, so the server
  // also checks the bytes it received.
  std::string payload_hash = "x-amz-content-sha256: " + Sha256Hex(req.body, req.body_len);
  curl_slist* headers = Curl().slist_append(nullptr, payload_hash.c_str());
  // Only headers that are sent: curl signs every header of this list, and an "Name:" entry that
  // removes one of curl's own headers would be signed but never sent.
  std::string content_type;
  if (has_body && !req.content_type.empty()) {
    content_type = "Content-Type: " + req.content_type;
    headers = Curl().slist_append(headers, content_type.c_str());
  }
  std::string token, range;
  if (!credentials_.session_token.empty()) {
    token = "x-amz-security-token: " + credentials_.session_token;
    headers = Curl().slist_append(headers, token.c_str());
  }
  if (!req.range.empty()) {
    range = "Range: " + req.range;
    headers = Curl().slist_append(headers, range.c_str());
  }
  Curl().easy_setopt(curl, CURLOPT_HTTPHEADER, headers);

  static const char kEmpty[] = "";
  if (std::strcmp(req.method, "HEAD") == 0) {
    Curl().easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (has_body) {
    Curl().easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body_len));
    Curl().easy_setopt(curl, CURLOPT_POSTFIELDS,
                       req.body == nullptr ? kEmpty : reinterpret_cast<const char*>(req.body));
    Curl().easy_setopt(curl, CURLOPT_CUSTOMREQUEST, req.method);
  } else if (std::strcmp(req.method, "GET") != 0) {
    Curl().easy_setopt(curl, CURLOPT_CUSTOMREQUEST, req.method);
  }
  attempt.code = Curl().easy_perform(curl);
  attempt.overflow = state.overflow;
  Curl().easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &attempt.response.status);
  Curl().easy_setopt(curl, CURLOPT_HTTPHEADER, nullptr);
  Curl().slist_free_all(headers);
  return attempt;
}

Result<HttpResponse> HttpClient::Send(const HttpRequest& req) {
  void* curl = AcquireHandle();
  if (curl == nullptr) {
    return Status::IoError(req.what + ": " +
                           (Curl().error.empty() ? "curl_easy_init failed" : Curl().error));
  }
  std::string last_failure;
  for (int attempt_no = 0;; ++attempt_no) {
    Attempt attempt = SendOnce(curl, req);
    attempt.response.attempts = attempt_no + 1;
    bool retryable = false;
    if (attempt.overflow) {
      ReleaseHandle(curl);
      return Status::Corrupt(req.what + ": the server sent more than the " +
                             std::to_string(req.sink_len) + " bytes asked for");
    }
    if (attempt.code == CURLE_OK) {
      if (attempt.response.status < 500) {
        ReleaseHandle(curl);
        return std::move(attempt.response);
      }
      retryable = true;
      last_failure = DescribeError(attempt.response);
    } else {
      retryable = IsRetryableCurlError(attempt.code);
      last_failure = Curl().easy_strerror(attempt.code);
    }
    if (!retryable || attempt_no >= policy_.max_retries) {
      ReleaseHandle(curl);
      return Status::IoError(
          req.what + ": " + last_failure +
          (retryable ? " (gave up after " + std::to_string(attempt_no + 1) + " attempts)" : ""));
    }
    int wait_ms = BackoffMs(policy_, attempt_no);
    sdk::Log(REFIT_LOG_DEBUG, "s3",
             std::string(req.method) + " " + req.what + ": " + last_failure + "; retry " +
                 std::to_string(attempt_no + 1) + " of " + std::to_string(policy_.max_retries) +
                 " in " + std::to_string(wait_ms) + " ms");
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
  }
}

std::string UriEncode(const std::string& text, bool keep_slash) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' ||
        (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string DescribeError(const HttpResponse& response) {
  std::optional<std::string> code = XmlFirst(response.body, "Code");
  std::string text = "HTTP " + std::to_string(response.status);
  if (response.status == 403 && response.body.empty()) {
    // HEAD answers have no body to carry the code.
    return text +
           " Forbidden (no S3 error code in the answer: check the credentials, the clock "
           "and the key's permissions)";
  }
  if (code && !code->empty()) {
    text += " " + *code;
    std::string message = XmlFirst(response.body, "Message").value_or("");
    if (message.size() > 200) message = message.substr(0, 200) + "...";
    if (!message.empty()) text += ": " + message;
  }
  return text;
}

}  // namespace refit::s3
