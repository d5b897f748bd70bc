#include "synthetic/synthetic.h"

#include <cmath>
#include <cstring>

namespace refit {

namespace {

// splitmix64: tiny, fast, good enough for synthetic weights.
inline uint64_t NextRandom(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Approximately standard normal from one 64-bit draw (sum of four 16-bit uniforms, Irwin-Hall).
inline float NextNormal(uint64_t& state) {
  uint64_t r = NextRandom(state);
  float sum =
      static_cast<float>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48)) *
      (1.0f / 65536.0f);
  return (sum - 2.0f) * 1.7320508f;  // variance of the sum of 4 U(0,1) is 1/3
}

}  // namespace

SyntheticModelSpec SyntheticModelSpec::ForParams(uint64_t params, uint64_t seed) {
  SyntheticModelSpec s;
  s.seed = seed;
  // Per layer ~ 2 h^2 (q,o) + 2 h^2 kv/heads (k,v) + 3 h ffn; embeddings 2 * vocab * h.
  // Grow hidden in steps of 64 until the count reaches params.
  for (uint64_t h = 64;; h += 64) {
    SyntheticModelSpec t = s;
    t.hidden = h;
    t.heads = std::max<uint64_t>(h / 64, 1);
    t.kv_heads = std::max<uint64_t>(t.heads / 3, 1);
    while (t.heads % t.kv_heads != 0) --t.kv_heads;
    t.ffn = (h * 8 / 3 + 63) / 64 * 64;
    t.vocab = std::min<uint64_t>(32768, std::max<uint64_t>(1024, h * 16));
    t.layers = std::max<uint64_t>(2, h / 64);
    uint64_t head_dim = h / t.heads;
    uint64_t per_layer = 2 * h * h + 2 * h * t.kv_heads * head_dim + 3 * h * t.ffn + 2 * h;
    uint64_t total = t.layers * per_layer + 2 * t.vocab * h + h;
    if (total >= params || h >= 16384) return t;
  }
}

uint16_t SyntheticModel::ToBF16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN, keep sign and payload top
  }
  uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

SyntheticModel::SyntheticModel(const SyntheticModelSpec& spec) : rng_state_(spec.seed * 7919 + 17) {
  const uint64_t h = spec.hidden;
  const uint64_t head_dim = h / spec.heads;
  const uint64_t kv = spec.kv_heads * head_dim;
  auto add = [&](std::string name, Shape shape, float std_dev, bool norm) {
    Tensor t;
    t.name = std::move(name);
    t.shape = shape;
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    t.master.resize(n);
    t.bf16.resize(n);
    t.scale.resize(n);
    for (uint64_t i = 0; i < n; ++i) {
      // Trained weights: mostly near-normal with heavier tails; norms sit around 1.
      float w = norm ? 1.0f + 0.05f * NextNormal(rng_state_) : std_dev * NextNormal(rng_state_);
      if (!norm && (NextRandom(rng_state_) & 63) == 0) w *= 4.0f;
      t.master[i] = w;
      t.bf16[i] = ToBF16(w);
      // Adam's |m / sqrt(v)| sits well below 1 for noisy gradients: ~[0.05, 0.6] x lr per
      // weight, which gives the ~1.4% density per step at lr 1e-6 seen on real BF16 runs.
      t.scale[i] = 0.05f + 0.55f * static_cast<float>(NextRandom(rng_state_) >> 40) / 16777216.0f;
    }
    params_ += n;
    tensors_.push_back(std::move(t));
  };
  add("model.embed_tokens.weight", {spec.vocab, h}, 0.02f, false);
  for (uint64_t l = 0; l < spec.layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {h}, 0, true);
    add(p + "self_attn.q_proj.weight", {h, h}, 0.02f, false);
    add(p + "self_attn.k_proj.weight", {kv, h}, 0.02f, false);
    add(p + "self_attn.v_proj.weight", {kv, h}, 0.02f, false);
    add(p + "self_attn.o_proj.weight", {h, h}, 0.02f, false);
    add(p + "post_attention_layernorm.weight", {h}, 0, true);
    add(p + "mlp.gate_proj.weight", {spec.ffn, h}, 0.02f, false);
    add(p + "mlp.up_proj.weight", {spec.ffn, h}, 0.02f, false);
    add(p + "mlp.down_proj.weight", {h, spec.ffn}, 0.02f, false);
  }
  add("model.norm.weight", {h}, 0, true);
  add("lm_head.weight", {spec.vocab, h}, 0.02f, false);
  for (Tensor& t : tensors_) {
    TensorView v;
    v.name = t.name;
    v.dtype = DType::kBF16;
    v.shape = t.shape;
    v.data = t.bf16.data();
    views_.push_back(std::move(v));
  }
}

SyntheticModel::~SyntheticModel() = default;

void SyntheticModel::Step(double lr) {
  const float step = static_cast<float>(lr);
  for (Tensor& t : tensors_) {
    const uint64_t n = t.master.size();
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t r = NextRandom(rng_state_);
      float sign = (r & 1) ? 1.0f : -1.0f;
      float jitter = 0.75f + 0.5f * static_cast<float>((r >> 8) & 0xFFFF) / 65536.0f;
      t.master[i] -= step * sign * jitter * t.scale[i];
      t.bf16[i] = ToBF16(t.master[i]);
    }
  }
}

}  // namespace refit
