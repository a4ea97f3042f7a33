// The out-of-process sandbox for Python: a library's entry points called in a worker process,
// with SharedMemory (isolation.cpp) mapped there. Starting and calling the worker release the
// GIL; what the C++ side uses meanwhile are C++ objects held by shared_ptr, never Python
// objects, so nothing is dropped without the GIL.
#include "bindings.hpp"

#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/shared_device_memory.hpp>
#include <cubridge/isolation/sandbox.hpp>

#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace nb = nanobind;

namespace cubridge::python {
namespace {

double milliseconds(std::chrono::nanoseconds d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

std::filesystem::path path_of(nb::handle p) {
  const nb::object text = nb::steal(PyOS_FSPath(p.ptr()));
  if (!text.is_valid()) throw nb::python_error();
  if (PyBytes_Check(text.ptr())) return std::string(PyBytes_AS_STRING(text.ptr()));
  return nb::cast<std::string>(text);
}

template <class T>
T option_value(nb::handle value, const char* name, const char* type) {
  T out{};
  if (!nb::try_cast(value, out))
    detail::throw_errc(errc::precondition, "cubridge.Sandbox",
                       std::string("option '") + name + "' must be " + type + ", not " +
                           Py_TYPE(value.ptr())->tp_name);
  return out;
}

std::chrono::milliseconds timeout_value(nb::handle value, const char* name) {
  const auto ms = option_value<long long>(value, name, "an int (milliseconds)");
  CUBRIDGE_EXPECTS(ms > 0, std::string("Sandbox option '") + name + "' must be > 0");
  return std::chrono::milliseconds(ms);
}

/// The Sandbox's keyword options and the sandbox_options field each sets: the one place to add
/// a field (the signature and the docstring are made from this table).
struct sandbox_option {
  const char* name;
  const char* signature;  // as Python spells its type and default
  void (*set)(sandbox_options&, nb::handle);
};
const sandbox_option sandbox_option_table[] = {
    {"worker", "worker: str | os.PathLike[str] | None = None",
     [](sandbox_options& o, nb::handle v) {
       if (!v.is_none()) o.worker = path_of(v);
     }},
    {"name", "name: str = ''",
     [](sandbox_options& o, nb::handle v) {
       o.name = option_value<std::string>(v, "name", "a str");
     }},
    {"call_timeout_ms", "call_timeout_ms: int = 30000",
     [](sandbox_options& o, nb::handle v) {
       o.call_timeout = timeout_value(v, "call_timeout_ms");
     }},
    {"start_timeout_ms", "start_timeout_ms: int = 60000",
     [](sandbox_options& o, nb::handle v) {
       o.start_timeout = timeout_value(v, "start_timeout_ms");
     }},
    {"device", "device: int = 0",
     [](sandbox_options& o, nb::handle v) { o.device = option_value<int>(v, "device", "an int"); }},
    {"initialize_cuda", "initialize_cuda: bool = True",
     [](sandbox_options& o, nb::handle v) {
       o.initialize_cuda = option_value<bool>(v, "initialize_cuda", "a bool");
     }},
    {"workers", "workers: int = 1",
     [](sandbox_options& o, nb::handle v) {
       o.workers = option_value<std::size_t>(v, "workers", "an int >= 1");
     }},
    {"standby", "standby: int = 1",
     [](sandbox_options& o, nb::handle v) {
       o.standby = option_value<std::size_t>(v, "standby", "an int >= 0");
     }},
    {"reset_guard", "reset_guard: bool = False",
     [](sandbox_options& o, nb::handle v) {
       o.environment.reset_guard = option_value<bool>(v, "reset_guard", "a bool");
     }},
    {"inherit_preload", "inherit_preload: bool = False",
     [](sandbox_options& o, nb::handle v) {
       o.environment.inherit_preload = option_value<bool>(v, "inherit_preload", "a bool");
     }},
    {"environment", "environment: dict[str, str] = {}",
     [](sandbox_options& o, nb::handle v) {
       for (const auto& [name, value] : option_value<std::map<std::string, std::string>>(
                v, "environment", "a dict of str to str"))
         o.environment.variables.push_back(name + "=" + value);
     }},
    {"mps", "mps: str = 'warn'",
     [](sandbox_options& o, nb::handle v) {
       o.mps = mps_policy_named(option_value<std::string>(v, "mps", "'allow', 'warn' or 'refuse'"),
                                "Sandbox");
     }},
};

const char* sandbox_signature() {
  static const std::string text = [] {
    std::string s = "def __init__(self, library: str | os.PathLike[str], *";
    for (const auto& o : sandbox_option_table) s += std::string(", ") + o.signature;
    return s + ") -> None";
  }();
  return text.c_str();
}

/// The worker packed beside the extension module (python/CMakeLists.txt), unless
/// $CUBRIDGE_SANDBOX_WORKER names one; empty: sandbox::default_worker() decides.
std::filesystem::path packaged_worker() {
  if (const char* env = std::getenv("CUBRIDGE_SANDBOX_WORKER"); env && *env) return {};
  const auto module_file =
      nb::cast<std::string>(nb::module_::import_("cubridge._cubridge").attr("__file__"));
  auto worker = std::filesystem::path(module_file).parent_path() / "cubridge-sandbox-worker";
  if (::access(worker.c_str(), X_OK) != 0) return {};
  return worker;
}

sandbox_options sandbox_options_of(nb::handle library, const nb::kwargs& given) {
  sandbox_options options;
  options.library = path_of(library);
  for (const auto& [key, value] : given) {
    const auto name = nb::cast<std::string>(key);
    const sandbox_option* field = nullptr;
    for (const auto& o : sandbox_option_table)
      if (name == o.name) field = &o;
    if (!field) {
      std::string known;
      for (const auto& o : sandbox_option_table)
        known += (known.empty() ? "" : ", ") + std::string(o.name);
      detail::throw_errc(errc::precondition, "cubridge.Sandbox",
                         "no option '" + name + "' (the options: " + known + ")");
    }
    field->set(options, value);
  }
  if (options.worker.empty()) options.worker = packaged_worker();
  return options;
}

/// A Sandbox as Python holds it. The sandbox and the shares are shared_ptrs that a call copies
/// before it releases the GIL, so that close() or unshare() from another thread meanwhile
/// leaves the running call what it uses.
class py_sandbox {
 public:
  explicit py_sandbox(sandbox_options options) {
    nb::gil_scoped_release unlocked;
    box_ = std::make_shared<sandbox>(sandbox::start(std::move(options)));
  }
  py_sandbox(const py_sandbox&) = delete;
  py_sandbox& operator=(const py_sandbox&) = delete;
  ~py_sandbox() { close(); }

  std::pair<int, nb::bytes> call(const std::string& entry, nb::handle request, nb::handle buffers,
                                 std::size_t reply_capacity, long long timeout_ms) {
    CUBRIDGE_EXPECTS(timeout_ms >= 0, "Sandbox.call timeout_ms must be >= 0 (0: the default)");
    const auto box = live();
    const auto bytes = request_bytes(request);
    std::vector<std::shared_ptr<share_entry>> used;
    if (nb::isinstance<py_shared_memory>(buffers)) {
      used.push_back(share_of(box, buffers, 0));
    } else {
      for (nb::handle b : buffers) used.push_back(share_of(box, b, used.size()));
    }
    sandbox_request r{.bytes = bytes,
                      .reply_capacity = reply_capacity,
                      .timeout = std::chrono::milliseconds(timeout_ms)};
    for (const auto& u : used) r.buffers.emplace_back(u->share);
    sandbox_reply reply;
    {
      nb::gil_scoped_release unlocked;
      reply = box->call(entry, r);
    }
    return {reply.status, to_bytes(reply.bytes)};
  }

  /// Ends `memory`'s share now (it is unmapped in the worker once no call uses it).
  void unshare(const py_shared_memory& memory) {
    std::shared_ptr<share_entry> ended;
    if (const auto it = shares_.find(memory.memory.get()); it != shares_.end()) {
      ended = std::move(it->second);
      shares_.erase(it);
    }
    nb::gil_scoped_release unlocked;
    ended.reset();
  }

  void restart() {
    const auto box = live();
    nb::gil_scoped_release unlocked;
    box->restart();
  }

  /// Ends every share and the worker; waits for a call in flight on another thread.
  void close() {
    auto shares = std::move(shares_);
    shares_.clear();
    auto box = std::move(box_);
    nb::gil_scoped_release unlocked;
    shares.clear();
    box.reset();
  }

  [[nodiscard]] bool closed() const { return box_ == nullptr; }
  /// A property of the running sandbox, read without the GIL (the sandbox's lock may be held
  /// by a call on another thread).
  template <class F>
  auto read(F f) const {
    const auto box = live();
    nb::gil_scoped_release unlocked;
    return f(*box);
  }

 private:
  struct share_entry {
    std::shared_ptr<const shared_device_memory> memory;  // declared first: outlives the share
    sandbox_share share;
  };

  std::shared_ptr<sandbox> live() const {
    CUBRIDGE_EXPECTS(box_ != nullptr, "the Sandbox is closed");
    return box_;
  }

  static std::vector<std::byte> request_bytes(nb::handle request) {
    Py_buffer view;
    if (PyObject_GetBuffer(request.ptr(), &view, PyBUF_SIMPLE) != 0) {
      PyErr_Clear();
      detail::throw_errc(
          errc::precondition, "Sandbox.call",
          std::string("the request must be bytes-like, not ") + Py_TYPE(request.ptr())->tp_name);
    }
    const auto* data = static_cast<const std::byte*>(view.buf);
    std::vector<std::byte> copy(data, data + view.len);  // the GIL is released while it is sent
    PyBuffer_Release(&view);
    return copy;
  }

  /// The share of a SharedMemory, made on its first use and kept for the Sandbox's life (the
  /// worker maps it once, and again after each restart).
  std::shared_ptr<share_entry> share_of(const std::shared_ptr<sandbox>& box, nb::handle buffer,
                                        std::size_t index) {
    if (!nb::isinstance<py_shared_memory>(buffer)) refuse_buffer(buffer, index);
    const auto& memory = nb::cast<const py_shared_memory&>(buffer).memory;
    if (const auto it = shares_.find(memory.get()); it != shares_.end()) return it->second;
    std::shared_ptr<share_entry> made;
    {
      nb::gil_scoped_release unlocked;
      made = std::make_shared<share_entry>(share_entry{memory, box->share(*memory)});
    }
    // Another thread may have shared it meanwhile: keep the first share.
    return shares_.try_emplace(memory.get(), std::move(made)).first->second;
  }

  [[noreturn]] static void refuse_buffer(nb::handle buffer, std::size_t index) {
    const nb::handle t(reinterpret_cast<PyObject*>(Py_TYPE(buffer.ptr())));
    const auto module = nb::cast<std::string>(nb::str(nb::getattr(t, "__module__", nb::str(""))));
    const auto name = nb::cast<std::string>(nb::str(t.attr("__qualname__")));
    const std::string type = module.empty() || module == "builtins" ? name : module + "." + name;
    const bool array = nb::hasattr(buffer, "data_ptr") ||
                       nb::hasattr(buffer, "__cuda_array_interface__") ||
                       nb::hasattr(buffer, "__dlpack__");
    const std::string head = "buffer " + std::to_string(index) + " is a " + type;
    if (!array)
      detail::throw_errc(errc::precondition, "Sandbox.call",
                         "buffer " + std::to_string(index) + " is of type " + type +
                             ": pass cubridge.SharedMemory objects as buffers");
    detail::throw_errc(
        errc::precondition, "Sandbox.call",
        head +
            ", whose memory cannot be exported to the sandbox's worker process (torch and "
            "CuPy allocate with cudaMalloc, which no other process can map): allocate a "
            "cubridge.SharedMemory(nbytes), work on it through torch.as_tensor(memory, "
            "device='cuda') or cupy.asarray(memory), and pass the SharedMemory itself");
  }

  std::shared_ptr<sandbox> box_;
  std::map<const shared_device_memory*, std::shared_ptr<share_entry>> shares_;
};

// The Sandbox class's docstring, naming every option of sandbox_option_table.
const std::string& sandbox_doc() {
  static const std::string doc = [] {
    std::string d =
        "Runs a shared library in a worker process and calls its entry points "
        "(sandbox_entry.hpp): a crash, abort, hang, CUDA fault or device reset there ends only "
        "the worker and raises SandboxError; a ready spare takes its place (standby), or a "
        "fresh worker is started. The host's contexts and memory are untouched. workers: calls "
        "in parallel; environment: variables set in the worker, which does not inherit the "
        "host's LD_PRELOAD unless inherit_preload; mps: what start does under MPS. Options:";
    for (const auto& o : sandbox_option_table) d += std::string(" ") + o.signature + ";";
    return d +
           " worker None: the worker packed with cubridge (or $CUBRIDGE_SANDBOX_WORKER). "
           "A context manager; close() ends the worker. Raises SandboxError(reason="
           "'start_failed') when the worker cannot start or load the library.";
  }();
  return doc;
}

// The Sandbox's workers: its state as properties, and wait_for_standby.
void bind_sandbox_state(nb::class_<py_sandbox>& c) {
  c.def_prop_ro("closed", &py_sandbox::closed, "True after close().")
      .def_prop_ro(
          "worker_pid",
          [](const py_sandbox& s) {
            return s.read([](const sandbox& b) { return b.worker_pid(); });
          },
          "The worker's process id (0 while none runs).")
      .def_prop_ro(
          "restarts",
          [](const py_sandbox& s) { return s.read([](const sandbox& b) { return b.restarts(); }); },
          "Workers started after the first one.")
      .def_prop_ro(
          "last_start_ms",
          [](const py_sandbox& s) {
            return s.read([](const sandbox& b) { return milliseconds(b.last_start_duration()); });
          },
          "How long the latest worker took to start, in milliseconds.")
      .def_prop_ro(
          "worker_cuda_status",
          [](const py_sandbox& s) {
            return s.read([](const sandbox& b) { return b.worker_cuda_status(); });
          },
          "What the worker said about CUDA at start: '' when initialised (or not asked for).")
      .def_prop_ro(
          "name",
          [](const py_sandbox& s) { return s.read([](const sandbox& b) { return b.name(); }); },
          "The name messages use (the library's file name unless given).")
      .def_prop_ro(
          "stats",
          [](const py_sandbox& s) {
            const auto st = s.read([](const sandbox& b) { return b.stats(); });
            nb::dict d;
            d["workers"] = st.workers;
            d["busy"] = st.busy;
            d["spares_ready"] = st.spares_ready;
            d["spares_starting"] = st.spares_starting;
            d["failures"] = st.failures;
            d["failovers"] = st.failovers;
            d["restarts"] = st.restarts;
            d["spares_started"] = st.spares_started;
            d["spare_start_failures"] = st.spare_start_failures;
            d["worker_pids"] = nb::cast(st.worker_pids);
            d["spare_pids"] = nb::cast(st.spare_pids);
            return d;
          },
          "Workers alive and busy, spares ready and starting, failures, failovers (a spare took "
          "over), restarts (a start in a caller's path), and the pids, as a dict.")
      .def(
          "wait_for_standby",
          [](const py_sandbox& s, double timeout_s) {
            const auto timeout = std::chrono::milliseconds(static_cast<long long>(timeout_s * 1e3));
            return s.read([timeout](const sandbox& b) { return b.wait_for_standby(timeout); });
          },
          nb::arg("timeout_s") = 30.0,
          "Waits until every spare is ready (at start-up, before taking traffic); False if the "
          "timeout passed first.");
}

}  // namespace

void bind_sandbox(nb::module_& m) {
  nb::class_<py_sandbox> c(m, "Sandbox", sandbox_doc().c_str());
  c.def(
       "__init__",
       [](py_sandbox* self, nb::handle library, const nb::kwargs& options) {
         new (self) py_sandbox(sandbox_options_of(library, options));
       },
       nb::arg("library"), nb::arg("options"), nb::sig(sandbox_signature()))
      .def("call", &py_sandbox::call, nb::arg("entry"),
           nb::arg("request").sig("b''") = nb::bytes(""), nb::arg("buffers") = nb::tuple(),
           nb::arg("reply_capacity") = std::size_t{65536}, nb::arg("timeout_ms") = 0,
           "Calls `entry` in the worker: returns (status, reply bytes). buffers: SharedMemory "
           "objects (exportable), handed to the entry as args->buffers in order; each is shared "
           "on its first use and stays shared until unshare() or close(). timeout_ms: 0 for "
           "the sandbox's call_timeout_ms. Raises SandboxError (.reason, .restarted, "
           ".restart_ms) and PreconditionError for a buffer that cannot be shared.")
      .def("unshare", &py_sandbox::unshare, nb::arg("memory"),
           "Ends the share of a SharedMemory (unmapped in the worker); no effect if not shared.")
      .def("restart", &py_sandbox::restart, "Kills the worker and starts a fresh one.")
      .def("close", &py_sandbox::close, "Ends the shares and the worker. Idempotent.")
      .def(
          "__enter__", [](nb::handle self) { return nb::borrow(self); }, "Returns the Sandbox.")
      .def(
          "__exit__", [](py_sandbox& s, nb::handle, nb::handle, nb::handle) { s.close(); },
          nb::arg("exc_type").none(), nb::arg("exc_value").none(), nb::arg("traceback").none(),
          "close().");
  bind_sandbox_state(c);
}

}  // namespace cubridge::python
