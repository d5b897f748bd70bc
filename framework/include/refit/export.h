// Symbol visibility of the core library (built with -fvisibility=hidden): only what is marked
// REFIT_API is exported from librefit.so.
#pragma once

#if defined(_WIN32)
#define REFIT_API
#else
#define REFIT_API __attribute__((visibility("default")))
#endif
