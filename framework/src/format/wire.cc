// Wire format v1 (docs/wire-format.md). Everything parsed here is untrusted.
#include "format/wire.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "common/text_util.h"

namespace refit {

using json = nlohmann::json;

namespace {

std::string Quoted(const std::string& name) { return "'" + internal::Printable(name) + "'"; }

Result<DType> DTypeFrom(const std::string& name) {
  auto dtype = DTypeFromName(name);
  if (!dtype.ok()) return Status::Corrupt("unknown dtype " + Quoted(name));
  return dtype;
}

const char* OpName(refit_op_t op) {
  switch (op) {
    case REFIT_OP_OVERWRITE:
      return "overwrite";
    case REFIT_OP_XOR:
      return "xor";
    case REFIT_OP_STEP:
      return "step";
  }
  return "?";
}

Result<refit_op_t> OpFromName(const std::string& name) {
  if (name == "overwrite") return REFIT_OP_OVERWRITE;
  if (name == "xor") return REFIT_OP_XOR;
  if (name == "step") return REFIT_OP_STEP;
  return Status::Corrupt("unknown op " + Quoted(name));
}

json ShapeJson(const Shape& s) {
  json a = json::array();
  for (uint64_t d : s) a.push_back(d);
  return a;
}

// Reads a JSON array of non-negative integers.
Result<Shape> ShapeFrom(const json& j, const char* what) {
  if (!j.is_array()) return Status::Corrupt(std::string(what) + " is not an array");
  if (j.size() > REFIT_MAX_DIMS) {
    return Status::Corrupt(std::string(what) + " has more than " + std::to_string(REFIT_MAX_DIMS) +
                           " dims");
  }
  Shape s;
  for (const json& d : j) {
    if (!d.is_number_unsigned()) {
      return Status::Corrupt(std::string(what) + " holds a non-integer or negative value");
    }
    s.push_back(d.get<uint64_t>());
  }
  return s;
}

// Names of tensors and encodings come from untrusted bytes and end up in error messages, maps and
// safetensors headers (never in file paths): bounded, printable, no NUL or other control bytes.
constexpr size_t kMaxNameBytes = 4096;
// Transport keys a manifest or commit points at: relative, no empty/"."/".." components.
constexpr size_t kMaxKeyBytes = 1024;
constexpr uint64_t kMaxWorld = 1u << 20;
constexpr size_t kSha256HexChars = 64;  // a SHA-256 or HMAC-SHA256 in hex

bool HasControlChar(const std::string& text) {
  for (unsigned char c : text) {
    if (c < 0x20 || c == 0x7f) return true;
  }
  return false;
}

Status CheckName(const std::string& name, const char* what) {
  if (name.empty()) return Status::Corrupt(std::string("empty ") + what);
  if (name.size() > kMaxNameBytes) {
    return Status::Corrupt(std::string(what) + " of " + std::to_string(name.size()) +
                           " bytes is longer than " + std::to_string(kMaxNameBytes));
  }
  if (HasControlChar(name)) {
    return Status::Corrupt(std::string(what) + " " + Quoted(name) + " holds a control character");
  }
  return Status::OK();
}

// A key this version's control objects may name: under the version's own directory, so a
// hostile manifest cannot point a receiver at another version's objects or outside the store.
Status CheckVersionKey(const std::string& key, uint64_t version) {
  const std::string dir = VersionDir(version) + "/";
  if (key.size() > kMaxKeyBytes) {
    return Status::Corrupt("key of " + std::to_string(key.size()) + " bytes is longer than " +
                           std::to_string(kMaxKeyBytes));
  }
  if (HasControlChar(key) || key.find('\\') != std::string::npos) {
    return Status::Corrupt("key " + Quoted(key) + " holds a control character or backslash");
  }
  if (key.compare(0, dir.size(), dir) != 0 || key.size() == dir.size()) {
    return Status::Corrupt("key " + Quoted(key) + " is not inside " + dir);
  }
  size_t begin = 0;
  while (begin <= key.size()) {
    size_t end = key.find('/', begin);
    if (end == std::string::npos) end = key.size();
    const std::string part = key.substr(begin, end - begin);
    if (part.empty() || part == "." || part == "..") {
      return Status::Corrupt("key " + Quoted(key) + " has an empty, '.' or '..' component");
    }
    begin = end + 1;
  }
  return Status::OK();
}

// Typed field access that never throws.
Result<const json*> Field(const json& obj, const char* key, json::value_t type) {
  auto it = obj.find(key);
  if (it == obj.end()) return Status::Corrupt(std::string("missing field '") + key + "'");
  bool ok = it->type() == type ||
            (type == json::value_t::number_unsigned && it->is_number_unsigned()) ||
            (type == json::value_t::number_integer && it->is_number_integer());
  if (!ok) return Status::Corrupt(std::string("field '") + key + "' has the wrong type");
  return &*it;
}

Result<uint64_t> U64Field(const json& obj, const char* key) {
  REFIT_ASSIGN_OR_RAISE(const json* v, Field(obj, key, json::value_t::number_unsigned));
  return v->get<uint64_t>();
}

Result<std::string> StringField(const json& obj, const char* key) {
  REFIT_ASSIGN_OR_RAISE(const json* v, Field(obj, key, json::value_t::string));
  return v->get<std::string>();
}

Result<json> ParseJson(const uint8_t* data, uint64_t size, const std::string& label) {
  json j =
      json::parse(reinterpret_cast<const char*>(data), reinterpret_cast<const char*>(data) + size,
                  nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::Corrupt(label + ": not a JSON object");
  }
  return j;
}

Result<std::optional<uint64_t>> OptionalVersion(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<uint64_t>();
  if (!it->is_number_unsigned()) {
    return Status::Corrupt(std::string("field '") + key + "' has the wrong type");
  }
  return std::optional<uint64_t>(it->get<uint64_t>());
}

json PayloadRefJson(const PayloadRef& p) {
  json j{{"key", p.key}, {"bytes", p.bytes}, {"xxh3", HexDigest(p.xxh3)}, {"records", p.records}};
  if (!p.sha256.empty()) j["sha256"] = p.sha256;
  return j;
}

// An optional lowercase-hex field of `chars` characters (a SHA-256 or an HMAC-SHA256).
Result<std::string> OptionalHexField(const json& obj, const char* key, size_t chars) {
  auto it = obj.find(key);
  if (it == obj.end()) return std::string();
  if (!it->is_string())
    return Status::Corrupt(std::string("field '") + key + "' has the wrong type");
  const std::string& hex = it->get_ref<const std::string&>();
  if (hex.size() != chars || hex.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return Status::Corrupt(std::string("field '") + key + "' is not " + std::to_string(chars) +
                           " lowercase hex digits");
  }
  return hex;
}

Result<PayloadRef> PayloadRefFrom(const json& j) {
  if (!j.is_object()) return Status::Corrupt("payload entry is not an object");
  PayloadRef p;
  REFIT_ASSIGN_OR_RAISE(p.key, StringField(j, "key"));
  REFIT_ASSIGN_OR_RAISE(p.bytes, U64Field(j, "bytes"));
  REFIT_ASSIGN_OR_RAISE(std::string hex, StringField(j, "xxh3"));
  REFIT_ASSIGN_OR_RAISE(p.xxh3, ParseHexDigest(hex));
  auto r = j.find("records");
  if (r != j.end()) {
    if (!r->is_number_unsigned()) return Status::Corrupt("field 'records' has the wrong type");
    p.records = r->get<uint64_t>();
  }
  REFIT_ASSIGN_OR_RAISE(p.sha256, OptionalHexField(j, "sha256", kSha256HexChars));
  return p;
}

// A JSON array of payload/manifest references, each key inside version's directory, no key twice.
Result<std::vector<PayloadRef>> RefsFrom(const json& a, uint64_t version, const char* what) {
  std::vector<PayloadRef> out;
  std::set<std::string> keys;
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string where = std::string(what) + " " + std::to_string(i);
    auto ref = PayloadRefFrom(a[i]);
    if (!ref.ok()) return ref.status().WithContext(where);
    Status key_ok = CheckVersionKey(ref.value().key, version);
    if (!key_ok.ok()) return key_ok.WithContext(where);
    if (!keys.insert(ref.value().key).second) {
      return Status::Corrupt(where + ": key " + Quoted(ref.value().key) + " is listed twice");
    }
    out.push_back(std::move(ref).value());
  }
  return out;
}

json TensorSpecsJson(const std::vector<TensorSpec>& specs) {
  json a = json::array();
  for (const TensorSpec& t : specs) {
    a.push_back(json{
        {"name", t.name}, {"dtype", std::string(NameOf(t.dtype))}, {"shape", ShapeJson(t.shape)}});
  }
  return a;
}

Result<std::vector<TensorSpec>> TensorSpecsFrom(const json& a) {
  if (!a.is_array()) return Status::Corrupt("tensor list is not an array");
  std::vector<TensorSpec> out;
  std::set<std::string> names;
  for (size_t i = 0; i < a.size(); ++i) {
    const json& t = a[i];
    std::string where = "tensor " + std::to_string(i);
    auto fail = [&](const Status& st) { return Status::Corrupt(where + ": " + st.message()); };
    if (!t.is_object()) return Status::Corrupt(where + " is not an object");
    TensorSpec s;
    auto name = StringField(t, "name");
    if (!name.ok()) return fail(name.status());
    s.name = name.value();
    REFIT_RETURN_NOT_OK(CheckName(s.name, "tensor name").WithContext(where));
    where += " (" + Quoted(s.name) + ")";
    if (s.name == "__metadata__") return Status::Corrupt(where + ": reserved name");
    if (!names.insert(s.name).second) return Status::Corrupt(where + ": listed twice");
    auto dt = StringField(t, "dtype");
    if (!dt.ok()) return fail(dt.status());
    auto dtype = DTypeFrom(dt.value());
    if (!dtype.ok()) return fail(dtype.status());
    s.dtype = dtype.value();
    auto sh = t.find("shape");
    if (sh == t.end()) return Status::Corrupt(where + ": missing field 'shape'");
    auto shape = ShapeFrom(*sh, "shape");
    if (!shape.ok()) return fail(shape.status());
    s.shape = shape.value();
    auto n = NumElements(s.shape);
    uint64_t nbytes = 0;
    if (!n.ok() || __builtin_mul_overflow(n.value(), uint64_t{SizeOf(s.dtype)}, &nbytes)) {
      return Status::Corrupt(where + ": shape " + ShapeToString(s.shape) +
                             " has more than 2^64 bytes");
    }
    out.push_back(std::move(s));
  }
  return out;
}

// Container errors name a tensor; in a payload, tensor 'r000003' holds record 3's bytes: say so.
Status NameBlobRecord(const Status& st) {
  const std::string& m = st.message();
  const std::string marker = "tensor 'r";
  const size_t at = m.find(marker);
  if (at == std::string::npos) return st;
  const size_t digits = at + marker.size();
  size_t end = digits;
  uint64_t index = 0;
  while (end < m.size() && end - digits < 19 && m[end] >= '0' && m[end] <= '9') {
    index = index * 10 + static_cast<uint64_t>(m[end++] - '0');
  }
  if (end - digits < 6 || end >= m.size() || m[end] != '\'') return st;
  const std::string record = " (record " + std::to_string(index) + ")";
  return Status(st.code(), m.substr(0, end + 1) + record + m.substr(end + 1));
}

}  // namespace

uint64_t RecordHeader::box_elements() const {
  // Parse() checked the extents against a shape whose size fits in 64 bits; saturate anyway so
  // that a hand-built header cannot wrap around.
  uint64_t n = 1;
  for (uint64_t d : box_extent) {
    if (d == 0) return 0;
  }
  for (uint64_t d : box_extent) {
    if (__builtin_mul_overflow(n, d, &n)) return UINT64_MAX;
  }
  return n;
}

std::string HexDigest(uint64_t digest) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, digest);
  return buf;
}

Result<uint64_t> ParseHexDigest(const std::string& text) {
  if (text.size() != 16) {
    return Status::Corrupt("digest " + Quoted(text) + " is not 16 lowercase hex digits");
  }
  uint64_t v = 0;
  for (char c : text) {
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else
      return Status::Corrupt("digest " + Quoted(text) + " is not 16 lowercase hex digits");
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return v;
}

// ---------------------------------------------------------------- payloads

PayloadBuilder::PayloadBuilder(Metadata metadata) : metadata_(std::move(metadata)) {}

size_t PayloadBuilder::Add(RecordHeader header, const uint8_t* bytes, uint64_t len) {
  uint8_t* dst = AddInPlace(std::move(header), len);
  if (len > 0) std::memcpy(dst, bytes, len);
  return headers_.size() - 1;
}

void PayloadBuilder::AppendRecord(RecordHeader header, uint64_t len, const uint8_t* borrowed) {
  header.data_begin = data_bytes_;
  header.data_end = data_bytes_ + len;
  headers_.push_back(std::move(header));
  borrowed_.push_back(borrowed);
  inline_at_.push_back(data_.size());
  data_bytes_ += len;
}

uint8_t* PayloadBuilder::AddInPlace(RecordHeader header, uint64_t len) {
  AppendRecord(std::move(header), len, nullptr);
  data_.resize(data_.size() + len);
  return data_.data() + inline_at_.back();
}

void PayloadBuilder::TrimLast(uint64_t final_len) {
  RecordHeader& h = headers_.back();
  data_bytes_ = h.data_begin + final_len;
  h.data_end = data_bytes_;
  data_.resize(inline_at_.back() + final_len);
}

size_t PayloadBuilder::AddBorrowed(RecordHeader header, const uint8_t* bytes, uint64_t len) {
  AppendRecord(std::move(header), len, bytes);
  return headers_.size() - 1;
}

Result<std::vector<uint8_t>> PayloadBuilder::Finish(internal::WorkerPool* pool, unsigned threads,
                                                    std::vector<uint8_t> reuse) {
  json records = json::array();
  std::vector<TensorView> blobs;
  blobs.reserve(headers_.size());
  for (size_t i = 0; i < headers_.size(); ++i) {
    const RecordHeader& h = headers_[i];
    char blob_name[32];
    std::snprintf(blob_name, sizeof(blob_name), "r%06zu", i);
    json r = {{"tensor", h.tensor},
              {"dtype", std::string(NameOf(h.dtype))},
              {"shape", ShapeJson(h.shape)},
              {"box_offset", ShapeJson(h.box_offset)},
              {"box_extent", ShapeJson(h.box_extent)},
              {"encoding", h.encoding},
              {"op", OpName(h.op)},
              {"changed", h.changed},
              {"digest", HexDigest(h.digest)},
              {"blob", blob_name}};
    if (h.create) r["create"] = true;
    records.push_back(std::move(r));
    TensorView v;
    v.name = blob_name;
    v.dtype = DType::kU8;
    v.shape = {h.data_end - h.data_begin};
    // Only read by the serializer (a TensorView's data is mutable).
    v.data =
        borrowed_[i] != nullptr ? const_cast<uint8_t*>(borrowed_[i]) : data_.data() + inline_at_[i];
    blobs.push_back(std::move(v));
  }
  Metadata md = metadata_;
  md["refit.records"] = records.dump();
  auto bytes = SerializeSafetensors(blobs, md, pool, threads, std::move(reuse));
  headers_.clear();
  borrowed_.clear();
  inline_at_.clear();
  data_.clear();
  data_bytes_ = 0;
  return bytes;
}

std::string Payload::MetadataOr(const std::string& key, const std::string& fallback) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? fallback : it->second;
}

namespace {

// The record's box against its tensor: same rank, the tensor's byte size fits in 64 bits (the
// box then fits too) and the box lies inside the tensor.
Status CheckRecordBox(const RecordHeader& h, const std::string& where) {
  if (h.box_offset.size() != h.shape.size() || h.box_extent.size() != h.shape.size()) {
    return Status::Corrupt(where + ": box rank differs from the tensor's rank");
  }
  auto n = NumElements(h.shape);
  uint64_t tensor_bytes = 0;
  if (!n.ok() || __builtin_mul_overflow(n.value(), uint64_t{SizeOf(h.dtype)}, &tensor_bytes)) {
    return Status::Corrupt(where + ": shape " + ShapeToString(h.shape) +
                           " has more than 2^64 bytes");
  }
  for (size_t d = 0; d < h.shape.size(); ++d) {
    // Written without offset + extent, which could wrap around 2^64.
    if (h.box_offset[d] > h.shape[d] || h.box_extent[d] > h.shape[d] - h.box_offset[d]) {
      return Status::Corrupt(where + ": box [" + std::to_string(h.box_offset[d]) + ", +" +
                             std::to_string(h.box_extent[d]) + ") exceeds dim " +
                             std::to_string(d) + " of size " + std::to_string(h.shape[d]));
    }
  }
  return Status::OK();
}

// The tensor, dtype, shape and box of a record; `where` gains the tensor's name once it is known,
// so later errors name it.
Status ParseRecordTensor(const json& r, std::string& where, RecordHeader& h) {
  auto fail = [&](const Status& st) { return Status::Corrupt(where + ": " + st.message()); };
  auto tensor = StringField(r, "tensor");
  if (!tensor.ok()) return fail(tensor.status());
  h.tensor = tensor.value();
  Status name_ok = CheckName(h.tensor, "tensor name");
  if (!name_ok.ok()) return fail(name_ok);
  where += " (" + Quoted(h.tensor) + ")";
  auto dt = StringField(r, "dtype");
  if (!dt.ok()) return fail(dt.status());
  auto dtype = DTypeFrom(dt.value());
  if (!dtype.ok()) return fail(dtype.status());
  h.dtype = dtype.value();
  for (auto [key, dst] : {std::pair<const char*, Shape*>{"shape", &h.shape},
                          {"box_offset", &h.box_offset},
                          {"box_extent", &h.box_extent}}) {
    auto f = r.find(key);
    if (f == r.end()) return Status::Corrupt(where + ": missing field '" + key + "'");
    auto shape = ShapeFrom(*f, key);
    if (!shape.ok()) return fail(shape.status());
    *dst = shape.value();
  }
  return CheckRecordBox(h, where);
}

// The encoding, op, change count, digest and create flag of a record.
Status ParseRecordCoding(const json& r, const std::string& where, RecordHeader& h) {
  auto fail = [&](const Status& st) { return Status::Corrupt(where + ": " + st.message()); };
  auto enc = StringField(r, "encoding");
  if (!enc.ok()) return fail(enc.status());
  h.encoding = enc.value();
  Status enc_ok = CheckName(h.encoding, "encoding name");
  if (!enc_ok.ok()) return fail(enc_ok);
  auto op = StringField(r, "op");
  if (!op.ok()) return fail(op.status());
  auto opv = OpFromName(op.value());
  if (!opv.ok()) return fail(opv.status());
  h.op = opv.value();
  auto changed = U64Field(r, "changed");
  if (!changed.ok()) return fail(changed.status());
  h.changed = changed.value();
  if (h.changed > h.box_elements()) {
    return Status::Corrupt(where + ": " + std::to_string(h.changed) + " changes in a box of " +
                           std::to_string(h.box_elements()) + " elements");
  }
  auto digest = StringField(r, "digest");
  if (!digest.ok()) return fail(digest.status());
  auto dv = ParseHexDigest(digest.value());
  if (!dv.ok()) return fail(dv.status());
  h.digest = dv.value();
  auto create = r.find("create");
  if (create != r.end()) {
    if (!create->is_boolean()) return Status::Corrupt(where + ": field 'create' is not a bool");
    h.create = create->get<bool>();
  }
  return Status::OK();
}

}  // namespace

Result<Payload> Payload::Parse(const uint8_t* data, uint64_t size, std::string label) {
  auto container = SafetensorsFile::FromBuffer(data, size, label);
  if (!container.ok()) return NameBlobRecord(container.status());
  std::unique_ptr<SafetensorsFile> file = std::move(container).value();
  Payload p;
  p.label_ = label;
  p.metadata_ = file->metadata();
  p.buffer_ = data + file->data_start();
  auto it = p.metadata_.find("refit.records");
  if (it == p.metadata_.end()) {
    return Status::Corrupt(label + ": not a refit payload (no refit.records metadata)");
  }
  auto format = p.metadata_.find("refit.format");
  if (format != p.metadata_.end() && format->second != kPayloadFormat &&
      format->second != kDeltaFormat) {
    return Status::Corrupt(label + ": refit.format " + Quoted(format->second) + " is not " +
                           kPayloadFormat + " or " + kDeltaFormat);
  }
  json records = json::parse(it->second, nullptr, false);
  if (records.is_discarded() || !records.is_array()) {
    return Status::Corrupt(label + ": refit.records is not a JSON array");
  }
  p.records_.reserve(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    const json& r = records[i];
    // Every error below is one line: "<label>: record <i> ('<tensor>'): <what>".
    std::string where = label + ": record " + std::to_string(i);
    if (!r.is_object()) return Status::Corrupt(where + ": not an object");
    RecordHeader h;
    REFIT_RETURN_NOT_OK(ParseRecordTensor(r, where, h));
    REFIT_RETURN_NOT_OK(ParseRecordCoding(r, where, h));
    auto blob = StringField(r, "blob");
    if (!blob.ok()) return Status::Corrupt(where + ": " + blob.status().message());
    const TensorView* view = file->Find(blob.value());
    if (view == nullptr) {
      return Status::Corrupt(where + ": blob " + Quoted(blob.value()) + " is not in the payload");
    }
    h.data_begin = static_cast<uint64_t>(view->bytes() - p.buffer_);
    h.data_end = h.data_begin + view->nbytes();
    p.records_.push_back(std::move(h));
  }
  return p;
}

// ---------------------------------------------------------------- control objects

std::string SerializeManifest(const Manifest& m) {
  json payloads = json::array();
  for (const PayloadRef& p : m.payloads) payloads.push_back(PayloadRefJson(p));
  json j = {{"format", kManifestFormat},
            {"version", m.version},
            {"base_version", m.base_version ? json(*m.base_version) : json(nullptr)},
            {"full", m.full},
            {"rank", m.rank},
            {"world", m.world},
            {"payloads", payloads},
            {"tensors", TensorSpecsJson(m.tensors)},
            {"total_elements", m.total_elements},
            {"changed_elements", m.changed_elements},
            {"model_bytes", m.model_bytes},
            {"changed_bytes", m.changed_bytes},
            {"payload_bytes", m.payload_bytes}};
  if (!m.mac.empty()) j["mac"] = m.mac;
  return j.dump(1);
}

Result<Manifest> ParseManifest(const uint8_t* data, uint64_t size, const std::string& label) {
  REFIT_ASSIGN_OR_RAISE(json j, ParseJson(data, size, label));
  auto fail = [&](const Status& st) { return Status::Corrupt(label + ": " + st.message()); };
  auto fmt = StringField(j, "format");
  if (!fmt.ok() || fmt.value() != kManifestFormat) {
    return Status::Corrupt(label + ": not a " + std::string(kManifestFormat) + " manifest");
  }
  Manifest m;
  auto version = U64Field(j, "version");
  if (!version.ok()) return fail(version.status());
  m.version = version.value();
  auto base = OptionalVersion(j, "base_version");
  if (!base.ok()) return fail(base.status());
  m.base_version = base.value();
  auto full = Field(j, "full", json::value_t::boolean);
  if (!full.ok()) return fail(full.status());
  m.full = full.value()->get<bool>();
  auto rank = U64Field(j, "rank");
  if (!rank.ok()) return fail(rank.status());
  auto world = U64Field(j, "world");
  if (!world.ok()) return fail(world.status());
  if (world.value() == 0 || world.value() > kMaxWorld || rank.value() >= world.value()) {
    return Status::Corrupt(label + ": rank " + std::to_string(rank.value()) + " of world " +
                           std::to_string(world.value()) + " is out of range");
  }
  m.rank = static_cast<int>(rank.value());
  m.world = static_cast<int>(world.value());
  auto payloads = Field(j, "payloads", json::value_t::array);
  if (!payloads.ok()) return fail(payloads.status());
  auto refs = RefsFrom(*payloads.value(), m.version, "payload");
  if (!refs.ok()) return fail(refs.status());
  m.payloads = std::move(refs).value();
  auto tensors = j.find("tensors");
  if (tensors != j.end()) {
    auto specs = TensorSpecsFrom(*tensors);
    if (!specs.ok()) return fail(specs.status());
    m.tensors = specs.value();
  }
  for (auto [key, dst] : {std::pair<const char*, uint64_t*>{"total_elements", &m.total_elements},
                          {"changed_elements", &m.changed_elements},
                          {"model_bytes", &m.model_bytes},
                          {"changed_bytes", &m.changed_bytes},
                          {"payload_bytes", &m.payload_bytes}}) {
    auto f = j.find(key);
    if (f != j.end() && f->is_number_unsigned()) *dst = f->get<uint64_t>();
  }
  auto mac = OptionalHexField(j, "mac", kSha256HexChars);
  if (!mac.ok()) return fail(mac.status());
  m.mac = mac.value();
  return m;
}

std::string SerializeCommit(const Commit& c) {
  json manifests = json::array();
  for (const PayloadRef& p : c.manifests) manifests.push_back(PayloadRefJson(p));
  json j = {{"format", kCommitFormat},
            {"version", c.version},
            {"base_version", c.base_version ? json(*c.base_version) : json(nullptr)},
            {"full", c.full},
            {"world", c.world},
            {"manifests", manifests}};
  if (!c.prev.empty()) j["prev"] = c.prev;
  if (!c.mac.empty()) j["mac"] = c.mac;
  return j.dump(1);
}

Result<Commit> ParseCommit(const uint8_t* data, uint64_t size, const std::string& label) {
  REFIT_ASSIGN_OR_RAISE(json j, ParseJson(data, size, label));
  auto fail = [&](const Status& st) { return Status::Corrupt(label + ": " + st.message()); };
  auto fmt = StringField(j, "format");
  if (!fmt.ok() || fmt.value() != kCommitFormat) {
    return Status::Corrupt(label + ": not a " + std::string(kCommitFormat) + " marker");
  }
  Commit c;
  auto version = U64Field(j, "version");
  if (!version.ok()) return fail(version.status());
  c.version = version.value();
  auto base = OptionalVersion(j, "base_version");
  if (!base.ok()) return fail(base.status());
  c.base_version = base.value();
  auto full = Field(j, "full", json::value_t::boolean);
  if (!full.ok()) return fail(full.status());
  c.full = full.value()->get<bool>();
  auto world = U64Field(j, "world");
  if (!world.ok()) return fail(world.status());
  if (world.value() == 0 || world.value() > kMaxWorld) {
    return Status::Corrupt(label + ": world " + std::to_string(world.value()) + " is out of range");
  }
  c.world = static_cast<int>(world.value());
  auto manifests = Field(j, "manifests", json::value_t::array);
  if (!manifests.ok()) return fail(manifests.status());
  auto refs = RefsFrom(*manifests.value(), c.version, "manifest");
  if (!refs.ok()) return fail(refs.status());
  c.manifests = std::move(refs).value();
  if (c.manifests.size() != static_cast<size_t>(c.world)) {
    return Status::Corrupt(label + ": " + std::to_string(c.manifests.size()) +
                           " manifests for world " + std::to_string(c.world));
  }
  for (auto [key, dst] : {std::pair<const char*, std::string*>{"prev", &c.prev}, {"mac", &c.mac}}) {
    auto hex = OptionalHexField(j, key, kSha256HexChars);
    if (!hex.ok()) return fail(hex.status());
    *dst = hex.value();
  }
  return c;
}

std::string SerializeAck(const Ack& a) {
  json j = {{"receiver", a.receiver},
            {"version", a.version},
            {"apply_seconds", a.apply_seconds},
            {"applied_records", a.applied_records}};
  if (!a.commit_sha256.empty()) j["commit_sha256"] = a.commit_sha256;
  return j.dump();
}

Result<Ack> ParseAck(const uint8_t* data, uint64_t size, const std::string& label) {
  REFIT_ASSIGN_OR_RAISE(json j, ParseJson(data, size, label));
  Ack a;
  auto fail = [&](const Status& st) { return Status::Corrupt(label + ": " + st.message()); };
  auto receiver = StringField(j, "receiver");
  if (!receiver.ok()) return fail(receiver.status());
  a.receiver = receiver.value();
  Status name_ok = CheckName(a.receiver, "receiver id");
  if (!name_ok.ok()) return fail(name_ok);
  auto version = U64Field(j, "version");
  if (!version.ok()) return fail(version.status());
  a.version = version.value();
  auto secs = j.find("apply_seconds");
  if (secs != j.end() && secs->is_number()) a.apply_seconds = secs->get<double>();
  auto recs = j.find("applied_records");
  if (recs != j.end() && recs->is_number_unsigned()) a.applied_records = recs->get<uint64_t>();
  auto commit = OptionalHexField(j, "commit_sha256", kSha256HexChars);
  if (!commit.ok()) return fail(commit.status());
  a.commit_sha256 = commit.value();
  return a;
}

std::string SerializeTensorSpecs(const std::vector<TensorSpec>& specs) {
  return TensorSpecsJson(specs).dump();
}

Result<std::vector<TensorSpec>> ParseTensorSpecs(const std::string& text,
                                                 const std::string& label) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return Status::Corrupt(label + ": tensor list is not JSON");
  auto specs = TensorSpecsFrom(j);
  if (!specs.ok()) return Status::Corrupt(label + ": " + specs.status().message());
  return specs;
}

// ---------------------------------------------------------------- keys

std::string VersionDir(uint64_t version) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "v%08" PRIu64, version);
  return buf;
}

std::string PayloadKey(uint64_t version, int rank, uint64_t seq) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "/payload.r%d.%06" PRIu64 ".st", rank, seq);
  return VersionDir(version) + buf;
}

std::string ManifestKey(uint64_t version, int rank) {
  return VersionDir(version) + "/manifest.r" + std::to_string(rank) + ".json";
}

std::string CommitKey(uint64_t version) { return VersionDir(version) + "/COMMIT"; }

std::string AckKey(const std::string& receiver, uint64_t version) {
  return "acks/" + receiver + "/" + VersionDir(version);
}

std::string NeedFullKey(const std::string& receiver) { return "acks/" + receiver + "/need-full"; }

std::optional<uint64_t> VersionOfKey(const std::string& key) {
  if (key.size() < 9 || key[0] != 'v') return std::nullopt;
  uint64_t v = 0;
  size_t i = 1;
  for (; i < key.size() && key[i] != '/'; ++i) {
    if (key[i] < '0' || key[i] > '9' || i > 19) return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(key[i] - '0');
  }
  if (i < 9) return std::nullopt;
  return v;
}

}  // namespace refit
