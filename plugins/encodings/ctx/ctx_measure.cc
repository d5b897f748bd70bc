// Measures `ctx` against the order-0 bound (ctx_bound.h) and its single-thread speed. Not part of
// the default build (target refit_ctx_measure, EXCLUDE_FROM_ALL):
//
//   refit_ctx_measure synthetic [params] [lr]       the project's synthetic trajectory, one step
//   refit_ctx_measure pair OLD.safetensors NEW.safetensors
//   refit_ctx_measure speed [params] [lr] [GiB]    throughput on >= GiB of bf16 (tiled synthetic;
//                                                  params 0: the bench's uniform buffer, lr =
//                                                  density)
//   refit_ctx_measure seeds DIR                     writes fuzz seeds (tests/fuzz/corpus/ctx)
//   refit_ctx_measure offline BASE NEW PLUGIN_DIR OUT_DIR   refit diff/apply with ctx, end to end
//
// Prints per-file totals: density, payload bytes, bound bytes, payload / bound, and the
// components (position and value bits per change) of both. Environment: CTX_FORM (a coded
// form), CTX_REPEAT=R (the fastest of R decodes per record), CTX_LISTED=1 (time the receiver's
// DecodeChanges instead of Decode), CTX_RECORDS=1 (a line per record).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "ctx_bound.h"
#include "ctx_codec.h"
#include "format/safetensors.h"
#include "refit/dtype.h"
#include "refit/kernels/diff.h"
#include "refit/kernels/dispatch.h"
#include "refit/refit.h"
#include "refit/registry.h"
#include "synthetic/synthetic.h"

namespace {

// CPU time of this thread: on a shared build machine wall time mostly measures the neighbours.
struct Clock {
  static double now() {
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  }
};

double Seconds(double since) { return Clock::now() - since; }

struct Totals {
  uint64_t elements = 0;
  uint64_t bytes = 0;
  uint64_t changed = 0;
  uint64_t payload = 0;
  double bound_bits = 0;
  double position_bits = 0;
  double scan_s = 0;    // compare-scan (CountDiff) of the records, thread CPU time
  double decode_s = 0;  // ctx decode of the records
};

// CTX_FORM=adaptive|tables|per_class|explicit forces one coded form (default: the codec's).
refit::ctx::CodedForm FormFromEnv() {
  const char* env = std::getenv("CTX_FORM");
  const std::string name = env != nullptr ? env : "";
  return name == "adaptive"    ? refit::ctx::CodedForm::kAdaptive
         : name == "tables"    ? refit::ctx::CodedForm::kTables
         : name == "per_class" ? refit::ctx::CodedForm::kTablesPerClass
         : name == "explicit"  ? refit::ctx::CodedForm::kTablesExplicit
                               : refit::ctx::CodedForm::kAuto;
}

// Encodes one tensor pair as one record, checks the round trip, adds to totals.
bool MeasureTensor(const std::string& name, refit::DType dtype, const void* old_bits,
                   const void* new_bits, uint64_t n, Totals* t) {
  const uint32_t es = refit::SizeOf(dtype);
  std::vector<uint64_t> positions;
  const uint64_t k = refit::kernels::DiffPositions(old_bits, new_bits, n, es, &positions);
  refit_encode_input_t in{};
  in.struct_size = sizeof(in);
  in.dtype = static_cast<int32_t>(dtype);
  in.elem_size = es;
  in.n_elems = n;
  in.old_bits = old_bits;
  in.new_bits = new_bits;
  in.positions = positions.data();
  in.n_changed = k;
  std::vector<uint8_t> out(refit::ctx::MaxEncodedSize(in));
  refit::Result<uint64_t> size = refit::ctx::EncodeAt(refit::kernels::ActiveSimdLevel(), in,
                                                      out.data(), out.size(), FormFromEnv());
  if (!size.ok()) {
    std::fprintf(stderr, "%s: encode: %s\n", name.c_str(), size.status().ToString().c_str());
    return false;
  }
  std::vector<uint8_t> bits(static_cast<const uint8_t*>(old_bits),
                            static_cast<const uint8_t*>(old_bits) + n * es);
  refit_decode_target_t target{};
  target.struct_size = sizeof(target);
  target.dtype = in.dtype;
  target.elem_size = es;
  target.n_elems = n;
  target.bits = bits.data();
  double t0 = Clock::now();
  (void)refit::kernels::CountDiff(old_bits, new_bits, n, es);
  t->scan_s += Seconds(t0);
  // CTX_REPEAT=R decodes each record R times (the old bits restored in between) and keeps the
  // fastest: the first decode also pays for its scratch's page faults.
  const char* repeat_env = std::getenv("CTX_REPEAT");
  const int repeats = repeat_env != nullptr ? std::max(1, std::atoi(repeat_env)) : 1;
  // CTX_LISTED=1 times DecodeChanges (the receiver's listing of a record's changes against the
  // old bits) instead of Decode; the listed changes are then applied, untimed, for the check.
  const bool listed = std::getenv("CTX_LISTED") != nullptr;
  std::vector<uint64_t> listed_positions(listed ? k : 0);
  std::vector<uint8_t> listed_values(listed ? k * es : 0);
  uint64_t listed_count = 0;
  double decode_s = 0;
  refit::Status st;
  for (int r = 0; r < repeats; ++r) {
    if (r > 0) std::memcpy(bits.data(), old_bits, n * es);
    t0 = Clock::now();
    if (listed) {
      refit::Result<uint64_t> count = refit::ctx::DecodeChanges(
          out.data(), *size, target, listed_positions.data(), listed_values.data(), k);
      st = count.status();
      listed_count = count.ok() ? *count : 0;
    } else {
      st = refit::ctx::Decode(out.data(), *size, target);
    }
    const double s = Seconds(t0);
    decode_s = r == 0 ? s : std::min(decode_s, s);
  }
  if (listed && st.ok()) {
    for (uint64_t c = 0; c < listed_count; ++c) {
      std::memcpy(bits.data() + listed_positions[c] * es, listed_values.data() + c * es, es);
    }
  }
  t->decode_s += decode_s;
  if (!st.ok() || std::memcmp(bits.data(), new_bits, n * es) != 0) {
    std::fprintf(stderr, "%s: round trip failed: %s\n", name.c_str(), st.ToString().c_str());
    return false;
  }
  const refit::ctx::Order0Bound b =
      refit::ctx::ComputeOrder0Bound(old_bits, new_bits, es, n, positions.data(), k);
  if (std::getenv("CTX_RECORDS") != nullptr) {  // per record: elements, changes, bytes, decode s
    std::printf("record %s %llu %llu %llu %.6f\n", name.c_str(), static_cast<unsigned long long>(n),
                static_cast<unsigned long long>(k), static_cast<unsigned long long>(*size),
                decode_s);
  }
  t->elements += n;
  t->bytes += n * es;
  t->changed += k;
  t->payload += *size;
  t->bound_bits += b.total_bits();
  t->position_bits += b.position_bits;
  return true;
}

void Print(const char* label, const Totals& t) {
  const double bound_bytes = t.bound_bits / 8;
  std::printf(
      "%-28s density %.4f%%  changes %llu  ctx %llu B (%.2f bits/change)  bound %.0f B "
      "(%.2f pos + %.2f val bits/change)  ctx/bound %.3f\n",
      label, 100.0 * static_cast<double>(t.changed) / static_cast<double>(t.elements),
      static_cast<unsigned long long>(t.changed), static_cast<unsigned long long>(t.payload),
      8.0 * static_cast<double>(t.payload) / static_cast<double>(t.changed), bound_bytes,
      t.position_bits / static_cast<double>(t.changed),
      (t.bound_bits - t.position_bits) / static_cast<double>(t.changed),
      static_cast<double>(t.payload) / bound_bytes);
  // Per-record speed (thread CPU time: robust to a loaded machine; noisy below ~10 ms).
  const double gb = static_cast<double>(t.bytes) / 1e9;
  std::printf("%-28s compare-scan %.2f GB/s, decode %.2f GB/s (%.3fx compare-scan)\n", "",
              gb / t.scan_s, gb / t.decode_s, t.scan_s / t.decode_s);
}

int Synthetic(uint64_t params, double lr) {
  refit::SyntheticModel model(refit::SyntheticModelSpec::ForParams(params));
  model.Step(lr);  // the first step leaves the initial rounding behind
  std::vector<std::vector<uint8_t>> before;
  for (const refit::TensorView& v : model.bf16()) {
    before.emplace_back(v.bytes(), v.bytes() + v.nbytes());
  }
  model.Step(lr);
  Totals t;
  for (size_t i = 0; i < model.bf16().size(); ++i) {
    const refit::TensorView& v = model.bf16()[i];
    if (!MeasureTensor(v.name, v.dtype, before[i].data(), v.data, v.num_elements(), &t)) return 1;
  }
  char label[64];
  std::snprintf(label, sizeof(label), "synthetic %lluM lr %.0e",
                static_cast<unsigned long long>(model.num_parameters() / 1000000), lr);
  Print(label, t);
  return 0;
}

int Pair(const char* old_path, const char* new_path) {
  auto a = refit::SafetensorsFile::Open(old_path);
  auto b = refit::SafetensorsFile::Open(new_path);
  if (!a.ok() || !b.ok()) {
    std::fprintf(stderr, "cannot open %s / %s\n", old_path, new_path);
    return 1;
  }
  Totals t;
  for (const refit::TensorView& v : (*b)->tensors()) {
    const refit::TensorView* o = (*a)->Find(v.name);
    if (o == nullptr || o->dtype != v.dtype || o->shape != v.shape) continue;
    if (!MeasureTensor(v.name, v.dtype, o->data, v.data, v.num_elements(), &t)) return 1;
  }
  std::string label = std::string(old_path).substr(std::string(old_path).rfind('/') + 1) + " -> " +
                      std::string(new_path).substr(std::string(new_path).rfind('/') + 1);
  Print(label.c_str(), t);
  return 0;
}

// Tiles one synthetic step to `gib` GiB of bf16 and times, per 16 MiB record like the sender:
// compare-scan (CountDiff), diff + digest + ctx encode, and decode + digest.
// `refit bench codec --density D`'s buffer (the same generator, 16 Mi elements): magnitudes
// log-uniform over 2^-14..2^-3 (12 classes), D of the elements move, 90% by one step.
void UniformDelta(double density, std::vector<uint8_t>* old_one, std::vector<uint8_t>* new_one) {
  const uint64_t n = uint64_t{1} << 24;
  old_one->resize(2 * n);
  new_one->resize(2 * n);
  const uint64_t threshold = static_cast<uint64_t>(density * 18446744073709551615.0);
  uint64_t s = 1000010;
  auto next = [&s] {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t r = next();
    const auto exp = static_cast<uint16_t>(127 - 14 + (r % 12));
    const auto bits = static_cast<uint16_t>(((r >> 8) & 0x8000) | (exp << 7) | ((r >> 16) & 0x7F));
    uint16_t moved = bits;
    const uint64_t c = next();
    if (c < threshold) {
      int32_t step = (c >> 20) % 10 == 0 ? static_cast<int32_t>(2 + (c >> 40) % 7) : 1;
      if ((c >> 30) & 1) step = -step;
      const int32_t ord = ((bits & 0x8000) ? -static_cast<int32_t>(bits & 0x7FFF) : bits) + step;
      moved = ord < 0 ? static_cast<uint16_t>(0x8000 | (-ord)) : static_cast<uint16_t>(ord);
      if (moved == bits) moved = bits ^ 1;
    }
    std::memcpy(old_one->data() + 2 * i, &bits, 2);
    std::memcpy(new_one->data() + 2 * i, &moved, 2);
  }
}

// params 0: the uniform buffer of `refit bench codec` at density `lr`.
int Speed(uint64_t params, double lr, double gib) {
  std::vector<uint8_t> old_one;
  std::vector<uint8_t> new_one;
  if (params == 0) {
    UniformDelta(lr, &old_one, &new_one);
  } else {
    refit::SyntheticModel model(refit::SyntheticModelSpec::ForParams(params));
    model.Step(lr);
    for (const refit::TensorView& v : model.bf16()) {
      old_one.insert(old_one.end(), v.bytes(), v.bytes() + v.nbytes());
    }
    model.Step(lr);
    for (const refit::TensorView& v : model.bf16()) {
      new_one.insert(new_one.end(), v.bytes(), v.bytes() + v.nbytes());
    }
  }
  const uint64_t total = static_cast<uint64_t>(gib * 1073741824.0) / 2 * 2;
  std::vector<uint8_t> old_bits(total);
  std::vector<uint8_t> new_bits(total);
  for (uint64_t off = 0; off < total; off += old_one.size()) {
    const uint64_t len = std::min<uint64_t>(old_one.size(), total - off);
    std::memcpy(old_bits.data() + off, old_one.data(), len);
    std::memcpy(new_bits.data() + off, new_one.data(), len);
  }
  const uint64_t chunk = 16ull << 20;
  const refit::ctx::CodedForm form = FormFromEnv();
  auto t0 = Clock::now();
  uint64_t differ = refit::kernels::CountDiff(old_bits.data(), new_bits.data(), total / 2, 2);
  const double scan_s = Seconds(t0);

  std::vector<uint64_t> positions;
  std::vector<uint8_t> out;
  std::vector<std::vector<uint8_t>> payloads;
  uint64_t payload_bytes = 0;
  double encode_only_s = 0;
  t0 = Clock::now();
  for (uint64_t off = 0; off < total; off += chunk) {
    const uint64_t len = std::min(chunk, total - off);
    positions.clear();
    refit_encode_input_t in{};
    in.struct_size = sizeof(in);
    in.dtype = REFIT_DTYPE_BF16;
    in.elem_size = 2;
    in.n_elems = len / 2;
    in.old_bits = old_bits.data() + off;
    in.new_bits = new_bits.data() + off;
    in.n_changed = refit::kernels::DiffPositions(in.old_bits, in.new_bits, len / 2, 2, &positions);
    in.positions = positions.data();
    (void)refit::kernels::Digest64(in.new_bits, len);
    out.resize(refit::ctx::MaxEncodedSize(in));
    auto e0 = Clock::now();
    refit::Result<uint64_t> size =
        refit::ctx::EncodeAt(refit::kernels::ActiveSimdLevel(), in, out.data(), out.size(), form);
    encode_only_s += Seconds(e0);
    if (!size.ok()) return 1;
    payloads.emplace_back(out.begin(), out.begin() + static_cast<ptrdiff_t>(*size));
    payload_bytes += *size;
  }
  const double encode_s = Seconds(t0);

  t0 = Clock::now();
  double decode_only_s = 0;
  size_t r = 0;
  for (uint64_t off = 0; off < total; off += chunk, ++r) {
    const uint64_t len = std::min(chunk, total - off);
    refit_decode_target_t target{};
    target.struct_size = sizeof(target);
    target.dtype = REFIT_DTYPE_BF16;
    target.elem_size = 2;
    target.n_elems = len / 2;
    target.bits = old_bits.data() + off;
    auto d0 = Clock::now();
    refit::Status st = refit::ctx::Decode(payloads[r].data(), payloads[r].size(), target);
    decode_only_s += Seconds(d0);
    if (!st.ok()) {
      std::fprintf(stderr, "decode: %s\n", st.ToString().c_str());
      return 1;
    }
    (void)refit::kernels::Digest64(target.bits, len);
  }
  const double decode_s = Seconds(t0);
  const bool exact = std::memcmp(old_bits.data(), new_bits.data(), total) == 0;
  const double gb = static_cast<double>(total) / 1e9;
  std::printf(
      "speed (thread CPU time): %.2f GB bf16, density %.3f%%, payload %.2f MB\n"
      "  compare-scan        %7.2f GB/s\n"
      "  diff+digest+encode  %7.2f GB/s (%.2fx scan; encode alone %.2f GB/s)\n"
      "  decode+digest       %7.2f GB/s (%.2fx scan; decode alone %.2f GB/s)  bit-exact: %s\n",
      gb, 100.0 * static_cast<double>(differ) / static_cast<double>(total / 2),
      static_cast<double>(payload_bytes) / 1e6, gb / scan_s, gb / encode_s, scan_s / encode_s,
      gb / encode_only_s, gb / decode_s, scan_s / decode_s, gb / decode_only_s,
      exact ? "yes" : "NO");
  return exact ? 0 : 1;
}

// Valid payloads for tests/fuzz/fuzz_ctx.cc: 97 elements whose initial bytes are i * 7, a few
// changes (one-ULP steps, sign flips, random bits) or all of them (literal mode). Each is written
// twice: plain (selector = dtype - 1) and with the checksum fix-up bit (selector | 0x80).
int Seeds(const std::string& dir) {
  constexpr uint64_t kElems = 97;
  std::mt19937_64 rng(42);
  for (int32_t dtype = REFIT_DTYPE_BOOL; dtype <= REFIT_DTYPE_F8_E5M2; ++dtype) {
    const uint32_t es = refit::SizeOf(static_cast<refit::DType>(dtype));
    std::vector<uint8_t> initial(kElems * es);
    for (size_t i = 0; i < initial.size(); ++i) initial[i] = static_cast<uint8_t>(i * 7);
    for (uint64_t changes : {uint64_t{0}, uint64_t{3}, uint64_t{12}, kElems}) {
      std::vector<uint8_t> next = initial;
      for (uint64_t c = 0; c < changes; ++c) {
        const uint64_t i = changes == kElems ? c : rng() % kElems;
        uint64_t v = 0;
        std::memcpy(&v, next.data() + i * es, es);
        switch (rng() % 4) {
          case 0:
            v += 1;
            break;
          case 1:
            v -= 1;
            break;
          case 2:
            v ^= uint64_t{1} << (es * 8 - 1);
            break;
          default:
            v = rng();
            break;
        }
        std::memcpy(next.data() + i * es, &v, es);
      }
      std::vector<uint64_t> positions;
      refit_encode_input_t in{};
      in.struct_size = sizeof(in);
      in.dtype = dtype;
      in.elem_size = es;
      in.n_elems = kElems;
      in.old_bits = initial.data();
      in.new_bits = next.data();
      in.n_changed =
          refit::kernels::DiffPositions(initial.data(), next.data(), kElems, es, &positions);
      in.positions = positions.data();
      // Both coded forms: the adaptive one (what a record this small gets) and the table form
      // (what larger records get), forced, with its chosen slots, with one slot per class and
      // with explicit tables only.
      for (refit::ctx::CodedForm form :
           {refit::ctx::CodedForm::kAdaptive, refit::ctx::CodedForm::kTables,
            refit::ctx::CodedForm::kTablesPerClass, refit::ctx::CodedForm::kTablesExplicit}) {
        const bool tables = form != refit::ctx::CodedForm::kAdaptive;
        const bool per_class = form == refit::ctx::CodedForm::kTablesPerClass;
        const bool explicit_only = form == refit::ctx::CodedForm::kTablesExplicit;
        if (tables && (changes == 0 || changes == kElems)) continue;  // empty / literal: as above
        std::vector<uint8_t> out(refit::ctx::MaxEncodedSize(in));
        refit::Result<uint64_t> size = refit::ctx::EncodeAt(refit::kernels::ActiveSimdLevel(), in,
                                                            out.data(), out.size(), form);
        if (!size.ok()) return 1;
        for (uint8_t flag : {uint8_t{0}, uint8_t{0x80}}) {
          const std::string name = dir + "/" +
                                   std::string(refit::NameOf(static_cast<refit::DType>(dtype))) +
                                   "_k" + std::to_string(in.n_changed) + (tables ? "_tables" : "") +
                                   (per_class ? "_per_class" : "") +
                                   (explicit_only ? "_explicit" : "") + (flag ? "_fixup" : "");
          std::ofstream f(name, std::ios::binary);
          const char selector = static_cast<char>((dtype - 1) | flag);
          f.write(&selector, 1);
          f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(*size));
          if (!f) return 1;
        }
      }
    }
  }
  return 0;
}

// The offline pipeline (DiffFiles / ApplyFile, what `refit diff` and `refit apply` run) with ctx
// loaded from plugin_dir: the applied file must hold exactly NEW's bytes.
int Offline(const std::string& base, const std::string& next, const std::string& plugin_dir,
            const std::string& out_dir) {
  auto registry = refit::Registry::WithBuiltins();
  if (!registry.ok()) return 1;
  refit::Status st = (*registry)->LoadDirectory(plugin_dir);
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  const std::string delta = out_dir + "/ctx.delta";
  const std::string applied = out_dir + "/applied.safetensors";
  auto diff = refit::DiffFiles(base, next, delta, "ctx", **registry, nullptr);
  if (!diff.ok()) {
    std::fprintf(stderr, "diff: %s\n", diff.status().ToString().c_str());
    return 1;
  }
  auto apply = refit::ApplyFile(base, delta, applied, **registry, nullptr);
  if (!apply.ok()) {
    std::fprintf(stderr, "apply: %s\n", apply.status().ToString().c_str());
    return 1;
  }
  auto want = refit::SafetensorsFile::Open(next);
  auto got = refit::SafetensorsFile::Open(applied);
  if (!want.ok() || !got.ok()) return 1;
  bool same = (*want)->tensors().size() == (*got)->tensors().size();
  for (const refit::TensorView& v : (*want)->tensors()) {
    const refit::TensorView* g = (*got)->Find(v.name);
    same = same && g != nullptr && g->nbytes() == v.nbytes() &&
           std::memcmp(g->data, v.data, v.nbytes()) == 0;
  }
  std::printf("offline ctx: %llu records, delta %llu bytes for %llu changes, bit-exact: %s\n",
              static_cast<unsigned long long>(diff->counters.records),
              static_cast<unsigned long long>(diff->delta_bytes),
              static_cast<unsigned long long>(diff->counters.changed_elements),
              same ? "yes" : "NO");
  return same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "synthetic") {
    return Synthetic(argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 50000000,
                     argc > 3 ? std::strtod(argv[3], nullptr) : 1e-6);
  }
  if (mode == "pair" && argc == 4) return Pair(argv[2], argv[3]);
  if (mode == "speed") {
    return Speed(argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 20000000,
                 argc > 3 ? std::strtod(argv[3], nullptr) : 1e-6,
                 argc > 4 ? std::strtod(argv[4], nullptr) : 1.0);
  }
  if (mode == "seeds" && argc == 3) return Seeds(argv[2]);
  if (mode == "offline" && argc == 6) return Offline(argv[2], argv[3], argv[4], argv[5]);
  std::fprintf(stderr,
               "usage: refit_ctx_measure synthetic [params] [lr] | pair OLD NEW | "
               "speed [params] [lr] [GiB] | seeds DIR | offline BASE NEW PLUGIN_DIR OUT_DIR\n");
  return 2;
}
