// Writes the seed bundles of bundle_fuzz (fuzz/corpus/bundle/), signed with the fuzzers' fixed
// key (fuzz_key.hpp): CUDA source payloads v1 and sm_100f, the sm_90 test cubin, the cubin
// declared as a fatbin and for sm_80, an unsigned bundle, a manifest with an unknown nested
// field, bundles that expire (in 2126, and one second after they were made) and a manifest with
// bytes after a NUL.
//   write_bundle_seeds DIR SM90_CUBIN      (scripts/fuzz-bundle says how it is run)
// Exits 0 once every seed is written, 1 when one cannot be, 64 on a usage error.
#include <cubridge/bundle/bundle.hpp>

#include "fuzz_key.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

using bytes = std::vector<std::byte>;

bytes read_file(const std::filesystem::path& path) {
  bytes out(std::filesystem::file_size(path));
  std::ifstream in(path, std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size())))
    throw std::runtime_error("cannot read " + path.string());
  return out;
}

bytes as_bytes(std::string_view text) {
  bytes out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

cubridge::bundle_manifest_input input(std::string name = "filters", std::uint64_t version = 3,
                                      std::string target = "sm_90",
                                      cubridge::payload_kind kind = cubridge::payload_kind::cubin) {
  cubridge::bundle_manifest_input in;
  in.name = std::move(name);
  in.version = version;
  in.target = std::move(target);
  in.kind = kind;
  in.created = std::chrono::sys_days{std::chrono::year{2026} / 11 / 29} + std::chrono::hours{12};
  return in;
}

void write_seeds(const std::filesystem::path& dir, const bytes& cubin) {
  const auto key = cubridge_fuzz::fuzz_secret_key();
  auto write = [&](const std::string& name, const bytes& b) {
    std::ofstream out(dir / name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    if (!out.flush()) throw std::runtime_error("cannot write " + (dir / name).string());
  };
  const auto source = as_bytes("__global__ void k(float* x) { x[0] = 1; }\n");
  write("source_v1.bundle",
        cubridge::sign_bundle(input("kernels", 1, "sm_90", cubridge::payload_kind::cuda_source),
                              source, key));
  write("source_sm100f.bundle",
        cubridge::sign_bundle(
            input("a-b_c.d", 18446744073709551615u, "sm_100f", cubridge::payload_kind::cuda_source),
            source, key));
  write("cubin_sm90.bundle", cubridge::sign_bundle(input(), cubin, key));
  write("cubin_kind_lie.bundle",
        cubridge::sign_bundle(input("m", 2, "sm_90", cubridge::payload_kind::fatbin), cubin, key));
  write("cubin_sm80_target.bundle", cubridge::sign_bundle(input("m", 2, "sm_80"), cubin, key));
  auto unsigned_bundle = cubridge::sign_bundle(
      input("u", 1, "sm_90", cubridge::payload_kind::cuda_source), source, key);
  std::fill(unsigned_bundle.end() - 64, unsigned_bundle.end(), std::byte{0});
  write("unsigned.bundle", unsigned_bundle);
  write("extra_field.bundle",
        cubridge::detail::sign_bundle_unchecked(
            "{\"created\":\"2026-11-29T12:00:00Z\",\"extra\":[1,{}],\"kind\":\"cuda_source\"}",
            source, key));
  auto expiring = input("e", 3, "sm_90", cubridge::payload_kind::cuda_source);
  expiring.expires = std::chrono::sys_days{std::chrono::year{2126} / 1 / 1};
  write("source_expires_2126.bundle", cubridge::sign_bundle(expiring, source, key));
  expiring.expires = *expiring.created + std::chrono::seconds{1};
  write("source_expired.bundle", cubridge::sign_bundle(expiring, source, key));
  const auto manifest_text = cubridge::detail::manifest_json(
      input("n", 1, "sm_90", cubridge::payload_kind::cuda_source), source, key.public_key());
  write("nul_after_manifest.bundle",
        cubridge::detail::sign_bundle_unchecked(manifest_text + std::string(1, '\0') + "\xff{}",
                                                source, key));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s DIR SM90_CUBIN\n", argv[0]);
    return 64;
  }
  try {
    write_seeds(argv[1], read_file(argv[2]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "write_bundle_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
