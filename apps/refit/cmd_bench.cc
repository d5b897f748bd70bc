// refit bench codec: payload size against the order-0 bound and published formats, and encode /
// apply throughput against memcpy and a plain compare-scan measured on the same buffers.
#include <malloc.h>
#include <zstd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_map>

#include "commands.h"
#include "common/progress.h"
#include "format/safetensors.h"
#include "format/wire.h"
#include "offline/delta_internal.h"
#include "plugins/encoding_cache.h"
#include "refit/delta.h"
#include "refit/kernels/diff.h"
#include "refit/refit.h"
#include "send/auto_policy.h"
#include "send/calibrate.h"
#include "synthetic/synthetic.h"

namespace refit::cli {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One pair of model versions to measure. Views point into `storage` or into mapped files.
struct Workload {
  std::string name;
  std::vector<TensorView> base, next;
  std::vector<std::vector<uint8_t>> storage;
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  uint64_t model_bytes() const {
    uint64_t b = 0;
    for (const TensorView& t : next) b += t.nbytes();
    return b;
  }
};

inline uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// bf16 ordered-integer steps: +-1 moves the value by one representable step.
inline int32_t OrderedBF16(uint16_t bits) {
  return (bits & 0x8000) ? -static_cast<int32_t>(bits & 0x7FFF) : static_cast<int32_t>(bits);
}
inline uint16_t FromOrderedBF16(int32_t ord) {
  return ord < 0 ? static_cast<uint16_t>(0x8000 | (-ord)) : static_cast<uint16_t>(ord);
}

// A bf16 buffer cut into 16 tensors with weight-like magnitudes (log-uniform over 2^-14..2^-3,
// random sign); `density` of the elements move, 90% by one ULP, the rest by 2..8 ULPs.
Workload DensityWorkload(uint64_t bytes, double density, uint64_t seed) {
  Workload w;
  char name[64];
  std::snprintf(name, sizeof(name), "sweep %.1f%%", density * 100);
  w.name = name;
  const uint64_t tensors = 16;
  const uint64_t per = std::max<uint64_t>(bytes / 2 / tensors, 1);
  w.storage.resize(2 * tensors);
  const uint64_t threshold = static_cast<uint64_t>(density * 18446744073709551615.0);
  uint64_t s = seed * 1000003 + 7;
  for (uint64_t t = 0; t < tensors; ++t) {
    std::vector<uint8_t>& b = w.storage[2 * t];
    std::vector<uint8_t>& x = w.storage[2 * t + 1];
    b.resize(per * 2);
    x.resize(per * 2);
    auto* bv = reinterpret_cast<uint16_t*>(b.data());
    auto* xv = reinterpret_cast<uint16_t*>(x.data());
    for (uint64_t i = 0; i < per; ++i) {
      uint64_t r = SplitMix(s);
      uint16_t exp = static_cast<uint16_t>(127 - 14 + (r % 12));
      uint16_t bits = static_cast<uint16_t>(((r >> 8) & 0x8000) | (exp << 7) | ((r >> 16) & 0x7F));
      bv[i] = bits;
      uint64_t c = SplitMix(s);
      if (c < threshold) {
        int32_t step = (c >> 20) % 10 == 0 ? static_cast<int32_t>(2 + (c >> 40) % 7) : 1;
        if ((c >> 30) & 1) step = -step;
        int32_t ord = OrderedBF16(bits) + step;
        uint16_t moved = FromOrderedBF16(ord);
        xv[i] = moved == bits ? static_cast<uint16_t>(bits ^ 1) : moved;
      } else {
        xv[i] = bits;
      }
    }
    TensorView v;
    v.name = "sweep." + std::to_string(t);
    v.dtype = DType::kBF16;
    v.shape = {per};
    v.data = b.data();
    w.base.push_back(v);
    v.data = x.data();
    w.next.push_back(v);
  }
  return w;
}

Workload SyntheticWorkload(uint64_t params, double lr, uint64_t seed) {
  Workload w;
  char name[64];
  std::snprintf(name, sizeof(name), "synthetic lr %g", lr);
  w.name = name;
  SyntheticModel model(SyntheticModelSpec::ForParams(params, seed));
  model.Step(lr);  // one step first: Adam moments are warm in a real run
  for (const TensorView& t : model.bf16()) {
    w.storage.emplace_back(t.bytes(), t.bytes() + t.nbytes());
  }
  model.Step(lr);
  for (const TensorView& t : model.bf16()) {
    w.storage.emplace_back(t.bytes(), t.bytes() + t.nbytes());
  }
  const size_t n = model.bf16().size();
  for (size_t i = 0; i < n; ++i) {
    TensorView v = model.bf16()[i];
    v.data = w.storage[i].data();
    w.base.push_back(v);
    v.data = w.storage[n + i].data();
    w.next.push_back(v);
  }
  return w;
}

Result<Workload> PairWorkload(const std::string& a, const std::string& b) {
  Workload w;
  auto slash = [](const std::string& p) { return p.substr(p.rfind('/') + 1); };
  w.name = slash(a) + " -> " + slash(b);
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<SafetensorsFile> fa, SafetensorsFile::Open(a));
  REFIT_ASSIGN_OR_RAISE(std::unique_ptr<SafetensorsFile> fb, SafetensorsFile::Open(b));
  // Copies in anonymous memory so the timings measure compute, not page faults on the files.
  for (const TensorView& t : fb->tensors()) {
    const TensorView* old = fa->Find(t.name);
    if (old == nullptr || old->dtype != t.dtype || old->shape != t.shape) {
      return Status::Invalid(w.name + ": tensor '" + t.name +
                             "' is missing or differs in dtype/shape in " + a);
    }
    w.storage.emplace_back(old->bytes(), old->bytes() + old->nbytes());
    w.storage.emplace_back(t.bytes(), t.bytes() + t.nbytes());
    TensorView v = t;
    v.data = w.storage[w.storage.size() - 2].data();
    w.base.push_back(v);
    v.data = w.storage.back().data();
    w.next.push_back(v);
  }
  return w;
}

// Runs fn(thread_index) on `threads` threads (inline for one).
void OnThreads(unsigned threads, const std::function<void(unsigned)>& fn) {
  if (threads <= 1) {
    fn(0);
    return;
  }
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < threads; ++i) pool.emplace_back([&fn, i] { fn(i); });
  for (std::thread& t : pool) t.join();
}

struct Bandwidth {
  double memcpy_gbps = 0;
  double compare_gbps = 0;
};

// Best of three passes, in bytes of model (one copy) per second. With several threads each takes
// an equal share of every tensor.
Bandwidth MeasureBandwidth(const Workload& w, unsigned threads) {
  uint64_t largest = 0;
  for (const TensorView& t : w.next) largest = std::max(largest, t.nbytes());
  std::vector<uint8_t> scratch(largest);
  std::fill(scratch.begin(), scratch.end(), 1);  // fault the pages in before timing
  Bandwidth bw;
  const double bytes = static_cast<double>(w.model_bytes());
  std::vector<uint64_t> counts(threads);
  for (int pass = 0; pass < 3; ++pass) {
    auto start = Clock::now();
    OnThreads(threads, [&](unsigned i) {
      for (const TensorView& t : w.next) {
        uint64_t b = t.nbytes() * i / threads, e = t.nbytes() * (i + 1) / threads;
        std::memcpy(scratch.data() + b, t.bytes() + b, e - b);
      }
    });
    bw.memcpy_gbps = std::max(bw.memcpy_gbps, bytes / SecondsSince(start) / 1e9);
    start = Clock::now();
    OnThreads(threads, [&](unsigned i) {
      uint64_t changed = 0;
      for (size_t k = 0; k < w.next.size(); ++k) {
        const uint32_t elem = SizeOf(w.next[k].dtype);
        const uint64_t n = w.next[k].num_elements();
        uint64_t b = n * i / threads, e = n * (i + 1) / threads;
        changed += kernels::CountDiff(w.base[k].bytes() + b * elem, w.next[k].bytes() + b * elem,
                                      e - b, elem);
      }
      counts[i] = changed;  // kept so the scan is not optimized away
    });
    bw.compare_gbps = std::max(bw.compare_gbps, bytes / SecondsSince(start) / 1e9);
  }
  return bw;
}

// Order-0 information bound, the change structure, and the published reference formats.
struct Analysis {
  uint64_t tensors = 0, elements = 0, changed = 0, changed_tensors = 0;
  double position_bits = 0, value_bits = 0;
  uint64_t bf16_changed = 0, one_ulp = 0, sign_flips = 0;
  std::map<int, std::pair<uint64_t, uint64_t>> by_exponent;       // old exponent -> (all, changed)
  std::map<std::string, std::pair<uint64_t, double>> references;  // name -> (bytes, seconds)
  double bound_bytes() const { return (position_bits + value_bits) / 8; }
};

double Log2Binomial(uint64_t n, uint64_t k) {
  return (std::lgamma(n + 1.0) - std::lgamma(k + 1.0) - std::lgamma(n - k + 1.0)) / std::log(2.0);
}

uint64_t LoadBits(const uint8_t* p, uint32_t elem) {
  uint64_t v = 0;
  std::memcpy(&v, p, elem);  // little-endian host
  return v;
}

// Appends the gaps between positions, each in the width the tensor needs (u16 unless a gap
// overflows it: u32, or u64), as slime and NeMo RL do.
void AppendGaps(const std::vector<uint64_t>& pos, std::vector<uint8_t>& out) {
  uint64_t max_gap = 0, prev = 0;
  for (uint64_t p : pos) {
    max_gap = std::max(max_gap, p - prev);
    prev = p;
  }
  const uint32_t width = max_gap <= 0xFFFF ? 2 : max_gap <= 0xFFFFFFFFull ? 4 : 8;
  size_t at = out.size();
  out.resize(at + pos.size() * width);
  prev = 0;
  for (uint64_t p : pos) {
    uint64_t gap = p - prev;
    prev = p;
    std::memcpy(out.data() + at, &gap, width);
    at += width;
  }
}

Result<uint64_t> ZstdSize(ZSTD_CCtx* cctx, const std::vector<uint8_t>& blob,
                          std::vector<uint8_t>& out) {
  out.resize(ZSTD_compressBound(blob.size()));
  size_t n = ZSTD_compressCCtx(cctx, out.data(), out.size(), blob.data(), blob.size(), 1);
  if (ZSTD_isError(n)) return Status::Internal(std::string("zstd: ") + ZSTD_getErrorName(n));
  return static_cast<uint64_t>(n);
}

using ZstdCtx = std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)>;

// The published formats a payload is compared with, sized tensor by tensor: slime's deltas_zstd
// and xor (one zstd-1 frame per tensor) and NeMo RL's xor (the whole sync as one frame).
class ReferenceFormats {
 public:
  Status Init() {
    if (!cctx_ || !nemo_) return Status::Internal("zstd: cannot create a context");
    ZSTD_CCtx_setParameter(nemo_.get(), ZSTD_c_compressionLevel, 1);
    return Status::OK();
  }

  // `pos`: the changed positions of base -> next (not empty).
  Status AddTensor(const TensorView& bt, const TensorView& nt, const std::vector<uint64_t>& pos) {
    const uint32_t elem = SizeOf(nt.dtype);
    const uint64_t k = pos.size();
    // slime-style deltas_zstd: u16 gaps (u32 when one overflows) + raw new values, zstd-1.
    auto start = Clock::now();
    blob_.clear();
    AppendGaps(pos, blob_);
    size_t at = blob_.size();
    blob_.resize(at + k * elem);
    for (uint64_t p : pos) {
      std::memcpy(blob_.data() + at, nt.bytes() + p * elem, elem);
      at += elem;
    }
    REFIT_ASSIGN_OR_RAISE(uint64_t z1, ZstdSize(cctx_.get(), blob_, zout_));
    slime_dz_ += z1;
    slime_dz_s_ += SecondsSince(start);

    // slime-style xor: zstd-1 of the tensor's full XOR.
    start = Clock::now();
    const uint64_t nbytes = nt.nbytes();
    blob_.resize(nbytes);
    const uint8_t* ob = bt.bytes();
    const uint8_t* nb = nt.bytes();
    for (uint64_t i = 0; i < nbytes; ++i) blob_[i] = ob[i] ^ nb[i];
    REFIT_ASSIGN_OR_RAISE(uint64_t z2, ZstdSize(cctx_.get(), blob_, zout_));
    slime_xor_ += z2;
    slime_xor_s_ += SecondsSince(start);

    // NeMo-style xor: u16 gaps (u32/u64 when needed) + XOR at changed positions, the whole sync
    // streamed into one zstd-1 frame.
    start = Clock::now();
    blob_.clear();
    AppendGaps(pos, blob_);
    at = blob_.size();
    blob_.resize(at + k * elem);
    for (uint64_t p : pos) {
      uint64_t x = LoadBits(bt.bytes() + p * elem, elem) ^ LoadBits(nt.bytes() + p * elem, elem);
      std::memcpy(blob_.data() + at, &x, elem);
      at += elem;
    }
    REFIT_RETURN_NOT_OK(NemoFeed(blob_, ZSTD_e_continue));
    nemo_s_ += SecondsSince(start);
    return Status::OK();
  }

  // Ends NeMo's frame; name -> (bytes, seconds) of each format.
  Status Finish(std::map<std::string, std::pair<uint64_t, double>>* references) {
    blob_.clear();
    auto start = Clock::now();
    REFIT_RETURN_NOT_OK(NemoFeed(blob_, ZSTD_e_end));
    nemo_s_ += SecondsSince(start);
    (*references)["slime deltas_zstd"] = {slime_dz_, slime_dz_s_};
    (*references)["slime xor"] = {slime_xor_, slime_xor_s_};
    (*references)["nemo xor"] = {nemo_bytes_, nemo_s_};
    return Status::OK();
  }

 private:
  Status NemoFeed(const std::vector<uint8_t>& in, ZSTD_EndDirective mode) {
    ZSTD_inBuffer ib{in.data(), in.size(), 0};
    while (true) {
      ZSTD_outBuffer ob{nemo_out_.data(), nemo_out_.size(), 0};
      size_t left = ZSTD_compressStream2(nemo_.get(), &ob, &ib, mode);
      if (ZSTD_isError(left))
        return Status::Internal(std::string("zstd: ") + ZSTD_getErrorName(left));
      nemo_bytes_ += ob.pos;
      if (mode == ZSTD_e_end ? left == 0 : ib.pos == ib.size) return Status::OK();
    }
  }

  ZstdCtx cctx_{ZSTD_createCCtx(), ZSTD_freeCCtx};
  ZstdCtx nemo_{ZSTD_createCCtx(), ZSTD_freeCCtx};
  std::vector<uint8_t> blob_, zout_;
  std::vector<uint8_t> nemo_out_ = std::vector<uint8_t>(1 << 20);
  double slime_dz_s_ = 0, slime_xor_s_ = 0, nemo_s_ = 0;
  uint64_t slime_dz_ = 0, slime_xor_ = 0, nemo_bytes_ = 0;
};

// The bf16 change structure: change rate by the old value's exponent, one-ULP and sign-flip
// counts.
void CountBF16Structure(const TensorView& bt, const TensorView& nt,
                        const std::vector<uint64_t>& pos, Analysis& a) {
  const auto* ov = reinterpret_cast<const uint16_t*>(bt.bytes());
  const auto* nv = reinterpret_cast<const uint16_t*>(nt.bytes());
  std::vector<uint64_t> all(256);
  for (uint64_t i = 0; i < nt.num_elements(); ++i) ++all[(ov[i] >> 7) & 0xFF];
  for (int e = 0; e < 256; ++e) {
    if (all[e] != 0) a.by_exponent[e - 127].first += all[e];
  }
  for (uint64_t p : pos) {
    ++a.by_exponent[static_cast<int>((ov[p] >> 7) & 0xFF) - 127].second;
    int32_t d = OrderedBF16(nv[p]) - OrderedBF16(ov[p]);
    if (d == 1 || d == -1) ++a.one_ulp;
    if ((ov[p] ^ nv[p]) & 0x8000) ++a.sign_flips;
  }
  a.bf16_changed += pos.size();
}

// Histograms of the changed elements' XOR patterns, for the order-0 value entropy.
struct XorHistograms {
  std::vector<uint64_t> narrow = std::vector<uint64_t>(65536);      // elements <= 2 bytes
  std::map<uint32_t, std::unordered_map<uint64_t, uint64_t>> wide;  // by element size

  void Add(const TensorView& bt, const TensorView& nt, const std::vector<uint64_t>& pos) {
    const uint32_t elem = SizeOf(nt.dtype);
    for (uint64_t p : pos) {
      uint64_t x = LoadBits(bt.bytes() + p * elem, elem) ^ LoadBits(nt.bytes() + p * elem, elem);
      if (elem <= 2)
        ++narrow[x];
      else
        ++wide[elem][x];
    }
  }

  // k * H0 summed over the histograms, in bits.
  double EntropyBits() const {
    auto entropy_bits = [](auto begin, auto end, auto count_of) {
      double total = 0, bits = 0;
      for (auto it = begin; it != end; ++it) total += static_cast<double>(count_of(*it));
      for (auto it = begin; it != end; ++it) {
        double c = static_cast<double>(count_of(*it));
        if (c > 0) bits -= c * std::log2(c / total);
      }
      return bits;
    };
    double bits = entropy_bits(narrow.begin(), narrow.end(), [](uint64_t c) { return c; });
    for (const auto& [elem, h] : wide) {
      (void)elem;
      bits += entropy_bits(h.begin(), h.end(), [](const auto& kv) { return kv.second; });
    }
    return bits;
  }
};

Result<Analysis> Analyze(const Workload& w) {
  Analysis a;
  XorHistograms hist;
  ReferenceFormats refs;
  REFIT_RETURN_NOT_OK(refs.Init());
  std::vector<uint64_t> pos;
  for (size_t ti = 0; ti < w.next.size(); ++ti) {
    const TensorView& nt = w.next[ti];
    const TensorView& bt = w.base[ti];
    const uint64_t n = nt.num_elements();
    ++a.tensors;
    a.elements += n;
    pos.clear();
    const uint64_t k = kernels::DiffPositions(bt.bytes(), nt.bytes(), n, SizeOf(nt.dtype), &pos);
    if (nt.dtype == DType::kBF16) CountBF16Structure(bt, nt, pos, a);
    if (k == 0) continue;
    ++a.changed_tensors;
    a.changed += k;
    a.position_bits += Log2Binomial(n, k);
    hist.Add(bt, nt, pos);
    REFIT_RETURN_NOT_OK(refs.AddTensor(bt, nt, pos));
  }
  REFIT_RETURN_NOT_OK(refs.Finish(&a.references));
  a.value_bits += hist.EntropyBits();
  return a;
}

struct EncodingResult {
  std::string encoding;
  unsigned threads = 1;
  uint64_t payload_bytes = 0;
  double encode_s = 0;
  double apply_s = 0;                      // on as many apply threads as encode threads
  std::map<std::string, uint64_t> chosen;  // records by encoding (what auto picked)
};

Result<EncodingResult> MeasureEncoding(const Workload& w, const std::string& encoding,
                                       unsigned threads, int reps, const Registry& registry,
                                       const Config* config,
                                       std::vector<std::vector<uint8_t>>& work) {
  EncodingResult r;
  r.encoding = encoding;
  r.threads = threads;
  DeltaOptions opt;
  opt.encoding = encoding;
  opt.threads = threads;
  // Records cut as the configured sender cuts them.
  if (config != nullptr) {
    REFIT_ASSIGN_OR_RAISE(opt.chunk_bytes, internal::SenderChunkBytes(*config));
  }
  std::vector<uint8_t> payload;
  for (int rep = 0; rep < reps; ++rep) {
    DeltaEncodeStats stats;
    payload.clear();
    payload.shrink_to_fit();
    REFIT_ASSIGN_OR_RAISE(payload, EncodeDelta(w.base, w.next, opt, registry, config, &stats));
    r.encode_s = rep == 0 ? stats.seconds : std::min(r.encode_s, stats.seconds);
  }
  r.payload_bytes = payload.size();
  REFIT_ASSIGN_OR_RAISE(Payload parsed, Payload::Parse(payload.data(), payload.size(), "bench"));
  for (const RecordHeader& h : parsed.records()) ++r.chosen[h.encoding];
  // Apply onto a fresh copy of the base (copy not timed), then check every bit.
  work.resize(w.base.size());
  std::vector<TensorView> views = w.base;
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t i = 0; i < views.size(); ++i) {
      work[i].assign(w.base[i].bytes(), w.base[i].bytes() + w.base[i].nbytes());
      views[i].data = work[i].data();
    }
    auto start = Clock::now();
    REFIT_ASSIGN_OR_RAISE(ApplyStats applied,
                          internal::ApplyDeltaOnThreads(payload, views, registry, config, threads));
    r.apply_s = rep == 0 ? SecondsSince(start) : std::min(r.apply_s, SecondsSince(start));
    (void)applied;
  }
  for (size_t i = 0; i < views.size(); ++i) {
    if (std::memcmp(work[i].data(), w.next[i].bytes(), w.next[i].nbytes()) != 0) {
      return Status::Internal(w.name + ": encoding '" + encoding + "' did not reproduce tensor '" +
                              w.next[i].name + "' bit for bit");
    }
  }
  return r;
}

std::string Fixed(double v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

using WorkloadMaker = std::function<Result<Workload>()>;

// One maker per workload the options ask for; workloads are built one at a time so only one pair
// of buffers is alive.
Result<std::vector<WorkloadMaker>> WorkloadMakers(const BenchCodecOptions& options) {
  std::vector<WorkloadMaker> makers;
  for (double d : options.densities) {
    if (!(d > 0 && d <= 1))
      return Status::Invalid("--density " + Fixed(d, 6) + " is not in (0, 1]");
    makers.push_back(
        [&, d]() -> Result<Workload> { return DensityWorkload(options.bytes, d, options.seed); });
  }
  for (double lr : options.lrs) {
    makers.push_back([&, lr]() -> Result<Workload> {
      return SyntheticWorkload(options.synthetic_params, lr, options.seed);
    });
  }
  for (const auto& [a, b] : options.pairs) {
    makers.push_back([a = a, b = b]() { return PairWorkload(a, b); });
  }
  if (makers.empty()) return Status::Invalid("nothing to measure (give --density, --lr or --pair)");
  return makers;
}

// The workload's size, density, order-0 bound and bf16 structure, printed and as JSON.
json DescribeWorkload(const Workload& w, const Analysis& a) {
  json jw;
  jw["name"] = w.name;
  jw["tensors"] = a.tensors;
  jw["elements"] = a.elements;
  jw["model_bytes"] = w.model_bytes();
  jw["changed"] = a.changed;
  jw["density"] = a.elements ? static_cast<double>(a.changed) / a.elements : 0.0;
  jw["bound_bytes"] = a.bound_bytes();
  jw["bound_position_bits_per_change"] = a.changed ? a.position_bits / a.changed : 0.0;
  jw["bound_value_bits_per_change"] = a.changed ? a.value_bits / a.changed : 0.0;
  if (a.bf16_changed > 0) {
    json s;
    s["one_ulp_share"] = static_cast<double>(a.one_ulp) / a.bf16_changed;
    s["sign_flip_share"] = static_cast<double>(a.sign_flips) / a.bf16_changed;
    json rates = json::object();
    for (const auto& [e, counts] : a.by_exponent) {
      if (counts.first >= 1000 && e >= -16 && e <= 2) {
        rates[std::to_string(e)] = static_cast<double>(counts.second) / counts.first;
      }
    }
    s["change_rate_by_old_exponent"] = rates;
    jw["bf16_structure"] = s;
  }
  std::printf("\n== %s: %" PRIu64
              " tensors, %s, density %.3f%%, order-0 bound %s (%.4f of dense; "
              "%.2f + %.2f bits per change)\n",
              w.name.c_str(), a.tensors, HumanBytes(w.model_bytes()).c_str(),
              100.0 * jw["density"].get<double>(),
              HumanBytes(static_cast<uint64_t>(a.bound_bytes())).c_str(),
              a.bound_bytes() / static_cast<double>(w.model_bytes()),
              jw["bound_position_bits_per_change"].get<double>(),
              jw["bound_value_bits_per_change"].get<double>());
  if (jw.contains("bf16_structure")) {
    const json& s = jw["bf16_structure"];
    std::printf("   bf16: one-ULP share %.1f%%, sign flips %.2e; change rate by old exponent:",
                100 * s["one_ulp_share"].get<double>(), s["sign_flip_share"].get<double>());
    for (const auto& [e, r] : s["change_rate_by_old_exponent"].items()) {
      std::printf(" 2^%s:%.3g%%", e.c_str(), 100 * r.get<double>());
    }
    std::printf("\n");
  }
  return jw;
}

// memcpy and compare-scan bandwidth at each thread count, printed and as JSON.
json MeasureBandwidths(const Workload& w, const std::vector<unsigned>& threads,
                       std::map<unsigned, Bandwidth>* bands) {
  json bw = json::object();
  for (unsigned t : threads) {
    Bandwidth& b = (*bands)[t] = MeasureBandwidth(w, t);
    bw[std::to_string(t)] = {{"memcpy_gbps", b.memcpy_gbps}, {"compare_scan_gbps", b.compare_gbps}};
    std::printf("   %u thread%s: memcpy %.2f GB/s, compare-scan %.2f GB/s (of model scanned)\n", t,
                t == 1 ? "" : "s", b.memcpy_gbps, b.compare_gbps);
  }
  return bw;
}

// The table header and one row per reference format; the rows as JSON.
json ReportReferences(const Workload& w, const Analysis& a) {
  const double model = static_cast<double>(w.model_bytes());
  const double nemo = static_cast<double>(a.references.at("nemo xor").first);
  std::printf("   %-22s %7s %10s %12s %9s %9s %12s %10s %8s  %s\n", "format", "threads", "payload",
              "x dense", "x bound", "x nemo", "encode GB/s", "apply GB/s", "enc/cmp", "records");
  json refs = json::array();
  for (const auto& [name, r] : a.references) {
    refs.push_back({{"name", name},
                    {"bytes", r.first},
                    {"encode_gbps", r.second > 0 ? model / r.second / 1e9 : 0.0}});
    std::printf("   %-22s %7s %10s %12.5f %9.3f %9.3f %12.2f %10s %8s\n", ("ref " + name).c_str(),
                "1", HumanBytes(r.first).c_str(), r.first / model, r.first / a.bound_bytes(),
                r.first / nemo, r.second > 0 ? model / r.second / 1e9 : 0.0, "-", "-");
  }
  return refs;
}

// One measured encoding at one thread count: its table row and its JSON.
json ReportEncoding(const Workload& w, const Analysis& a, const EncodingResult& r,
                    const Bandwidth& band) {
  const double model = static_cast<double>(w.model_bytes());
  const double nemo = static_cast<double>(a.references.at("nemo xor").first);
  const double enc_gbps = model / r.encode_s / 1e9;
  const double apply_gbps = r.apply_s > 0 ? model / r.apply_s / 1e9 : 0.0;
  std::string chosen;
  for (const auto& [name, count] : r.chosen) {
    chosen += (chosen.empty() ? "" : " ") + name + ":" + std::to_string(count);
  }
  std::printf("   %-22s %7u %10s %12.5f %9.3f %9.3f %12.2f %10s %8.2f  %s\n", r.encoding.c_str(),
              r.threads, HumanBytes(r.payload_bytes).c_str(), r.payload_bytes / model,
              r.payload_bytes / a.bound_bytes(), r.payload_bytes / nemo, enc_gbps,
              r.apply_s > 0 ? Fixed(apply_gbps, 2).c_str() : "-", enc_gbps / band.compare_gbps,
              chosen.c_str());
  json je = {{"encoding", r.encoding},
             {"threads", r.threads},
             {"payload_bytes", r.payload_bytes},
             {"payload_over_dense", r.payload_bytes / model},
             {"payload_over_bound", r.payload_bytes / a.bound_bytes()},
             {"payload_over_nemo_xor", r.payload_bytes / nemo},
             {"encode_gbps", enc_gbps},
             {"encode_over_compare_scan", enc_gbps / band.compare_gbps},
             {"records_by_encoding", r.chosen}};
  if (r.apply_s > 0) {
    je["apply_gbps"] = apply_gbps;
    je["apply_over_compare_scan"] = apply_gbps / band.compare_gbps;
  }
  return je;
}

// The registry (with the config's plugins) and the encodings to measure.
struct BenchSetup {
  std::unique_ptr<Config> config;
  std::shared_ptr<Registry> registry;
  std::vector<std::string> encodings;
  std::vector<unsigned> threads;
};

Result<BenchSetup> LoadBenchSetup(const BenchCodecOptions& options) {
  BenchSetup setup;
  if (!options.config_path.empty()) {
    REFIT_ASSIGN_OR_RAISE(Config c, LoadConfigFile(options.config_path));
    setup.config = std::make_unique<Config>(std::move(c));
  }
  REFIT_ASSIGN_OR_RAISE(setup.registry, LoadRegistry(setup.config.get()));
  if (setup.config) REFIT_RETURN_NOT_OK(ValidateConfig(*setup.config, *setup.registry));
  setup.encodings = options.encodings;
  if (setup.encodings.empty()) {
    for (const ComponentInfo* c : setup.registry->List()) {
      if (c->kind == REFIT_KIND_ENCODING) setup.encodings.push_back(c->name);
    }
    setup.encodings.push_back("auto");
  }
  setup.threads = options.threads;
  if (setup.threads.empty()) setup.threads = {1, 2};
  return setup;
}

// Everything measured on one workload, as its JSON entry.
Result<json> MeasureWorkload(const Workload& w, const BenchSetup& setup, int reps) {
  REFIT_ASSIGN_OR_RAISE(Analysis a, Analyze(w));
  json jw = DescribeWorkload(w, a);
  std::map<unsigned, Bandwidth> bands;
  jw["bandwidth"] = MeasureBandwidths(w, setup.threads, &bands);
  jw["references"] = ReportReferences(w, a);
  json encs = json::array();
  std::vector<std::vector<uint8_t>> work;
  // Progress in bytes of the model measured (each encoding at each thread count covers it once).
  internal::ProgressMeter progress("bench " + w.name,
                                   w.model_bytes() * setup.encodings.size() * setup.threads.size());
  progress.Add(0);
  for (const std::string& e : setup.encodings) {
    for (unsigned t : setup.threads) {
      REFIT_ASSIGN_OR_RAISE(EncodingResult r, MeasureEncoding(w, e, t, reps, *setup.registry,
                                                              setup.config.get(), work));
      progress.Erase();  // the table row goes to the same terminal
      encs.push_back(ReportEncoding(w, a, r, bands[t]));
      std::fflush(stdout);
      progress.Add(w.model_bytes());
    }
  }
  progress.Finish();
  jw["encodings"] = encs;
  return jw;
}

// [encoding.auto] mode link's cost model of this machine, for its `calibration` key: the auto
// candidates measured on bf16 and f32 (send/calibrate.h), the JSON ParseCostModel reads.
Result<json> LinkModelReport(const BenchSetup& setup) {
  internal::EncodingCache cache(*setup.registry, setup.config.get());
  REFIT_ASSIGN_OR_RAISE(const internal::AutoPolicy* policy, cache.Auto());
  internal::CostModelFile model;
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    REFIT_ASSIGN_OR_RAISE(std::vector<internal::EncodingCost> costs,
                          internal::Calibrate(policy->candidates, dtype));
    for (size_t i = 0; i < costs.size(); ++i) {
      model[std::string(NameOf(dtype))][policy->candidates[i]->name()] = costs[i];
    }
  }
  return json::parse(internal::SerializeCostModel(model));
}

Status WriteReport(const json& report, const std::string& path) {
  std::string text = report.dump(2) + "\n";
  if (path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return Status::OK();
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) return Status::IoError("cannot write " + path);
  return Status::OK();
}

}  // namespace

Status RunBenchCodec(const BenchCodecOptions& options) {
  // Steady state of a long-running sender: freed buffers stay in the heap and are reused, so the
  // timings measure the codecs rather than page faults on fresh allocations (costly in VMs).
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, INT32_MAX);
  if (options.reps < 1) return Status::Invalid("--reps must be >= 1");
  REFIT_ASSIGN_OR_RAISE(BenchSetup setup, LoadBenchSetup(options));
  REFIT_ASSIGN_OR_RAISE(std::vector<WorkloadMaker> makers, WorkloadMakers(options));
  json report;
  report["machine"] = {{"hardware_threads", std::thread::hardware_concurrency()}};
  report["reps"] = options.reps;
  report["workloads"] = json::array();
  for (auto& make : makers) {
    REFIT_ASSIGN_OR_RAISE(Workload w, make());
    REFIT_ASSIGN_OR_RAISE(json jw, MeasureWorkload(w, setup, options.reps));
    report["workloads"].push_back(std::move(jw));
  }
  if (options.json_path.empty()) return Status::OK();
  REFIT_ASSIGN_OR_RAISE(report["link_model"], LinkModelReport(setup));
  return WriteReport(report, options.json_path);
  return Status::OK();
}

void RegisterBench(CLI::App& app, Commands& commands) {
  // The flags; the ones that are not BenchCodecOptions fields are turned into them once parsed.
  struct Flags {
    BenchCodecOptions bench;
    std::string bytes = "1GiB";
    std::vector<std::string> pairs;
    bool sweep = false, synthetic = false;
    std::string params = "100M";
  };
  auto f = std::make_shared<Flags>();
  BenchCodecOptions& bench = f->bench;
  auto* bench_cmd = app.add_subcommand("bench", "Measure encodings and the machine");
  bench_cmd->require_subcommand(1);
  RegisterBenchApply(*bench_cmd, commands);
  RegisterBenchTrajectory(*bench_cmd, commands);
  RegisterBenchE2e(*bench_cmd, commands);
  auto* cmd = bench_cmd->add_subcommand(
      "codec", "Payload vs the order-0 bound and published formats; encode/apply throughput");
  cmd->add_option("--density", bench.densities,
                  "sweep buffers at these densities (repeatable; --sweep: 0.001 0.01 0.03 0.1)");
  cmd->add_flag("--sweep", f->sweep, "sweep densities 0.1%, 1%, 3%, 10%");
  cmd->add_option("--bytes", f->bytes, "size of each sweep buffer (bf16)")->capture_default_str();
  cmd->add_option("--lr", bench.lrs, "synthetic model steps at these learning rates");
  cmd->add_flag("--synthetic", f->synthetic, "synthetic model at lr 1e-6 and 1e-5");
  cmd->add_option("--params", f->params, "synthetic model size")->capture_default_str();
  cmd->add_option("--pair", f->pairs, "A.safetensors B.safetensors (repeatable)")
      ->expected(2)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--encoding", bench.encodings,
                  "encodings to measure (repeatable; default: every registered one + auto)");
  cmd->add_option("--threads", bench.threads, "thread counts (repeatable; default 1 2)");
  cmd->add_option("--json", bench.json_path, "write the results as JSON (- for stdout)");
  cmd->add_option("--config", bench.config_path,
                  "TOML config (plugins, encoding settings, sender.chunk_bytes)");
  cmd->add_option("--seed", bench.seed, "random seed")->capture_default_str();
  cmd->add_option("--reps", bench.reps, "timings: best of this many runs")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  commands.push_back({cmd, [f]() -> Status {
                        BenchCodecOptions& o = f->bench;
                        REFIT_ASSIGN_OR_RAISE(o.bytes, ParseSize(f->bytes));
                        REFIT_ASSIGN_OR_RAISE(o.synthetic_params, ParseCount(f->params));
                        if (f->sweep) {
                          for (double d : {0.001, 0.01, 0.03, 0.1}) o.densities.push_back(d);
                        }
                        if (f->synthetic) {
                          for (double lr : {1e-6, 1e-5}) o.lrs.push_back(lr);
                        }
                        for (size_t i = 0; i + 1 < f->pairs.size(); i += 2) {
                          o.pairs.emplace_back(f->pairs[i], f->pairs[i + 1]);
                        }
                        return RunBenchCodec(o);
                      }});
}

}  // namespace refit::cli
