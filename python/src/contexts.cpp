// Devices, contexts, scoped_current, streams and launch configurations for Python. Contexts are
// context managers: `with ctx:` pushes the context on the calling thread and pops it after.
#include "bindings.hpp"

#include <cubridge/core/context.hpp>
#include <cubridge/core/device.hpp>
#include <cubridge/core/primary_context.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/stream.hpp>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace nb = nanobind;

namespace cubridge::python {
namespace {

std::uintptr_t handle_of(CUcontext c) {
  return reinterpret_cast<std::uintptr_t>(c);
}

/// `with cubridge.scoped_current(ctx):` as scoped_current does it in C++; reusable, not
/// re-entrant (the push belongs to one with-block on one thread).
class py_scoped_current {
 public:
  explicit py_scoped_current(context_arg ctx) : ctx_(std::move(ctx)) {}
  void enter() {
    CUBRIDGE_EXPECTS(current_ == nullptr, "scoped_current entered twice; use a new one");
    current_ = std::make_unique<scoped_current>(ctx_.ref());
  }
  void exit() { current_.reset(); }

 private:
  context_arg ctx_;  // keeps an owning context alive while pushed
  std::unique_ptr<scoped_current> current_;
};

/// The pushes of `with ctx:` blocks on this thread, innermost last: with-blocks nest, so
/// __exit__ pops the one its __enter__ pushed.
thread_local std::vector<std::unique_ptr<scoped_current>> with_blocks;

/// Context methods every context class shares, on top of its own.
template <class Class>
void bind_context_common(Class& c) {
  using T = typename Class::Type;
  c.def_prop_ro(
       "handle", [](const T& ctx) { return handle_of(ctx.ref().get()); },
       "The CUcontext as an int (what ctypes, cuda-python and others take).")
      .def_prop_ro(
          "device", [](const T& ctx) { return ctx.ref().device(); }, "The context's device.")
      .def_prop_ro(
          "id", [](const T& ctx) { return ctx.ref().id(); },
          "The driver's unique id of the context (cuCtxGetId).")
      .def(
          "synchronize", [](const T& ctx) { ctx.ref().synchronize(); },
          nb::call_guard<nb::gil_scoped_release>(), "Waits for all work in the context.")
      .def(
          "__enter__",
          [](nb::handle self) {
            with_blocks.push_back(std::make_unique<scoped_current>(as_context(self).ref()));
            return nb::borrow(self);
          },
          "Pushes the context on this thread (scoped_current) until the with-block ends.")
      .def(
          "__exit__",
          [](nb::handle, nb::args) {
            CUBRIDGE_EXPECTS(!with_blocks.empty(), "__exit__ without __enter__ on this thread");
            with_blocks.pop_back();
          },
          "Pops it, leaving the context stack as it was.")
      .def("__repr__", [](const T& ctx) { return "<cubridge " + ctx.ref().describe() + ">"; });
}

void bind_device(nb::module_& m) {
  nb::class_<device>(m, "Device", "A CUDA device (a CUdevice). Compare with ==.")
      .def(nb::new_([](int ordinal) { return device::get(ordinal); }), nb::arg("ordinal") = 0,
           "The device of `ordinal`. Raises Error for an ordinal out of range.")
      .def_prop_ro("ordinal", &device::ordinal, "The device's ordinal (0, 1, ...).")
      .def_prop_ro("name", &device::name, "The device's name ('NVIDIA H200').")
      .def_prop_ro(
          "compute_capability", [](const device& d) { return to_string(d.capability()); },
          "The architecture name, e.g. 'sm_90'.")
      .def_prop_ro("total_memory", &device::total_memory, "Bytes of device memory.")
      .def_prop_ro("multiprocessor_count", &device::multiprocessor_count,
                   "The number of streaming multiprocessors.")
      .def_prop_ro(
          "primary_context_active", [](const device& d) { return d.primary_state().active; },
          "True when the device's primary context is active (the runtime or torch made it).")
      .def("__eq__", [](const device& a, const device& b) { return a == b; })
      .def("__hash__", [](const device& d) { return d.ordinal(); })
      .def("__repr__", [](const device& d) {
        return "<cubridge.Device " + std::to_string(d.ordinal()) + " " + d.name() + ">";
      });
  m.def(
      "devices",
      [] {
        std::vector<device> all;
        for (int i = 0; i < device::count(); ++i) all.push_back(device::get(i));
        return all;
      },
      "Every CUDA device. Raises DriverUnavailable without a driver.");
}

void bind_contexts(nb::module_& m) {
  nb::class_<context_ref> ref(m, "ContextRef",
                              "A context made elsewhere (not owned): keep its owner alive.");
  ref.def_prop_ro(
         "handle", [](const context_ref& c) { return handle_of(c.get()); },
         "The CUcontext as an int.")
      .def_prop_ro("device", &context_ref::device, "The context's device.")
      .def_prop_ro("id", &context_ref::id, "The driver's unique id of the context.")
      .def("synchronize", &context_ref::synchronize, nb::call_guard<nb::gil_scoped_release>(),
           "Waits for all work in the context.")
      .def("__eq__", [](const context_ref& a, const context_ref& b) { return a == b; })
      .def("__repr__", [](const context_ref& c) { return "<cubridge " + c.describe() + ">"; });
  m.def(
      "current_context",
      []() -> std::optional<context_ref> {
        const auto c = context_ref::current();
        if (!c) return std::nullopt;
        return c;
      },
      "The calling thread's current context as a ContextRef, or None.");

  nb::class_<context> owned(m, "Context",
                            "An owned context (cuCtxCreate): the driver-first way. Runtime "
                            "calls, cuBLAS and torch kernels launched while it is current use it.");
  owned.def_static(
      "create", [](const device& d, unsigned flags) { return context::create(d, flags); },
      nb::arg("device"), nb::arg("flags") = 0u,
      "A new context on `device` (not made current). `flags` are cuCtxCreate's.");
  bind_context_common(owned);

  nb::class_<primary_context> primary(
      m, "PrimaryContext",
      "A retained reference to a device's primary context, the one the Runtime API, torch and "
      "CuPy use.");
  primary
      .def_static("retain", &primary_context::retain, nb::arg("device"),
                  "Retains `device`'s primary context (creating it if needed).")
      .def_static("adopt_runtime", &primary_context::adopt_runtime,
                  "The context the Runtime API (torch, CuPy) uses on this thread, retained; the "
                  "runtime is initialised first if nobody did. Raises Error if a driver context "
                  "is current instead.")
      .def_prop_ro("retained_id", &primary_context::retained_id,
                   "The context's id when it was retained.")
      .def_prop_ro("was_reset", &primary_context::was_reset,
                   "True when someone reset the primary context since (cudaDeviceReset).")
      .def("check_not_reset", &primary_context::check_not_reset,
           "Raises ContextResetError naming both ids if the context was reset.");
  bind_context_common(primary);

  nb::class_<py_scoped_current>(m, "scoped_current",
                                "with cubridge.scoped_current(ctx): pushes `ctx` for the block "
                                "and restores the caller's context stack after.")
      .def(nb::new_([](nb::handle ctx) { return py_scoped_current(as_context(ctx)); }),
           nb::arg("context"))
      .def("__enter__", [](py_scoped_current& s) { s.enter(); })
      .def("__exit__", [](py_scoped_current& s, nb::args) { s.exit(); });
}

void bind_streams(nb::module_& m) {
  nb::class_<stream>(m, "Stream",
                     "An owned stream (cuStreamCreate) in a context it keeps alive. Streams of "
                     "torch, CuPy and cuda.core work wherever cubridge takes a stream too.")
      .def(nb::new_([](nb::handle ctx, bool non_blocking) {
             return stream::create(as_context(ctx),
                                   non_blocking ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT);
           }),
           nb::arg("context") = nb::none(), nb::arg("non_blocking") = true,
           "A stream in `context` (default: the thread's current context).")
      .def_prop_ro(
          "handle", [](const stream& s) { return reinterpret_cast<std::uintptr_t>(s.get()); },
          "The CUstream as an int.")
      .def(
          "__cuda_stream__",
          [](const stream& s) {
            return std::make_tuple(0, reinterpret_cast<std::uintptr_t>(s.get()));
          },
          "(0, handle): the stream protocol of cuda.core and others.")
      .def("synchronize", &stream::synchronize, nb::call_guard<nb::gil_scoped_release>(),
           "Waits for the work queued so far.")
      .def_prop_ro("ready", &stream::ready, "True when all work queued so far is done.");
}

void bind_stream_destroy(nb::module_& m) {
  m.def(
      "before_stream_destroy",
      [](nb::handle s) {
        const auto ref = as_stream(s);
        CUBRIDGE_EXPECTS(!ref.is_legacy() && !ref.is_per_thread(),
                         "before_stream_destroy takes a stream that can be destroyed, not a "
                         "default stream");
        before_stream_destroy(ref.get());
      },
      nb::arg("stream").none(),
      "Call before a stream that hot kernels launched on is destroyed by its owner (a CuPy "
      "stream going out of scope, cudaStreamDestroy): the hot modules fence their work on it "
      "now, so that their old versions can still be unloaded. cubridge.Stream does this itself; "
      "torch's streams are pooled and never destroyed.");
}

void bind_launch_config(nb::module_& m) {
  nb::class_<py_launch_config>(
      m, "LaunchConfig",
      "Grid, block, dynamic shared memory, stream and cluster of a launch. Make one and reuse "
      "it: the stream is resolved here, not at every launch.")
      .def(nb::new_([](nb::handle grid, nb::handle block, nb::handle stream, unsigned shared_mem,
                       nb::handle cluster) {
             return make_launch_config(grid, block, stream, shared_mem, cluster);
           }),
           nb::arg("grid") = 1, nb::arg("block") = 1, nb::kw_only(), nb::arg("stream") = nb::none(),
           nb::arg("shared_mem") = 0u, nb::arg("cluster") = nb::none(),
           "grid, block, cluster: an int or a tuple of up to 3 ints. stream: None (the legacy "
           "default stream), a cubridge.Stream, a torch or CuPy stream, any object with "
           "__cuda_stream__, or a handle as an int.")
      .def_prop_ro(
          "grid",
          [](const py_launch_config& c) {
            return std::make_tuple(c.config.grid.x, c.config.grid.y, c.config.grid.z);
          },
          "(x, y, z) blocks.")
      .def_prop_ro(
          "block",
          [](const py_launch_config& c) {
            return std::make_tuple(c.config.block.x, c.config.block.y, c.config.block.z);
          },
          "(x, y, z) threads per block.")
      .def_prop_ro(
          "shared_mem", [](const py_launch_config& c) { return c.config.dynamic_shared_bytes; },
          "Dynamic shared memory in bytes.")
      .def_prop_ro(
          "stream", [](const py_launch_config& c) { return c.stream_object; },
          "The stream object it was made with (None: the legacy default stream).")
      .def("__repr__", [](const py_launch_config& c) {
        return "<cubridge.LaunchConfig " + c.config.describe() + ">";
      });
}

}  // namespace

void bind_contexts_and_streams(nb::module_& m) {
  bind_device(m);
  bind_contexts(m);
  bind_streams(m);
  bind_stream_destroy(m);
  bind_launch_config(m);
}

}  // namespace cubridge::python
