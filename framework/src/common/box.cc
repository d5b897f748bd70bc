#include "common/box.h"

#include <cstring>

namespace refit {

uint64_t BoxElements(const Box& box) {
  uint64_t n = 1;
  for (uint64_t e : box.extent) n *= e;
  return n;
}

uint64_t BoxStartElement(const Shape& shape, const Box& box) {
  uint64_t index = 0;
  for (size_t d = 0; d < shape.size(); ++d) index = index * shape[d] + box.offset[d];
  return index;
}

bool BoxIsContiguous(const Shape& shape, const Box& box) {
  // Contiguous iff, after the first dim with extent > 1, every later dim is taken whole.
  if (BoxElements(box) == 0) return true;
  size_t d = 0;
  while (d < shape.size() && box.extent[d] == 1) ++d;
  if (d == shape.size()) return true;
  for (size_t k = d + 1; k < shape.size(); ++k) {
    if (box.extent[k] != shape[k]) return false;
  }
  return true;
}

void ForEachRun(const Shape& shape, const Box& box,
                const std::function<void(uint64_t start, uint64_t count)>& fn) {
  const size_t ndim = shape.size();
  if (BoxElements(box) == 0) return;
  if (ndim == 0) {
    fn(0, 1);
    return;
  }
  // The innermost dims taken whole merge into the run; find the first dim of the run.
  size_t run_dim = ndim - 1;
  uint64_t run = box.extent[ndim - 1];
  while (run_dim > 0 && box.extent[run_dim] == shape[run_dim]) {
    --run_dim;
    run *= box.extent[run_dim];
  }
  // Dims [0, run_dim) are iterated one index at a time.
  std::vector<uint64_t> strides(ndim, 1);
  for (size_t d = ndim - 1; d > 0; --d) strides[d - 1] = strides[d] * shape[d];
  std::vector<uint64_t> idx(run_dim, 0);
  while (true) {
    uint64_t start = 0;
    for (size_t d = 0; d < run_dim; ++d) start += (box.offset[d] + idx[d]) * strides[d];
    for (size_t d = run_dim; d < ndim; ++d) start += box.offset[d] * strides[d];
    fn(start, run);
    size_t d = run_dim;
    while (d > 0) {
      --d;
      if (++idx[d] < box.extent[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (run_dim == 0) return;
  }
}

std::vector<Box> SplitBox(const Box& box, uint64_t max_elements) {
  std::vector<Box> out;
  const size_t ndim = box.extent.size();
  const uint64_t total = BoxElements(box);
  if (total == 0) return out;
  if (max_elements == 0) max_elements = 1;
  if (total <= max_elements || ndim == 0) {
    out.push_back(box);
    return out;
  }
  // Smallest d such that one index step of dim d (the trailing block) fits.
  size_t cut = ndim - 1;
  uint64_t block = 1;  // elements in dims (cut, ndim)
  for (size_t d = ndim; d-- > 0;) {
    uint64_t next = block * box.extent[d];
    if (next > max_elements || d == 0) {
      cut = d;
      break;
    }
    block = next;
  }
  const uint64_t per_cut = max_elements / block > 0 ? max_elements / block : 1;
  std::vector<uint64_t> idx(cut, 0);
  while (true) {
    for (uint64_t begin = 0; begin < box.extent[cut]; begin += per_cut) {
      Box b;
      b.offset = box.offset;
      b.extent = box.extent;
      for (size_t d = 0; d < cut; ++d) {
        b.offset[d] += idx[d];
        b.extent[d] = 1;
      }
      b.offset[cut] += begin;
      b.extent[cut] = std::min(per_cut, box.extent[cut] - begin);
      out.push_back(std::move(b));
    }
    size_t d = cut;
    bool done = true;
    while (d > 0) {
      --d;
      if (++idx[d] < box.extent[d]) {
        done = false;
        break;
      }
      idx[d] = 0;
    }
    if (done) break;
  }
  return out;
}

void GatherBox(const uint8_t* tensor, const Shape& shape, const Box& box, uint32_t elem_size,
               uint8_t* out) {
  ForEachRun(shape, box, [&](uint64_t start, uint64_t count) {
    std::memcpy(out, tensor + start * elem_size, count * elem_size);
    out += count * elem_size;
  });
}

void ScatterBox(const uint8_t* in, const Shape& shape, const Box& box, uint32_t elem_size,
                uint8_t* tensor) {
  ForEachRun(shape, box, [&](uint64_t start, uint64_t count) {
    std::memcpy(tensor + start * elem_size, in, count * elem_size);
    in += count * elem_size;
  });
}

}  // namespace refit
