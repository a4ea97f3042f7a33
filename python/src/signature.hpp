#pragma once
// What each parameter of a kernel is, as far as its name says: a C++ kernel's mangled name
// spells its parameter types (`_Z5scalePffi` is scale(float*, float, int)); an extern "C" name
// spells nothing, and the driver's sizes are then all there is to check against.
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge::python {

/// The kinds of value a Python argument can be converted to.
enum class parameter_kind {
  unknown,       ///< not spelled by the name (extern "C", a class type): checked by size only
  pointer,       ///< T*: a tensor, an array or a device address
  signed_int,    ///< char, short, int, long, long long
  unsigned_int,  ///< unsigned ..., bool is not one of these
  boolean,       ///< bool
  floating,      ///< float, double
  half,          ///< __half, __nv_bfloat16 (16-bit floats: pass numpy scalars or bytes)
};

/// One parameter: its kind and the type as C++ spells it ("float*", "int", "" when unknown).
struct parameter_type {
  parameter_kind kind = parameter_kind::unknown;
  std::string spelling;
};

/// The parameter types `mangled` spells, or nothing when it spells none (not an Itanium mangled
/// function name, or one the demangler refuses). An empty list is a function of no parameters.
[[nodiscard]] std::optional<std::vector<parameter_type>> parameter_types(
    const std::string& mangled);

/// The function's name as C++ spells it without its parameters or return type ("scale",
/// "ns::scale<float>"), or empty when `mangled` is not a mangled function name.
[[nodiscard]] std::string unmangled_name(const std::string& mangled);

/// The kind of one demangled parameter type ("const float*", "unsigned int", "Point").
[[nodiscard]] parameter_kind kind_of(std::string_view type);

}  // namespace cubridge::python
