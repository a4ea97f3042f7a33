#include <cubridge/compile/compile.hpp>
#include <cubridge/core/detail/file_io.hpp>

#include <nvJitLink.h>
#include <nvrtc.h>

#include <cctype>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace cubridge {

namespace {

std::string describe_compile(std::string_view verb, std::string_view name,
                             std::string_view architecture, std::string_view log) {
  std::string text = std::string(verb) + " '" + std::string(name) + "'";
  if (!architecture.empty()) text += " for " + std::string(architecture);
  if (!log.empty()) {
    text += "; log:\n";
    text += log;
    while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  }
  return text;
}

std::string_view nvjitlink_result_name(nvJitLinkResult result) noexcept {
  switch (result) {
    case NVJITLINK_SUCCESS:
      return "NVJITLINK_SUCCESS";
    case NVJITLINK_ERROR_UNRECOGNIZED_OPTION:
      return "NVJITLINK_ERROR_UNRECOGNIZED_OPTION";
    case NVJITLINK_ERROR_MISSING_ARCH:
      return "NVJITLINK_ERROR_MISSING_ARCH";
    case NVJITLINK_ERROR_INVALID_INPUT:
      return "NVJITLINK_ERROR_INVALID_INPUT";
    case NVJITLINK_ERROR_PTX_COMPILE:
      return "NVJITLINK_ERROR_PTX_COMPILE";
    case NVJITLINK_ERROR_NVVM_COMPILE:
      return "NVJITLINK_ERROR_NVVM_COMPILE";
    case NVJITLINK_ERROR_INTERNAL:
      return "NVJITLINK_ERROR_INTERNAL";
    case NVJITLINK_ERROR_THREADPOOL:
      return "NVJITLINK_ERROR_THREADPOOL";
    case NVJITLINK_ERROR_UNRECOGNIZED_INPUT:
      return "NVJITLINK_ERROR_UNRECOGNIZED_INPUT";
    case NVJITLINK_ERROR_FINALIZE:
      return "NVJITLINK_ERROR_FINALIZE";
    case NVJITLINK_ERROR_NULL_INPUT:
      return "NVJITLINK_ERROR_NULL_INPUT";
    case NVJITLINK_ERROR_INCOMPATIBLE_OPTIONS:
      return "NVJITLINK_ERROR_INCOMPATIBLE_OPTIONS";
    case NVJITLINK_ERROR_INCORRECT_INPUT_TYPE:
      return "NVJITLINK_ERROR_INCORRECT_INPUT_TYPE";
    case NVJITLINK_ERROR_ARCH_MISMATCH:
      return "NVJITLINK_ERROR_ARCH_MISMATCH";
    case NVJITLINK_ERROR_OUTDATED_LIBRARY:
      return "NVJITLINK_ERROR_OUTDATED_LIBRARY";
    case NVJITLINK_ERROR_MISSING_FATBIN:
      return "NVJITLINK_ERROR_MISSING_FATBIN";
    case NVJITLINK_ERROR_UNRECOGNIZED_ARCH:
      return "NVJITLINK_ERROR_UNRECOGNIZED_ARCH";
    case NVJITLINK_ERROR_UNSUPPORTED_ARCH:
      return "NVJITLINK_ERROR_UNSUPPORTED_ARCH";
    case NVJITLINK_ERROR_LTO_NOT_ENABLED:
      return "NVJITLINK_ERROR_LTO_NOT_ENABLED";
  }
  return "NVJITLINK_ERROR_UNKNOWN";
}

std::string_view nvrtc_description(nvrtcResult result) noexcept {
  switch (result) {
    case NVRTC_ERROR_COMPILATION:
      return "compilation failed";
    case NVRTC_ERROR_INVALID_OPTION:
      return "invalid option";
    case NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID:
      return "name expression not valid";
    case NVRTC_ERROR_OUT_OF_MEMORY:
      return "out of memory";
    default:
      return {};
  }
}

std::string_view nvjitlink_description(nvJitLinkResult result) noexcept {
  switch (result) {
    case NVJITLINK_ERROR_PTX_COMPILE:
      return "PTX compilation failed";
    case NVJITLINK_ERROR_UNRECOGNIZED_OPTION:
      return "unrecognized option";
    case NVJITLINK_ERROR_INVALID_INPUT:
      return "invalid input";
    case NVJITLINK_ERROR_UNRECOGNIZED_ARCH:
      return "unrecognized architecture";
    case NVJITLINK_ERROR_UNSUPPORTED_ARCH:
      return "unsupported architecture";
    default:
      return {};
  }
}

/// What a compile is about, for error messages.
struct compile_subject {
  std::string_view name;
  std::string_view architecture;
};

[[noreturn]] void throw_nvrtc(nvrtcResult result, const char* call, const compile_subject& what,
                              std::string log, std::source_location where) {
  throw compile_error(error_source::nvrtc, static_cast<int>(result), nvrtcGetErrorString(result),
                      std::string(nvrtc_description(result)), call, std::string(what.name),
                      std::string(what.architecture), std::move(log), where);
}

[[noreturn]] void throw_nvjitlink(nvJitLinkResult result, const char* call,
                                  const compile_subject& what, std::string log,
                                  std::source_location where) {
  throw compile_error(error_source::nvjitlink, static_cast<int>(result),
                      std::string(nvjitlink_result_name(result)),
                      std::string(nvjitlink_description(result)), call, std::string(what.name),
                      std::string(what.architecture), std::move(log), where);
}

void check_nvrtc(nvrtcResult result, const char* call, const compile_subject& what,
                 std::source_location where = std::source_location::current()) {
  if (result != NVRTC_SUCCESS) [[unlikely]]
    throw_nvrtc(result, call, what, {}, where);
}

/// True for "<prefix><digits>" with an optional "a" or "f" suffix, e.g. "sm_90a".
bool is_architecture(std::string_view arch, std::string_view prefix) {
  if (!arch.starts_with(prefix)) return false;
  arch.remove_prefix(prefix.size());
  if (!arch.empty() && (arch.back() == 'a' || arch.back() == 'f')) arch.remove_suffix(1);
  if (arch.size() < 2 || arch.size() > 3) return false;
  for (char c : arch)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

bool sets_architecture(std::string_view option) {
  return option.starts_with("-arch") || option.starts_with("--gpu-architecture") ||
         option.starts_with("--gpu-name");
}

struct program_deleter {
  void operator()(nvrtcProgram program) const noexcept { nvrtcDestroyProgram(&program); }
};
using program_handle = std::unique_ptr<std::remove_pointer_t<nvrtcProgram>, program_deleter>;

std::string program_log(nvrtcProgram program) {
  std::size_t size = 0;
  if (nvrtcGetProgramLogSize(program, &size) != NVRTC_SUCCESS || size <= 1) return {};
  std::string log(size, '\0');
  if (nvrtcGetProgramLog(program, log.data()) != NVRTC_SUCCESS) return {};
  while (!log.empty() && log.back() == '\0') log.pop_back();
  return log;
}

/// A compiled NVRTC program, with its lowered names and log.
struct nvrtc_program {
  program_handle program;
  std::map<std::string, std::string> lowered_names;
  std::string log;
};

/// NVRTC's options: the architecture, the include paths, the defines, the extra options, then the
/// toolkit's include directories, which so come after every directory the caller gave.
std::vector<std::string> nvrtc_arguments(const compile_options& options) {
  std::vector<std::string> arguments;
  arguments.push_back("--gpu-architecture=" + options.architecture);
  for (const auto& path : options.include_paths)
    arguments.push_back("--include-path=" + path.string());
  for (const auto& [macro, value] : options.defines)
    arguments.push_back(std::string("-D").append(macro).append("=").append(value));
  arguments.insert(arguments.end(), options.extra_options.begin(), options.extra_options.end());
  if (options.search_toolkit_headers)
    for (const auto& path : toolkit_include_paths())
      arguments.push_back("--include-path=" + path.string());
  return arguments;
}

/// Compiles `source`; `program_name` is the name NVRTC gets (its log's, and the directory it
/// searches first for quoted includes), source.name the one messages use.
nvrtc_program compile_program(const cuda_source& source, const compile_options& options,
                              std::string_view architecture_prefix,
                              const std::string& program_name) {
  const compile_subject what{source.name, options.architecture};
  const std::string involved = describe_compile("compiling", source.name, options.architecture, {});
  CUBRIDGE_EXPECTS(is_architecture(options.architecture, architecture_prefix),
                   involved + ": the architecture must be " + std::string(architecture_prefix) +
                       "<digits> with an optional 'a' or 'f'");
  for (const auto& option : options.extra_options)
    // NOLINTNEXTLINE(performance-inefficient-string-concatenation): built only when it throws
    CUBRIDGE_EXPECTS(!sets_architecture(option), involved + ": extra option '" + option +
                                                     "' sets the architecture; use "
                                                     "compile_options::architecture");
  std::set<std::string_view> header_names;
  for (const auto& header : options.headers)
    CUBRIDGE_EXPECTS(header_names.insert(header.name).second,
                     involved + ": header '" + header.name + "' is given twice");

  std::vector<const char*> header_contents;
  std::vector<const char*> header_include_names;
  for (const auto& header : options.headers) {
    header_contents.push_back(header.content.c_str());
    header_include_names.push_back(header.name.c_str());
  }
  nvrtcProgram raw = nullptr;
  check_nvrtc(nvrtcCreateProgram(&raw, source.text.c_str(), program_name.c_str(),
                                 static_cast<int>(header_contents.size()), header_contents.data(),
                                 header_include_names.data()),
              "nvrtcCreateProgram", what);
  nvrtc_program result{program_handle(raw), {}, {}};

  for (const auto& expression : options.name_expressions)
    check_nvrtc(nvrtcAddNameExpression(raw, expression.c_str()), "nvrtcAddNameExpression", what);

  const std::vector<std::string> arguments = nvrtc_arguments(options);
  std::vector<const char*> argument_pointers;
  argument_pointers.reserve(arguments.size());
  for (const auto& argument : arguments) argument_pointers.push_back(argument.c_str());

  const nvrtcResult compiled = nvrtcCompileProgram(raw, static_cast<int>(argument_pointers.size()),
                                                   argument_pointers.data());
  result.log = program_log(raw);
  if (compiled != NVRTC_SUCCESS)
    throw_nvrtc(compiled, "nvrtcCompileProgram", what, result.log, std::source_location::current());

  for (const auto& expression : options.name_expressions) {
    const char* lowered = nullptr;
    const nvrtcResult found = nvrtcGetLoweredName(raw, expression.c_str(), &lowered);
    if (found != NVRTC_SUCCESS || lowered == nullptr)
      throw_nvrtc(found != NVRTC_SUCCESS ? found : NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID,
                  "nvrtcGetLoweredName", {source.name, options.architecture},
                  "name expression '" + expression + "' has no lowered name",
                  std::source_location::current());
    result.lowered_names.emplace(expression, lowered);
  }
  return result;
}

/// nvrtc_compile with the name NVRTC gets apart from the one messages use (compile_program).
compiled_image compile_cubin(const cuda_source& source, const compile_options& options,
                             const std::string& program_name) {
  auto program = compile_program(source, options, "sm_", program_name);
  const compile_subject what{source.name, options.architecture};
  std::size_t size = 0;
  check_nvrtc(nvrtcGetCUBINSize(program.program.get(), &size), "nvrtcGetCUBINSize", what);
  compiled_image image;
  image.cubin.resize(size);
  check_nvrtc(nvrtcGetCUBIN(program.program.get(), reinterpret_cast<char*>(image.cubin.data())),
              "nvrtcGetCUBIN", what);
  image.lowered_names = std::move(program.lowered_names);
  image.log = std::move(program.log);
  return image;
}

struct link_deleter {
  void operator()(nvJitLinkHandle handle) const noexcept { nvJitLinkDestroy(&handle); }
};
using link_handle = std::unique_ptr<std::remove_pointer_t<nvJitLinkHandle>, link_deleter>;

std::string link_log(nvJitLinkHandle handle, bool error_log) {
  std::size_t size = 0;
  const nvJitLinkResult sized =
      error_log ? nvJitLinkGetErrorLogSize(handle, &size) : nvJitLinkGetInfoLogSize(handle, &size);
  if (sized != NVJITLINK_SUCCESS || size <= 1) return {};
  std::string log(size, '\0');
  const nvJitLinkResult read = error_log ? nvJitLinkGetErrorLog(handle, log.data())
                                         : nvJitLinkGetInfoLog(handle, log.data());
  if (read != NVJITLINK_SUCCESS) return {};
  while (!log.empty() && log.back() == '\0') log.pop_back();
  return log;
}

}  // namespace

compile_error::compile_error(error_source source, int code, std::string code_name,
                             std::string description, std::string call, std::string source_name,
                             std::string architecture, std::string log, std::source_location where)
    : error(source, code, std::move(code_name), std::move(description), std::move(call),
            describe_compile(source == error_source::nvjitlink ? "linking" : "compiling",
                             source_name, architecture, log),
            where),
      source_name_(std::move(source_name)),
      architecture_(std::move(architecture)),
      log_(std::move(log)) {}

compiled_image nvrtc_compile(const cuda_source& source, const compile_options& options) {
  return compile_cubin(source, options, source.name);
}

compiled_image nvrtc_compile_file(const std::filesystem::path& file,
                                  const compile_options& options) {
  const auto bytes = detail::read_regular_file(file, detail::max_image_bytes, "CUDA source file");
  const std::filesystem::path absolute = std::filesystem::absolute(file).lexically_normal();
  compile_options beside_first = options;
  // Headers beside the file come first, as nvcc finds them (compile.hpp).
  beside_first.include_paths.insert(beside_first.include_paths.begin(), absolute.parent_path());
  const cuda_source source{file.filename().string(),
                           std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size())};
  return compile_cubin(source, beside_first, absolute.string());
}

compiled_ptx nvrtc_compile_ptx(const cuda_source& source, const compile_options& options) {
  auto program = compile_program(source, options, "compute_", source.name);
  const compile_subject what{source.name, options.architecture};
  std::size_t size = 0;
  check_nvrtc(nvrtcGetPTXSize(program.program.get(), &size), "nvrtcGetPTXSize", what);
  compiled_ptx result;
  result.ptx.resize(size);
  check_nvrtc(nvrtcGetPTX(program.program.get(), result.ptx.data()), "nvrtcGetPTX", what);
  while (!result.ptx.empty() && result.ptx.back() == '\0') result.ptx.pop_back();
  result.lowered_names = std::move(program.lowered_names);
  result.log = std::move(program.log);
  return result;
}

compiled_image ptx_to_cubin(std::string_view ptx, const ptx_link_options& options) {
  const compile_subject what{options.name, options.architecture};
  const std::string involved = describe_compile("linking", options.name, options.architecture, {});
  CUBRIDGE_EXPECTS(!ptx.empty(), involved);
  CUBRIDGE_EXPECTS(is_architecture(options.architecture, "sm_"),
                   involved + ": the architecture must be sm_<digits> with an optional 'a' or 'f'");
  for (const auto& option : options.extra_options)
    // NOLINTNEXTLINE(performance-inefficient-string-concatenation): built only when it throws
    CUBRIDGE_EXPECTS(!sets_architecture(option), involved + ": extra option '" + option +
                                                     "' sets the architecture; use "
                                                     "ptx_link_options::architecture");

  std::vector<std::string> arguments{"-arch=" + options.architecture};
  arguments.insert(arguments.end(), options.extra_options.begin(), options.extra_options.end());
  std::vector<const char*> argument_pointers;
  argument_pointers.reserve(arguments.size());
  for (const auto& argument : arguments) argument_pointers.push_back(argument.c_str());

  nvJitLinkHandle raw = nullptr;
  const nvJitLinkResult created = nvJitLinkCreate(
      &raw, static_cast<std::uint32_t>(argument_pointers.size()), argument_pointers.data());
  link_handle handle(raw);
  if (created != NVJITLINK_SUCCESS)
    throw_nvjitlink(created, "nvJitLinkCreate", what, raw ? link_log(raw, true) : std::string{},
                    std::source_location::current());

  // The PTX compiler reads the text up to its NUL.
  const std::string text(ptx);
  const nvJitLinkResult added = nvJitLinkAddData(raw, NVJITLINK_INPUT_PTX, text.c_str(),
                                                 text.size() + 1, options.name.c_str());
  if (added != NVJITLINK_SUCCESS)
    throw_nvjitlink(added, "nvJitLinkAddData", what, link_log(raw, true),
                    std::source_location::current());
  const nvJitLinkResult completed = nvJitLinkComplete(raw);
  if (completed != NVJITLINK_SUCCESS)
    throw_nvjitlink(completed, "nvJitLinkComplete", what, link_log(raw, true),
                    std::source_location::current());

  std::size_t size = 0;
  const nvJitLinkResult sized = nvJitLinkGetLinkedCubinSize(raw, &size);
  if (sized != NVJITLINK_SUCCESS)
    throw_nvjitlink(sized, "nvJitLinkGetLinkedCubinSize", what, link_log(raw, true),
                    std::source_location::current());
  compiled_image image;
  image.cubin.resize(size);
  const nvJitLinkResult got = nvJitLinkGetLinkedCubin(raw, image.cubin.data());
  if (got != NVJITLINK_SUCCESS)
    throw_nvjitlink(got, "nvJitLinkGetLinkedCubin", what, link_log(raw, true),
                    std::source_location::current());
  image.log = link_log(raw, false);
  return image;
}

library_version nvrtc_version() {
  int major = 0;
  int minor = 0;
  check_nvrtc(nvrtcVersion(&major, &minor), "nvrtcVersion", {"(version query)", {}});
  return {major, minor};
}

library_version nvjitlink_version() {
  unsigned major = 0;
  unsigned minor = 0;
  const nvJitLinkResult result = nvJitLinkVersion(&major, &minor);
  if (result != NVJITLINK_SUCCESS)
    throw_nvjitlink(result, "nvJitLinkVersion", {"(version query)", {}}, {},
                    std::source_location::current());
  return {static_cast<int>(major), static_cast<int>(minor)};
}

}  // namespace cubridge
