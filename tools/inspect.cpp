#include "inspect.hpp"

#include <cubridge/bundle/unverified_bundle.hpp>
#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/detail/printable.hpp>
#include <cubridge/core/error.hpp>

#include <cxxabi.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <sstream>

namespace cubridge::tool {

std::optional<std::string> demangled_name(const std::string& name) {
  if (!name.starts_with("_Z")) return std::nullopt;
  int status = 0;
  const std::unique_ptr<char, void (*)(void*)> text(
      abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status), &std::free);
  if (status != 0 || !text) return std::nullopt;
  return std::string(text.get());
}

namespace {

constexpr const char* inspect_call = "inspect";

/// The bundle's bytes, verified with `keys` or, without keys, only read. A refusal names `path`.
inspected_file inspect_bundle(std::span<const std::byte> bytes, const std::filesystem::path& path,
                              const std::vector<public_key>& keys) {
  const std::string file = "'" + path.string() + "'";
  try {
    if (!keys.empty()) {
      trusted_keys trusted;
      for (const auto& k : keys) trusted.add(k);
      auto verified = verify_bundle(bytes, trusted);
      return {inspected_bundle{std::move(verified.manifest), true}, std::move(verified.image)};
    }
    auto read = read_bundle_unverified(bytes);
    inspected_file out{inspected_bundle{std::move(read.manifest), false}, std::nullopt};
    if (out.bundle->manifest.kind == payload_kind::cuda_source) return out;
    try {
      out.image = inspect_image(read.payload);
    } catch (const error& e) {
      throw bundle_error(bundle_reason::payload_kind_mismatch, inspect_call,
                         "payload is not a " + std::string(to_string(out.bundle->manifest.kind)) +
                             ": " + e.involved(),
                         e.where());
    }
    return out;
  } catch (const bundle_error& e) {
    throw bundle_error(e.reason(), e.call(), file + ": " + e.involved(), e.where());
  }
}

/// A name from an unverified manifest, safe for a terminal (no escape sequences).
std::string shown(std::string_view text) {
  return detail::printable(text, {.max_bytes = 256,
                                  .quoted = false,
                                  .escape = detail::printable_escape::hex,
                                  .cut = detail::printable_cut::counted});
}

}  // namespace

inspected_file inspect_file(const std::filesystem::path& path,
                            const std::vector<public_key>& keys) {
  // The first bytes decide, not the name: a bundle renamed .cubin is still a bundle.
  const verify_limits limits;
  std::vector<std::byte> bytes;
  {
    detail::regular_file file(path, detail::max_image_bytes, "image or bundle");
    file.read_some(bytes, 9);  // as many as the magic, "CUBRIDGEB", has
    if (has_bundle_magic(bytes)) {
      // The bundle's size limit before the bundle is read whole, not after.
      const auto size = static_cast<std::uint64_t>(file.status().st_size);
      if (size > limits.max_bundle_bytes)
        throw bundle_error(bundle_reason::too_large, inspect_call,
                           "'" + path.string() + "': " + std::to_string(size) + " bytes, limit " +
                               std::to_string(limits.max_bundle_bytes));
      file.read_rest(bytes);
      return inspect_bundle(bytes, path, keys);
    }
  }
  if (!keys.empty())
    detail::throw_errc(errc::precondition, inspect_call,
                       "'" + path.string() +
                           "' is no bundle (it does not start with \"CUBRIDGEB\"): --key "
                           "verifies a bundle's signature, and an image has none");
  return {std::nullopt, inspect_image_file(path)};
}

nlohmann::json describe_image(const image_info& info) {
  nlohmann::json out;
  out["kind"] = to_string(info.kind);
  nlohmann::json targets = nlohmann::json::array();
  for (const auto& t : info.targets) {
    nlohmann::json target{{"kind", to_string(t.kind)},
                          {"arch", t.arch_name},
                          {"sm", t.sm},
                          {"compressed", t.compressed},
                          {"address_bits", t.address_bits}};
    if (t.ptx_version)
      target["ptx_version"] =
          std::to_string(t.ptx_version->major) + "." + std::to_string(t.ptx_version->minor);
    targets.push_back(std::move(target));
  }
  out["targets"] = std::move(targets);
  nlohmann::json kernels = nlohmann::json::array();
  for (const auto& k : info.kernels) {
    nlohmann::json kernel{{"name", k.name}};
    if (k.parameter_sizes)
      kernel["parameter_sizes"] = *k.parameter_sizes;
    else
      kernel["parameter_sizes"] = nullptr;
    if (const auto demangled = demangled_name(k.name))
      kernel["demangled"] = *demangled;
    else
      kernel["demangled"] = nullptr;
    kernels.push_back(std::move(kernel));
  }
  out["kernels"] = std::move(kernels);
  out["kernels_complete"] = info.kernels_complete;
  return out;
}

std::string render_image(const image_info& info, const std::string& file) {
  std::ostringstream out;
  out << file << ": " << to_string(info.kind) << "\n";
  for (const auto& t : info.targets) {
    out << "  target  " << t.arch_name << " (" << to_string(t.kind)
        << (t.compressed ? ", compressed" : "");
    if (t.ptx_version) out << ", PTX ISA " << t.ptx_version->major << "." << t.ptx_version->minor;
    out << ")\n";
  }
  for (const auto& k : info.kernels) {
    out << "  kernel  " << k.name << "(";
    if (k.parameter_sizes) {
      for (std::size_t i = 0; i < k.parameter_sizes->size(); ++i)
        out << (i ? ", " : "") << (*k.parameter_sizes)[i] << " B";
    } else {
      out << "parameters not recorded";
    }
    out << ")";
    if (const auto demangled = demangled_name(k.name)) out << "  " << *demangled;
    out << "\n";
  }
  if (!info.kernels_complete)
    out << "  (some entries are zstd-compressed: their kernels are not listed)\n";
  return out.str();
}

nlohmann::json describe_file(const inspected_file& inspected) {
  nlohmann::json out =
      inspected.image ? describe_image(*inspected.image) : nlohmann::json::object();
  if (inspected.bundle) {
    const auto& m = inspected.bundle->manifest;
    out["bundle"] = {
        {"name", m.name},
        {"version", m.version},
        {"target", m.target},
        {"kind", to_string(m.kind)},
        {"payload_size", m.payload_size},
        {"payload_sha256", m.payload_sha256},
        {"created", m.created},
        {"expires", m.expires.empty() ? nlohmann::json(nullptr) : nlohmann::json(m.expires)},
        {"signer", to_hex(m.key_id)},
        {"verified", inspected.bundle->verified}};
  }
  return out;
}

std::string render_file(const inspected_file& inspected, const std::string& file) {
  if (!inspected.bundle) return render_image(*inspected.image, file);
  const auto& m = inspected.bundle->manifest;
  std::ostringstream out;
  out << file << ": bundle\n";
  out << "  name:      " << shown(m.name) << "\n";
  out << "  version:   " << m.version << "\n";
  out << "  target:    " << m.target << "\n";
  out << "  payload:   " << to_string(m.kind) << ", " << m.payload_size << " bytes, SHA-256 "
      << m.payload_sha256 << "\n";
  out << "  created:   " << m.created << "\n";
  if (!m.expires.empty()) out << "  expires:   " << m.expires << "\n";
  out << "  signer:    key " << to_hex(m.key_id) << "\n";
  if (inspected.bundle->verified)
    out << "  signature: verified by " << to_hex(m.key_id) << "\n";
  else
    out << "  signature: not verified (pass --key FILE to verify)\n";
  if (inspected.image)
    out << render_image(*inspected.image, file + " (payload)");
  else
    out << file << " (payload): CUDA C++ source, compiled by the receiver for its device\n";
  return out.str();
}

}  // namespace cubridge::tool
