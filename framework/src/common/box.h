// N-d boxes of row-major tensors: how records address slices, and how the pipelines turn a box
// into contiguous runs of memory (no full-tensor assembly, no per-element index math).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "refit/export.h"
#include "refit/tensor.h"

namespace refit {

struct Box {
  Shape offset;
  Shape extent;
};

// True when the box covers one contiguous run of the tensor's row-major memory.
bool BoxIsContiguous(const Shape& shape, const Box& box);
// Row-major element index of the box's first element.
uint64_t BoxStartElement(const Shape& shape, const Box& box);
uint64_t BoxElements(const Box& box);

// Calls fn(start_element_in_tensor, count) for each maximal contiguous run of the box, in the
// box's row-major order.
void ForEachRun(const Shape& shape, const Box& box,
                const std::function<void(uint64_t start, uint64_t count)>& fn);

// Splits a box into sub-boxes of at most max_elements each (>= 1 element per sub-box unless the
// box is empty), in row-major order: leading dims are fixed one index at a time until the trailing
// block fits, then the next dim is cut into ranges. A sub-box of a contiguous box is contiguous.
std::vector<Box> SplitBox(const Box& box, uint64_t max_elements);

// Copies the box's elements into a contiguous buffer, and back.
void GatherBox(const uint8_t* tensor, const Shape& shape, const Box& box, uint32_t elem_size,
               uint8_t* out);
void ScatterBox(const uint8_t* in, const Shape& shape, const Box& box, uint32_t elem_size,
                uint8_t* tensor);

}  // namespace refit
