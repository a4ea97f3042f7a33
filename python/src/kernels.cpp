// Modules and kernels for Python: loaded from bytes, files or CUDA C++ source (NVRTC through the
// on-disk compile cache), kernels found by their C++ name, launches checked against the real
// parameter list (arguments.cpp converts them).
#include "bindings.hpp"

#include <cubridge/compile/compile_cache.hpp>
#include <cubridge/compile/machine_code.hpp>
#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/image.hpp>
#include <cubridge/core/module.hpp>

#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace nb = nanobind;

namespace cubridge::python {
namespace {

/// A module as Python holds it: the module and the kernel names its image holds.
struct py_module {
  module loaded;
  std::vector<std::string> kernel_names;
};

/// The process's compile cache (compile_cache::open_default), opened on first use.
compile_cache& shared_cache() {
  static std::once_flag once;
  static std::optional<compile_cache> cache;
  std::call_once(once, [] { cache.emplace(compile_cache::open_default()); });
  return *cache;
}

py_module load_into(const context_arg& where, const std::vector<std::byte>& bytes,
                    std::string name) {
  nb::gil_scoped_release unlocked;  // loading may take milliseconds (PTX: the driver's JIT)
  const auto info = inspect_image(bytes);
  std::vector<std::string> names;
  for (const auto& k : info.kernels) names.push_back(k.name);
  auto loaded = module::load(where, bytes, info, load_options{.name = std::move(name)});
  return {std::move(loaded), std::move(names)};
}

py_module load_module(nb::handle image, nb::handle ctx, std::string name) {
  const auto bytes = image_bytes(image);
  if (name.empty() && !PyObject_CheckBuffer(image.ptr()))
    name = std::filesystem::path(nb::cast<std::string>(nb::str(image))).filename().string();
  return load_into(as_context(ctx), bytes, std::move(name));
}

py_module module_from_source(const std::string& source, nb::handle ctx, const std::string& name,
                             const std::vector<std::string>& options,
                             const std::map<std::string, std::string>& defines, bool cache) {
  const auto where = as_context(ctx);
  build_options build;
  build.compile.extra_options = options;
  build.compile.defines = defines;
  std::vector<std::byte> code;
  {
    nb::gil_scoped_release unlocked;
    if (cache) build.cache = &shared_cache();
    code = build_machine_code(source_kind::cuda_source,
                              {reinterpret_cast<const std::byte*>(source.data()), source.size()},
                              name, where.ref().device().capability(), build);
  }
  return load_into(where, code, name);
}

py_kernel kernel_of(const py_module& m, const std::string& name) {
  auto k = m.loaded.get_kernel(resolve_kernel_name(m.kernel_names, name));
  auto signature = signature_of(k.name(), k.parameters());
  return {std::move(k), std::move(signature)};
}

/// Kernel.launch(config, *args), METH_FASTCALL (add_fast_method).
PyObject* launch(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return fast_launch<py_kernel>(
      self, args, nargs, "Kernel.launch",
      [](const kernel& k, const launch_config& c, const kernel_arguments& values) -> PyObject* {
        k.launch(c, values);
        Py_RETURN_NONE;
      });
}

PyMethodDef launch_method{
    "launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&launch)), METH_FASTCALL,
    "launch($self, config, /, *args)\n--\n\n"
    "Launches with `args` checked against the kernel's parameters: torch and CuPy tensors, "
    "__cuda_array_interface__ or DLPack arrays pass their device address, ints, floats and "
    "bools convert to the parameter's type (range-checked), numpy scalars and bytes pass their "
    "bytes. Raises LaunchArgumentError naming the parameter, and launches nothing, when one "
    "does not fit."};

std::vector<std::pair<std::size_t, std::size_t>> parameter_list(const launch_signature& s) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (const auto& p : s.parameters) out.emplace_back(p.offset, p.size);
  return out;
}

nb::object signature_list(const launch_signature& s) {
  if (s.types.empty() && !s.parameters.empty()) return nb::none();
  nb::list out;
  for (const auto& t : s.types) out.append(t.spelling);
  return out;
}

void bind_kernel(nb::module_& m) {
  auto cls =
      nb::class_<py_kernel>(m, "Kernel",
                            "A kernel of a loaded module. Launch it with launch(config, *args).")
          .def_prop_ro(
              "name", [](const py_kernel& k) { return k.k.name(); },
              "The name the module exports (mangled for C++ kernels).")
          .def_prop_ro(
              "parameters", [](const py_kernel& k) { return parameter_list(k.signature); },
              "(offset, size) of each parameter, as the driver reports them.")
          .def_prop_ro(
              "signature", [](const py_kernel& k) { return signature_list(k.signature); },
              "Each parameter's C++ type as the mangled name spells it, or None for an "
              "extern \"C\" kernel (then only sizes are checked).")
          .def_prop_ro(
              "handle",
              [](const py_kernel& k) {
                return reinterpret_cast<std::uintptr_t>(k.k.launch_handle());
              },
              "The handle cuLaunchKernel takes (a CUfunction) as an int.")
          .def_prop_ro("max_threads_per_block",
                       [](const py_kernel& k) {
                         return k.k.attribute(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
                       })
          .def_prop_ro("num_registers",
                       [](const py_kernel& k) { return k.k.attribute(CU_FUNC_ATTRIBUTE_NUM_REGS); })
          .def("__repr__",
               [](const py_kernel& k) { return "<cubridge.Kernel " + k.k.name() + ">"; });
  add_fast_method(cls, launch_method);
}

/// The benchmark's floor (bench/python/bench_launch.py): `count` launches from C++ with the
/// arguments converted once, i.e. what the driver's cuLaunchKernel costs by itself in this
/// process. Returns nanoseconds per launch.
double driver_launch_loop(const py_kernel& k, const py_launch_config& c, std::size_t count,
                          const nb::args& args) {
  kernel_arguments values;
  convert_arguments(k.signature, items_of(args), c.config, values);
  nb::gil_scoped_release unlocked;
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < count; ++i) k.k.launch_raw(c.config, values.pointers());
  const std::chrono::duration<double, std::nano> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / static_cast<double>(count);
}

/// The benchmark's breakdown: `count` conversions of `args` for `k` with nothing launched, i.e.
/// what checking and converting Python arguments costs. Returns nanoseconds per conversion.
double conversion_loop(const py_kernel& k, const py_launch_config& c, std::size_t count,
                       const nb::args& args) {
  kernel_arguments values;
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < count; ++i)
    convert_arguments(k.signature, items_of(args), c.config, values);
  const std::chrono::duration<double, std::nano> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / static_cast<double>(count);
}

/// What a launch would pass for `args` to a kernel named `name` whose parameters have `sizes`:
/// each argument's bytes, after every check a launch makes. No driver needed: the conversion
/// rules are tested on machines without a GPU through this.
std::vector<nb::bytes> pack_arguments(const std::string& name,
                                      const std::vector<std::size_t>& sizes, const nb::args& args) {
  std::vector<parameter_info> parameters;
  std::size_t offset = 0;
  for (const auto size : sizes) {
    parameters.push_back({offset, size});
    offset += size;
  }
  const auto signature = signature_of(name, parameters);
  kernel_arguments values;
  const launch_config config{.stream = stream_ref::legacy_default()};
  convert_arguments(signature, items_of(args), config, values);
  std::vector<nb::bytes> out;
  for (std::size_t i = 0; i < values.count(); ++i)
    out.emplace_back(static_cast<const char*>(values.pointers()[i]), values.sizes()[i]);
  return out;
}

}  // namespace

void bind_kernels(nb::module_& m) {
  m.def("_pack_arguments", &pack_arguments, nb::arg("name"), nb::arg("sizes"), nb::arg("args"),
        "The bytes a launch would pass for `args` to a kernel named `name` (mangled: its types "
        "are checked too) with parameters of `sizes` bytes; raises as a launch would. For tests "
        "without a GPU.");
  m.def("_conversion_loop", &conversion_loop, nb::arg("kernel"), nb::arg("config"),
        nb::arg("count"), nb::arg("args"),
        "Benchmark breakdown: `count` conversions of `args` for `kernel`, nothing launched; "
        "nanoseconds per conversion.");
  m.def("_driver_launch_loop", &driver_launch_loop, nb::arg("kernel"), nb::arg("config"),
        nb::arg("count"), nb::arg("args"),
        "Benchmark floor: `count` launches of `kernel` from C++ (cuLaunchKernel alone, arguments "
        "converted once); nanoseconds per launch.");
  nb::class_<device_view>(m, "DeviceView",
                          "Device memory cubridge exposes (a __device__ variable, a shared "
                          "buffer): wrap it with torch.as_tensor(v, device='cuda') or "
                          "cupy.asarray(v).")
      .def_ro("address", &device_view::address, "The device address as an int.")
      .def_ro("nbytes", &device_view::bytes, "Its size in bytes.")
      .def_prop_ro("__cuda_array_interface__", [](const device_view& v) {
        nb::dict d;
        d["shape"] = nb::make_tuple(v.bytes);
        d["typestr"] = "|u1";
        d["data"] = nb::make_tuple(v.address, false);
        d["version"] = 3;
        d["strides"] = nb::none();
        d["stream"] = nb::none();
        return d;
      });

  bind_kernel(m);
  nb::class_<py_module>(m, "Module",
                        "A module loaded into one context: cubin, fatbin or PTX, or CUDA C++ "
                        "compiled for the context's device.")
      .def_static("load", &load_module, nb::arg("image"), nb::arg("context") = nb::none(),
                  nb::arg("name") = "",
                  "Loads an image (bytes, or the path of a .cubin, .fatbin or .ptx file) into "
                  "`context` (default: the thread's current context). Raises ImageError for "
                  "bytes that are no image or have no code for the device.")
      .def_static("from_source", &module_from_source, nb::arg("source"),
                  nb::arg("context") = nb::none(), nb::kw_only(), nb::arg("name") = "kernel.cu",
                  nb::arg("options") = std::vector<std::string>{},
                  nb::arg("defines") = std::map<std::string, std::string>{},
                  nb::arg("cache") = true,
                  "CUDA C++ compiled by NVRTC for the context's device (through the on-disk "
                  "compile cache unless cache=False) and loaded. Raises CompileError with the log.")
      .def_prop_ro(
          "name", [](const py_module& m) { return m.loaded.name(); }, "The module's name.")
      .def_prop_ro(
          "kernel_names", [](const py_module& m) { return m.kernel_names; },
          "The kernels the image holds, as it names them.")
      .def_prop_ro(
          "context", [](const py_module& m) { return m.loaded.context(); },
          "The context it is loaded into (a ContextRef).")
      .def("get_kernel", &kernel_of, nb::arg("name"),
           "The kernel `name`: as the image names it, or a C++ kernel by its unmangled name "
           "('scale', 'ns::scale', 'scale<float>').")
      .def(
          "get_global",
          [](nb::handle self, const std::string& name) {
            const auto span = nb::cast<const py_module&>(self).loaded.get_global(name);
            return device_view{span.address(), span.size(), nb::borrow(self)};
          },
          nb::arg("name"), "A __device__ variable's memory as a DeviceView.")
      .def("__repr__",
           [](const py_module& m) { return "<cubridge.Module '" + m.loaded.name() + "'>"; });
}

std::string resolve_kernel_name(const std::vector<std::string>& names, const std::string& name) {
  std::vector<std::string> matches;
  for (const auto& n : names) {
    if (n == name) return n;
    const auto plain = unmangled_name(n);
    if (plain.empty()) continue;
    const auto bracket = plain.find('<');
    if (plain == name || (bracket != std::string::npos && plain.substr(0, bracket) == name))
      matches.push_back(n);
  }
  if (matches.size() == 1) return matches[0];
  if (matches.empty()) return name;  // get_kernel says it is not there
  std::string list;
  for (const auto& n : matches) list += (list.empty() ? "" : ", ") + n;
  detail::throw_errc(errc::precondition, "get_kernel",
                     "'" + name + "' names several kernels (" + list + "): give one of these");
}

std::vector<std::string> kernel_names_of(std::span<const std::byte> image) {
  std::vector<std::string> names;
  for (const auto& k : inspect_image(image).kernels) names.push_back(k.name);
  return names;
}

std::vector<std::byte> image_bytes(nb::handle image) {
  if (PyObject_CheckBuffer(image.ptr())) {
    Py_buffer view;
    if (PyObject_GetBuffer(image.ptr(), &view, PyBUF_SIMPLE) != 0) throw nb::python_error();
    const auto* first = static_cast<const std::byte*>(view.buf);
    std::vector<std::byte> out(first, first + view.len);
    PyBuffer_Release(&view);
    return out;
  }
  const auto path = nb::cast<std::string>(nb::module_::import_("os").attr("fspath")(image));
  return detail::read_regular_file(path, detail::max_image_bytes, "image");
}

}  // namespace cubridge::python
