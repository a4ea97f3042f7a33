// ImageInfo and friends: what cubridge::inspect_image finds, as read-only Python objects.
#include "bindings.hpp"
#include "inspect.hpp"

#include <cubridge/bundle/bundle.hpp>
#include <cubridge/core/compute_capability.hpp>
#include <cubridge/core/image.hpp>

#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <filesystem>
#include <string>
#include <vector>

namespace nb = nanobind;

namespace cubridge::python {
namespace {

std::optional<std::string> ptx_version_text(const image_target& t) {
  if (!t.ptx_version) return std::nullopt;
  return std::to_string(t.ptx_version->major) + "." + std::to_string(t.ptx_version->minor);
}

/// What `cubridge inspect FILE [--key KEY]... [--json]` prints, from the tool's own code.
std::string inspect_report(const std::filesystem::path& path,
                           const std::vector<std::filesystem::path>& key_files, bool json) {
  std::vector<public_key> keys;
  for (const auto& k : key_files) keys.push_back(read_public_key_file(k));
  const auto inspected = tool::inspect_file(path, keys);
  return json ? tool::describe_file(inspected).dump(2) + "\n"
              : tool::render_file(inspected, path.string());
}

}  // namespace

void bind_images(nb::module_& m) {
  nb::class_<image_kernel>(m, "ImageKernel", "One kernel (entry function) an image defines.")
      .def_ro("name", &image_kernel::name, "The name as in the image (mangled for C++ kernels).")
      .def_ro("parameter_sizes", &image_kernel::parameter_sizes,
              "Size in bytes of each parameter in order; None where the image does not say.")
      .def_prop_ro(
          "demangled", [](const image_kernel& k) { return tool::demangled_name(k.name); },
          "The C++ name ('void scale<float>(float*, float, unsigned long)'); None for an "
          "extern \"C\" name.")
      .def("__repr__", [](const image_kernel& k) { return "<ImageKernel " + k.name + ">"; });

  nb::class_<image_target>(m, "ImageTarget", "One piece of code in an image (or fatbin entry).")
      .def_prop_ro(
          "kind", [](const image_target& t) { return std::string(to_string(t.kind)); },
          "'cubin', 'ptx' or (fatbin entries only) 'lto_ir'.")
      .def_ro("sm", &image_target::sm, "Compute capability as major * 10 + minor (90 for 9.0).")
      .def_ro("arch", &image_target::arch_name, "'sm_90a' for SASS, 'compute_90' for PTX.")
      .def_ro("compressed", &image_target::compressed, "True for a compressed fatbin entry.")
      .def_ro("address_bits", &image_target::address_bits, "Device address size: 64 or 32.")
      .def_prop_ro("ptx_version", &ptx_version_text, "The PTX ISA version ('9.0'), or None.")
      .def_ro("kernel_names", &image_target::kernel_names, "Kernels of this entry, in order.")
      .def("__repr__", [](const image_target& t) { return "<ImageTarget " + t.arch_name + ">"; });

  nb::class_<image_info>(m, "ImageInfo", "What cubridge.inspect found in a GPU image.")
      .def_prop_ro(
          "kind", [](const image_info& i) { return std::string(to_string(i.kind)); },
          "'cubin', 'fatbin' or 'ptx'.")
      .def_ro("targets", &image_info::targets, "The code it holds: one target, or fatbin entries.")
      .def_ro("kernels", &image_info::kernels, "Kernels defined, deduplicated by name.")
      .def_ro("kernels_complete", &image_info::kernels_complete,
              "False when some entry could not be read, so kernels may miss some.")
      .def(
          "find_kernel",
          [](const image_info& i, const std::string& name) {
            const auto* k = i.find_kernel(name);
            return k ? std::optional<image_kernel>(*k) : std::nullopt;
          },
          nb::arg("name"), "The kernel called `name`, or None.")
      .def(
          "can_run_on",
          [](const image_info& i, const std::string& arch) {
            return can_run_on(i, architecture_named(arch));
          },
          nb::arg("arch"), "True when some target runs on a device of `arch` ('sm_90').")
      .def(
          "to_json", [](const image_info& i) { return tool::describe_image(i).dump(); },
          "The JSON text `cubridge inspect --json` prints.")
      .def("__repr__", [](const image_info& i) {
        return "<ImageInfo " + std::string(to_string(i.kind)) + ", " +
               std::to_string(i.targets.size()) + " targets, " + std::to_string(i.kernels.size()) +
               " kernels>";
      });

  m.def(
      "inspect_bytes", [](const nb::bytes& b) { return inspect_image(byte_span(b)); },
      nb::arg("image"), "inspect_image of a cubin, fatbin or PTX image in memory.");
  m.def("inspect_file", &inspect_image_file, nb::arg("path"),
        "inspect_image of the file at `path`.");
  m.def("render_image", &tool::render_image, nb::arg("info"), nb::arg("file"),
        "The image as `cubridge inspect FILE` prints it for people.");
  m.def("inspect_report", &inspect_report, nb::arg("path"),
        nb::arg("key_files") = std::vector<std::filesystem::path>{}, nb::arg("json") = false,
        "What `cubridge inspect FILE [--key KEY]... [--json]` prints: an image, or a bundle "
        "(told by its magic) read or, with key_files, verified (BundleError when refused).");
}

}  // namespace cubridge::python
