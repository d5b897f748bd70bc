// Small text helpers shared by the parsers of untrusted input (safetensors headers, TOML).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace refit::internal {

// Strict UTF-8 (no overlong forms, surrogates or code points past U+10FFFF). On failure
// *error_offset (if given) receives the offset of the first bad byte.
bool IsValidUtf8(std::string_view text, size_t* error_offset = nullptr);

// text with control characters written as \xNN, so that untrusted names keep error messages on
// one printable line.
std::string Printable(std::string_view text);

}  // namespace refit::internal
