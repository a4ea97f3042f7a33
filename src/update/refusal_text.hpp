#pragma once
// What the gate and the endpoint both write into a refusal: its detail, bounded, and the GPU
// it names. Internal to cubridge_update.
#include <cubridge/core/image.hpp>

#include <cstddef>
#include <optional>
#include <string>

namespace cubridge::update_internal {

/// The longest detail a refusal carries, in bytes.
inline constexpr std::size_t max_detail_bytes = 4096;

/// `detail` cut to max_detail_bytes (at a UTF-8 character boundary), saying how much was cut.
/// Not escaped: JSON escaping, or detail::printable, takes care of control characters.
inline std::string bounded_detail(std::string detail) {
  if (detail.size() <= max_detail_bytes) return detail;
  std::size_t cut = max_detail_bytes - 32;
  while (cut > 0 && (static_cast<unsigned char>(detail[cut]) & 0xC0) == 0x80) --cut;
  const auto more = detail.size() - cut;
  detail.resize(cut);
  return detail + " ... (" + std::to_string(more) + " more bytes)";
}

/// "sm_90" for a sink's device; "" when it knows none.
inline std::string gpu_name(const std::optional<compute_capability>& device) {
  return device ? to_string(*device) : "";
}

}  // namespace cubridge::update_internal
