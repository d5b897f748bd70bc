# Third-party packages (Debian 12 names in scripts/install-deps.sh).
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(toml11 3.7 REQUIRED)
find_package(CLI11 REQUIRED)
# libcrypto: SHA-256 and HMAC-SHA256 of the version chain and signed versions (core only).
find_package(OpenSSL 3 REQUIRED COMPONENTS Crypto)

function(refit_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wno-missing-field-initializers)
  if(REFIT_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
