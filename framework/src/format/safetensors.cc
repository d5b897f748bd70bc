// safetensors reader (validate everything, then expose views) and atomic writer.
#include "format/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/file_util.h"
#include "common/text_util.h"
#include "common/worker_pool.h"
#include "refit/kernels/buffer.h"

namespace refit {
namespace {

using internal::IsValidUtf8;
using internal::Printable;
using nlohmann::json;

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr uint64_t kLengthPrefixBytes = 8;

// Safetensors dtype names that refit does not handle: a file using them is valid but unsupported,
// anything else in the dtype field is garbage.
constexpr std::string_view kForeignSafetensorsDTypes[] = {"U16",     "U32", "U64",     "C64",
                                                          "F8_E8M0", "F4",  "F6_E2M3", "F6_E3M2"};

std::string Quoted(std::string_view name) { return "'" + Printable(name) + "'"; }

uint64_t ReadLE64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void AppendLE64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// Rejects duplicate keys in any JSON object (nlohmann would silently keep one of them) and
// remembers the first one, with the top-level entry it sits in, for the error message.
class DuplicateKeyFinder {
 public:
  bool OnEvent(int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects_.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects_.empty()) open_objects_.pop_back();
        break;
      case json::parse_event_t::key: {
        if (open_objects_.empty() || !parsed.is_string()) break;
        const std::string& key = parsed.get_ref<const std::string&>();
        if (open_objects_.size() == 1) {
          top_level_key_ = key;
          top_level_order_.push_back(key);
        }
        if (!open_objects_.back().insert(key).second && !found_) {
          found_ = true;
          duplicate_ = key;
          duplicate_top_level_ = open_objects_.size() == 1;
          enclosing_ = top_level_key_;
        }
        break;
      }
      default:
        break;
    }
    return true;
  }
  bool found() const { return found_; }
  // The top-level keys in header order (nlohmann's object sorts them by name).
  const std::vector<std::string>& top_level_order() const { return top_level_order_; }
  std::string Describe() const {
    if (duplicate_top_level_) return "duplicate tensor name " + Quoted(duplicate_);
    return "entry " + Quoted(enclosing_) + ": duplicate field " + Quoted(duplicate_);
  }

 private:
  std::vector<std::set<std::string>> open_objects_;
  std::string top_level_key_;
  std::vector<std::string> top_level_order_;
  bool found_ = false;
  bool duplicate_top_level_ = false;
  std::string duplicate_;
  std::string enclosing_;
};

// Used only after a failed parse, to say where the JSON is broken.
struct JsonErrorFinder : nlohmann::json_sax<json> {
  std::string message;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    message = ex.what();
    return false;
  }
};

std::string JsonErrorText(const char* first, const char* last) {
  JsonErrorFinder finder;
  json::sax_parse(first, last, &finder, json::input_format_t::json, /*strict=*/true);
  if (finder.message.empty()) return "header is not valid JSON";
  // "[json.exception.parse_error.101] parse error at line 1, column 5: ..." -> from "parse error".
  std::string_view text = finder.message;
  size_t pos = text.find("parse error");
  if (pos != std::string_view::npos) text.remove_prefix(pos);
  return "header is not valid JSON (" + Printable(text) + ")";
}

bool IsForeignSafetensorsDType(std::string_view name) {
  return std::find(std::begin(kForeignSafetensorsDTypes), std::end(kForeignSafetensorsDTypes),
                   name) != std::end(kForeignSafetensorsDTypes);
}

struct ParsedEntry {
  TensorView view;
  uint64_t begin = 0;
  uint64_t end = 0;
};

std::string OffsetsText(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

// Validates one tensor entry of the header against a data buffer of buffer_size bytes.
Status ParseEntry(const std::string& name, const json& entry, uint64_t buffer_size,
                  ParsedEntry* out) {
  const std::string where = "tensor " + Quoted(name);
  if (!entry.is_object()) return Status::Corrupt(where + ": entry is not a JSON object");
  for (const auto& [field, value] : entry.items()) {
    if (field != "dtype" && field != "shape" && field != "data_offsets") {
      return Status::Corrupt(where + ": unexpected field " + Quoted(field));
    }
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(field)) return Status::Corrupt(where + ": missing '" + field + "'");
  }

  const json& dtype_json = entry.at("dtype");
  if (!dtype_json.is_string()) return Status::Corrupt(where + ": dtype is not a string");
  const std::string& dtype_name = dtype_json.get_ref<const std::string&>();
  Result<DType> dtype = DTypeFromSafetensors(dtype_name);
  if (!dtype.ok()) {
    if (IsForeignSafetensorsDType(dtype_name)) {
      return Status::Unsupported(where + ": dtype " + Quoted(dtype_name) +
                                 " is not supported by refit");
    }
    return Status::Corrupt(where + ": unknown dtype " + Quoted(dtype_name));
  }

  const json& shape_json = entry.at("shape");
  if (!shape_json.is_array()) return Status::Corrupt(where + ": shape is not an array");
  if (shape_json.size() > REFIT_MAX_DIMS) {
    return Status::Corrupt(where + ": shape has " + std::to_string(shape_json.size()) +
                           " dims, at most " + std::to_string(REFIT_MAX_DIMS) + " supported");
  }
  Shape shape;
  for (const json& dim : shape_json) {
    if (!dim.is_number_unsigned()) {
      const std::string what = dim.is_number() ? dim.dump() : "a " + std::string(dim.type_name());
      return Status::Corrupt(where + ": shape holds " + what + ", not a non-negative integer");
    }
    shape.push_back(dim.get<uint64_t>());
  }
  Result<uint64_t> elements = NumElements(shape);
  uint64_t nbytes = 0;
  if (!elements.ok() ||
      __builtin_mul_overflow(*elements, static_cast<uint64_t>(SizeOf(*dtype)), &nbytes)) {
    return Status::Corrupt(where + ": shape " + ShapeToString(shape) + " is too large");
  }

  const json& offsets = entry.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    return Status::Corrupt(where + ": data_offsets must be [begin, end] (non-negative integers)");
  }
  const uint64_t begin = offsets[0].get<uint64_t>();
  const uint64_t end = offsets[1].get<uint64_t>();
  if (begin > end) {
    return Status::Corrupt(where + ": data_offsets " + OffsetsText(begin, end) +
                           " end before they begin");
  }
  if (end > buffer_size) {
    return Status::Corrupt(where + ": data_offsets " + OffsetsText(begin, end) +
                           " run past the data buffer of " + std::to_string(buffer_size) +
                           " bytes");
  }
  if (end - begin != nbytes) {
    return Status::Corrupt(where + ": data_offsets " + OffsetsText(begin, end) + " hold " +
                           std::to_string(end - begin) + " bytes, shape " + ShapeToString(shape) +
                           " of " + std::string(NameOf(*dtype)) + " needs " +
                           std::to_string(nbytes));
  }
  out->view.name = name;
  out->view.dtype = *dtype;
  out->view.shape = std::move(shape);
  out->begin = begin;
  out->end = end;
  return Status::OK();
}

// Per the spec the tensors tile the buffer exactly: sorted by offsets (as `entries` are), each
// starts where the previous one ended and the last ends at the buffer's end.
Status CheckTiling(const std::vector<ParsedEntry>& entries, uint64_t buffer_size) {
  uint64_t covered = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const ParsedEntry& e = entries[i];
    if (e.begin < covered) {
      const ParsedEntry& prev = entries[i - 1];
      return Status::Corrupt("tensor " + Quoted(e.view.name) + ": data_offsets " +
                             OffsetsText(e.begin, e.end) + " overlap tensor " +
                             Quoted(prev.view.name) + " " + OffsetsText(prev.begin, prev.end));
    }
    if (e.begin > covered) {
      return Status::Corrupt("bytes " + OffsetsText(covered, e.begin) +
                             " of the data buffer belong to no tensor (before tensor " +
                             Quoted(e.view.name) + ")");
    }
    covered = e.end;
  }
  if (covered != buffer_size) {
    return Status::Corrupt("bytes " + OffsetsText(covered, buffer_size) +
                           " of the data buffer belong to no tensor");
  }
  return Status::OK();
}

}  // namespace

// ------------------------------------------------------------------------------------ reading

SafetensorsFile::~SafetensorsFile() = default;

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path,
                                                               bool writable) {
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<internal::MappedFile> mapping,
                        internal::MappedFile::Open(path, writable));
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->label_ = path;
  file->base_ = mapping->data();
  file->size_ = mapping->size();
  file->mapping_ = std::move(mapping);
  // An empty file maps to nothing: it is simply too short, which Parse() reports.
  REFIT_RETURN_NOT_OK(file->Parse());
  return file;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBuffer(const uint8_t* data,
                                                                     uint64_t size,
                                                                     std::string label) {
  if (data == nullptr && size > 0) return Status::Invalid(label + ": null buffer");
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->label_ = std::move(label);
  file->base_ = data;
  file->size_ = size;
  REFIT_RETURN_NOT_OK(file->Parse());
  return file;
}

Status SafetensorsFile::Parse() {
  auto corrupt = [this](const std::string& message) {
    return Status::Corrupt(label_ + ": " + message);
  };
  if (size_ < kLengthPrefixBytes) {
    return corrupt("file is " + std::to_string(size_) +
                   " bytes, too short for the 8-byte header length");
  }
  const uint64_t header_len = ReadLE64(base_);
  if (header_len > kSafetensorsMaxHeaderBytes) {
    return corrupt("header length " + std::to_string(header_len) + " exceeds the limit of " +
                   std::to_string(kSafetensorsMaxHeaderBytes) + " bytes");
  }
  if (header_len > size_ - kLengthPrefixBytes) {
    return corrupt("header length " + std::to_string(header_len) + " runs past the end of the " +
                   std::to_string(size_) + "-byte file");
  }
  data_start_ = kLengthPrefixBytes + header_len;
  const uint64_t buffer_size = size_ - data_start_;
  const char* first = reinterpret_cast<const char*>(base_ + kLengthPrefixBytes);
  const char* last = first + header_len;

  DuplicateKeyFinder duplicates;
  json header = json::parse(
      first, last,
      [&duplicates](int depth, json::parse_event_t event, json& parsed) {
        return duplicates.OnEvent(depth, event, parsed);
      },
      /*allow_exceptions=*/false);
  if (header.is_discarded()) return corrupt(JsonErrorText(first, last));
  if (duplicates.found()) return corrupt(duplicates.Describe());
  if (!header.is_object()) return corrupt("header is not a JSON object");

  std::vector<ParsedEntry> entries;
  entries.reserve(header.size());
  // Header order, so that tensors sharing an offset (empty ones) keep the writer's order.
  for (const std::string& name : duplicates.top_level_order()) {
    const auto found = header.find(name);
    if (found == header.end()) return corrupt("entry " + Quoted(name) + " vanished while parsing");
    const json& value = *found;
    if (name == kMetadataKey) {
      if (!value.is_object()) return corrupt("__metadata__ is not a JSON object");
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) {
          return corrupt("__metadata__ " + Quoted(key) + " is not a string");
        }
        metadata_.emplace(key, text.get<std::string>());
      }
      continue;
    }
    ParsedEntry entry;
    Status st = ParseEntry(name, value, buffer_size, &entry);
    if (!st.ok()) return Status(st.code(), label_ + ": " + st.message());
    entries.push_back(std::move(entry));
  }

  std::stable_sort(entries.begin(), entries.end(), [](const ParsedEntry& a, const ParsedEntry& b) {
    return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
  });
  Status tiled = CheckTiling(entries, buffer_size);
  if (!tiled.ok()) return corrupt(tiled.message());

  tensors_.reserve(entries.size());
  uint8_t* buffer = const_cast<uint8_t*>(base_) + data_start_;
  for (ParsedEntry& e : entries) {
    e.view.data = buffer + e.begin;
    index_.emplace(e.view.name, tensors_.size());
    tensors_.push_back(std::move(e.view));
  }
  return Status::OK();
}

const TensorView* SafetensorsFile::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Status SafetensorsFile::Sync() { return mapping_ != nullptr ? mapping_->Sync() : Status::OK(); }

Status SafetensorsFile::PopulateForReading() {
  return mapping_ != nullptr ? mapping_->PopulateForReading() : Status::OK();
}

Status SafetensorsFile::ReadInPlaceIfCheaper(bool* in_place, double* fault_s_per_gb,
                                             double* pread_s_per_gb) {
  internal::MappedFile::ReadCosts costs;
  *in_place = mapping_ == nullptr;
  if (mapping_ != nullptr) REFIT_RETURN_NOT_OK(mapping_->ReadInPlaceIfCheaper(in_place, &costs));
  *fault_s_per_gb = costs.fault_s_per_gb;
  *pread_s_per_gb = costs.pread_s_per_gb;
  return Status::OK();
}

// ------------------------------------------------------------------------------------ writing

Result<SafetensorsLayout> PlanSafetensors(const std::vector<TensorView>& tensors,
                                          const Metadata& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) {
      if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
        return Status::Invalid("__metadata__ " + Quoted(key) + ": not valid UTF-8");
      }
      meta[key] = value;
    }
    header[std::string(kMetadataKey)] = std::move(meta);
  }

  SafetensorsLayout layout;
  layout.offsets.reserve(tensors.size());
  std::set<std::string_view> names;
  for (const TensorView& t : tensors) {
    const std::string where = "tensor " + Quoted(t.name);
    if (t.name == kMetadataKey) return Status::Invalid(where + ": reserved name");
    if (!IsValidUtf8(t.name)) return Status::Invalid(where + ": name is not valid UTF-8");
    if (!names.insert(t.name).second)
      return Status::Invalid("duplicate tensor name " + Quoted(t.name));
    const DTypeInfo* info = FindDType(static_cast<int32_t>(t.dtype));
    if (info == nullptr) return Status::Invalid(where + ": invalid dtype");
    if (t.shape.size() > REFIT_MAX_DIMS) {
      return Status::Invalid(where + ": " + std::to_string(t.shape.size()) + " dims, at most " +
                             std::to_string(REFIT_MAX_DIMS) + " supported");
    }
    Result<uint64_t> elements = NumElements(t.shape);
    uint64_t nbytes = 0;
    if (!elements.ok() ||
        __builtin_mul_overflow(*elements, static_cast<uint64_t>(info->size), &nbytes)) {
      return Status::Invalid(where + ": shape " + ShapeToString(t.shape) + " is too large");
    }
    const uint64_t begin = layout.data_bytes;
    if (__builtin_add_overflow(begin, nbytes, &layout.data_bytes)) {
      return Status::Invalid("tensors total more than 2^64 bytes");
    }
    layout.offsets.push_back(begin);
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = std::string(info->safetensors);
    entry["shape"] = t.shape;
    entry["data_offsets"] = {begin, layout.data_bytes};
    header[t.name] = std::move(entry);
  }

  std::string json_text = header.dump();
  // Pad with spaces so the byte buffer starts 8-byte aligned in the file.
  json_text.append((8 - (kLengthPrefixBytes + json_text.size()) % 8) % 8, ' ');
  if (json_text.size() > kSafetensorsMaxHeaderBytes) {
    return Status::Invalid("safetensors header would be " + std::to_string(json_text.size()) +
                           " bytes, over the limit of " +
                           std::to_string(kSafetensorsMaxHeaderBytes));
  }
  layout.header.reserve(kLengthPrefixBytes + json_text.size());
  AppendLE64(&layout.header, json_text.size());
  layout.header += json_text;
  return layout;
}

// PlanSafetensors only lays tensors out (views may have no data); writers need the bytes.
static Status CheckHasData(const std::vector<TensorView>& tensors) {
  for (const TensorView& t : tensors) {
    if (t.data == nullptr && t.nbytes() > 0) {
      return Status::Invalid("tensor " + Quoted(t.name) + ": null data");
    }
  }
  return Status::OK();
}

namespace {

// Below this many bytes per thread a file is assembled on the caller's thread alone.
constexpr uint64_t kParallelBytesPerThread = 4 << 20;

// Copies the bytes of the file in [begin, end) (offsets in the file) from the header and the
// tensors into out.
void CopyFileRange(const SafetensorsLayout& layout, const std::vector<TensorView>& tensors,
                   uint8_t* out, uint64_t begin, uint64_t end) {
  const auto copy_piece = [&](uint64_t at, const void* src, uint64_t len) {
    const uint64_t from = std::max(at, begin);
    const uint64_t to = std::min(at + len, end);
    if (from < to)
      std::memcpy(out + from, static_cast<const uint8_t*>(src) + (from - at), to - from);
  };
  copy_piece(0, layout.header.data(), layout.header.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    copy_piece(layout.header.size() + layout.offsets[i], tensors[i].data, tensors[i].nbytes());
  }
}

}  // namespace

Result<std::vector<uint8_t>> SerializeSafetensors(const std::vector<TensorView>& tensors,
                                                  const Metadata& metadata,
                                                  internal::WorkerPool* pool, unsigned threads,
                                                  std::vector<uint8_t> reuse) {
  REFIT_ASSIGN_OR_RAISE(SafetensorsLayout layout, PlanSafetensors(tensors, metadata));
  REFIT_RETURN_NOT_OK(CheckHasData(tensors));
  const uint64_t total = layout.header.size() + layout.data_bytes;
  if (layout.data_bytes > std::numeric_limits<size_t>::max() - layout.header.size()) {
    return Status::Invalid("safetensors payload of " + std::to_string(layout.data_bytes) +
                           " bytes does not fit in memory");
  }
  std::vector<uint8_t> out = std::move(reuse);
  out.clear();
  kernels::ReserveWithHugePages(out, static_cast<size_t>(total));
  const size_t stripes =
      pool == nullptr ? 1 : std::clamp<uint64_t>(total / kParallelBytesPerThread, 1, threads);
  if (stripes > 1) {
    // A vector's bytes can only be sized by a zero fill, on one thread: its fresh pages (the
    // fault is the cost, ~10 us a page in a VM) are populated in parallel first, and the bytes
    // copied in parallel after the fill.
    const auto part = [&](size_t k) { return total * k / stripes; };
    internal::RunStripes(pool, stripes, [&](size_t k) {
      kernels::PopulateForWrite(out.data() + part(k), part(k + 1) - part(k));
    });
    out.resize(static_cast<size_t>(total));
    internal::RunStripes(pool, stripes, [&](size_t k) {
      CopyFileRange(layout, tensors, out.data(), part(k), part(k + 1));
    });
    return out;
  }
  // Appended piece by piece into reserved capacity: every byte is written once (a sized vector
  // would be zero-filled first, a second pass over payloads of many MB).
  out.insert(out.end(), layout.header.begin(), layout.header.end());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t nbytes = tensors[i].nbytes();
    out.resize(layout.header.size() + layout.offsets[i]);  // no-op unless the plan pads
    const auto* data = static_cast<const uint8_t*>(tensors[i].data);
    if (nbytes > 0) out.insert(out.end(), data, data + nbytes);
  }
  out.resize(static_cast<size_t>(total));
  return out;
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                        const Metadata& metadata) {
  Result<SafetensorsLayout> planned = PlanSafetensors(tensors, metadata);
  if (!planned.ok()) return planned.status().WithContext(path);
  REFIT_RETURN_NOT_OK(CheckHasData(tensors).WithContext(path));
  const SafetensorsLayout& layout = planned.value();

  // Until Commit succeeds, any failure removes the temporary file and leaves path alone.
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<internal::AtomicFile> file,
                        internal::AtomicFile::Create(path));
  REFIT_RETURN_NOT_OK(
      file->Write(reinterpret_cast<const uint8_t*>(layout.header.data()), layout.header.size()));
  for (const TensorView& t : tensors) REFIT_RETURN_NOT_OK(file->Write(t.bytes(), t.nbytes()));
  return file->Commit();
}

}  // namespace refit
