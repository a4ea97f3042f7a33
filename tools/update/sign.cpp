// `cubridge sign`: a cubin, fatbin or CUDA source file as a signed module bundle.
#include "exit_codes.hpp"
#include "update/signing.hpp"
#include "update/update_commands.hpp"

#include <cubridge/image.hpp>

#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>

namespace cubridge::tool {

std::vector<std::byte> read_bytes(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) detail::throw_errc(errc::io, "read", "cannot open '" + file.string() + "'");
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) detail::throw_errc(errc::io, "read", "cannot read '" + file.string() + "'");
  std::vector<std::byte> out(chars.size());
  if (!chars.empty()) std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

std::vector<std::byte> sign_file(const signing_request& request, bundle_manifest* manifest_out) {
  const auto key = read_secret_key_file(request.key);
  const auto payload = read_bytes(request.file);
  bundle_manifest_input in;
  in.name = request.name.empty() ? request.file.stem().string() : request.name;
  in.version = request.version;
  in.target = request.target;
  if (request.file.extension() == ".cu") {
    in.kind = payload_kind::cuda_source;
    if (in.target.empty())
      detail::throw_errc(errc::precondition, "sign",
                         request.file.string() + ": CUDA source needs --target (e.g. sm_90)");
  } else {
    const auto info = inspect_image(payload);  // names the file's problem if it is no image
    if (info.kind == image_kind::ptx)
      detail::throw_errc(errc::precondition, "sign",
                         request.file.string() +
                             ": PTX is not a bundle payload; compile it to a cubin "
                             "(the service's driver would JIT it)");
    in.kind = info.kind == image_kind::cubin ? payload_kind::cubin : payload_kind::fatbin;
    if (in.target.empty()) {
      if (info.kind != image_kind::cubin || info.targets.size() != 1)
        detail::throw_errc(errc::precondition, "sign",
                           request.file.string() + ": a fatbin needs --target (e.g. sm_90)");
      in.target = info.targets.front().arch_name;
    }
  }
  auto bundle = sign_bundle(in, payload, key);
  if (manifest_out) {
    // Check what was written the way a receiver will (kind, target), with this key trusted.
    *manifest_out = verify_bundle(bundle, {key.public_key()}).manifest;
  }
  return bundle;
}

bundle_manifest peek_manifest(std::span<const std::byte> bundle) {
  // Layout per docs/bundle-format.md: magic (9), format (1), manifest length (4, LE), manifest.
  auto refuse = [](bundle_reason reason, const std::string& why) {
    throw bundle_error(reason, "read bundle", why);
  };
  if (bundle.size() < 14 || std::memcmp(bundle.data(), "CUBRIDGEB", 9) != 0)
    refuse(bundle_reason::bad_magic, "not a cubridge bundle (no CUBRIDGEB header)");
  std::uint32_t length = 0;
  for (int i = 3; i >= 0; --i) length = (length << 8) | std::to_integer<std::uint32_t>(bundle[10 + i]);
  if (length > bundle.size() - 14) refuse(bundle_reason::malformed, "truncated in the manifest");
  const auto json = nlohmann::json::parse(reinterpret_cast<const char*>(bundle.data()) + 14,
                                          reinterpret_cast<const char*>(bundle.data()) + 14 + length,
                                          nullptr, false);
  if (!json.is_object() || !json.contains("name") || !json["name"].is_string() ||
      !json.contains("version") || !json["version"].is_number_unsigned())
    refuse(bundle_reason::malformed_manifest, "manifest has no name and version");
  bundle_manifest m;
  m.name = json["name"].get<std::string>();
  m.version = json["version"].get<std::uint64_t>();
  if (json.contains("target") && json["target"].is_string()) m.target = json["target"];
  return m;
}

int update_commands::sign() const {
  signing_request request{sign_args_.file, sign_args_.key, sign_args_.name, sign_args_.version,
                          sign_args_.target};
  bundle_manifest m;
  const auto bundle = sign_file(request, &m);
  const std::filesystem::path out =
      sign_args_.out.empty() ? m.name + "-v" + std::to_string(m.version) + ".bundle"
                             : sign_args_.out;
  std::ofstream file(out, std::ios::binary | std::ios::trunc);
  file.write(reinterpret_cast<const char*>(bundle.data()), static_cast<std::streamsize>(bundle.size()));
  file.close();
  if (!file) detail::throw_errc(errc::io, "sign", "cannot write '" + out.string() + "'");
  std::cout << out.string() << ": module '" << m.name << "' v" << m.version << ", "
            << to_string(m.kind) << " for " << m.target << ", " << m.payload_size
            << " bytes, key " << to_hex(m.key_id) << "\n";
  return exit_ok;
}

}  // namespace cubridge::tool
