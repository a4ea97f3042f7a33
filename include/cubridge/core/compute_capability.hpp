#pragma once
// A GPU's compute capability, and the one spelling of it as a real architecture name ("sm_90",
// "sm_90a", "sm_100f"): what a device reports, what a bundle targets, what NVRTC and nvJitLink
// compile for, and what "does this image run here" is decided against (image.hpp).

#include <compare>
#include <optional>
#include <string>
#include <string_view>

namespace cubridge {

/// The suffix of an architecture name, which decides which devices the code runs on.
enum class arch_variant {
  generic,          ///< no suffix (sm_80, compute_80)
  family_specific,  ///< "f" (sm_100f): runs on the same major compute capability, minor >= its own
  arch_specific,    ///< "a" (sm_90a): runs only on exactly that compute capability
};

/// Compute capability, e.g. {9, 0} for an H100/H200. A device's has no variant; an architecture
/// name's may ("sm_90a" is {9, 0, arch_variant::arch_specific}).
struct compute_capability {
  int major = 0;
  int minor = 0;
  arch_variant variant = arch_variant::generic;

  /// major * 10 + minor: 90 for 9.0, 100 for 10.0, whatever the variant.
  [[nodiscard]] constexpr int as_int() const noexcept { return major * 10 + minor; }
  /// The same major and minor, without the variant (what a device of this capability reports).
  [[nodiscard]] constexpr compute_capability numbers() const noexcept { return {major, minor}; }

  /// Ordered by major, minor, then variant (generic < "f" < "a").
  friend constexpr auto operator<=>(const compute_capability&, const compute_capability&) = default;
};

/// The strict parser of a real architecture name: "sm_" + 2 or 3 digits without a leading zero
/// (the last digit is the minor version) + optionally "a" or "f". "sm_90" is {9, 0}, "sm_100f"
/// {10, 0, family_specific}, "sm_120a" {12, 0, arch_specific}. nullopt for anything else
/// ("sm90", "sm_9", "sm_090", "sm_1000", "compute_90", "sm_90b", "").
[[nodiscard]] constexpr std::optional<compute_capability> parse_compute_capability(
    std::string_view name) noexcept {
  if (name.size() < 5 || name.substr(0, 3) != "sm_") return std::nullopt;
  std::string_view digits = name.substr(3);
  arch_variant variant = arch_variant::generic;
  if (digits.back() == 'a') variant = arch_variant::arch_specific;
  if (digits.back() == 'f') variant = arch_variant::family_specific;
  if (variant != arch_variant::generic) digits.remove_suffix(1);
  if (digits.size() < 2 || digits.size() > 3 || digits.front() == '0') return std::nullopt;
  int value = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  return compute_capability{value / 10, value % 10, variant};
}

/// The architecture name parse_compute_capability reads: "sm_90", "sm_90a", "sm_100f".
[[nodiscard]] inline std::string to_string(const compute_capability& capability) {
  std::string name = "sm_" + std::to_string(capability.as_int());
  if (capability.variant == arch_variant::arch_specific) name += 'a';
  if (capability.variant == arch_variant::family_specific) name += 'f';
  return name;
}

}  // namespace cubridge
