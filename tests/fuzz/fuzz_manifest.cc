// Fuzzes the JSON control objects a receiver and a sender read from a transport: manifests,
// commit markers, acks and tensor spec lists. Every input goes through every parser (the
// "format" field decides which one accepts it, so seeds need no selector byte). Anything
// accepted must survive a serialize/parse round trip unchanged; anything rejected must be one
// line naming the label.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "format/wire.h"
#include "fuzz_check.h"

namespace {

const std::string kLabel = "fuzz.json";

template <typename T>
void CheckError(const refit::Result<T>& r) {
  if (r.ok()) return;
  const std::string m = r.status().message();
  FUZZ_CHECK(m.rfind(kLabel + ": ", 0) == 0, "error does not name the label: %s", m.c_str());
  FUZZ_CHECK(m.find('\n') == std::string::npos, "multi-line error: %s", m.c_str());
}

const uint8_t* Bytes(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

bool SameRefs(const std::vector<refit::PayloadRef>& a, const std::vector<refit::PayloadRef>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].key != b[i].key || a[i].bytes != b[i].bytes || a[i].xxh3 != b[i].xxh3 ||
        a[i].records != b[i].records || a[i].sha256 != b[i].sha256) {
      return false;
    }
  }
  return true;
}

bool SameSpecs(const std::vector<refit::TensorSpec>& a, const std::vector<refit::TensorSpec>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].dtype != b[i].dtype || a[i].shape != b[i].shape) {
      return false;
    }
  }
  return true;
}

void CheckManifest(const uint8_t* data, size_t size) {
  auto m = refit::ParseManifest(data, size, kLabel);
  CheckError(m);
  if (!m.ok()) return;
  const std::string text = refit::SerializeManifest(*m);
  auto again = refit::ParseManifest(Bytes(text), text.size(), "again");
  FUZZ_CHECK(again.ok(), "re-parse failed: %s", again.status().ToString().c_str());
  FUZZ_CHECK(again->version == m->version && again->base_version == m->base_version &&
                 again->full == m->full && again->rank == m->rank && again->world == m->world &&
                 SameRefs(again->payloads, m->payloads) && SameSpecs(again->tensors, m->tensors) &&
                 again->total_elements == m->total_elements &&
                 again->changed_elements == m->changed_elements &&
                 again->model_bytes == m->model_bytes && again->changed_bytes == m->changed_bytes &&
                 again->payload_bytes == m->payload_bytes && again->mac == m->mac,
             "manifest round trip differs");
  // A MAC is checked over the serialization of what was parsed: it must be a fixed point.
  FUZZ_CHECK(refit::SerializeManifest(*again) == text, "manifest serialization not canonical");
  for (const refit::PayloadRef& p : m->payloads) {
    // Accepted keys live under the manifest's own version directory.
    FUZZ_CHECK(refit::VersionOfKey(p.key) == m->version, "payload key '%s' outside v%llu",
               p.key.c_str(), static_cast<unsigned long long>(m->version));
  }
}

void CheckCommit(const uint8_t* data, size_t size) {
  auto c = refit::ParseCommit(data, size, kLabel);
  CheckError(c);
  if (!c.ok()) return;
  const std::string text = refit::SerializeCommit(*c);
  auto again = refit::ParseCommit(Bytes(text), text.size(), "again");
  FUZZ_CHECK(again.ok(), "re-parse failed: %s", again.status().ToString().c_str());
  FUZZ_CHECK(again->version == c->version && again->base_version == c->base_version &&
                 again->full == c->full && again->world == c->world &&
                 SameRefs(again->manifests, c->manifests) && again->prev == c->prev &&
                 again->mac == c->mac,
             "commit round trip differs");
  FUZZ_CHECK(refit::SerializeCommit(*again) == text, "commit serialization not canonical");
  for (const refit::PayloadRef& p : c->manifests) {
    FUZZ_CHECK(refit::VersionOfKey(p.key) == c->version, "manifest key '%s' outside v%llu",
               p.key.c_str(), static_cast<unsigned long long>(c->version));
  }
}

void CheckAck(const uint8_t* data, size_t size) {
  auto a = refit::ParseAck(data, size, kLabel);
  CheckError(a);
  if (!a.ok()) return;
  const std::string text = refit::SerializeAck(*a);
  auto again = refit::ParseAck(Bytes(text), text.size(), "again");
  FUZZ_CHECK(again.ok(), "re-parse failed: %s", again.status().ToString().c_str());
  FUZZ_CHECK(again->receiver == a->receiver && again->version == a->version &&
                 again->applied_records == a->applied_records &&
                 again->commit_sha256 == a->commit_sha256,
             "ack round trip differs");
}

void CheckTensorSpecs(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto specs = refit::ParseTensorSpecs(text, kLabel);
  CheckError(specs);
  if (!specs.ok()) return;
  auto again = refit::ParseTensorSpecs(refit::SerializeTensorSpecs(*specs), "again");
  FUZZ_CHECK(again.ok(), "re-parse failed: %s", again.status().ToString().c_str());
  FUZZ_CHECK(SameSpecs(*again, *specs), "tensor spec round trip differs");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  CheckManifest(data, size);
  CheckCommit(data, size);
  CheckAck(data, size);
  CheckTensorSpecs(data, size);
  // Keys: a version VersionOfKey reads back names the directory VersionDir writes.
  const std::string key(reinterpret_cast<const char*>(data), size);
  if (auto v = refit::VersionOfKey(key)) {
    FUZZ_CHECK(refit::VersionOfKey(refit::PayloadKey(*v, 0, 0)) == *v, "key round trip");
    FUZZ_CHECK(refit::VersionOfKey(refit::ManifestKey(*v, 1)) == *v, "key round trip");
    FUZZ_CHECK(refit::VersionOfKey(refit::CommitKey(*v)) == *v, "key round trip");
    FUZZ_CHECK(!refit::VersionOfKey(refit::AckKey("r0", *v)), "ack keys are not version keys");
    FUZZ_CHECK(!refit::VersionOfKey(refit::NeedFullKey("r0")), "need-full is not a version key");
  }
  return 0;
}
