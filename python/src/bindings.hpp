#pragma once
// The parts of the extension module cubridge._cubridge, one function per file.
#include "signature.hpp"

#include <cubridge/core/compute_capability.hpp>
#include <cubridge/core/context_ref.hpp>
#include <cubridge/core/kernel.hpp>
#include <cubridge/core/launch_config.hpp>
#include <cubridge/core/shared_device_memory.hpp>
#include <cubridge/core/stream_ref.hpp>
#include <cubridge/isolation/mps_policy.hpp>
#include <cubridge/swap/hot_module.hpp>
#include <cubridge/swap/hot_module_group.hpp>
#include <cubridge/update/update_gate.hpp>
#include <cubridge/update_swap/hot_module_sink.hpp>

#include <nanobind/nanobind.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace cubridge::python {

/// Python exceptions for cubridge errors (the classes live in cubridge/_errors.py).
void register_errors(nanobind::module_& m);
/// The Python exception object for a C++ exception (what the translator would raise), for
/// callbacks that hand an error to Python code rather than raise it. Needs the GIL.
[[nodiscard]] nanobind::object python_exception(const std::exception_ptr& p);
/// ImageInfo, ImageTarget, ImageKernel, inspect_bytes, inspect_file, render_image.
void bind_images(nanobind::module_& m);
/// PublicKey, SecretKey, KeyPair, BundleManifest, VerifiedBundle and the bundle functions.
void bind_bundles(nanobind::module_& m);

/// Device, devices(), ContextRef, current_context(), Context, PrimaryContext, scoped_current,
/// Stream, LaunchConfig (contexts.cpp).
void bind_contexts_and_streams(nanobind::module_& m);
/// Module, Kernel (kernels.cpp).
void bind_kernels(nanobind::module_& m);
/// HotModule, HotKernel, StagedVersion, HotModuleStats, HotReloader (hot.cpp); ProbationPolicy
/// first, which HotModule.stage takes.
void bind_hot_modules(nanobind::module_& m);
/// ProbationPolicy (probation.cpp).
void bind_probation_policy(nanobind::module_& m);
/// GuestContext, SharedMemory (isolation.cpp).
void bind_isolation(nanobind::module_& m);
/// Sandbox (sandbox.cpp).
void bind_sandbox(nanobind::module_& m);
/// The architecture `arch` names ("sm_90", "sm_90a"). @throws error (errc::precondition) for a
/// name that is none (module.cpp).
[[nodiscard]] compute_capability architecture_named(const std::string& arch);
/// The mps_policy named "allow", "warn" or "refuse" (GuestContext's and Sandbox's `mps`).
/// @throws error (errc::precondition) naming `who` for any other name.
[[nodiscard]] mps_policy mps_policy_named(const std::string& name, const std::string& who);
/// UpdateEndpoint (endpoint.cpp).
void bind_update_endpoint(nanobind::module_& m);
/// health(), exit_when_poisoned(), POISONED_EXIT_CODE (health.cpp).
void bind_health(nanobind::module_& m);

/// What UpdateGate takes besides its modules and keys (the update_gate_options a Python service
/// sets), also taken by UpdateEndpoint and FleetAgent when they build a private gate.
struct gate_settings {
  std::string state_file;
  bool persist_state = true;  // as update_gate_options: the default file unless state_file
  std::map<std::string, std::uint64_t> version_floor;
  bool require_expiry = false;
  std::optional<double> max_bundle_age_s;
  double rollback_window_s = 300;
  bool operator==(const gate_settings&) const = default;
};
/// The update_gate_options of `s` and `keys`. @throws error (errc::precondition) naming `who`
/// for a duration that is not positive.
[[nodiscard]] update_gate_options gate_options_of(const gate_settings& s,
                                                  const std::vector<public_key>& keys,
                                                  const char* who);

/// cubridge.UpdateGate (gate.cpp): a node's one gate and the sink of its HotModules, whose
/// Python objects it keeps alive. Shared by reference between its doors.
class py_update_gate {
 public:
  /// A gate over `hot_modules` (None, a HotModule, a HotModuleGroup or an iterable of them).
  py_update_gate(nanobind::handle hot_modules, const std::vector<public_key>& keys,
                 const gate_settings& settings, const char* who);
  /// Serves one more HotModule or HotModuleGroup. @throws error (errc::precondition) otherwise.
  /// Serves `hot_module` through the gate; a version that arrives for it goes through
  /// `probation` first when one is given (the node's per-module policy).
  void add(nanobind::handle hot_module, const probation_policy* probation = nullptr);
  [[nodiscard]] update_gate& gate() const noexcept { return *gate_; }
  [[nodiscard]] const std::shared_ptr<update_gate>& shared() const noexcept { return gate_; }
  [[nodiscard]] nanobind::list modules() const;

 private:
  std::vector<nanobind::object> modules_;  // the Python objects of what the sink holds
  std::shared_ptr<hot_module_sink> sink_;
  std::shared_ptr<update_gate> gate_;
  std::string who_;
};
/// The UpdateGate a door uses: `gate` when given (then `hot_modules` and `keys` must be None),
/// else a private one over `hot_modules` and `keys` with `settings`. @throws error
/// (errc::precondition) naming `who` for both or neither.
[[nodiscard]] nanobind::object gate_for(nanobind::handle gate, nanobind::handle hot_modules,
                                        nanobind::handle keys, const gate_settings& settings,
                                        const char* who);
/// UpdateGate (gate.cpp).
void bind_update_gate(nanobind::module_& m);

/// A hot module as Python holds it: the module and the kernel names of its first version (the
/// interface, for resolve_kernel_name).
struct py_hot_module {
  hot_module hot;
  std::vector<std::string> kernel_names;
};

/// A hot module group as Python holds it (group.cpp): the group and its interface's names.
struct py_hot_module_group {
  hot_module_group group;
  std::vector<std::string> kernel_names;
};
/// HotModuleGroup, GroupKernel, PinnedGeneration (group.cpp).
void bind_hot_module_groups(nanobind::module_& m);

/// A smoke test that calls the Python callable `test` (borrowed: its owner outlives what runs
/// it) with the staged module as a StagedModule of the interface `names` (hot.cpp). What it
/// raises rejects the version, with the Python error's message as the cause.
[[nodiscard]] std::function<void(const module&)> python_smoke_test(PyObject* test,
                                                                   std::vector<std::string> names);
/// `policy` with its checks' kernel names resolved against the interface `kernel_names`
/// (resolve_kernel_name: "scale" for _Z5scalePfi), as stage_options::probation takes it
/// (probation.cpp). @throws error (errc::precondition) for a name that means several kernels.
[[nodiscard]] probation_policy probation_for(const probation_policy& policy,
                                             const std::vector<std::string>& kernel_names);
/// {'serving': ..., 'rollback_target': ... or None, 'retired': [...]}, as HotModule.versions.
[[nodiscard]] nanobind::dict versions_dict(const held_versions& v);

/// The context a Python argument names: a Context, PrimaryContext, GuestContext or ContextRef, or
/// None for the calling thread's current context (refused when there is none). Owning contexts
/// are kept alive by what is created in them. @throws error (errc::precondition) for anything
/// else.
[[nodiscard]] context_arg as_context(nanobind::handle context);
/// The guest's context, owning a share of the guest, when `object` is a GuestContext; else
/// nullopt (isolation.cpp).
[[nodiscard]] std::optional<context_arg> guest_context_arg(nanobind::handle object);

/// Device memory a Python object stands for: where it starts and how many bytes it spans.
struct device_range {
  std::uintptr_t address = 0;
  std::size_t bytes = 0;
};
/// The memory of a torch tensor (data_ptr, numel * element_size), a CuPy array (.data.ptr,
/// .nbytes), a DeviceView or SharedMemory, an object with __cuda_array_interface__ (its extent)
/// or a DLPack array in device memory. `what` names it in errors ("buffer 'input'").
/// @throws error (errc::precondition) for host memory and for objects of no such kind.
[[nodiscard]] device_range as_device_range(nanobind::handle array, const std::string& what);

/// The stream a Python object names: None (the legacy default stream), a cubridge.Stream, an
/// object with __cuda_stream__ (cuda.core, torch), a torch stream (.cuda_stream), a CuPy stream
/// (.ptr) or a handle as an int. @throws error (errc::precondition) for anything else.
[[nodiscard]] stream_ref as_stream(nanobind::handle stream);

/// A launch configuration as Python holds it: the stream object kept alive beside its handle.
struct py_launch_config {
  launch_config config;
  nanobind::object stream_object;
};
/// LaunchConfig(grid, block, stream=, shared_mem=, cluster=). @throws error (precondition)
[[nodiscard]] py_launch_config make_launch_config(nanobind::handle grid, nanobind::handle block,
                                                  nanobind::handle stream, unsigned shared_mem,
                                                  nanobind::handle cluster);

/// What a launch checks Python arguments against: the driver's parameter list and the types
/// the kernel's name spells (empty for extern "C" kernels).
struct launch_signature {
  std::string kernel_name;
  std::vector<parameter_info> parameters;
  std::vector<parameter_type> types;
};
[[nodiscard]] launch_signature signature_of(std::string name,
                                            std::span<const parameter_info> parameters);

/// The Python arguments `args` converted for the kernel of `signature` into `out` (cleared
/// first): tensors and arrays (torch, CuPy, __cuda_array_interface__, DLPack) as their device
/// address, ints, floats and bools as the parameter's type, numpy scalars and bytes as their
/// bytes. A __cuda_array_interface__ that names a stream makes `config`'s stream wait for it.
/// @throws launch_argument_error naming the kernel, the parameter and what was given.
void convert_arguments(const launch_signature& signature, std::span<PyObject* const> args,
                       const launch_config& config, kernel_arguments& out);
/// The items of a tuple, as convert_arguments takes them.
inline std::span<PyObject* const> items_of(const nanobind::tuple& t) {
  return {&PyTuple_GET_ITEM(t.ptr(), 0), static_cast<std::size_t>(PyTuple_GET_SIZE(t.ptr()))};
}

/// The argument list a launch converts into: one per thread, reused so that a launch allocates
/// nothing, and a fresh one for a launch made while converting another (a Python property
/// such as __cuda_array_interface__ may launch).
class launch_arguments {
 public:
  launch_arguments() noexcept : list_(busy_ ? own_ : reused_), nested_(busy_) { busy_ = true; }
  ~launch_arguments() { busy_ = nested_; }
  launch_arguments(const launch_arguments&) = delete;
  launch_arguments& operator=(const launch_arguments&) = delete;
  [[nodiscard]] kernel_arguments& get() noexcept { return list_; }

 private:
  static thread_local inline kernel_arguments reused_;
  static thread_local inline bool busy_ = false;
  kernel_arguments own_;
  kernel_arguments& list_;
  bool nested_;
};

/// `name(config, *args)` added to `cls` as a METH_FASTCALL method that calls
/// `launch(self, config, args)`: the launch path then skips nanobind's general dispatcher, which
/// builds an argument tuple per call. C++ exceptions become Python exceptions as elsewhere.
using fast_launch_function = PyObject* (*)(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
void add_fast_method(nanobind::handle cls, PyMethodDef& method);
/// Drops what the launch path remembers of the argument types it has seen (and the references
/// to them it holds). Called at interpreter exit; harmless at any time: types are looked at again.
void forget_array_protocols() noexcept;
/// The C++ object of `config`, a cubridge.LaunchConfig. @throws error (precondition) otherwise.
[[nodiscard]] const py_launch_config& launch_config_of(PyObject* config);
/// Sets the Python error for the exception being handled (what the translator raises).
void set_python_error(const std::exception_ptr& p) noexcept;

/// The body of every METH_FASTCALL launch, `who`(config, *args): `self` holds a `Held` (a
/// kernel `.k` and its `.signature`); args[0] is the config, the rest are converted and handed
/// with it to `launch(kernel, config, arguments)`, which launches and returns the Python result.
template <class Held, class Launch>
PyObject* fast_launch(PyObject* self, PyObject* const* args, Py_ssize_t nargs, const char* who,
                      Launch launch) noexcept {
  try {
    if (nargs < 1) [[unlikely]]
      detail::throw_errc(errc::precondition, who, "launch(config, *args) needs a config");
    const auto& held = *nanobind::inst_ptr<Held>(self);
    const auto& c = launch_config_of(args[0]);
    launch_arguments values;
    convert_arguments(held.signature, {args + 1, static_cast<std::size_t>(nargs - 1)}, c.config,
                      values.get());
    return launch(held.k, c.config, values.get());
  } catch (...) {
    set_python_error(std::current_exception());
    return nullptr;
  }
}

/// A kernel as Python holds it: the kernel and what its launches are checked against.
struct py_kernel {
  kernel k;
  launch_signature signature;
};
/// The kernel of `names` (a module's kernels, mangled) that `name` means: itself, or the one
/// C++ kernel whose unmangled name it is ("scale" for _Z5scalePfi, "ns::scale",
/// "scale<float>"). @throws error (errc::precondition) naming the candidates when several match.
[[nodiscard]] std::string resolve_kernel_name(const std::vector<std::string>& names,
                                              const std::string& name);
/// The kernel names an image holds (inspect_image), for resolve_kernel_name.
[[nodiscard]] std::vector<std::string> kernel_names_of(std::span<const std::byte> image);

/// Device memory seen from Python: an address, a size and what keeps it alive. Exposes
/// __cuda_array_interface__ (bytes), so torch.as_tensor and cupy.asarray wrap it in place.
struct device_view {
  std::uintptr_t address = 0;
  std::size_t bytes = 0;
  nanobind::object owner;
};

/// cubridge.SharedMemory: VMM memory (isolation.cpp). Shared: a sandbox's share of it holds the
/// memory too (sandbox.cpp), so the memory outlives every share of it.
struct py_shared_memory {
  std::shared_ptr<const shared_device_memory> memory;
};

/// An image as Python passes it: bytes-like (copied into `bytes`) or a path (read).
[[nodiscard]] std::vector<std::byte> image_bytes(nanobind::handle image);

/// "torch.Tensor": a Python object's type, for messages.
inline std::string type_name(PyObject* o) {
  return Py_TYPE(o)->tp_name;
}
/// A handle or address Python passes as an int. @throws nanobind's cast error if it is none.
inline std::uintptr_t int_of(nanobind::handle h) {
  return nanobind::cast<std::uintptr_t>(h);
}

/// The bytes of a Python bytes object, as the C++ API takes them (no copy).
inline std::span<const std::byte> byte_span(const nanobind::bytes& b) {
  return {static_cast<const std::byte*>(b.data()), b.size()};
}
/// A Python bytes object holding a copy of `data`.
inline nanobind::bytes to_bytes(std::span<const std::byte> data) {
  return nanobind::bytes(reinterpret_cast<const char*>(data.data()), data.size());
}

}  // namespace cubridge::python
