// `cubridge sign`: a cubin, fatbin or CUDA source file as a signed module bundle.
#include "exit_codes.hpp"
#include "update/arguments.hpp"
#include "update/signing.hpp"
#include "update/update_commands.hpp"

#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/image.hpp>

#include <nlohmann/json.hpp>

#include <cstring>
#include <iostream>

#include <sys/stat.h>

namespace cubridge::tool {
namespace {

file_identity identity_of(const struct ::stat& st) {
  return {st.st_dev, st.st_ino};
}

std::string mode_text(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

// Refuses an output that is, by any name, one of the inputs: the file it would replace.
void refuse_overwriting(const std::filesystem::path& out, const file_identity& input,
                        const std::filesystem::path& input_path, const char* what) {
  struct ::stat st {};
  if (::stat(out.c_str(), &st) == 0 && identity_of(st) == input)
    throw usage_error("-o '" + out.string() + "' is the " + what + " '" + input_path.string() +
                      "' (the same file, by a link or another name): writing the bundle there "
                      "would destroy it; choose another output");
}

}  // namespace

input_file read_input(const std::filesystem::path& path, std::uint64_t max_bytes,
                      std::string_view what) {
  detail::regular_file file(path, max_bytes, what);
  input_file out;
  out.identity = identity_of(file.status());
  file.read_rest(out.bytes);
  return out;
}

signing_key read_signing_key(const std::filesystem::path& path, bool allow_readable) {
  detail::regular_file file(path, 4096, "key file");
  const auto mode = file.status().st_mode;
  if ((mode & 077) != 0) {
    const auto problem = "'" + path.string() +
                         "' may be read or written by group or others (mode " + mode_text(mode) +
                         "); a secret key must be the owner's alone";
    if (!allow_readable)
      detail::throw_errc(errc::precondition, "read key file",
                         problem + ": chmod 600 it, or pass --allow-readable-key");
    std::cerr << "cubridge: warning: " << problem << " (signing anyway: --allow-readable-key)\n";
  }
  std::vector<std::byte> bytes;
  file.read_rest(bytes);
  std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  ::explicit_bzero(bytes.data(), bytes.size());
  try {
    signing_key out{secret_key_from_text(text), identity_of(file.status())};
    ::explicit_bzero(text.data(), text.size());
    return out;
  } catch (...) {
    ::explicit_bzero(text.data(), text.size());
    throw;
  }
}

std::vector<std::byte> sign_payload(const signing_request& request,
                                    std::span<const std::byte> payload, bool cuda_source,
                                    const secret_key& key, bundle_manifest* manifest_out) {
  bundle_manifest_input in;
  in.name = request.name.empty() ? request.file.stem().string() : request.name;
  in.version = request.version;
  in.target = request.target;
  in.expires = request.expires;
  if (cuda_source) {
    in.kind = payload_kind::cuda_source;
    if (in.target.empty())
      detail::throw_errc(errc::precondition, "sign",
                         request.file.string() +
                             ": CUDA source needs --target (e.g. sm_90): `sign` signs the source "
                             "itself, which the service compiles for that target; `push` and "
                             "`fleet publish` compile it here first");
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

int update_commands::sign() const {
  signing_request request{sign_args_.file,
                          sign_args_.key,
                          sign_args_.name,
                          sign_args_.version,
                          sign_args_.target,
                          std::nullopt,
                          sign_args_.allow_readable_key};
  if (!sign_args_.expires.empty())
    request.expires = parse_expires(sign_args_.expires, std::chrono::system_clock::now());
  const auto key = read_signing_key(request.key, request.allow_readable_key);
  const auto payload = read_input(request.file, max_input_bytes, "payload");
  bundle_manifest m;
  const auto bundle =
      sign_payload(request, payload.bytes, request.file.extension() == ".cu", key.key, &m);
  const std::filesystem::path out = sign_args_.out.empty()
                                        ? m.name + "-v" + std::to_string(m.version) + ".bundle"
                                        : sign_args_.out;
  refuse_overwriting(out, key.identity, request.key, "secret key file");
  refuse_overwriting(out, payload.identity, request.file, "payload");
  // A fresh file renamed into place: never written through a link, never half written.
  detail::write_file_atomically(out, bundle, 0644, true, "bundle");
  std::cout << out.string() << ": module '" << m.name << "' v" << m.version << ", "
            << to_string(m.kind) << " for " << m.target << ", " << m.payload_size << " bytes, key "
            << to_hex(m.key_id);
  if (!m.expires.empty()) std::cout << ", expires " << m.expires;
  std::cout << "\n";
  return exit_ok;
}

}  // namespace cubridge::tool
