// The config keys of the compressing encodings (deltas_zstd, xor): every codec round-trips, and
// bad values are refused at create time naming the key. The conformance suite covers the defaults.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "refit/config.h"
#include "refit/kernels/diff.h"
#include "refit/registry.h"

namespace refit {
namespace {

std::shared_ptr<Registry> Load() {
  auto registry = Registry::WithBuiltins();
  EXPECT_TRUE(registry.ok());
  EXPECT_TRUE((*registry)->LoadDirectory(REFIT_BUILD_PLUGIN_DIR).ok());
  return std::move(registry).value();
}

Result<std::unique_ptr<Encoding>> Make(const Registry& registry, const std::string& name,
                                       const std::string& toml) {
  REFIT_ASSIGN_OR_RAISE(Config config, Config::FromString(toml, "test.toml"));
  return registry.CreateEncoding(name, &config, "encoding." + name);
}

// Encodes a 1%-changed bf16 run and decodes it onto the old bits; returns the payload size.
uint64_t RoundTrip(const Encoding& enc) {
  const uint64_t n = 100000;
  std::vector<uint16_t> old_bits(n);
  std::mt19937_64 rng(5);
  // Weights of one magnitude share their high byte (sign + exponent): what compressors find.
  for (auto& v : old_bits) v = static_cast<uint16_t>(0x3c00 | (rng() & 0xff));
  std::vector<uint16_t> new_bits = old_bits;
  for (uint64_t i = 0; i < n; i += 1 + rng() % 200) new_bits[i] ^= 1 + (rng() & 3);
  std::vector<uint64_t> positions;
  kernels::DiffPositions(old_bits.data(), new_bits.data(), n, 2, &positions);
  refit_encode_input_t in{};
  in.struct_size = sizeof(in);
  in.dtype = REFIT_DTYPE_BF16;
  in.elem_size = 2;
  in.n_elems = n;
  in.old_bits = old_bits.data();
  in.new_bits = new_bits.data();
  in.positions = positions.data();
  in.n_changed = positions.size();
  Result<uint64_t> max = enc.MaxEncodedSize(in);
  EXPECT_TRUE(max.ok()) << max.status().ToString();
  if (!max.ok()) return 0;
  std::vector<uint8_t> payload(*max);
  auto size = enc.Encode(in, payload.data(), payload.size());
  EXPECT_TRUE(size.ok()) << size.status().ToString();
  if (!size.ok()) return 0;
  refit_decode_target_t t{};
  t.struct_size = sizeof(t);
  t.dtype = REFIT_DTYPE_BF16;
  t.elem_size = 2;
  t.n_elems = n;
  t.bits = old_bits.data();
  Status st = enc.Decode(payload.data(), *size, t);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(std::memcmp(old_bits.data(), new_bits.data(), n * 2), 0);
  return *size;
}

TEST(EncodingCodecOptions, EveryCodecAndLevelRoundTrips) {
  std::shared_ptr<Registry> registry = Load();
  for (const std::string name : {"deltas_zstd", "xor"}) {
    std::vector<std::string> configs = {"", "codec = \"zstd\"\nlevel = 3\n",
                                        "codec = \"zstd\"\nlevel = -5\n", "codec = \"lz4\"\n"};
    if (name == "xor") configs.push_back("codec = \"none\"\n");
    for (const std::string& body : configs) {
      auto enc = Make(*registry, name, "[encoding." + name + "]\n" + body);
      ASSERT_TRUE(enc.ok()) << name << " " << body << ": " << enc.status().ToString();
      EXPECT_GT(RoundTrip(**enc), 0u) << name << " " << body;
    }
  }
}

TEST(EncodingCodecOptions, CompressedIsSmallerThanDeltas) {
  std::shared_ptr<Registry> registry = Load();
  auto deltas = registry->CreateEncoding("deltas");
  auto zstd = registry->CreateEncoding("deltas_zstd");
  auto xor_enc = registry->CreateEncoding("xor");
  ASSERT_TRUE(deltas.ok() && zstd.ok() && xor_enc.ok());
  const uint64_t plain = RoundTrip(**deltas);
  EXPECT_LT(RoundTrip(**zstd), plain);
  // Small XORs (1..4 in the low byte): the zero high plane compresses away.
  EXPECT_LT(RoundTrip(**xor_enc), RoundTrip(**zstd));
}

TEST(EncodingCodecOptions, BadValuesAreRefusedNamingTheKey) {
  std::shared_ptr<Registry> registry = Load();
  for (const std::string name : {"deltas_zstd", "xor"}) {
    for (const std::string body : {"codec = \"brotli\"\n", "level = 99\n", "level = 0\n",
                                   "codec = \"lz4\"\nlevel = 9\n", "level = \"fast\"\n"}) {
      auto enc = Make(*registry, name, "[encoding." + name + "]\n" + body);
      ASSERT_FALSE(enc.ok()) << name << " accepted " << body;
      const std::string msg = enc.status().ToString();
      EXPECT_TRUE(msg.find("codec") != std::string::npos || msg.find("level") != std::string::npos)
          << msg;
    }
  }
  auto none = Make(*registry, "deltas_zstd", "[encoding.deltas_zstd]\ncodec = \"none\"\n");
  EXPECT_FALSE(none.ok()) << "deltas_zstd without compression is `deltas`";
}

}  // namespace
}  // namespace refit
