// Entry point of the `s3` transport (a loadable plugin: it links libcurl, the core does not); the
// engine is in s3_transport.{h,cc}, the HTTP layer in s3_http.{h,cc}.
#include "refit/sdk/plugin.hpp"
#include "s3_transport.h"

namespace {
const refit_config_key_t kS3Keys[] = {
    {"endpoint", REFIT_CFG_STRING, nullptr,
     "http(s)://host[:port] of the S3 service, e.g. https://s3.us-east-1.amazonaws.com or "
     "http://127.0.0.1:9000"},
    {"region", REFIT_CFG_STRING, "\"us-east-1\"", "Region the requests are signed for (SigV4)"},
    {"bucket", REFIT_CFG_STRING, nullptr, "Bucket holding the channel's objects"},
    {"prefix", REFIT_CFG_STRING, "\"\"",
     "Key prefix inside the bucket (a key path like \"runs/exp1\"); several channels can share a "
     "bucket"},
    {"addressing", REFIT_CFG_STRING, "\"path\"",
     "\"path\" (host/bucket/key) or \"virtual\" (bucket.host/key)"},
    {"access_key_id", REFIT_CFG_STRING, "\"\"",
     "Access key id; unset: AWS_ACCESS_KEY_ID, else the shared credentials file"},
    {"secret_access_key", REFIT_CFG_STRING, "\"\"",
     "Secret access key (never logged); unset: AWS_SECRET_ACCESS_KEY, else the shared "
     "credentials file"},
    {"session_token", REFIT_CFG_STRING, "\"\"",
     "Session token of temporary credentials; unset: AWS_SESSION_TOKEN or the profile's"},
    {"profile", REFIT_CFG_STRING, "\"\"",
     "Profile of the shared credentials file (AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials); "
     "unset: AWS_PROFILE, else \"default\""},
    {"part_bytes", REFIT_CFG_SIZE, "\"16MiB\"",
     "Puts larger than this are multipart uploads of parts this size (5MiB..5GiB); gets larger "
     "than this are split into ranged GETs of this size"},
    {"concurrency", REFIT_CFG_INT, "4", "Parts uploaded / ranges fetched in parallel per object"},
    {"list_page_keys", REFIT_CFG_INT, "1000",
     "Keys per ListObjectsV2 page (1..1000); larger listings follow continuation tokens"},
    {"max_retries", REFIT_CFG_INT, "5",
     "Retries of a request after a 5xx, a timeout or a refused/reset connection (never after a "
     "4xx)"},
    {"timeout_s", REFIT_CFG_INT, "30",
     "Connect timeout, and how long a request may move no byte before it is abandoned (and "
     "retried)"},
    {"retry_base_ms", REFIT_CFG_INT, "100",
     "Backoff before the first retry; doubles per retry, jittered to [1/2, 1] of the value"},
    {"retry_max_ms", REFIT_CFG_INT, "5000", "Cap of the backoff between retries"},
    {"encode_slash_in_query", REFIT_CFG_BOOL, "true",
     "Percent-encode '/' in query values as SigV4 says; false for servers that verify signatures "
     "against a raw '/' (moto 5)"},
};
}  // namespace

REFIT_PLUGIN("s3", "0.1.0",
             refit::sdk::MakeTransport<refit::s3::S3Transport>(
                 "s3", "Objects in an S3 bucket: SigV4 over libcurl, multipart puts, ranged gets",
                 &kS3Keys))
