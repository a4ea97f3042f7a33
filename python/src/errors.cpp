// C++ exceptions to Python: every cubridge::error becomes an instance of a class of
// cubridge/_errors.py carrying the C++ fields; the most specific C++ type picks the class.
#include "bindings.hpp"

#include <cubridge/bundle/bundle.hpp>
#include <cubridge/compile/compile.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/fleet/error.hpp>
#include <cubridge/isolation/guest_context.hpp>
#include <cubridge/isolation/sandbox.hpp>
#include <cubridge/swap/error.hpp>
#include <cubridge/swap/probation.hpp>

#include <nanobind/stl/string.h>

#include <cctype>
#include <chrono>
#include <exception>
#include <string>

namespace nb = nanobind;

namespace cubridge::python {
namespace {

const char* source_name(error_source source) {
  switch (source) {
    case error_source::driver:
      return "driver";
    case error_source::runtime:
      return "runtime";
    case error_source::nvrtc:
      return "nvrtc";
    case error_source::nvjitlink:
      return "nvjitlink";
    case error_source::cubridge:
      return "cubridge";
  }
  return "cubridge";
}

bool is_fleet_error(const error& e) {
  return e.domain() != nullptr && e.domain()->layer() == fleet_error_domain.layer();
}

/// FleetError's reason: the code's name in lower case without the domain's prefix
/// ("CUBRIDGE_FLEET_CONFLICT" -> "conflict").
std::string fleet_reason(int code) {
  std::string name(fleet_error_domain.name(code));
  constexpr std::string_view prefix = "CUBRIDGE_FLEET_";
  if (name.starts_with(prefix)) name.erase(0, prefix.size());
  for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

/// The fields every cubridge error has, as keyword arguments of cubridge.Error.
nb::dict fields_of(const error& e) {
  nb::dict fields;
  fields["code"] = e.code();
  fields["name"] = e.code_name();
  fields["description"] = e.description();
  fields["call"] = e.call();
  fields["involved"] = e.involved();
  fields["source"] = source_name(e.source());
  fields["layer"] = e.domain() ? nb::cast(std::string(e.domain()->layer())) : nb::none();
  fields["where"] = std::string(e.where().file_name()) + ":" + std::to_string(e.where().line());
  return fields;
}

/// The class of cubridge/_errors.py for this error, by its C++ type and code.
const char* class_of(const error& e) {
  if (dynamic_cast<const bundle_error*>(&e)) return "BundleError";
  if (dynamic_cast<const guest_error*>(&e)) return "GuestError";
  if (dynamic_cast<const sandbox_error*>(&e)) return "SandboxError";
  if (dynamic_cast<const compile_error*>(&e)) return "CompileError";
  if (dynamic_cast<const driver_unavailable*>(&e)) return "DriverUnavailable";
  if (dynamic_cast<const image_error*>(&e)) return "ImageError";
  if (dynamic_cast<const launch_argument_error*>(&e)) return "LaunchArgumentError";
  if (dynamic_cast<const context_reset_error*>(&e)) return "ContextResetError";
  if (dynamic_cast<const probation_error*>(&e)) return "ProbationError";
  if (dynamic_cast<const version_rejected_error*>(&e)) return "VersionRejected";
  if (is_fleet_error(e)) return "FleetError";
  if (e.is(errc::precondition)) return "PreconditionError";
  if (e.is(errc::io)) return "IOFailure";
  return "Error";
}

nb::object exception_of(const error& e) {
  nb::dict fields = fields_of(e);
  if (const auto* b = dynamic_cast<const bundle_error*>(&e))
    fields["reason"] = std::string(to_string(b->reason()));
  if (const auto* g = dynamic_cast<const guest_error*>(&e)) {
    nb::list findings;
    for (const auto& f : g->findings())
      findings.append(nb::make_tuple(std::string(to_string(f.what)), f.detail));
    fields["findings"] = findings;
    fields["guest"] = g->guest();
  }
  if (const auto* s = dynamic_cast<const sandbox_error*>(&e)) {
    fields["reason"] = std::string(to_string(s->reason()));
    fields["recovery"] = std::string(to_string(s->recovery()));
    fields["restarted"] = s->restarted();
    fields["restart_ms"] = std::chrono::duration<double, std::milli>(s->restart_duration()).count();
  }
  if (is_fleet_error(e)) fields["reason"] = fleet_reason(e.code());
  if (const auto* p = dynamic_cast<const probation_error*>(&e)) {
    const auto& r = p->result();
    fields["verdict"] = std::string(to_string(r.verdict));
    fields["kernel"] = r.kernel;
    fields["launch"] = r.launch;
    fields["parameter"] = r.parameter;
    fields["offset"] = r.offset;
    fields["passed"] = r.passed;
    fields["not_mirrorable"] = r.not_mirrorable;
  }
  if (const auto* c = dynamic_cast<const compile_error*>(&e)) {
    fields["source_name"] = c->source_name();
    fields["architecture"] = c->architecture();
    fields["log"] = c->log();
  }
  return nb::module_::import_("cubridge._errors").attr("_make")(class_of(e), e.what(), fields);
}

/// Sets `e` as the Python error; never throws.
void raise(const error& e) noexcept {
  try {
    const nb::object exc = exception_of(e);
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  } catch (nb::python_error& failed) {  // cubridge._errors missing: still say what failed
    failed.restore();
  }
}

}  // namespace

nb::object python_exception(const std::exception_ptr& p) {
  try {
    std::rethrow_exception(p);
  } catch (const error& e) {
    return exception_of(e);
  } catch (nb::python_error& e) {
    return nb::borrow(e.value());
  } catch (const nb::builtin_exception& e) {
    const bool type_error = e.type() == nb::exception_type::type_error;
    return nb::handle(type_error ? PyExc_TypeError : PyExc_RuntimeError)(e.what());
  } catch (const std::exception& e) {
    return nb::handle(PyExc_RuntimeError)(e.what());
  } catch (...) {
    return nb::handle(PyExc_RuntimeError)("an exception of a type cubridge does not know");
  }
}

void set_python_error(const std::exception_ptr& p) noexcept {
  try {
    std::rethrow_exception(p);
  } catch (nb::python_error& e) {
    e.restore();  // as raised, traceback included
    return;
  } catch (...) {
  }
  try {
    const nb::object exc = python_exception(p);
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  } catch (nb::python_error& failed) {  // cubridge._errors missing: still say what failed
    failed.restore();
  }
}

void register_errors(nb::module_&) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const error& e) {
      raise(e);
    }
  });
}

}  // namespace cubridge::python
