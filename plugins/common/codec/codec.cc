#include "codec/codec.h"

#include <lz4.h>
#include <zstd.h>

#include <cstring>
#include <memory>

namespace refit::codec {
namespace {

struct CCtxFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DCtxFree {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

// One context per thread: creating one per call costs more than compressing a small record.
ZSTD_CCtx* ThreadCCtx() {
  thread_local std::unique_ptr<ZSTD_CCtx, CCtxFree> cctx(ZSTD_createCCtx());
  return cctx.get();
}
ZSTD_DCtx* ThreadDCtx() {
  thread_local std::unique_ptr<ZSTD_DCtx, DCtxFree> dctx(ZSTD_createDCtx());
  return dctx.get();
}

}  // namespace

const char* CodecName(Codec codec) {
  switch (codec) {
    case Codec::kNone:
      return "none";
    case Codec::kZstd:
      return "zstd";
    case Codec::kLz4:
      return "lz4";
  }
  return "unknown";
}

Result<Codec> ParseCodec(const std::string& name) {
  for (Codec c : {Codec::kNone, Codec::kZstd, Codec::kLz4}) {
    if (name == CodecName(c)) return c;
  }
  return Status::Invalid("codec '" + name + "' is not one of \"zstd\", \"lz4\", \"none\"");
}

bool CodecFromByte(uint8_t byte, Codec* codec) {
  if (byte > static_cast<uint8_t>(Codec::kLz4)) return false;
  *codec = static_cast<Codec>(byte);
  return true;
}

Status CheckLevel(Codec codec, int64_t level, const char* key) {
  if (codec == Codec::kZstd) {
    if (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel() || level == 0) {
      return Status::Invalid(std::string("config key '") + key + "' = " + std::to_string(level) +
                             " is outside zstd's levels [" + std::to_string(ZSTD_minCLevel()) +
                             ", -1] and [1, " + std::to_string(ZSTD_maxCLevel()) + "]");
    }
  } else if (level != 1) {
    return Status::Invalid(std::string("config key '") + key + "' = " + std::to_string(level) +
                           ": codec " + CodecName(codec) + " has only level 1");
  }
  return Status::OK();
}

uint64_t CompressBound(Codec codec, uint64_t n) {
  switch (codec) {
    case Codec::kNone:
      return n;
    case Codec::kZstd: {
      const size_t bound = ZSTD_compressBound(static_cast<size_t>(n));
      return ZSTD_isError(bound) ? 0 : bound;
    }
    case Codec::kLz4:
      return n > LZ4_MAX_INPUT_SIZE ? 0
                                    : static_cast<uint64_t>(LZ4_compressBound(static_cast<int>(n)));
  }
  return 0;
}

Result<uint64_t> Compress(Codec codec, int level, const uint8_t* src, uint64_t n, uint8_t* dst,
                          uint64_t cap) {
  switch (codec) {
    case Codec::kNone:
      if (cap < n)
        return Status::Invalid("output of " + std::to_string(cap) + " bytes < " +
                               std::to_string(n));
      if (n > 0) std::memcpy(dst, src, n);
      return n;
    case Codec::kZstd: {
      ZSTD_CCtx* cctx = ThreadCCtx();
      if (cctx == nullptr) return Status::Internal("zstd: cannot allocate a compression context");
      const size_t r = ZSTD_compressCCtx(cctx, dst, cap, src, n, level);
      if (ZSTD_isError(r)) {
        return Status::Invalid(std::string("zstd compress of ") + std::to_string(n) +
                               " bytes failed: " + ZSTD_getErrorName(r));
      }
      return static_cast<uint64_t>(r);
    }
    case Codec::kLz4: {
      if (n > LZ4_MAX_INPUT_SIZE) {
        return Status::Invalid("lz4 compresses at most " + std::to_string(LZ4_MAX_INPUT_SIZE) +
                               " bytes at once, not " + std::to_string(n));
      }
      const int cap_int = cap > INT32_MAX ? INT32_MAX : static_cast<int>(cap);
      const int r =
          LZ4_compress_default(reinterpret_cast<const char*>(src), reinterpret_cast<char*>(dst),
                               static_cast<int>(n), cap_int);
      if (r <= 0 && n > 0) {
        return Status::Invalid("lz4 compress of " + std::to_string(n) + " bytes into " +
                               std::to_string(cap) + " failed");
      }
      return static_cast<uint64_t>(r);
    }
  }
  return Status::Invalid("unknown codec");
}

Status Decompress(Codec codec, const uint8_t* src, uint64_t n, uint8_t* dst, uint64_t expected) {
  switch (codec) {
    case Codec::kNone:
      if (n != expected) {
        return Status::Corrupt("uncompressed body has " + std::to_string(n) + " bytes, expected " +
                               std::to_string(expected));
      }
      if (n > 0) std::memcpy(dst, src, n);
      return Status::OK();
    case Codec::kZstd: {
      // Exactly one frame covering all n bytes, declaring exactly the expected size.
      const size_t frame = ZSTD_findFrameCompressedSize(src, n);
      if (ZSTD_isError(frame) || frame != n) {
        return Status::Corrupt("zstd body of " + std::to_string(n) +
                               " bytes is not exactly one complete frame");
      }
      const unsigned long long content = ZSTD_getFrameContentSize(src, n);
      if (content != expected) {
        return Status::Corrupt("zstd frame declares " +
                               (content == ZSTD_CONTENTSIZE_UNKNOWN ? std::string("no size")
                                : content == ZSTD_CONTENTSIZE_ERROR
                                    ? std::string("an invalid size")
                                    : std::to_string(content) + " bytes") +
                               ", expected " + std::to_string(expected));
      }
      ZSTD_DCtx* dctx = ThreadDCtx();
      if (dctx == nullptr) return Status::Internal("zstd: cannot allocate a decompression context");
      const size_t r = ZSTD_decompressDCtx(dctx, dst, expected, src, n);
      if (ZSTD_isError(r) || r != expected) {
        return Status::Corrupt(std::string("zstd body does not decompress to ") +
                               std::to_string(expected) + " bytes" +
                               (ZSTD_isError(r) ? std::string(": ") + ZSTD_getErrorName(r) : ""));
      }
      return Status::OK();
    }
    case Codec::kLz4: {
      if (n > LZ4_MAX_INPUT_SIZE || expected > LZ4_MAX_INPUT_SIZE || n == 0) {
        return Status::Corrupt("lz4 body of " + std::to_string(n) + " bytes for " +
                               std::to_string(expected) + " is out of lz4's range");
      }
      // LZ4_decompress_safe never reads past src + n nor writes past dst + expected.
      const int r =
          LZ4_decompress_safe(reinterpret_cast<const char*>(src), reinterpret_cast<char*>(dst),
                              static_cast<int>(n), static_cast<int>(expected));
      if (r < 0 || static_cast<uint64_t>(r) != expected) {
        return Status::Corrupt("lz4 body does not decompress to exactly " +
                               std::to_string(expected) + " bytes");
      }
      return Status::OK();
    }
  }
  return Status::Corrupt("unknown codec");
}

Result<CodecSetting> CodecFromConfig(const refit::sdk::ConfigView& cfg) {
  CodecSetting setting;
  REFIT_ASSIGN_OR_RAISE(std::string name, cfg.GetString("codec", "zstd"));
  REFIT_ASSIGN_OR_RAISE(setting.codec, ParseCodec(name));
  REFIT_ASSIGN_OR_RAISE(int64_t level, cfg.GetInt("level", 1));
  REFIT_RETURN_NOT_OK(CheckLevel(setting.codec, level, "level"));
  setting.level = static_cast<int>(level);
  return setting;
}

}  // namespace refit::codec
