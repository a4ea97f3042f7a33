#pragma once
// `cubridge inspect FILE`: what a GPU image holds, without a GPU.
#include <cubridge/core/image.hpp>

#include <nlohmann/json.hpp>

#include <string>

namespace cubridge::tool {

/// The image as JSON: kind, targets, kernels with parameter sizes.
nlohmann::json describe_image(const image_info& info);
/// The image as a table for people.
std::string render_image(const image_info& info, const std::string& file);

}  // namespace cubridge::tool
