// Fuzzes the link-aware `auto` cost model file ([encoding.auto] calibration): parsing never
// crashes, errors are one line naming the file, and anything accepted holds only finite
// non-negative numbers and survives a serialize/parse round trip unchanged.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "send/cost_model.h"

namespace {

const std::string kLabel = "fuzz.json";

bool Sane(const refit::internal::LinearCost& c) {
  for (double v : {c.record, c.elem, c.change}) {
    if (!std::isfinite(v) || v < 0 || v > 1e12) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto model = refit::internal::ParseCostModel(text, kLabel);
  if (!model.ok()) {
    const std::string m = model.status().message();
    FUZZ_CHECK(m.rfind(kLabel + ": ", 0) == 0, "error does not name the file: %s", m.c_str());
    FUZZ_CHECK(m.find('\n') == std::string::npos, "multi-line error: %s", m.c_str());
    return 0;
  }
  for (const auto& [dtype, encodings] : *model) {
    for (const auto& [name, cost] : encodings) {
      FUZZ_CHECK(Sane(cost.encode_ns) && Sane(cost.decode_ns) && Sane(cost.bytes),
                 "accepted a bad number for %s/%s", dtype.c_str(), name.c_str());
    }
  }
  const std::string once = refit::internal::SerializeCostModel(*model);
  auto again = refit::internal::ParseCostModel(once, "again");
  FUZZ_CHECK(again.ok(), "re-parse failed: %s", again.status().ToString().c_str());
  FUZZ_CHECK(refit::internal::SerializeCostModel(*again) == once, "round trip differs");
  return 0;
}
