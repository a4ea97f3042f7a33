// Hot module groups for Python: one hot module over a context on each device, staged, promoted
// and rolled back on every member at once (hot_module_group.hpp). Launches go to the member of
// their stream's context and hold the GIL; stage, promote and rollback release it.
#include "bindings.hpp"

#include <cubridge/core/image.hpp>
#include <cubridge/swap/hot_module_group.hpp>

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <utility>
#include <vector>

namespace nb = nanobind;

namespace cubridge::python {
namespace {

struct py_group_kernel {
  group_kernel k;
  launch_signature signature;
};

/// The images a HotModuleGroup call was given: one for every member (bytes, a str or a path),
/// or a list or tuple of one per member. One image is read once and shared by every member.
struct member_images {
  std::vector<std::vector<std::byte>> bytes;  // one, or one per member
  std::size_t members = 0;

  [[nodiscard]] std::vector<std::span<const std::byte>> spans() const {
    if (bytes.size() == 1)
      return std::vector<std::span<const std::byte>>(members, std::span(bytes.front()));
    return {bytes.begin(), bytes.end()};
  }
};

member_images images_of(nb::handle images, std::size_t members) {
  member_images out{{}, members};
  if (nb::isinstance<nb::list>(images) || nb::isinstance<nb::tuple>(images)) {
    for (nb::handle one : images) out.bytes.push_back(image_bytes(one));
    if (out.bytes.size() != members)
      detail::throw_errc(errc::precondition, "cubridge.HotModuleGroup",
                         std::to_string(out.bytes.size()) + " images given for " +
                             std::to_string(members) + " members: one, or one per member");
  } else {
    out.bytes.push_back(image_bytes(images));
  }
  return out;
}

py_hot_module_group load_group(std::string name, nb::handle images, nb::handle contexts,
                               std::uint64_t label) {
  std::vector<context_arg> where;
  for (nb::handle c : contexts) where.push_back(as_context(c));
  CUBRIDGE_EXPECTS(!where.empty(), "group '" + name + "' needs at least one context");
  const auto given = images_of(images, where.size());
  auto names = kernel_names_of(given.bytes.front());
  hot_module_options options;
  options.origin.label = label;
  nb::gil_scoped_release unlocked;
  return {hot_module_group::load(std::move(name), std::move(where), given.spans(), options),
          std::move(names)};
}

staged_group stage_group(const py_hot_module_group& g, nb::handle images, nb::handle smoke_test,
                         std::string source_name) {
  const auto given = images_of(images, g.group.size());
  stage_options options;
  options.source_name = std::move(source_name);
  if (!smoke_test.is_none())
    options.smoke_test = python_smoke_test(smoke_test.ptr(), g.kernel_names);
  nb::gil_scoped_release unlocked;
  // One image for all: the group inspects it once for every member.
  return given.bytes.size() == 1 ? g.group.stage(given.bytes.front(), options)
                                 : g.group.stage(given.spans(), options);
}

/// GroupKernel.launch(config, *args), METH_FASTCALL (add_fast_method).
PyObject* launch_group(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return fast_launch<py_group_kernel>(
      self, args, nargs, "GroupKernel.launch",
      [](const group_kernel& k, const launch_config& c, const kernel_arguments& values) {
        return PyLong_FromUnsignedLongLong(k.launch(c, values));
      });
}

/// GroupKernel.launch_pinned(generation, config, *args), METH_FASTCALL.
PyObject* launch_group_pinned(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  const pinned_generation* pinned = nullptr;
  try {
    if (nargs < 1 || !nb::isinstance<pinned_generation>(nb::handle(args[0])))
      detail::throw_errc(errc::precondition, "GroupKernel.launch_pinned",
                         "launch_pinned(generation, config, *args) takes the PinnedGeneration of "
                         "HotModuleGroup.pin() first");
    pinned = nb::inst_ptr<pinned_generation>(args[0]);
  } catch (...) {
    set_python_error(std::current_exception());
    return nullptr;
  }
  return fast_launch<py_group_kernel>(
      self, args + 1, nargs - 1, "GroupKernel.launch_pinned",
      [pinned](const group_kernel& k, const launch_config& c, const kernel_arguments& values) {
        return PyLong_FromUnsignedLongLong(k.launch(*pinned, c, values));
      });
}

PyMethodDef launch_group_method{
    "launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&launch_group)),
    METH_FASTCALL,
    "launch($self, config, /, *args)\n--\n\n"
    "As HotKernel.launch, on the member whose context owns config's stream (the current "
    "context for the legacy default stream); returns the id of the version that ran."};

PyMethodDef launch_group_pinned_method{
    "launch_pinned",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&launch_group_pinned)),
    METH_FASTCALL,
    "launch_pinned($self, generation, config, /, *args)\n--\n\n"
    "As launch, on the version of `generation` (HotModuleGroup.pin()) for that member: every "
    "launch through one pin runs one generation, on whichever device."};

nb::dict generation_dict(const generation& g) {
  nb::dict d;
  d["id"] = g.id;
  d["member_versions"] = g.member_versions;
  return d;
}

// StagedGroup: a version staged on every member.
void bind_staged_group(nb::module_& m) {
  nb::class_<staged_group>(m, "StagedGroup",
                           "A version staged on every member of a HotModuleGroup, not serving "
                           "yet: promote it or drop it (dropping unloads it everywhere).")
      .def_prop_ro("size", &staged_group::size, "The member count.");
}

// PinnedGeneration: the generation HotModuleGroup.pin() holds for launch_pinned.
void bind_pinned_generation(nb::module_& m) {
  nb::class_<pinned_generation>(m, "PinnedGeneration",
                                "One generation of a HotModuleGroup pinned on every member "
                                "(HotModuleGroup.pin()): launches through it run that generation.")
      .def_prop_ro("id", &pinned_generation::id, "The generation's id.")
      .def_prop_ro("size", &pinned_generation::size, "The member count.");
}

// GroupKernel, with its METH_FASTCALL launch and launch_pinned.
void bind_group_kernel(nb::module_& m) {
  auto kernel = nb::class_<py_group_kernel>(
                    m, "GroupKernel",
                    "A kernel of a HotModuleGroup: each launch goes to the member of its "
                    "stream's context and runs the version serving there.")
                    .def_prop_ro(
                        "name", [](const py_group_kernel& k) { return k.k.name(); },
                        "The name the image exports (mangled for C++ kernels).");
  add_fast_method(kernel, launch_group_method);
  add_fast_method(kernel, launch_group_pinned_method);
}

// HotModuleGroup: loading, stage, promote, rollback, its kernels and its members.
void bind_hot_module_group(nb::module_& m) {
  nb::class_<py_hot_module_group>(
      m, "HotModuleGroup",
      "One hot module over a context on each device: stage, promote and rollback cover every "
      "member, all or nothing; launches go to the member of their stream's context.")
      .def(nb::new_(&load_group), nb::arg("name"), nb::arg("image"), nb::arg("contexts"),
           nb::kw_only(), nb::arg("label") = 0,
           "Loads the first version into every context of `contexts` (one per device; several "
           "of one device are allowed): `image` for all, or a list of one image per context.")
      .def("stage", &stage_group, nb::arg("image"), nb::kw_only(),
           nb::arg("smoke_test") = nb::none(), nb::arg("source_name") = "",
           "Stages a version on every member at once (one image or one per member). "
           "smoke_test(staged) runs for each member's staged module, possibly on several threads "
           "at once; a refusal on any member raises VersionRejected and stages nothing anywhere.")
      .def(
          "promote",
          [](py_hot_module_group& g, staged_group& v) {
            nb::gil_scoped_release unlocked;
            return g.group.promote(std::move(v));
          },
          nb::arg("version"),
          "Makes a staged version serve on every member at once, or on none; returns the new "
          "generation's id.")
      .def(
          "rollback",
          [](py_hot_module_group& g) {
            nb::gil_scoped_release unlocked;
            return g.group.rollback();
          },
          "Makes the previous generation serve again on every member; returns its id.")
      .def(
          "pin", [](const py_hot_module_group& g) { return g.group.pin(); },
          "Pins the serving generation on every member, for launch_pinned.")
      .def(
          "get_kernel",
          [](const py_hot_module_group& g, const std::string& name) {
            auto k = g.group.get_kernel(resolve_kernel_name(g.kernel_names, name));
            auto signature = signature_of(k.name(), k.on(0).parameters());
            return py_group_kernel{std::move(k), std::move(signature)};
          },
          nb::arg("name"), "A kernel of the interface (by its image name or C++ name).")
      .def_prop_ro(
          "serving",
          [](const py_hot_module_group& g) { return generation_dict(g.group.serving()); },
          "{'id': generation id, 'member_versions': [each member's version id]}.")
      .def_prop_ro(
          "versions",
          [](const py_hot_module_group& g) { return versions_dict(g.group.versions()); },
          "As HotModule.versions (every member holds the same versions).")
      .def_prop_ro(
          "size", [](const py_hot_module_group& g) { return g.group.size(); }, "The member count.")
      .def_prop_ro(
          "name", [](const py_hot_module_group& g) { return g.group.name(); }, "The group's name.")
      .def(
          "member_stats",
          [](const py_hot_module_group& g, std::size_t i) { return g.group.member(i).stats(); },
          nb::arg("member"), "Member `member`'s counters (HotModuleStats).")
      .def(
          "member_context",
          [](const py_hot_module_group& g, std::size_t i) { return g.group.member(i).context(); },
          nb::arg("member"), "Member `member`'s context (a ContextRef).")
      .def(
          "reclaim",
          [](const py_hot_module_group& g) {
            nb::gil_scoped_release unlocked;
            return g.group.reclaim();
          },
          "Unloads every member's retired versions that can be unloaded now; returns how many.");
}

}  // namespace

void bind_hot_module_groups(nb::module_& m) {
  // The classes HotModuleGroup's signatures use are registered before it.
  bind_staged_group(m);
  bind_pinned_generation(m);
  bind_group_kernel(m);
  bind_hot_module_group(m);
}

}  // namespace cubridge::python
