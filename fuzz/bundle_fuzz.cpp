// libFuzzer target for cubridge::verify_bundle: any input must either verify or raise
// cubridge::bundle_error; anything else (a crash, a sanitizer report, another exception, a
// timeout) is a bug. The trusted key is fixed (fuzz_key.hpp) so that the seeds in
// fuzz/corpus/bundle/ (signed with it by fuzz/write_bundle_seeds.cpp) reach the checks after the
// signature.
#include <cubridge/bundle/bundle.hpp>

#include "fuzz_key.hpp"

#include <cstddef>
#include <cstdint>
#include <span>

namespace {
const cubridge::trusted_keys& fuzz_keys() {
  static const cubridge::trusted_keys keys{cubridge_fuzz::fuzz_secret_key().public_key()};
  return keys;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  cubridge::verify_limits limits;
  limits.max_bundle_bytes = 1 << 20;
  limits.max_manifest_bytes = 4096;
  try {
    const auto verified = cubridge::verify_bundle(bytes, fuzz_keys(), limits);
    (void)verified.version();
  } catch (const cubridge::bundle_error&) {
  }
  return 0;
}
