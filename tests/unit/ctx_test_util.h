// A delta for the ctx codec tests: old and new bits of one record, its positions, and the
// encode input / decode target the codec takes.
#pragma once

#include <cstdint>
#include <vector>

#include "refit/kernels/diff.h"
#include "refit/plugin_abi.h"

namespace refit::testing {

struct CtxDelta {
  int32_t dtype = REFIT_DTYPE_BF16;
  uint32_t elem_size = 2;
  std::vector<uint8_t> old_bits;
  std::vector<uint8_t> new_bits;
  std::vector<uint64_t> positions;

  uint64_t n() const { return old_bits.size() / elem_size; }
  refit_encode_input_t Input() {
    positions.clear();
    refit_encode_input_t in{};
    in.struct_size = sizeof(in);
    in.dtype = dtype;
    in.elem_size = elem_size;
    in.n_elems = n();
    in.old_bits = old_bits.data();
    in.new_bits = new_bits.data();
    in.n_changed =
        kernels::DiffPositions(old_bits.data(), new_bits.data(), n(), elem_size, &positions);
    in.positions = positions.data();
    return in;
  }
  refit_decode_target_t Target(std::vector<uint8_t>* bits) const {
    refit_decode_target_t t{};
    t.struct_size = sizeof(t);
    t.dtype = dtype;
    t.elem_size = elem_size;
    t.n_elems = n();
    t.bits = bits->data();
    return t;
  }
};

}  // namespace refit::testing
