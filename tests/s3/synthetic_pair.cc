// Writes two consecutive BF16 versions of a synthetic trajectory (framework/synthetic: Llama-shaped
// fp32 master weights, one Adam-like step at lr between them) as safetensors files, for the manual
// 1 GB acceptance run of the s3 transport (acceptance_1g.sh). Not a test of its own.
//   refit_s3_synthetic_pair PARAMS LR V1.safetensors V2.safetensors
#include <cstdio>
#include <cstdlib>
#include <string>

#include "format/safetensors.h"
#include "synthetic/synthetic.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s PARAMS LR V1.safetensors V2.safetensors\n", argv[0]);
    return 2;
  }
  const uint64_t params = std::strtoull(argv[1], nullptr, 10);
  const double lr = std::atof(argv[2]);
  refit::SyntheticModel model(refit::SyntheticModelSpec::ForParams(params, /*seed=*/1));
  for (int version = 1; version <= 2; ++version) {
    if (version == 2) model.Step(lr);
    refit::Status st = refit::WriteSafetensors(argv[2 + version], model.bf16());
    if (!st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  std::printf("%llu parameters, lr %g: %s %s\n",
              static_cast<unsigned long long>(model.num_parameters()), lr, argv[3], argv[4]);
  return 0;
}
