#pragma once
// libsodium set up once for the libraries that use it (cubridge_bundle: bundle.cpp;
// cubridge_compile: compile_cache_*.cpp). Internal and never installed, so <sodium.h> stays out of
// the public headers; header-only, so no extra library has to be linked or exported.

#include <cubridge/core/error.hpp>

#include <sodium.h>

namespace cubridge::detail {

/// Initialises libsodium before its first use. sodium_init is thread-safe and idempotent; the
/// static makes later calls free. Throws cubridge::error (errc::precondition, call
/// "sodium_init") when libsodium cannot start (e.g. no source of randomness).
inline void ensure_sodium() {
  static const int result = sodium_init();
  if (result < 0) throw_errc(errc::precondition, "sodium_init", "libsodium failed to initialise");
}

}  // namespace cubridge::detail
