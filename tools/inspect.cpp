#include "inspect.hpp"

#include <sstream>

namespace cubridge::tool {

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
    out << ")\n";
  }
  if (!info.kernels_complete)
    out << "  (some entries are zstd-compressed: their kernels are not listed)\n";
  return out.str();
}

}  // namespace cubridge::tool
