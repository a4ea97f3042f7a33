// Hot modules for Python: stage (with a smoke test written in Python, or on probation), promote,
// rollback, stats, and reloading from a watched directory. Launches hold the GIL (they take
// microseconds); staging, promoting and rolling back release it, so Python threads keep launching
// meanwhile.
#include "bindings.hpp"

#include <cubridge/core/image.hpp>
#include <cubridge/swap/hot_module.hpp>
#include <cubridge/swap/hot_reload.hpp>

#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace nb = nanobind;

namespace cubridge::python {
namespace {

struct py_hot_kernel {
  hot_kernel k;
  launch_signature signature;
};

/// The staged module as a smoke test sees it; usable only while the test runs.
struct staged_module {
  const module* loaded = nullptr;
  std::vector<std::string> kernel_names;

  [[nodiscard]] const module& get() const {
    CUBRIDGE_EXPECTS(loaded != nullptr,
                     "the staged module of a smoke test is usable only while the test runs");
    return *loaded;
  }
};

py_hot_module load_hot(std::string name, nb::handle image, nb::handle ctx, std::uint64_t label) {
  const auto bytes = image_bytes(image);
  const auto where = as_context(ctx);
  auto names = kernel_names_of(bytes);
  hot_module_options options;
  options.origin.label = label;
  nb::gil_scoped_release unlocked;
  return {hot_module::load(where, std::move(name), bytes, std::move(options)), std::move(names)};
}

staged_version stage(const py_hot_module& h, nb::handle image, nb::handle smoke_test,
                     std::string source_name, std::vector<std::string> carry_globals,
                     const probation_policy* probation) {
  const auto bytes = image_bytes(image);
  stage_options options;
  options.source_name = std::move(source_name);
  options.carry_globals = std::move(carry_globals);
  if (!smoke_test.is_none())
    options.smoke_test = python_smoke_test(smoke_test.ptr(), h.kernel_names);
  if (probation) options.probation = probation_for(*probation, h.kernel_names);
  // Without the GIL: a probation waits for launches that Python threads may be making.
  nb::gil_scoped_release unlocked;
  const auto info = inspect_image(bytes);
  return h.hot.stage(bytes, info, options);
}

/// HotKernel.launch(config, *args), METH_FASTCALL (add_fast_method).
PyObject* launch_hot(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return fast_launch<py_hot_kernel>(
      self, args, nargs, "HotKernel.launch",
      [](const hot_kernel& k, const launch_config& c, const kernel_arguments& values) {
        return PyLong_FromUnsignedLongLong(k.launch(c, values));
      });
}

/// HotKernel.capture(config, *args), METH_FASTCALL (add_fast_method).
PyObject* capture_hot(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return fast_launch<py_hot_kernel>(
      self, args, nargs, "HotKernel.capture",
      [](const hot_kernel& k, const launch_config& c, const kernel_arguments& values) {
        return PyLong_FromUnsignedLongLong(k.capture(c, values));
      });
}

PyMethodDef capture_hot_method{
    "capture", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&capture_hot)),
    METH_FASTCALL,
    "capture($self, config, /, *args)\n--\n\n"
    "As launch, into the stream capture config.stream is under (torch.cuda.graph): the node it "
    "adds is remembered, so that HotModule.track_graph of the graph follows it whatever version "
    "serves by then. Returns the id of the version captured. Raises PreconditionError if the "
    "stream is not capturing."};

PyMethodDef launch_hot_method{
    "launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&launch_hot)),
    METH_FASTCALL,
    "launch($self, config, /, *args)\n--\n\n"
    "As Kernel.launch, on the serving version; returns the id of the version that ran. The "
    "per-thread default stream is refused (its work could not be fenced)."};

/// A watched directory feeding a hot module; stops when closed, or when collected.
class py_hot_reloader {
 public:
  py_hot_reloader(nb::object target, const std::string& directory, nb::object smoke_test,
                  nb::object on_promoted, nb::object on_refused, unsigned debounce_ms,
                  std::vector<std::string> options)
      : target_(std::move(target)),
        smoke_test_(std::move(smoke_test)),
        on_promoted_(std::move(on_promoted)),
        on_refused_(std::move(on_refused)) {
    hot_reloader::options o;
    o.debounce = std::chrono::milliseconds(debounce_ms);
    o.compile.extra_options = std::move(options);
    auto& hot = nb::cast<py_hot_module&>(target_);
    if (!smoke_test_.is_none())
      o.stage.smoke_test = python_smoke_test(smoke_test_.ptr(), hot.kernel_names);
    // Raw pointers: the objects are ours and outlive the reloader (close() ends it first).
    if (!on_promoted_.is_none())
      o.on_promoted = [f = on_promoted_.ptr()](const std::filesystem::path& p, std::uint64_t id) {
        nb::gil_scoped_acquire locked;
        call_reporting(f, nb::str(p.string().c_str()), nb::int_(id));
      };
    if (!on_refused_.is_none())
      o.on_refused = [f = on_refused_.ptr()](const std::filesystem::path& p, std::exception_ptr e) {
        nb::gil_scoped_acquire locked;
        call_reporting(f, nb::str(p.string().c_str()), python_exception(e));
      };
    nb::gil_scoped_release unlocked;
    reloader_ = std::make_unique<hot_reloader>(hot.hot, directory, std::move(o));  // a handle
  }
  py_hot_reloader(const py_hot_reloader&) = delete;
  py_hot_reloader& operator=(const py_hot_reloader&) = delete;
  ~py_hot_reloader() { close(); }

  /// Stops watching; waits for a file being handled (its callbacks may need the GIL).
  void close() {
    if (!reloader_) return;
    nb::gil_scoped_release unlocked;
    reloader_.reset();
  }

 private:
  /// A callback's exception cannot reach anyone on the watcher thread: Python prints it.
  static void call_reporting(PyObject* f, nb::handle a, nb::handle b) {
    try {
      nb::handle fn(f);
      fn(a, b);
    } catch (nb::python_error& e) {
      e.discard_as_unraisable(f);
    }
  }

  nb::object target_;  // the HotModule, for its kernel names (the reloader holds the module)
  nb::object smoke_test_, on_promoted_, on_refused_;
  std::unique_ptr<hot_reloader> reloader_;
};

void bind_staged(nb::module_& m) {
  nb::class_<staged_module>(m, "StagedModule",
                            "The module a smoke test checks, before it can serve.")
      .def(
          "get_kernel",
          [](const staged_module& s, const std::string& name) {
            auto k = s.get().get_kernel(resolve_kernel_name(s.kernel_names, name));
            auto signature = signature_of(k.name(), k.parameters());
            return py_kernel{std::move(k), std::move(signature)};
          },
          nb::arg("name"), "A kernel of the staged version, to launch on probe data.")
      .def_prop_ro(
          "kernel_names", [](const staged_module& s) { return s.kernel_names; },
          "The interface's kernel names.");
  nb::class_<staged_version>(m, "StagedVersion",
                             "A version loaded and validated, not serving yet: promote it or "
                             "drop it (dropping unloads it).")
      .def_prop_ro(
          "source", [](const staged_version& v) { return v.origin().source; },
          "Where it came from (stage's source_name).");
  nb::class_<hot_module_stats>(m, "HotModuleStats", "A hot module's counters at one instant.")
      .def_ro("current_id", &hot_module_stats::current_id,
              "The serving version's id (1 for the first, +1 per promote; rollback returns to an "
              "older id).")
      .def_ro("promotions", &hot_module_stats::promotions,
              "Switches to another version (promote and rollback).")
      .def_ro("rollbacks", &hot_module_stats::rollbacks, "Rollbacks that switched.")
      .def_ro("rejected", &hot_module_stats::rejected, "Versions refused by stage or promote.")
      .def_ro("retired_waiting", &hot_module_stats::retired_waiting,
              "Old versions not unloaded yet (pinned, or their GPU work not done).")
      .def_ro("unloaded", &hot_module_stats::unloaded, "Versions unloaded so far.")
      .def_ro("reclaim_failures", &hot_module_stats::reclaim_failures,
              "Failures on the unload path so far.")
      .def_ro("last_reclaim_failure", &hot_module_stats::last_reclaim_failure,
              "The latest of them, '' if none.");
}

void bind_hot_kernel(nb::module_& m) {
  auto cls =
      nb::class_<py_hot_kernel>(m, "HotKernel",
                                "A kernel of a hot module: every launch runs the version serving "
                                "at that moment and returns its id.")
          .def_prop_ro(
              "name", [](const py_hot_kernel& k) { return k.k.name(); },
              "The name the image exports (mangled for C++ kernels).");
  add_fast_method(cls, launch_hot_method);
  add_fast_method(cls, capture_hot_method);
}

}  // namespace

/// A smoke test that calls the Python callable `test` (borrowed: its owner outlives the
/// stage() or the reloader that runs it) with the staged module. What it raises rejects the
/// version, with the Python error's message as the cause.
std::function<void(const module&)> python_smoke_test(PyObject* test,
                                                     std::vector<std::string> names) {
  return [test, names = std::move(names)](const module& m) {
    nb::gil_scoped_acquire locked;
    nb::object view = nb::cast(staged_module{&m, names});
    std::string failure;
    try {
      nb::handle fn(test);
      fn(view);
    } catch (nb::python_error& e) {
      failure = e.what();
    }
    nb::cast<staged_module&>(view).loaded = nullptr;
    if (!failure.empty()) throw std::runtime_error("the Python smoke test raised " + failure);
  };
}

namespace {
nb::dict held(const held_version& v) {
  nb::dict d;
  d["id"] = v.id;
  d["label"] = v.origin.label;
  d["signer"] = v.origin.signer;
  d["source"] = v.origin.source;
  d["staged_at"] = std::chrono::duration<double>(v.origin.staged_at.time_since_epoch()).count();
  return d;
}

}  // namespace

nb::dict versions_dict(const held_versions& v) {
  nb::dict d;
  d["serving"] = held(v.serving);
  d["rollback_target"] = v.rollback_target ? nb::object(held(*v.rollback_target)) : nb::none();
  nb::list retired;
  for (const auto& r : v.retired) retired.append(held(r));
  d["retired"] = retired;
  return d;
}

namespace {

// HotReloader: the watcher HotModule.reload_from returns.
void bind_hot_reloader(nb::module_& m) {
  nb::class_<py_hot_reloader>(m, "HotReloader",
                              "Promotes every good file dropped into a directory (.cu, .ptx, "
                              ".cubin, .fatbin). A context manager; close() stops it.")
      .def("close", &py_hot_reloader::close, "Stops watching (waits for a file being handled).")
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__exit__", [](py_hot_reloader& r, nb::args) { r.close(); });
}

// HotModule's serving state: stats, versions, name, context and read_global.
void bind_hot_module_state(nb::class_<py_hot_module>& c) {
  c.def_prop_ro(
       "stats", [](const py_hot_module& h) { return h.hot.stats(); },
       "The counters (HotModuleStats).")
      .def_prop_ro(
          "versions", [](const py_hot_module& h) { return versions_dict(h.hot.versions()); },
          "{'serving': ..., 'rollback_target': ... or None, 'retired': [...]}: each "
          "version's id, label (its bundle version, 0: none), signer (the signing key's id), "
          "source and staged_at.")
      .def_prop_ro(
          "name", [](const py_hot_module& h) { return h.hot.name(); }, "The module's name.")
      .def_prop_ro(
          "context", [](const py_hot_module& h) { return h.hot.context(); },
          "The context it is loaded into (a ContextRef).")
      .def(
          "read_global",
          [](const py_hot_module& h, const std::string& name, std::size_t nbytes) {
            std::vector<std::byte> out(nbytes);
            h.hot.read_global(name, out);
            return to_bytes(out);
          },
          nb::arg("name"), nb::arg("nbytes"),
          "The serving version's __device__ variable `name` (nbytes long) as bytes.");
}

// HotModule's CUDA graphs: track, untrack, launch (or replay through a callable) and list.
void bind_hot_module_graphs(nb::class_<py_hot_module>& c) {
  c.def(
       "track_graph",
       [](py_hot_module& h, std::uintptr_t graph, std::uintptr_t exec, const std::string& name) {
         nb::gil_scoped_release unlocked;
         h.hot.track_graph(reinterpret_cast<CUgraph>(graph), reinterpret_cast<CUgraphExec>(exec),
                           name);
       },
       nb::arg("graph"), nb::arg("exec"), nb::arg("name") = "",
       "Follows an instantiated CUDA graph (handles as ints: torch's raw_cuda_graph() and "
       "raw_cuda_graph_exec()): the nodes HotKernel.capture added to it, and nodes launching "
       "the serving version, are pointed at the serving version now and after every promote "
       "and rollback. `name` names it in errors.")
      .def(
          "untrack_graph",
          [](py_hot_module& h, std::uintptr_t exec) {
            nb::gil_scoped_release unlocked;
            h.hot.untrack_graph(reinterpret_cast<CUgraphExec>(exec));
          },
          nb::arg("exec"), "Stops following the graph `exec` (before it is destroyed).")
      .def(
          "launch_graph",
          [](const py_hot_module& h, std::uintptr_t exec, nb::handle stream, nb::object launch) {
            const auto where = as_stream(stream);
            const auto graph = reinterpret_cast<CUgraphExec>(exec);
            nb::gil_scoped_release unlocked;
            if (launch.is_none()) return h.hot.launch_graph(graph, where);
            // The callable (torch's CUDAGraph.replay) runs with the GIL, under the graph's lock.
            return h.hot.launch_graph(graph, where, [&] {
              nb::gil_scoped_acquire locked;
              launch();
            });
          },
          nb::arg("exec"), nb::arg("stream"), nb::arg("launch") = nb::none(),
          "Launches a tracked graph on `stream` on the serving version, or calls launch() to "
          "enqueue it there (torch's CUDAGraph.replay): no promote switches the graph meanwhile, "
          "and the version it ran stays loaded until that work completed. Returns the id of the "
          "version it ran.")
      .def_prop_ro(
          "graphs",
          [](const py_hot_module& h) {
            nb::list out;
            for (const auto& g : h.hot.graphs()) {
              nb::dict d;
              d["name"] = g.name;
              d["exec"] = reinterpret_cast<std::uintptr_t>(g.exec);
              d["version"] = g.version;
              d["nodes"] = g.nodes;
              out.append(d);
            }
            return out;
          },
          "The graphs followed: [{'name', 'exec', 'version' (its nodes launch), 'nodes'}].");
}

nb::list prewarm_steps(const prewarm_report& report) {
  nb::list out;
  for (const auto& step : report.steps) {
    nb::dict d;
    d["what"] = step.what;
    d["milliseconds"] = step.milliseconds;
    d["already_done"] = step.already_done;
    out.append(d);
  }
  return out;
}

// HotModule's upkeep: reclaim, and reload_from (a HotReloader on a watched directory).
void bind_hot_module_upkeep(nb::class_<py_hot_module>& c) {
  c.def(
       "_prewarm_load",
       [](const py_hot_module& h) {
         prewarm_report report;
         {
           nb::gil_scoped_release unlocked;
           report = h.hot.prewarm();
         }
         return prewarm_steps(report);
       },
       "Loads the serving version's kernels (HotModule.prewarm does this, then the warm-up "
       "launches).")
      .def(
          "reclaim",
          [](const py_hot_module& h) {
            nb::gil_scoped_release unlocked;
            return h.hot.reclaim();
          },
          "Unloads the retired versions that can be unloaded now; returns how many.")
      .def(
          "reload_from",
          [](nb::object self, const std::string& directory, nb::object smoke_test,
             nb::object on_promoted, nb::object on_refused, unsigned debounce_ms,
             std::vector<std::string> options) {
            return std::make_unique<py_hot_reloader>(
                std::move(self), directory, std::move(smoke_test), std::move(on_promoted),
                std::move(on_refused), debounce_ms, std::move(options));
          },
          nb::arg("directory"), nb::kw_only(), nb::arg("smoke_test") = nb::none(),
          nb::arg("on_promoted") = nb::none(), nb::arg("on_refused") = nb::none(),
          nb::arg("debounce_ms") = 200, nb::arg("options") = std::vector<std::string>{},
          "Watches `directory` and promotes every good file dropped there. on_promoted(path, "
          "id) and on_refused(path, error) run on the watcher thread.");
}

// HotModule: loading, stage, promote, rollback and its kernels; then its state and upkeep.
void bind_hot_module(nb::module_& m) {
  nb::class_<py_hot_module> c(m, "HotModule",
                              "A named, versioned module whose kernels keep launching while "
                              "versions are staged, promoted and rolled back.");
  c.def(nb::new_(&load_hot), nb::arg("name"), nb::arg("image"), nb::arg("context") = nb::none(),
        nb::kw_only(), nb::arg("label") = 0,
        "Loads the first version (bytes or a path) into `context` (default: current). Its "
        "kernels are the interface every later version must keep. `label`: the version's "
        "number where it came from (its bundle version for an UpdateEndpoint; 0: none).")
      .def("stage", &stage, nb::arg("image"), nb::kw_only(), nb::arg("smoke_test") = nb::none(),
           nb::arg("source_name") = "", nb::arg("carry_globals") = std::vector<std::string>{},
           nb::arg("probation").none() = nb::none(),
           "Loads and validates a new version without serving it. smoke_test(staged) may "
           "launch its kernels; what it raises rejects the version. probation=ProbationPolicy("
           "...): then it must also match the serving version on mirrored live launches in a "
           "sandbox worker (stage blocks up to deadline_s; launch from other threads "
           "meanwhile). Raises VersionRejected (ProbationError for a failed probation); the "
           "serving version is untouched either way.")
      .def(
          "promote",
          [](py_hot_module& h, staged_version& v) {
            nb::gil_scoped_release unlocked;
            return h.hot.promote(std::move(v));
          },
          nb::arg("version"), "Makes a staged version serve; returns its id.")
      .def(
          "rollback",
          [](py_hot_module& h) {
            nb::gil_scoped_release unlocked;
            return h.hot.rollback();
          },
          "Makes the previous version serve again; returns its id.")
      .def(
          "get_kernel",
          [](const py_hot_module& h, const std::string& name) {
            auto k = h.hot.get_kernel(resolve_kernel_name(h.kernel_names, name));
            const auto parameters = k.parameters();
            auto signature = signature_of(k.name(), parameters);
            return py_hot_kernel{std::move(k), std::move(signature)};
          },
          nb::arg("name"), "A kernel of the interface (by its image name or C++ name).");
  bind_hot_module_state(c);
  bind_hot_module_graphs(c);
  bind_hot_module_upkeep(c);
}

}  // namespace

void bind_hot_modules(nb::module_& m) {
  m.def(
      "_synchronize_stream",
      [](nb::handle stream) {
        const auto s = as_stream(stream);
        nb::gil_scoped_release unlocked;
        s.synchronize();
      },
      nb::arg("stream"), "Waits for `stream` (any stream LaunchConfig takes; None: legacy).");
  bind_probation_policy(m);  // before HotModule, whose stage() takes one
  bind_staged(m);
  bind_hot_kernel(m);
  bind_hot_reloader(m);
  bind_hot_module(m);
}

}  // namespace cubridge::python
