#include "s3_transport.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <thread>

#include "common/transport_key.h"
#include "s3_xml.h"

namespace refit::s3 {
namespace {

constexpr uint64_t kMinPartBytes = uint64_t{5} << 20;  // S3's minimum for all parts but the last
constexpr uint64_t kMaxPartBytes = uint64_t{5} << 30;
constexpr uint64_t kMaxParts = 10000;
constexpr int kMaxListPages = 1000000;

// Runs task(i) for i in [0, n) on up to `threads` threads; the first failure stops the others
// from starting new tasks and is what comes back.
Status RunParallel(size_t n, int threads, const std::function<Status(size_t)>& task) {
  const size_t workers = std::min(n, static_cast<size_t>(std::max(threads, 1)));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;
  Status first;
  auto work = [&] {
    while (!failed) {
      size_t i = next++;
      if (i >= n) return;
      Status st = task(i);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(mutex);
        if (first.ok()) first = st;
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  return first;
}

Result<int64_t> IntInRange(const sdk::ConfigView& cfg, const char* key, int64_t fallback,
                           int64_t lo, int64_t hi) {
  REFIT_ASSIGN_OR_RAISE(int64_t value, cfg.GetInt(key, fallback));
  if (value < lo || value > hi) {
    return Status::Invalid("config key '" + std::string(key) + "' = " + std::to_string(value) +
                           " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) +
                           "]");
  }
  return value;
}

Status ReadRetryOptions(const sdk::ConfigView& cfg, RetryPolicy* retry) {
  REFIT_ASSIGN_OR_RAISE(int64_t retries, IntInRange(cfg, "max_retries", 5, 0, 100));
  REFIT_ASSIGN_OR_RAISE(int64_t timeout, IntInRange(cfg, "timeout_s", 30, 1, 3600));
  REFIT_ASSIGN_OR_RAISE(int64_t base, IntInRange(cfg, "retry_base_ms", 100, 1, 600000));
  REFIT_ASSIGN_OR_RAISE(int64_t cap, IntInRange(cfg, "retry_max_ms", 5000, 1, 3600000));
  if (cap < base) {
    return Status::Invalid("config key 'retry_max_ms' (" + std::to_string(cap) +
                           ") must be at least 'retry_base_ms' (" + std::to_string(base) + ")");
  }
  *retry = RetryPolicy{static_cast<int>(retries), static_cast<int>(timeout), static_cast<int>(base),
                       static_cast<int>(cap)};
  return Status::OK();
}

Status ReadCredentialOptions(const sdk::ConfigView& cfg, CredentialSettings* out) {
  REFIT_ASSIGN_OR_RAISE(out->access_key_id, cfg.GetString("access_key_id", ""));
  REFIT_ASSIGN_OR_RAISE(out->secret_access_key, cfg.GetString("secret_access_key", ""));
  REFIT_ASSIGN_OR_RAISE(out->session_token, cfg.GetString("session_token", ""));
  REFIT_ASSIGN_OR_RAISE(out->profile, cfg.GetString("profile", ""));
  return Status::OK();
}

Status ReadLocation(const sdk::ConfigView& cfg, S3Options* options) {
  REFIT_ASSIGN_OR_RAISE(options->endpoint, cfg.GetString("endpoint", ""));
  REFIT_ASSIGN_OR_RAISE(options->region, cfg.GetString("region", "us-east-1"));
  REFIT_ASSIGN_OR_RAISE(options->bucket, cfg.GetString("bucket", ""));
  REFIT_ASSIGN_OR_RAISE(options->prefix, cfg.GetString("prefix", ""));
  REFIT_ASSIGN_OR_RAISE(std::string addressing, cfg.GetString("addressing", "path"));
  if (addressing != "path" && addressing != "virtual") {
    return Status::Invalid("config key 'addressing' = '" + addressing +
                           "': expected \"path\" or \"virtual\"");
  }
  options->virtual_addressing = addressing == "virtual";
  REFIT_ASSIGN_OR_RAISE(options->encode_slash_in_query, cfg.GetBool("encode_slash_in_query", true));
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<S3Transport>> S3Transport::Create(const sdk::ConfigView& cfg,
                                                         refit_transport_role_t /*role*/,
                                                         const std::string& /*peer_id*/) {
  S3Options options;
  REFIT_RETURN_NOT_OK(ReadLocation(cfg, &options));
  REFIT_ASSIGN_OR_RAISE(options.part_bytes, cfg.GetSize("part_bytes", options.part_bytes));
  if (options.part_bytes < kMinPartBytes || options.part_bytes > kMaxPartBytes) {
    return Status::Invalid("config key 'part_bytes' = " + std::to_string(options.part_bytes) +
                           ": S3 parts must be between 5MiB and 5GiB");
  }
  REFIT_ASSIGN_OR_RAISE(int64_t concurrency, IntInRange(cfg, "concurrency", 4, 1, 64));
  options.concurrency = static_cast<int>(concurrency);
  REFIT_ASSIGN_OR_RAISE(int64_t page_keys, IntInRange(cfg, "list_page_keys", 1000, 1, 1000));
  options.list_page_keys = static_cast<int>(page_keys);
  REFIT_RETURN_NOT_OK(ReadRetryOptions(cfg, &options.retry));
  REFIT_RETURN_NOT_OK(ReadCredentialOptions(cfg, &options.credentials));
  return Open(std::move(options));
}

Result<std::unique_ptr<S3Transport>> S3Transport::Open(S3Options options) {
  std::string& endpoint = options.endpoint;
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  const size_t scheme_end = endpoint.find("://");
  const std::string scheme = scheme_end == std::string::npos ? "" : endpoint.substr(0, scheme_end);
  const std::string host = scheme_end == std::string::npos ? "" : endpoint.substr(scheme_end + 3);
  if ((scheme != "http" && scheme != "https") || host.empty() ||
      host.find_first_of("/?#@ ") != std::string::npos) {
    return Status::Invalid("config key 'endpoint' = '" + endpoint +
                           "': expected http(s)://host[:port], e.g. "
                           "https://s3.us-east-1.amazonaws.com");
  }
  // Bucket names are DNS labels (lowercase, digits, '.', '-'): nothing in a URL to escape.
  const std::string& bucket = options.bucket;
  if (bucket.size() < 3 || bucket.size() > 63 ||
      !std::all_of(bucket.begin(), bucket.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-';
      })) {
    return Status::Invalid("config key 'bucket' = '" + bucket +
                           "': expected an S3 bucket name (3-63 of a-z 0-9 . -)");
  }
  if (options.region.empty() || options.region.find_first_of(":/ ") != std::string::npos) {
    return Status::Invalid("config key 'region' = '" + options.region + "' is not a region name");
  }
  while (!options.prefix.empty() && options.prefix.back() == '/') options.prefix.pop_back();
  if (!options.prefix.empty()) {
    Status st = ValidateTransportKey(options.prefix);
    if (!st.ok()) return Status::Invalid("config key 'prefix': " + st.message());
    options.prefix += '/';
  }
  REFIT_ASSIGN_OR_RAISE(Credentials credentials, ResolveCredentials(options.credentials));
  options.credentials = CredentialSettings{};  // the resolved copy is the only one kept
  std::string scheme_host =
      options.virtual_addressing ? scheme + "://" + bucket + "." + host : scheme + "://" + host;
  return std::unique_ptr<S3Transport>(
      new S3Transport(std::move(options), std::move(scheme_host), std::move(credentials)));
}

S3Transport::S3Transport(S3Options options, std::string scheme_host, Credentials credentials)
    : options_(std::move(options)), scheme_host_(std::move(scheme_host)) {
  http_ = std::make_unique<HttpClient>(std::move(credentials), options_.region, options_.retry);
}

std::string S3Transport::ObjectUrl(const std::string& key, const std::string& query) const {
  // Keys and the prefix hold only [A-Za-z0-9._-/]: nothing to escape in the path.
  std::string path = options_.virtual_addressing ? "/" : "/" + options_.bucket + "/";
  return scheme_host_ + path + options_.prefix + key + (query.empty() ? "" : "?" + query);
}

std::string S3Transport::BucketUrl(const std::string& query) const {
  std::string path = options_.virtual_addressing ? "/" : "/" + options_.bucket + "/";
  return scheme_host_ + path + "?" + query;
}

std::string S3Transport::Name(const std::string& op, const std::string& key) const {
  // The framework's message already names the operation and the key: this adds where it went.
  return (op.empty() ? "" : op + " ") + "s3://" + options_.bucket + "/" + options_.prefix + key;
}

Status S3Transport::Fail(const std::string& op, const std::string& key,
                         const HttpResponse& resp) const {
  return Status::IoError(Name(op, key) + ": " + DescribeError(resp));
}

Status S3Transport::Put(const std::string& key, const uint8_t* data, uint64_t len) {
  REFIT_RETURN_NOT_OK(ValidateTransportKey(key));
  if (data == nullptr && len != 0) return Status::Invalid("put '" + key + "': null data");
  if (len > options_.part_bytes) return PutMultipart(key, data, len);
  return PutSingle(key, data, len);
}

Status S3Transport::PutSingle(const std::string& key, const uint8_t* data, uint64_t len) {
  HttpRequest req;
  req.method = "PUT";
  req.url = ObjectUrl(key);
  req.what = Name("", key);
  req.body = data;
  req.body_len = len;
  req.content_type = "application/octet-stream";
  REFIT_ASSIGN_OR_RAISE(HttpResponse resp, http_->Send(req));
  if (resp.status != 200) return Fail("", key, resp);
  return Status::OK();
}

Status S3Transport::PutMultipart(const std::string& key, const uint8_t* data, uint64_t len) {
  HttpRequest start;
  start.method = "POST";
  start.url = ObjectUrl(key, "uploads=");
  start.what = Name("starting the multipart upload of", key);
  start.content_type = "application/octet-stream";
  REFIT_ASSIGN_OR_RAISE(HttpResponse resp, http_->Send(start));
  if (resp.status != 200) return Fail("starting the multipart upload of", key, resp);
  std::optional<std::string> upload_id = XmlFirst(resp.body, "UploadId");
  if (!upload_id || upload_id->empty()) {
    return Status::IoError(Name("starting the multipart upload of", key) +
                           ": the answer has no UploadId");
  }
  Result<std::string> parts = UploadParts(key, *upload_id, data, len);
  Status st = parts.ok() ? CompleteUpload(key, *upload_id, parts.value()) : parts.status();
  // A failed upload is aborted so that no parts stay stored (and billed) in the bucket.
  if (!st.ok()) AbortUpload(key, *upload_id);
  return st;
}

Result<std::string> S3Transport::UploadParts(const std::string& key, const std::string& upload_id,
                                             const uint8_t* data, uint64_t len) {
  uint64_t part_bytes = options_.part_bytes;
  // S3 allows 10000 parts: a larger object gets larger parts.
  if ((len + part_bytes - 1) / part_bytes > kMaxParts)
    part_bytes = (len + kMaxParts - 1) / kMaxParts;
  const size_t n_parts = static_cast<size_t>((len + part_bytes - 1) / part_bytes);
  std::vector<std::string> etags(n_parts);
  const std::string encoded_id = UriEncode(upload_id, !options_.encode_slash_in_query);
  Status st = RunParallel(n_parts, options_.concurrency, [&](size_t i) -> Status {
    const std::string part = "part " + std::to_string(i + 1) + " of " + std::to_string(n_parts);
    HttpRequest req;
    req.method = "PUT";
    req.url = ObjectUrl(key, "partNumber=" + std::to_string(i + 1) + "&uploadId=" + encoded_id);
    req.what = Name(part + " of", key);
    req.body = data + i * part_bytes;
    req.body_len = std::min(part_bytes, len - i * part_bytes);
    req.content_type = "application/octet-stream";
    REFIT_ASSIGN_OR_RAISE(HttpResponse resp, http_->Send(req));
    if (resp.status != 200) return Fail(part + " of", key, resp);
    if (resp.etag.empty()) {
      return Status::IoError(req.what + ": the answer has no ETag");
    }
    etags[i] = resp.etag;
    return Status::OK();
  });
  REFIT_RETURN_NOT_OK(st);
  std::string xml = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < n_parts; ++i) {
    xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" +
           XmlEscape(etags[i]) + "</ETag></Part>";
  }
  return xml + "</CompleteMultipartUpload>";
}

Status S3Transport::CompleteUpload(const std::string& key, const std::string& upload_id,
                                   const std::string& parts_xml) {
  HttpRequest req;
  req.method = "POST";
  req.url = ObjectUrl(key, "uploadId=" + UriEncode(upload_id, !options_.encode_slash_in_query));
  req.what = Name("completing the multipart upload of", key);
  req.body = reinterpret_cast<const uint8_t*>(parts_xml.data());
  req.body_len = parts_xml.size();
  req.content_type = "application/xml";
  REFIT_ASSIGN_OR_RAISE(HttpResponse resp, http_->Send(req));
  // S3 may answer 200 and still report an error in the body.
  if (resp.status != 200 || resp.body.find("<Error>") != std::string::npos) {
    return Fail("completing the multipart upload of", key, resp);
  }
  return Status::OK();
}

void S3Transport::AbortUpload(const std::string& key, const std::string& upload_id) {
  HttpRequest req;
  req.method = "DELETE";
  req.url = ObjectUrl(key, "uploadId=" + UriEncode(upload_id, !options_.encode_slash_in_query));
  req.what = Name("aborting the multipart upload of", key);
  Result<HttpResponse> resp = http_->Send(req);
  if (!resp.ok() ||
      (resp.value().status != 204 && resp.value().status != 200 && resp.value().status != 404)) {
    sdk::Log(REFIT_LOG_WARN, "s3",
             req.what + " failed (" +
                 (resp.ok() ? DescribeError(resp.value()) : resp.status().message()) +
                 "): its parts stay until a bucket lifecycle rule removes them");
  }
}

Result<std::optional<uint64_t>> S3Transport::Size(const std::string& key) {
  REFIT_RETURN_NOT_OK(ValidateTransportKey(key));
  HttpRequest req;
  req.method = "HEAD";
  req.url = ObjectUrl(key);
  req.what = Name("", key);
  REFIT_ASSIGN_OR_RAISE(HttpResponse resp, http_->Send(req));
  if (resp.status == 404) return std::optional<uint64_t>();
  if (resp.status != 200) return Fail("", key, resp);
  if (!resp.has_content_length) {
    return Status::IoError(req.what + ": the answer has no Content-Length");
  }
  return std::optional<uint64_t>(resp.content_length);
}

Status S3Transport::RangePastEnd(const std::string& key, uint64_t offset, uint64_t len) {
  REFIT_ASSIGN_OR_RAISE(std::optional<uint64_t> size, Size(key));
  if (!size) return Status::NotFound(Name("", key) + ": no such key");
  return Status::Corrupt(Name("", key) + ": wanted bytes [" + std::to_string(offset) + ", " +
                         std::to_string(offset + len) + ") but the object has " +
                         std::to_string(*size));
}

Status S3Transport::GetRange(const std::string& key, uint64_t offset, uint8_t* buf, uint64_t len) {
  HttpRequest req;
  req.method = "GET";
  req.url = ObjectUrl(key);
  req.what = Name("", key);
  req.range = "bytes=" + std::to_string(offset) + "-" + std::to_string(offset + len - 1);
  req.sink = buf;
  req.sink_len = len;
  req.skip_on_200 = offset;
  REFIT_ASSIGN_OR_RAISE(HttpResponse resp, http_->Send(req));
  if (resp.status == 404) {
    return Status::NotFound(req.what + ": no such key");
  }
  if (resp.status == 416) return RangePastEnd(key, offset, len);
  if (resp.status != 206 && resp.status != 200) return Fail("", key, resp);
  if (resp.sink_received != len) return RangePastEnd(key, offset, len);
  return Status::OK();
}

Status S3Transport::Get(const std::string& key, uint64_t offset, uint8_t* buf, uint64_t len) {
  REFIT_RETURN_NOT_OK(ValidateTransportKey(key));
  if (len > UINT64_MAX - offset) {
    return Status::Invalid("get '" + key + "': range offset " + std::to_string(offset) + " + " +
                           std::to_string(len) + " overflows");
  }
  if (buf == nullptr && len != 0) return Status::Invalid("get '" + key + "': null buffer");
  if (len == 0) {  // no byte to ask for: the key must exist and reach offset
    REFIT_ASSIGN_OR_RAISE(std::optional<uint64_t> size, Size(key));
    if (!size) return Status::NotFound(Name("", key) + ": no such key");
    return offset <= *size ? Status::OK() : RangePastEnd(key, offset, len);
  }
  const uint64_t chunk = options_.part_bytes;
  if (len <= chunk || options_.concurrency == 1) return GetRange(key, offset, buf, len);
  const size_t n_chunks = static_cast<size_t>((len + chunk - 1) / chunk);
  return RunParallel(n_chunks, options_.concurrency, [&](size_t i) {
    const uint64_t begin = i * chunk;
    return GetRange(key, offset + begin, buf + begin, std::min(chunk, len - begin));
  });
}

Result<std::vector<std::pair<std::string, uint64_t>>> S3Transport::List(const std::string& prefix) {
  REFIT_RETURN_NOT_OK(ValidateTransportPrefix(prefix));
  const bool keep_slash = !options_.encode_slash_in_query;
  std::vector<std::pair<std::string, uint64_t>> out;
  std::string token;
  for (int page = 0; page < kMaxListPages; ++page) {
    // Query parameters in the sorted order SigV4's canonical request has them.
    std::string query =
        token.empty() ? "" : "continuation-token=" + UriEncode(token, keep_slash) + "&";
    query += "list-type=2&max-keys=" + std::to_string(options_.list_page_keys) +
             "&prefix=" + UriEncode(options_.prefix + prefix, keep_slash);
    HttpRequest req;
    req.url = BucketUrl(query);
    req.what = "listing " + Name("", prefix) + "*";
    REFIT_ASSIGN_OR_RAISE(HttpResponse resp, http_->Send(req));
    if (resp.status != 200) {
      return Status::IoError(req.what + ": " + DescribeError(resp));
    }
    std::optional<ListPage> parsed = ParseListPage(resp.body);
    if (!parsed) {
      return Status::IoError(req.what + ": the answer is not a ListObjectsV2 result");
    }
    for (auto& [full_key, size] : parsed->objects) {
      if (full_key.compare(0, options_.prefix.size(), options_.prefix) != 0) continue;
      std::string key = full_key.substr(options_.prefix.size());
      // Objects others put under the prefix whose names are not keys are not ours to list.
      if (!ValidateTransportKey(key).ok()) continue;
      out.emplace_back(std::move(key), size);
    }
    if (!parsed->truncated) return out;
    token = std::move(parsed->next_token);
  }
  return Status::IoError("list '" + prefix + "': more than " + std::to_string(kMaxListPages) +
                         " pages");
}

Status S3Transport::Remove(const std::string& key) {
  REFIT_RETURN_NOT_OK(ValidateTransportKey(key));
  HttpRequest req;
  req.method = "DELETE";
  req.url = ObjectUrl(key);
  req.what = Name("", key);
  REFIT_ASSIGN_OR_RAISE(HttpResponse resp, http_->Send(req));
  if (resp.status == 204 || resp.status == 200 || resp.status == 404) return Status::OK();
  return Fail("", key, resp);
}

}  // namespace refit::s3
