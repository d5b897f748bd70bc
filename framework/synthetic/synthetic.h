// A synthetic training trajectory: fp32 master weights of a Llama-shaped model, Adam-like
// updates, and the BF16 cast taken at every sync (what a trainer publishes). Used by `refit demo`,
// tests and benchmarks; deterministic for a seed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "refit/export.h"
#include "refit/tensor.h"

namespace refit {

struct SyntheticModelSpec {
  uint64_t hidden = 768;
  uint64_t layers = 12;
  uint64_t heads = 12;
  uint64_t kv_heads = 4;
  uint64_t ffn = 2048;
  uint64_t vocab = 16384;
  uint64_t seed = 1;

  // A spec of about `params` parameters (scales hidden/ffn/vocab/layers together).
  static SyntheticModelSpec ForParams(uint64_t params, uint64_t seed = 1);
};

class SyntheticModel {
 public:
  explicit SyntheticModel(const SyntheticModelSpec& spec);
  ~SyntheticModel();

  // One optimizer step at learning rate lr (Adam-like: each element moves by ~lr with a random
  // sign and magnitude), then the BF16 cast of every tensor is refreshed.
  void Step(double lr);

  // BF16 views of the current weights (names follow HF Llama), valid while the model lives.
  const std::vector<TensorView>& bf16() const { return views_; }
  uint64_t num_parameters() const { return params_; }

  // Round-to-nearest-even fp32 -> bf16 on bit patterns (NaN stays NaN, quiet).
  static uint16_t ToBF16(float value);

 private:
  struct Tensor {
    std::string name;
    Shape shape;
    std::vector<float> master;
    std::vector<uint16_t> bf16;
    std::vector<float> scale;  // per-element update scale (Adam's 1/sqrt(v) varies per weight)
  };
  std::vector<Tensor> tensors_;
  std::vector<TensorView> views_;
  uint64_t params_ = 0;
  uint64_t rng_state_;
};

}  // namespace refit
