#include "signature.hpp"

#include "inspect.hpp"  // tools/: tool::demangled_name, the one demangler

#include <array>
#include <utility>

namespace cubridge::python {
namespace {

std::string demangle(const std::string& mangled) {
  return tool::demangled_name(mangled).value_or(std::string());
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

/// The text between the parentheses of the function's parameter list: the last top-level
/// "(...)" of "void scale<float>(float*, float, int)" (template arguments may hold parentheses).
std::string_view parameter_list(std::string_view demangled) {
  if (demangled.empty() || demangled.back() != ')') return {};
  int depth = 0;
  for (std::size_t i = demangled.size(); i-- > 0;) {
    if (demangled[i] == ')') ++depth;
    if (demangled[i] == '(' && --depth == 0)
      return demangled.substr(i + 1, demangled.size() - i - 2);
  }
  return {};
}

/// The parameters of `list`, split at the commas outside <>, () and [].
std::vector<std::string_view> split_parameters(std::string_view list) {
  std::vector<std::string_view> out;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const char c = list[i];
    if (c == '<' || c == '(' || c == '[') ++depth;
    if (c == '>' || c == ')' || c == ']') --depth;
    if (c == ',' && depth == 0) {
      out.push_back(trim(list.substr(start, i - start)));
      start = i + 1;
    }
  }
  if (!trim(list).empty()) out.push_back(trim(list.substr(start)));
  return out;
}

std::string_view without_qualifiers(std::string_view type) {
  for (const std::string_view q : {"const ", "volatile "})
    while (type.starts_with(q)) type.remove_prefix(q.size());
  for (const std::string_view q : {" const", " volatile"})
    while (type.ends_with(q)) type.remove_suffix(q.size());
  return trim(type);
}

}  // namespace

parameter_kind kind_of(std::string_view type) {
  type = without_qualifiers(type);
  if (type.ends_with("*") || type.ends_with("* __restrict__") || type.ends_with("*__restrict__"))
    return parameter_kind::pointer;
  static constexpr std::array<std::pair<std::string_view, parameter_kind>, 20> names{{
      {"bool", parameter_kind::boolean},
      {"float", parameter_kind::floating},
      {"double", parameter_kind::floating},
      {"char", parameter_kind::signed_int},
      {"signed char", parameter_kind::signed_int},
      {"short", parameter_kind::signed_int},
      {"int", parameter_kind::signed_int},
      {"long", parameter_kind::signed_int},
      {"long long", parameter_kind::signed_int},
      {"__int128", parameter_kind::signed_int},
      {"unsigned char", parameter_kind::unsigned_int},
      {"unsigned short", parameter_kind::unsigned_int},
      {"unsigned int", parameter_kind::unsigned_int},
      {"unsigned long", parameter_kind::unsigned_int},
      {"unsigned long long", parameter_kind::unsigned_int},
      {"unsigned __int128", parameter_kind::unsigned_int},
      {"__half", parameter_kind::half},
      {"__nv_bfloat16", parameter_kind::half},
      {"half", parameter_kind::half},
      {"wchar_t", parameter_kind::signed_int},
  }};
  for (const auto& [name, kind] : names)
    if (type == name) return kind;
  return parameter_kind::unknown;
}

std::string unmangled_name(const std::string& mangled) {
  if (!mangled.starts_with("_Z")) return {};
  const std::string demangled = demangle(mangled);
  const std::string_view list = parameter_list(demangled);
  if (list.data() == nullptr) return {};
  std::string_view head(demangled.data(),
                        static_cast<std::size_t>(list.data() - demangled.data()) - 1);
  // A template's demangled name starts with its return type: "void scale<float>".
  int depth = 0;
  for (std::size_t i = head.size(); i-- > 0;) {
    if (head[i] == '>') ++depth;
    if (head[i] == '<') --depth;
    if (head[i] == ' ' && depth == 0) {
      head.remove_prefix(i + 1);
      break;
    }
  }
  return std::string(head);
}

std::optional<std::vector<parameter_type>> parameter_types(const std::string& mangled) {
  if (!mangled.starts_with("_Z")) return std::nullopt;
  const std::string demangled = demangle(mangled);
  const std::string_view list = parameter_list(demangled);
  if (list.data() == nullptr) return std::nullopt;
  std::vector<parameter_type> out;
  for (const auto p : split_parameters(list)) out.push_back({kind_of(p), std::string(p)});
  if (out.size() == 1 && out[0].spelling == "void") out.clear();  // f(void)
  return out;
}

}  // namespace cubridge::python
