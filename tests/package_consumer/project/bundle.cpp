// cubridge::bundle alone: a fresh key signs a bundle, which verifies against that key and is
// refused under another (libsodium inside); no GPU.
#include <cubridge/bundle/bundle.hpp>

#include <cstdio>
#include <string_view>
#include <vector>

int main() {
  const auto signer = cubridge::generate_keypair();
  const auto stranger = cubridge::generate_keypair();
  constexpr std::string_view source = "extern \"C\" __global__ void k() {}\n";
  std::vector<std::byte> payload;
  for (const char c : source) payload.push_back(static_cast<std::byte>(c));
  cubridge::bundle_manifest_input input;
  input.name = "consumer";
  input.version = 3;
  input.target = "sm_90";
  input.kind = cubridge::payload_kind::cuda_source;
  const auto bundle = cubridge::sign_bundle(input, payload, signer.secret_key);
  const auto verified = cubridge::verify_bundle(bundle, cubridge::trusted_keys{signer.public_key});
  if (verified.version() != 3 || verified.payload != payload) {
    std::printf("cubridge consumer bundle: the verified bundle differs from the signed one\n");
    return 1;
  }
  try {
    (void)cubridge::verify_bundle(bundle, cubridge::trusted_keys{stranger.public_key});
    std::printf("cubridge consumer bundle: a bundle of an untrusted key verified\n");
    return 1;
  } catch (const cubridge::bundle_error&) {
    // Expected: unknown_key.
  }
  std::printf("cubridge consumer bundle: signed and verified %zu bytes\n", bundle.size());
  return 0;
}
