#pragma once
// Signed CUDA-source bundles for the policy tests (the gate, the fleet agent): text payloads,
// so that no compiled image is needed; a fake sink takes them for the device they name.
#include <cubridge/bundle/bundle.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cubridge::testing {

/// A bundle of module `name` at `version`, signed with `key`: a small CUDA source for `target`.
inline std::vector<std::byte> source_bundle(const std::string& name, std::uint64_t version,
                                            const cubridge::secret_key& key,
                                            const std::string& target = "sm_90",
                                            std::size_t padding = 0) {
  const std::string source = "extern \"C\" __global__ void k" + std::to_string(version) +
                             "() {}\n// " + std::string(padding, 'x') + "\n";
  cubridge::bundle_manifest_input in;
  in.name = name;
  in.version = version;
  in.target = target;
  in.kind = cubridge::payload_kind::cuda_source;
  return cubridge::sign_bundle(in, std::as_bytes(std::span(source.data(), source.size())), key);
}

}  // namespace cubridge::testing
