#include "send/calibrate.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>

#include "common/stopwatch.h"
#include "refit/kernels/diff.h"

namespace refit::internal {

namespace {

constexpr uint64_t kElements = 1 << 20;
constexpr uint64_t kSmallElements = kElements / 16;
constexpr double kLowDensity = 0.002;
constexpr double kHighDensity = 0.03;
constexpr int kRuns = 3;

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct FloatBits {
  int exponent_bits = 0;  // 0: not a float dtype
  int mantissa_bits = 0;
};

FloatBits FloatLayout(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return {8, 7};
    case DType::kF16:
      return {5, 10};
    case DType::kF32:
      return {8, 23};
    case DType::kF64:
      return {11, 52};
    case DType::kF8E4M3:
      return {4, 3};
    case DType::kF8E5M2:
      return {5, 2};
    default:
      return {};
  }
}

// One element's old bits: weight-like floats (random sign and mantissa, exponents a few below
// 1.0, each step down half as likely), small integers, or 0/1 for bool.
uint64_t OldValue(DType dtype, const FloatBits& f, uint64_t& rng) {
  const uint64_t r = SplitMix(rng);
  if (dtype == DType::kBool) return r & 1;
  if (f.exponent_bits == 0) return 16 + (r % 100);  // room for +-8 in every integer width
  const int bias = (1 << (f.exponent_bits - 1)) - 1;
  const int drop = std::min(std::countr_zero(r | (1ull << 8)), 8);
  const uint64_t exponent = static_cast<uint64_t>(std::max(1, bias - 2 - drop));
  const uint64_t mantissa = (r >> 12) & ((1ull << f.mantissa_bits) - 1);
  const uint64_t sign = (r >> 11) & 1;
  return (sign << (f.exponent_bits + f.mantissa_bits)) | (exponent << f.mantissa_bits) | mantissa;
}

// A change: one step of the magnitude (90%) or 2..8 steps, up or down; never equal to old.
uint64_t NewValue(DType dtype, const FloatBits& f, uint64_t old, uint64_t& rng) {
  if (dtype == DType::kBool) return old ^ 1;
  const uint64_t r = SplitMix(rng);
  const uint64_t step = (r % 10) != 0 ? 1 : 2 + (r >> 8) % 7;
  const bool up = ((r >> 16) & 1) != 0;
  const uint64_t sign_mask = f.exponent_bits == 0 ? 0 : 1ull << (f.exponent_bits + f.mantissa_bits);
  const uint64_t magnitude = old & ~sign_mask;
  const uint64_t moved = up || magnitude <= step ? magnitude + step : magnitude - step;
  return (old & sign_mask) | moved;
}

void Store(uint8_t* dst, uint64_t value, uint32_t elem) { std::memcpy(dst, &value, elem); }

struct SyntheticDelta {
  std::vector<uint8_t> old_bits, new_bits, old_values, new_values;
  std::vector<uint64_t> positions;
  uint64_t digest = 0;  // of the new bits, as a record header carries it
  refit_encode_input_t in{};
};

// Little-endian hosts only (as the wire format): Store keeps the low `elem` bytes.
void MakeDelta(DType dtype, uint64_t n, double density, uint64_t seed, SyntheticDelta* d) {
  const uint32_t elem = SizeOf(dtype);
  const FloatBits f = FloatLayout(dtype);
  uint64_t rng = seed;
  d->old_bits.resize(n * elem);
  d->positions.clear();
  d->old_values.clear();
  d->new_values.clear();
  const uint64_t threshold = static_cast<uint64_t>(density * 18446744073709551615.0);
  for (uint64_t i = 0; i < n; ++i) {
    Store(&d->old_bits[i * elem], OldValue(dtype, f, rng), elem);
    if (SplitMix(rng) < threshold) d->positions.push_back(i);
  }
  d->new_bits = d->old_bits;
  d->old_values.resize(d->positions.size() * elem);
  d->new_values.resize(d->positions.size() * elem);
  for (size_t j = 0; j < d->positions.size(); ++j) {
    uint8_t* at = &d->new_bits[d->positions[j] * elem];
    uint64_t old = 0;
    std::memcpy(&old, at, elem);
    Store(at, NewValue(dtype, f, old, rng), elem);
    std::memcpy(&d->old_values[j * elem], &d->old_bits[d->positions[j] * elem], elem);
    std::memcpy(&d->new_values[j * elem], at, elem);
  }
  d->digest = kernels::Digest64(d->new_bits.data(), d->new_bits.size());
  refit_encode_input_t& in = d->in;
  in = refit_encode_input_t{};
  in.struct_size = sizeof(in);
  in.dtype = static_cast<int32_t>(dtype);
  in.elem_size = elem;
  in.n_elems = n;
  in.old_bits = d->old_bits.data();
  in.new_bits = d->new_bits.data();
  in.positions = d->positions.data();
  in.n_changed = d->positions.size();
  in.old_values = d->old_values.data();
  in.new_values = d->new_values.data();
}

struct Sample {
  double encode_ns = 0, decode_ns = 0, bytes = 0;
};

// Scratch of the receiver-side decode.
struct DecodeScratch {
  std::vector<uint8_t> copy;
  kernels::PositionList positions;
  kernels::ValueList values;
};

// What a receiver does with a record (receive/apply.cc ComputeChanges): the encoding lists its
// changes against the old bits, which are digested patched; or, when it cannot, the record is
// decoded into a copy of the old bits that is then diffed and digested. Encodings differ here by
// more than their decode alone (the copy and the second scan), so that is what is timed, the
// digest check included.
Status DecodeLikeAReceiver(const Encoding& enc, const uint8_t* payload, uint64_t len,
                           const SyntheticDelta& d, DecodeScratch& s) {
  const uint64_t n = d.in.n_elems;
  const uint32_t elem = d.in.elem_size;
  refit_decode_target_t t{};
  t.struct_size = sizeof(t);
  t.dtype = d.in.dtype;
  t.elem_size = elem;
  t.n_elems = n;
  const uint64_t want = d.digest;
  if (enc.can_decode_changes()) {
    s.positions.resize(d.in.n_changed);
    s.values.resize(d.in.n_changed * elem);
    t.bits = const_cast<uint8_t*>(d.old_bits.data());  // read only
    refit_decoded_changes_t listed{};
    listed.struct_size = sizeof(listed);
    listed.capacity = d.in.n_changed;
    listed.positions = s.positions.data();
    listed.values = s.values.data();
    Status st = enc.DecodeChanges(payload, len, t, &listed);
    if (st.ok()) {
      const kernels::PatchedDigest pd = kernels::DigestPatched(
          d.old_bits.data(), n, elem, s.positions.data(), listed.count, s.values.data());
      return pd.positions_valid && pd.digest == want ? Status::OK() : Status::Internal("mismatch");
    }
    if (st.code() != StatusCode::kUnsupported) return st;
  }
  s.copy.resize(n * elem);
  std::memcpy(s.copy.data(), d.old_bits.data(), n * elem);
  t.bits = s.copy.data();
  REFIT_RETURN_NOT_OK(enc.Decode(payload, len, t));
  const kernels::DiffDigest dd =
      kernels::DiffPositionsAndDigest(d.old_bits.data(), s.copy.data(), n, elem, &s.positions, {});
  return dd.digest == want ? Status::OK() : Status::Internal("mismatch");
}

Result<Sample> Measure(const Encoding& enc, const SyntheticDelta& d) {
  REFIT_ASSIGN_OR_RAISE(uint64_t cap, enc.MaxEncodedSize(d.in));
  if (cap == 0) return Status::Internal("encoding '" + enc.name() + "' cannot size its output");
  std::vector<uint8_t> out(cap);
  DecodeScratch scratch;
  Sample s;
  s.encode_ns = s.decode_ns = std::numeric_limits<double>::infinity();
  for (int run = 0; run < kRuns; ++run) {
    Stopwatch encode_clock;
    REFIT_ASSIGN_OR_RAISE(uint64_t len, enc.Encode(d.in, out.data(), cap));
    s.encode_ns = std::min(s.encode_ns, encode_clock.Seconds() * 1e9);
    s.bytes = static_cast<double>(len);
    Stopwatch decode_clock;
    Status st = DecodeLikeAReceiver(enc, out.data(), len, d, scratch);
    s.decode_ns = std::min(s.decode_ns, decode_clock.Seconds() * 1e9);
    if (!st.ok()) {
      return Status::Internal("calibrating encoding '" + enc.name() +
                              "': its decode does not reproduce the new bits: " + st.message());
    }
  }
  return s;
}

// Fits record + elem * n + change * k through (n, k1), (n, k2) and (small, k3); negative
// coefficients (timing noise) are clamped to 0.
LinearCost Fit(double t1, double t2, double t3, double k1, double k2, double k3) {
  const double n = static_cast<double>(kElements);
  const double small = static_cast<double>(kSmallElements);
  LinearCost c;
  c.change = k2 > k1 ? std::max(0.0, (t2 - t1) / (k2 - k1)) : 0;
  c.elem = std::max(0.0, ((t2 - t3) - c.change * (k2 - k3)) / (n - small));
  c.record = std::max(0.0, t2 - c.elem * n - c.change * k2);
  return c;
}

}  // namespace

Result<std::vector<EncodingCost>> Calibrate(const std::vector<const Encoding*>& candidates,
                                            DType dtype) {
  SyntheticDelta lo, hi, small;
  MakeDelta(dtype, kElements, kLowDensity, 1, &lo);
  MakeDelta(dtype, kElements, kHighDensity, 2, &hi);
  MakeDelta(dtype, kSmallElements, kHighDensity, 3, &small);
  const double k1 = static_cast<double>(lo.positions.size());
  const double k2 = static_cast<double>(hi.positions.size());
  const double k3 = static_cast<double>(small.positions.size());
  std::vector<EncodingCost> costs;
  for (const Encoding* enc : candidates) {
    Result<Sample> a = Measure(*enc, lo);
    Result<Sample> b = a.ok() ? Measure(*enc, hi) : a;
    Result<Sample> c = b.ok() ? Measure(*enc, small) : b;
    if (!c.ok()) {
      return c.status().WithContext("calibrating [encoding.auto] on " + std::string(NameOf(dtype)));
    }
    EncodingCost cost;
    cost.encode_ns = Fit(a->encode_ns, b->encode_ns, c->encode_ns, k1, k2, k3);
    cost.decode_ns = Fit(a->decode_ns, b->decode_ns, c->decode_ns, k1, k2, k3);
    cost.bytes = Fit(a->bytes, b->bytes, c->bytes, k1, k2, k3);
    costs.push_back(cost);
  }
  return costs;
}

Result<const std::vector<EncodingCost>*> CalibratedOnce(
    const std::vector<const Encoding*>& candidates, DType dtype, const std::string& key) {
  // Never erased: the pointers handed out stay valid for the process.
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<std::vector<EncodingCost>>> cache;
  std::lock_guard<std::mutex> lock(mu);
  const std::string full_key = key + "|" + std::string(NameOf(dtype));
  auto it = cache.find(full_key);
  if (it != cache.end()) return it->second.get();
  REFIT_ASSIGN_OR_RAISE(std::vector<EncodingCost> costs, Calibrate(candidates, dtype));
  auto stored = std::make_unique<std::vector<EncodingCost>>(std::move(costs));
  const std::vector<EncodingCost>* out = stored.get();
  cache.emplace(full_key, std::move(stored));
  return out;
}

}  // namespace refit::internal
