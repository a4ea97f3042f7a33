// cubridge._cubridge: the C++ library for Python. The package cubridge (cubridge/__init__.py)
// puts Python's idiom on top; everything here calls the C++ API, nothing is done twice.
#include "bindings.hpp"
#include "doctor.hpp"
#ifndef CUBRIDGE_PYTHON_FLEET
#define CUBRIDGE_PYTHON_FLEET 0  // python/CMakeLists.txt sets it where the fleet layer is built
#endif
#if CUBRIDGE_PYTHON_FLEET
#include "fleet_bindings.hpp"
#endif

#include <cubridge/compile/machine_code.hpp>
#include <cubridge/core/compute_capability.hpp>
#include <cubridge/core/device.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/version.hpp>

#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>

namespace nb = nanobind;

namespace cubridge::python {
namespace {

nb::bytes compile_cuda(const std::string& source, const std::string& arch, const std::string& name,
                       const std::vector<std::string>& options,
                       const std::map<std::string, std::string>& defines) {
  const auto target = architecture_named(arch);
  build_options build;
  build.compile.extra_options = options;
  build.compile.defines = defines;
  std::vector<std::byte> code;
  {
    nb::gil_scoped_release unlocked;  // NVRTC takes its time; other Python threads may run
    code = build_machine_code(source_kind::cuda_source,
                              {reinterpret_cast<const std::byte*>(source.data()), source.size()},
                              name, target, build);
  }
  return to_bytes(code);
}

}  // namespace

compute_capability architecture_named(const std::string& arch) {
  const auto cc = parse_compute_capability(arch);
  CUBRIDGE_EXPECTS(cc.has_value(),
                   "architecture '" + arch + "' is not a real architecture name such as sm_90");
  return *cc;
}

}  // namespace cubridge::python

NB_MODULE(_cubridge, m) {
  using namespace cubridge::python;
  m.doc() = "cubridge's C++ library; use the package `cubridge`, which wraps this module.";
  m.attr("__version__") = std::string(cubridge::version());
  register_errors(m);
  // torch.library keeps a registered op (and the HotModule its body closes over) until the
  // process ends: cubridge.torch turns nanobind's exit-time leak report off for that reason.
  m.def("_set_leak_warnings", &nanobind::set_leak_warnings, nanobind::arg("enabled"),
        "Turns nanobind's report of objects alive at exit on or off.");
  bind_images(m);
  bind_bundles(m);
  bind_contexts_and_streams(m);
  bind_kernels(m);
  bind_hot_modules(m);
  bind_hot_module_groups(m);
  bind_isolation(m);
  bind_sandbox(m);
  bind_update_gate(m);
  bind_update_endpoint(m);
  bind_health(m);
#if CUBRIDGE_PYTHON_FLEET
  bind_fleet_controller(m);
  bind_fleet_agent(m);
#endif
  m.attr("has_fleet") = CUBRIDGE_PYTHON_FLEET != 0;
  // Argument types the launch path remembers are let go before the interpreter finalises, so no
  // user class (nor what it refers to) outlives it.
  nb::module_::import_("atexit").attr("register")(
      nb::cpp_function([] { forget_array_protocols(); }));
  m.def("_forget_array_protocols", &forget_array_protocols,
        "Drops the launch path's cache of argument types (what exit does). For tests.");

  m.def(
      "diagnose", [] { return cubridge::tool::diagnose().dump(); },
      "The report of `cubridge doctor --json`, as JSON text.");
  m.def(
      "render_doctor",
      [](const std::string& report) {
        return cubridge::tool::render_table(nlohmann::json::parse(report));
      },
      nb::arg("report"), "The report of diagnose() as `cubridge doctor` prints it for people.");
  m.def("driver_available", &cubridge::driver::available,
        "True when libcuda.so.1 was found and has every entry point cubridge needs.");
  m.def(
      "driver_unavailable_reason",
      [] { return std::string(cubridge::driver::unavailable_reason()); },
      "Why the driver is unavailable (empty when it is available).");
  m.def("device_count", &cubridge::device::count,
        "The number of CUDA devices. Raises DriverUnavailable without a driver.");
  m.def(
      "kernel_signature",
      [](const std::string& mangled) -> std::optional<std::vector<std::string>> {
        const auto types = cubridge::python::parameter_types(mangled);
        if (!types) return std::nullopt;
        std::vector<std::string> out;
        for (const auto& t : *types) out.push_back(t.spelling);
        return out;
      },
      nb::arg("name"),
      "The C++ parameter types a mangled kernel name spells (['float*', 'float', 'int'] for "
      "_Z5scalePffi), or None for a name that spells none (extern \"C\"). What launches check "
      "Python arguments against, beside the driver's sizes.");
  m.def(
      "unmangled_name",
      [](const std::string& mangled) { return cubridge::python::unmangled_name(mangled); },
      nb::arg("name"),
      "A mangled kernel name as C++ spells the function ('scale', 'ns::scale<float>'), or '' "
      "for a name that is not mangled.");
  m.def("compile_cuda", &compile_cuda, nb::arg("source"), nb::arg("arch") = "sm_90",
        nb::arg("name") = "kernel.cu", nb::arg("options") = std::vector<std::string>{},
        nb::arg("defines") = std::map<std::string, std::string>{},
        "CUDA C++ source compiled by NVRTC to a cubin for `arch` (build_machine_code).");
}
