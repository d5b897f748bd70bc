#include "common/box.h"

#include <gtest/gtest.h>

#include <numeric>

namespace refit {
namespace {

// Row-major index of every element of the box, the slow way.
std::vector<uint64_t> Reference(const Shape& shape, const Box& box) {
  std::vector<uint64_t> out;
  std::vector<uint64_t> idx(shape.size(), 0);
  if (BoxElements(box) == 0) return out;
  while (true) {
    uint64_t flat = 0;
    for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + box.offset[d] + idx[d];
    out.push_back(flat);
    size_t d = shape.size();
    while (d > 0) {
      --d;
      if (++idx[d] < box.extent[d]) break;
      idx[d] = 0;
      if (d == 0) return out;
    }
    if (shape.empty()) return out;
  }
}

std::vector<uint64_t> Runs(const Shape& shape, const Box& box) {
  std::vector<uint64_t> out;
  ForEachRun(shape, box, [&](uint64_t start, uint64_t count) {
    for (uint64_t i = 0; i < count; ++i) out.push_back(start + i);
  });
  return out;
}

TEST(Box, RunsMatchReferenceForManyBoxes) {
  const Shape shape = {4, 5, 6};
  for (uint64_t o0 = 0; o0 < 4; ++o0)
    for (uint64_t e0 = 0; o0 + e0 <= 4; ++e0)
      for (uint64_t o1 : {0, 2})
        for (uint64_t e1 : {1, 3, 5})
          for (uint64_t o2 : {0, 1})
            for (uint64_t e2 : {1, 5, 6}) {
              if (o1 + e1 > 5 || o2 + e2 > 6) continue;
              Box box{{o0, o1, o2}, {e0, e1, e2}};
              EXPECT_EQ(Runs(shape, box), Reference(shape, box));
              bool contiguous = true;
              auto ref = Reference(shape, box);
              for (size_t i = 1; i < ref.size(); ++i) contiguous &= ref[i] == ref[i - 1] + 1;
              EXPECT_EQ(BoxIsContiguous(shape, box), contiguous);
            }
}

TEST(Box, ScalarAndEmpty) {
  EXPECT_EQ(Runs({}, Box{{}, {}}), std::vector<uint64_t>{0});
  EXPECT_TRUE(Runs({3, 0}, Box{{0, 0}, {3, 0}}).empty());
}

TEST(Box, SplitCoversTheBoxExactlyOnceWithinTheCap) {
  const Shape shape = {7, 9, 11};
  Box whole{{0, 0, 0}, shape};
  for (uint64_t cap : {1, 5, 11, 12, 98, 99, 100, 693, 1000}) {
    std::vector<uint64_t> seen;
    for (const Box& b : SplitBox(whole, cap)) {
      EXPECT_LE(BoxElements(b), cap);
      EXPECT_TRUE(BoxIsContiguous(shape, b));
      auto r = Reference(shape, b);
      seen.insert(seen.end(), r.begin(), r.end());
    }
    EXPECT_EQ(seen, Reference(shape, whole)) << "cap " << cap;
  }
  // A non-contiguous parent box splits into pieces of that box only.
  Box part{{1, 2, 3}, {3, 4, 5}};
  std::vector<uint64_t> seen;
  for (const Box& b : SplitBox(part, 7)) {
    auto r = Reference(shape, b);
    seen.insert(seen.end(), r.begin(), r.end());
  }
  EXPECT_EQ(seen, Reference(shape, part));
}

TEST(Box, GatherScatterRoundTrip) {
  const Shape shape = {6, 8};
  std::vector<uint16_t> tensor(48);
  std::iota(tensor.begin(), tensor.end(), 0);
  Box box{{1, 2}, {3, 4}};
  std::vector<uint16_t> out(12);
  GatherBox(reinterpret_cast<uint8_t*>(tensor.data()), shape, box, 2,
            reinterpret_cast<uint8_t*>(out.data()));
  EXPECT_EQ(out[0], 10);
  EXPECT_EQ(out[4], 18);
  for (auto& v : out) v = static_cast<uint16_t>(v + 1000);
  ScatterBox(reinterpret_cast<uint8_t*>(out.data()), shape, box, 2,
             reinterpret_cast<uint8_t*>(tensor.data()));
  EXPECT_EQ(tensor[10], 1010);
  EXPECT_EQ(tensor[9], 9);
  EXPECT_EQ(tensor[13], 1013);
  EXPECT_EQ(tensor[14], 14);
}

}  // namespace
}  // namespace refit
