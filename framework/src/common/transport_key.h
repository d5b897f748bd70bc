// The transport key grammar every transport checks before any I/O (docs/transports.md, "Keys"):
// relative, '/'-separated, each component [A-Za-z0-9._-]+ and never "." or "..", at most 512
// characters; names ending in .tmp.<digits>.<digits> are reserved (the disk transport's puts in
// flight), so no transport accepts them and a key listed by one is a key to all. A static library
// of its own (refit_transport_key) because transport plugins never link the core.
#pragma once

#include <string>

#include "refit/status.h"

namespace refit {

// InvalidArgument naming the key (quoted, non-printable bytes as \xNN) when it breaks the grammar.
Status ValidateTransportKey(const std::string& key);
// A list prefix: empty, or a key prefix (complete components valid as above, the last one partial).
Status ValidateTransportPrefix(const std::string& prefix);
// True for one character a key component may hold.
bool IsTransportKeyChar(char c);
// True for "<name>.tmp.<digits>.<digits>", the reserved form.
bool IsReservedTmpName(const std::string& name);

}  // namespace refit
