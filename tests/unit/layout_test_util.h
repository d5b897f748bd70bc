// The layout tests' helpers (unit and integration): the synthetic checkpoints and the exact-cover,
// map/list and round-trip checks are the layout conformance suite's (refit/conformance/
// layout_util.h); what is here only states where particular layouts put things.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "format/safetensors.h"
#include "refit/conformance/layout_util.h"
#include "refit/registry.h"
#include "refit/tensor.h"

namespace refit::testing {

using conformance::CanonicalTensor;
using conformance::ExpectExactCover;
using conformance::ExpectMapAgreesWithList;
using conformance::ExpectRoundTrip;
using conformance::FindCanonical;
using conformance::LocalTensor;
using conformance::MakeCheckpoint;
using conformance::ModelDesc;
using conformance::RankShards;
using conformance::ShardAll;
using conformance::Specs;
using conformance::Views;

// The registry the programs use: builtins plus the build tree's .so plugins.
inline std::shared_ptr<Registry> TestRegistry() {
  Result<std::shared_ptr<Registry>> r = LoadRegistry(nullptr);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(r).value() : nullptr;
}

// Rows [row0, row0 + n) and columns [col0, col0 + m) of a 2-d (or rows of a 1-d) canonical tensor,
// copied element by element: the tests' own statement of where a layout puts things.
inline std::vector<uint8_t> Rows(const CanonicalTensor& t, uint64_t row0, uint64_t n) {
  const uint64_t row_bytes = t.bytes.size() / t.shape[0];
  return std::vector<uint8_t>(t.bytes.begin() + row0 * row_bytes,
                              t.bytes.begin() + (row0 + n) * row_bytes);
}
inline std::vector<uint8_t> Cols(const CanonicalTensor& t, uint64_t col0, uint64_t m) {
  const uint64_t elem = SizeOf(t.dtype), cols = t.shape[1];
  std::vector<uint8_t> out;
  for (uint64_t r = 0; r < t.shape[0]; ++r) {
    auto begin = t.bytes.begin() + (r * cols + col0) * elem;
    out.insert(out.end(), begin, begin + m * elem);
  }
  return out;
}
inline void Append(std::vector<uint8_t>* out, const std::vector<uint8_t>& more) {
  out->insert(out->end(), more.begin(), more.end());
}

}  // namespace refit::testing
