#pragma once
// The fuzzers' fixed signing key, for fuzzing only: the seed corpora (fuzz/corpus/bundle/ and
// fuzz/corpus/rollback/, written by write_bundle_seeds and write_rollback_seeds) are signed with
// it and the fuzz targets trust it, so that the seeds reach the checks after the signature.
#include <cubridge/bundle/bundle.hpp>

namespace cubridge_fuzz {

inline cubridge::secret_key fuzz_secret_key() {
  return cubridge::secret_key_from_text(
      "cubridge-ed25519-secret "
      "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n");
}

}  // namespace cubridge_fuzz
