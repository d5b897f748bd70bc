#include "receive/box_digests.h"

#include <nlohmann/json.hpp>

#include "common/state_json.h"
#include "refit/kernels/diff.h"

namespace refit::internal {

using json = nlohmann::json;

void BoxDigestTable::Reset(uint64_t version) {
  version_ = version;
  stale_ = false;
  boxes_.clear();
}

void BoxDigestTable::Record(const std::string& tensor, const Box& box, uint64_t digest, bool full) {
  if (stale_) return;
  auto& entries = boxes_[tensor];
  auto it = entries.find(box.offset);
  if (it != entries.end() && it->second.extent == box.extent) {
    it->second.digest = digest;
  } else if (full && it == entries.end()) {
    entries.emplace(box.offset, Entry{box.extent, digest});
  } else {
    stale_ = true;
    boxes_.clear();
  }
}

bool BoxDigestTable::Matches(const std::vector<TensorView>& tensors,
                             const std::map<std::string, uint64_t>& mapped) const {
  if (stale_) return false;
  std::vector<uint8_t> scratch;
  for (const TensorView& t : tensors) {
    auto entries = boxes_.find(t.name);
    auto expected = mapped.find(t.name);
    const uint64_t want = expected == mapped.end() ? 0 : expected->second;
    uint64_t covered = 0;
    if (entries == boxes_.end()) {
      if (want != 0) return false;
      continue;
    }
    const uint32_t elem = SizeOf(t.dtype);
    for (const auto& [offset, entry] : entries->second) {
      const Box box{offset, entry.extent};
      if (offset.size() != t.shape.size()) return false;
      for (size_t d = 0; d < offset.size(); ++d) {
        if (offset[d] > t.shape[d] || entry.extent[d] > t.shape[d] - offset[d]) return false;
      }
      const uint64_t n = BoxElements(box);
      covered += n;
      const uint8_t* bits;
      if (BoxIsContiguous(t.shape, box)) {
        bits = t.bytes() + BoxStartElement(t.shape, box) * elem;
      } else {
        scratch.resize(n * elem);
        GatherBox(t.bytes(), t.shape, box, elem, scratch.data());
        bits = scratch.data();
      }
      if (kernels::Digest64(bits, n * elem) != entry.digest) return false;
    }
    if (covered != want) return false;
  }
  return true;
}

std::string BoxDigestTable::Serialize() const {
  json tensors = json::object();
  for (const auto& [name, entries] : boxes_) {
    json list = json::array();
    for (const auto& [offset, entry] : entries) {
      list.push_back({{"offset", offset}, {"extent", entry.extent}, {"digest", entry.digest}});
    }
    tensors[name] = std::move(list);
  }
  json j = {{"version", version_}, {"stale", stale_}, {"tensors", std::move(tensors)}};
  return j.dump();
}

Result<BoxDigestTable> BoxDigestTable::Parse(const std::string& text, const std::string& label) {
  REFIT_ASSIGN_OR_RAISE(json j, ParseStateObject(text, label));
  BoxDigestTable table;
  REFIT_RETURN_NOT_OK(ReadStateField(j, label, "version", &table.version_));
  REFIT_RETURN_NOT_OK(ReadStateField(j, label, "stale", &table.stale_));
  auto tensors = j.find("tensors");
  if (tensors == j.end() || !tensors->is_object()) {
    return Status::Corrupt(label + ": no 'tensors' object");
  }
  for (const auto& [name, list] : tensors->items()) {
    if (!list.is_array()) return Status::Corrupt(label + ": '" + name + "' is not a list");
    for (const json& e : list) {
      auto offset = e.find("offset"), extent = e.find("extent"), digest = e.find("digest");
      if (!e.is_object() || offset == e.end() || extent == e.end() || digest == e.end() ||
          !digest->is_number_unsigned() || !offset->is_array() || !extent->is_array()) {
        return Status::Corrupt(label + ": a box of '" + name + "' is malformed");
      }
      Shape o, x;
      for (const json& v : *offset) {
        if (!v.is_number_unsigned()) return Status::Corrupt(label + ": bad box offset");
        o.push_back(v.get<uint64_t>());
      }
      for (const json& v : *extent) {
        if (!v.is_number_unsigned()) return Status::Corrupt(label + ": bad box extent");
        x.push_back(v.get<uint64_t>());
      }
      if (o.size() != x.size()) return Status::Corrupt(label + ": box rank mismatch");
      table.boxes_[name][o] = Entry{x, digest->get<uint64_t>()};
    }
  }
  return table;
}

}  // namespace refit::internal
