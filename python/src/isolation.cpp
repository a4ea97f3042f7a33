// Isolation for Python: guest contexts as context managers around calls into third-party
// libraries, and VMM memory that every context of the device and a sandbox's worker process
// can use (the sandbox itself: sandbox.cpp). Synchronising the guest releases the GIL.
#include "bindings.hpp"

#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/device.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/primary_context.hpp>
#include <cubridge/core/shared_device_memory.hpp>
#include <cubridge/isolation/guest_context.hpp>

#include <nanobind/stl/string.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace nb = nanobind;

namespace cubridge::python {
namespace {}  // namespace

mps_policy mps_policy_named(const std::string& name, const std::string& who) {
  for (const auto p : {mps_policy::allow, mps_policy::warn, mps_policy::refuse})
    if (name == to_string(p)) return p;
  detail::throw_errc(errc::precondition, who,
                     who + " option 'mps' must be 'allow', 'warn' or 'refuse', not '" + name + "'");
}

namespace {

device device_of(nb::handle d) {
  if (nb::isinstance<device>(d)) return nb::cast<device>(d);
  return device::get(nb::cast<int>(d));
}

// --- GuestContext -------------------------------------------------------------------------------

/// The guest context as an owner of its CUcontext, so that what Python creates in it (modules,
/// streams: as_context) keeps it alive, as for every other owning context.
class guest_owner final : public detail::context_owner {
 public:
  explicit guest_owner(guest_context g) : context_owner(g.ref().get()), guest(std::move(g)) {}
  guest_context guest;
};

struct py_guest_context {
  std::shared_ptr<guest_owner> owner;
  [[nodiscard]] guest_context& get() const { return owner->guest; }
};

/// A guest_scope on the heap (it can be neither moved nor copied; this initialises it in place).
struct held_scope {
  explicit held_scope(guest_context& g) : scope(g.enter()) {}
  guest_scope scope;
};

/// The `with guest:` blocks open on this thread, innermost last: with-blocks nest, so __exit__
/// leaves the one its __enter__ entered.
struct open_guest_block {
  std::shared_ptr<guest_owner> guest;
  std::unique_ptr<held_scope> scope;
};
thread_local std::vector<open_guest_block> guest_blocks;

void enter_guest(const py_guest_context& g) {
  guest_blocks.push_back({g.owner, std::make_unique<held_scope>(g.get())});
}

/// Leaves the innermost block; checks the host unless the block raised (as guest_context::call
/// does: the block's exception propagates, the stack is restored either way).
void exit_guest(const py_guest_context& g, nb::handle exc_type) {
  CUBRIDGE_EXPECTS(!guest_blocks.empty() && guest_blocks.back().guest == g.owner,
                   "GuestContext '" + g.get().name() +
                       "' left on a thread where it is not the innermost with-block");
  open_guest_block block = std::move(guest_blocks.back());
  guest_blocks.pop_back();
  if (!exc_type.is_none()) return;  // the scope's destructor restores the stack, unchecked
  nb::gil_scoped_release unlocked;  // leave() synchronises the guest context
  block.scope->scope.leave();
}

nb::object call_in_guest(const py_guest_context& g, nb::handle fn, const nb::args& args,
                         const nb::kwargs& kwargs) {
  guest_scope scope = g.get().enter();
  nb::object result = fn(*args, **kwargs);  // what it raises propagates; the scope restores
  {
    nb::gil_scoped_release unlocked;
    scope.leave();
  }
  return result;
}

// GuestContext's checks of the host state: watch, watch_primary, unwatch and check_host.
void bind_guest_checks(nb::class_<py_guest_context>& c) {
  c.def(
       "watch",
       [](const py_guest_context& g, std::string name, nb::handle array) {
         const auto range = as_device_range(array, "buffer '" + name + "'");
         g.get().watch(std::move(name), range.address, range.bytes);
       },
       nb::arg("name"), nb::arg("buffer"),
       "Watches a host buffer (a torch or CuPy tensor, DeviceView, SharedMemory, "
       "__cuda_array_interface__ or DLPack array): after each call it must still be the same "
       "allocation. Unwatch it before freeing it.")
      .def(
          "watch_primary",
          [](const py_guest_context& g, const primary_context& primary) { g.get().watch(primary); },
          nb::arg("primary"),
          "Watches a primary context: a reset (cudaDeviceReset) during a call is reported. "
          "Raises ContextResetError if it was reset already.")
      .def(
          "unwatch",
          [](const py_guest_context& g, nb::handle buffer) {
            const auto address = PyLong_Check(buffer.ptr())
                                     ? nb::cast<std::uintptr_t>(buffer)
                                     : as_device_range(buffer, "the buffer to unwatch").address;
            g.get().unwatch(address);
          },
          nb::arg("buffer"), "Stops watching a buffer (the object or its address).")
      .def(
          "check_host", [](const py_guest_context& g) { g.get().check_host(); },
          nb::call_guard<nb::gil_scoped_release>(),
          "Checks the watched host state now; raises GuestError naming what broke.");
}

// GuestContext's own state, as properties, and its repr.
void bind_guest_state(nb::class_<py_guest_context>& c) {
  c.def_prop_ro(
       "context", [](const py_guest_context& g) { return g.get().ref(); },
       "The guest's own context as a ContextRef (pass the GuestContext itself where a "
       "context is taken, to keep it alive).")
      .def_prop_ro(
          "name", [](const py_guest_context& g) { return g.get().name(); },
          "The name messages use.")
      .def_prop_ro(
          "device", [](const py_guest_context& g) { return g.get().device(); },
          "The guest context's device.")
      .def("__repr__", [](const py_guest_context& g) {
        return "<cubridge.GuestContext '" + g.get().name() + "' " + g.get().ref().describe() + ">";
      });
}

// GuestContext: creation, with-blocks and call; then its checks and its state.
void bind_guest_context(nb::module_& m) {
  nb::class_<py_guest_context> c(
      m, "GuestContext",
      "A context of its own for third-party CUDA code (cuCtxCreate), with the checks that say "
      "what a call broke in the host's state. `with guest:` runs the block with the guest's "
      "context current on this thread; leaving restores the caller's context stack exactly and "
      "raises GuestError for what the block broke (the watched primary context reset, a "
      "watched buffer gone, a sticky error) unless the block raised itself.");
  c.def(nb::new_([](nb::handle dev, std::string name, bool synchronize_after_call,
                    bool watch_active_primary, const std::string& mps) {
          guest_options options;
          options.name = std::move(name);
          options.synchronize_after_call = synchronize_after_call;
          options.watch_active_primary = watch_active_primary;
          options.mps = mps_policy_named(mps, "GuestContext");
          const device d = device_of(dev);
          nb::gil_scoped_release unlocked;
          auto guest = guest_context::create(d, std::move(options));
          return py_guest_context{std::make_shared<guest_owner>(std::move(guest))};
        }),
        nb::arg("device") = 0, nb::arg("name") = "guest", nb::kw_only(),
        nb::arg("synchronize_after_call") = true, nb::arg("watch_active_primary") = true,
        nb::arg("mps") = "warn",
        "A guest context on `device` (an ordinal or a Device). synchronize_after_call: "
        "wait for the work a call issued so that its faults show at that call. "
        "watch_active_primary: watch the device's primary context (torch's, CuPy's) if it "
        "is active now. mps: under NVIDIA MPS a guest context contains nothing: 'warn' "
        "(one line on stderr), 'refuse' (raise) or 'allow'.")
      .def(
          "__enter__",
          [](nb::handle self) {
            enter_guest(nb::cast<const py_guest_context&>(self));
            return nb::borrow(self);
          },
          "Makes the guest's context current on this thread (guest_scope) until the block ends.")
      .def(
          "__exit__",
          [](const py_guest_context& g, nb::handle exc_type, nb::handle, nb::handle) {
            exit_guest(g, exc_type);
          },
          nb::arg("exc_type").none(), nb::arg("exc_value").none(), nb::arg("traceback").none(),
          "Restores the caller's context stack; unless the block raised, checks the host and "
          "raises GuestError for what broke.")
      .def("call", &call_in_guest, nb::arg("fn"), nb::arg("args"), nb::arg("kwargs"),
           "fn(*args, **kwargs) with the guest context current; returns what fn returned. "
           "Raises GuestError for what the call broke; what fn raises propagates unchecked.");
  bind_guest_checks(c);
  bind_guest_state(c);
}

// --- SharedMemory -------------------------------------------------------------------------------

void bind_shared_memory(nb::module_& m) {
  nb::class_<py_shared_memory>(
      m, "SharedMemory",
      "Device memory every context of the device can use (VMM), and with exportable=True "
      "also a sandbox's worker process. Wrap it in place with torch.as_tensor(memory, "
      "device='cuda') or cupy.asarray(memory) (bytes; .view() them as another dtype).")
      .def(nb::new_([](std::size_t nbytes, nb::handle dev, bool exportable) {
             CUBRIDGE_EXPECTS(nbytes > 0, "SharedMemory of 0 bytes");
             const device d = device_of(dev);
             nb::gil_scoped_release unlocked;
             return py_shared_memory{
                 std::make_shared<const shared_device_memory>(shared_device_memory::allocate(
                     d, nbytes, exportable ? memory_export::posix_fd : memory_export::none))};
           }),
           nb::arg("nbytes"), nb::arg("device") = 0, nb::arg("exportable") = true,
           "At least `nbytes` on `device` (rounded up to the allocation granularity, often "
           "2 MiB: see .nbytes). exportable: can be shared with a Sandbox.")
      .def_prop_ro(
          "address", [](const py_shared_memory& s) { return s.memory->address(); },
          "The device address.")
      .def_prop_ro(
          "nbytes", [](const py_shared_memory& s) { return s.memory->size_bytes(); },
          "Bytes mapped (the request rounded up to the granularity).")
      .def_prop_ro(
          "device", [](const py_shared_memory& s) { return s.memory->device(); },
          "The device the memory is on.")
      .def_prop_ro(
          "exportable",
          [](const py_shared_memory& s) {
            return s.memory->exportable() == memory_export::posix_fd;
          },
          "True when a Sandbox can map it in its worker.")
      .def_prop_ro("__cuda_array_interface__",
                   [](const py_shared_memory& s) {
                     nb::dict d;
                     d["shape"] = nb::make_tuple(s.memory->size_bytes());
                     d["typestr"] = "|u1";
                     d["data"] = nb::make_tuple(s.memory->address(), false);
                     d["version"] = 3;
                     d["strides"] = nb::none();
                     d["stream"] = nb::none();
                     return d;
                   })
      .def("__repr__", [](const py_shared_memory& s) {
        return "<cubridge.SharedMemory " + std::to_string(s.memory->size_bytes()) +
               " bytes on device " + std::to_string(s.memory->device().ordinal()) + ">";
      });
}

}  // namespace

std::optional<context_arg> guest_context_arg(nb::handle object) {
  if (!nb::isinstance<py_guest_context>(object)) return std::nullopt;
  const auto& g = nb::cast<const py_guest_context&>(object);
  return context_arg(g.get().ref(), g.owner);
}

void bind_isolation(nb::module_& m) {
  bind_guest_context(m);
  bind_shared_memory(m);
}

}  // namespace cubridge::python
