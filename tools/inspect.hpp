#pragma once
// `cubridge inspect FILE`: what a GPU image or a signed bundle holds, without a GPU. Shared with
// `python -m cubridge inspect` (python/src/images.cpp), so that both print the same.
#include <cubridge/bundle/bundle.hpp>
#include <cubridge/core/image.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace cubridge::tool {

/// A C++ kernel's name as C++ spells it ("void scale<float>(float*, float, unsigned long)" for
/// "_Z5scaleIfEvPT_S0_m"); nullopt for an extern "C" name (anything not starting "_Z", which
/// __cxa_demangle would otherwise read as a type: "f" is "float") or one the demangler refuses.
[[nodiscard]] std::optional<std::string> demangled_name(const std::string& name);

/// A bundle as inspect read it.
struct inspected_bundle {
  bundle_manifest manifest;
  /// True when verify_bundle passed with the keys given; false when none were given (then
  /// nothing of the manifest is vouched for).
  bool verified = false;
};

/// What `inspect FILE` read: an image, or a bundle and the image it carries.
struct inspected_file {
  std::optional<inspected_bundle> bundle;
  /// The image, or the bundle's payload's; nullopt only for a bundle of CUDA source.
  std::optional<image_info> image;
};

/// Reads the file at `path`: a bundle when its first bytes are the bundle magic (whatever the
/// file is called), else an image (inspect_image_file). A bundle is verified (verify_bundle,
/// default limits, the system clock) when `keys` are given, else only read
/// (read_bundle_unverified) and its cubin or fatbin payload inspected.
/// Throws cubridge::error (errc::io) when the file cannot be read, image_error for what is no
/// image, bundle_error naming the file and the reason for a bundle that is refused (a payload
/// that is no image: payload_kind_mismatch), and cubridge::error (errc::precondition) when
/// `keys` are given for an image, which has no signature to verify.
[[nodiscard]] inspected_file inspect_file(const std::filesystem::path& path,
                                          const std::vector<public_key>& keys = {});

/// The image as JSON: kind, targets, kernels with parameter sizes and demangled names.
[[nodiscard]] nlohmann::json describe_image(const image_info& info);
/// The image as a table for people.
[[nodiscard]] std::string render_image(const image_info& info, const std::string& file);

/// The file as JSON: describe_image's fields (none for a bundle of CUDA source), and for a
/// bundle "bundle": its manifest's fields, "signer" (the key id) and "verified".
[[nodiscard]] nlohmann::json describe_file(const inspected_file& inspected);
/// The file as a table for people: the bundle's manifest and signature, then its image.
[[nodiscard]] std::string render_file(const inspected_file& inspected, const std::string& file);

}  // namespace cubridge::tool
