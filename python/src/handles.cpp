// Contexts, streams and launch configurations named by Python objects: what every binding that
// takes a `context` or a `stream` argument converts it with.
#include "bindings.hpp"

#include <cubridge/core/context.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/primary_context.hpp>
#include <cubridge/core/stream.hpp>

#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

namespace nb = nanobind;

namespace cubridge::python {
namespace {

dims dims_of(nb::handle value, const char* what) {
  std::vector<unsigned> items;
  try {  // an int, or a sequence of ints, each in 0 .. 2**32-1
    if (PyLong_Check(value.ptr()))
      items = {nb::cast<unsigned>(value)};
    else
      items = nb::cast<std::vector<unsigned>>(value);
  } catch (const nb::cast_error&) {
    items.clear();
  }
  CUBRIDGE_EXPECTS(!items.empty() && items.size() <= 3,
                   std::string(what) + " must be an int or a tuple of 1 to 3 ints in 0 .. 2**32-1");
  return {items[0], items.size() > 1 ? items[1] : 1u, items.size() > 2 ? items[2] : 1u};
}

}  // namespace

context_arg as_context(nb::handle c) {
  if (c.is_none()) {
    const auto current = context_ref::current();
    CUBRIDGE_EXPECTS(static_cast<bool>(current),
                     "no context given and none is current on this thread: pass one, or adopt "
                     "torch's or CuPy's with cubridge.PrimaryContext.adopt_runtime()");
    return current;
  }
  if (nb::isinstance<context>(c)) return nb::cast<const context&>(c);
  if (nb::isinstance<primary_context>(c)) return nb::cast<const primary_context&>(c);
  if (nb::isinstance<context_ref>(c)) return nb::cast<context_ref>(c);
  if (auto guest = guest_context_arg(c)) return *std::move(guest);
  detail::throw_errc(errc::precondition, "cubridge",
                     "a " + type_name(c.ptr()) +
                         " is no context: pass a Context, PrimaryContext, GuestContext, "
                         "ContextRef or None");
}

stream_ref as_stream(nb::handle s) {
  if (s.is_none()) return stream_ref::legacy_default();
  if (nb::isinstance<stream>(s)) return nb::cast<const stream&>(s);
  if (PyLong_Check(s.ptr())) return stream_ref::from_native(reinterpret_cast<CUstream>(int_of(s)));
  if (nb::hasattr(s, "__cuda_stream__")) {
    const nb::object pair = s.attr("__cuda_stream__")();
    CUBRIDGE_EXPECTS(
        PyTuple_Check(pair.ptr()) && PyTuple_GET_SIZE(pair.ptr()) == 2 &&
            PyLong_Check(PyTuple_GET_ITEM(pair.ptr(), 1)),
        "__cuda_stream__() of a " + type_name(s.ptr()) + " must return (version, handle)");
    return stream_ref::from_native(reinterpret_cast<CUstream>(int_of(pair[1])));
  }
  for (const char* attribute : {"cuda_stream", "ptr"})  // torch, CuPy
    if (nb::hasattr(s, attribute))
      return stream_ref::from_native(reinterpret_cast<CUstream>(int_of(s.attr(attribute))));
  detail::throw_errc(errc::precondition, "cubridge",
                     "a " + type_name(s.ptr()) +
                         " is no stream: pass None, a cubridge.Stream, a torch or CuPy stream, "
                         "an object with __cuda_stream__, or a handle as an int");
}

py_launch_config make_launch_config(nb::handle grid, nb::handle block, nb::handle stream,
                                    unsigned shared_mem, nb::handle cluster) {
  py_launch_config c{launch_config{.grid = dims_of(grid, "grid"),
                                   .block = dims_of(block, "block"),
                                   .dynamic_shared_bytes = shared_mem,
                                   .stream = as_stream(stream)},
                     nb::borrow(stream)};
  if (!cluster.is_none()) c.config.cluster = dims_of(cluster, "cluster");
  return c;
}

}  // namespace cubridge::python
