// Byte-stream compression for encodings: zstd and lz4 behind one small API.
//
// Shared by the encodings that compress (deltas_zstd, xor); not a plugin kind. Every call is
// stateless for the caller and safe from several threads at once (contexts are per thread).
// Output is deterministic: the same codec, level and input give the same bytes.
#pragma once

#include <cstdint>
#include <string>

#include "refit/sdk/plugin.hpp"
#include "refit/status.h"

namespace refit::codec {

// Values are stored in payload headers: never renumber.
enum class Codec : uint8_t { kNone = 0, kZstd = 1, kLz4 = 2 };

// "none", "zstd" or "lz4".
const char* CodecName(Codec codec);

// The codec of a config string; an error names the accepted values.
Result<Codec> ParseCodec(const std::string& name);

// The `codec` and `level` keys of a compressing encoding's config section, validated
// (defaults: zstd, level 1).
struct CodecSetting {
  Codec codec = Codec::kZstd;
  int level = 1;
};
Result<CodecSetting> CodecFromConfig(const refit::sdk::ConfigView& cfg);

// The codec of a payload header byte; false if unknown.
bool CodecFromByte(uint8_t byte, Codec* codec);

// Compression level for zstd: ZSTD_minCLevel() .. ZSTD_maxCLevel() (1 is fast and the default);
// lz4 takes only its default level (1). Names the config key in the error.
Status CheckLevel(Codec codec, int64_t level, const char* key);

// Largest Compress() output for n input bytes; 0 if n is too large for the codec.
uint64_t CompressBound(Codec codec, uint64_t n);

// Compresses n bytes of src into dst (cap bytes); returns the compressed size. kNone copies.
Result<uint64_t> Compress(Codec codec, int level, const uint8_t* src, uint64_t n, uint8_t* dst,
                          uint64_t cap);

// Decompresses exactly n bytes of src (one complete frame, nothing after it) into exactly
// expected bytes at dst. Any other size, a truncated or corrupt frame, or trailing bytes are
// kCorrupt errors; dst may hold garbage after an error.
Status Decompress(Codec codec, const uint8_t* src, uint64_t n, uint8_t* dst, uint64_t expected);

}  // namespace refit::codec
