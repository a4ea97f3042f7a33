// Finding the sandbox worker and the reset guard from where cubridge's code is installed
// (installation.hpp). The directories come from GNUInstallDirs at configure time, relative to
// the prefix, so the same lookup works in any copy of the install tree.
#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/core/installation.hpp>

#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <optional>
#include <system_error>
#include <vector>

#ifndef CUBRIDGE_INSTALL_PREFIX
#define CUBRIDGE_INSTALL_PREFIX "/usr/local"
#endif
#ifndef CUBRIDGE_INSTALL_BINDIR
#define CUBRIDGE_INSTALL_BINDIR "bin"
#endif
#ifndef CUBRIDGE_INSTALL_LIBDIR
#define CUBRIDGE_INSTALL_LIBDIR "lib"
#endif
#ifndef CUBRIDGE_INSTALL_LIBEXECDIR
#define CUBRIDGE_INSTALL_LIBEXECDIR "libexec"
#endif

namespace cubridge {
namespace {

namespace fs = std::filesystem;

#ifndef CUBRIDGE_BUILD_TREE_SANDBOX_WORKER
#define CUBRIDGE_BUILD_TREE_SANDBOX_WORKER ""
#endif
#ifndef CUBRIDGE_BUILD_TREE_PROBATION_ENTRY
#define CUBRIDGE_BUILD_TREE_PROBATION_ENTRY ""
#endif
#ifndef CUBRIDGE_BUILD_TREE_RESET_GUARD
#define CUBRIDGE_BUILD_TREE_RESET_GUARD ""
#endif

struct helper_facts {
  const char* file_name;
  const char* variable;    // the environment's override
  const char* directory;   // under the prefix
  const char* build_tree;  // where the build that compiled this put it; "" when it built none
  bool executable;
};

helper_facts facts(helper_file which) {
  if (which == helper_file::sandbox_worker)
    return {"cubridge-sandbox-worker", "CUBRIDGE_SANDBOX_WORKER", CUBRIDGE_INSTALL_LIBEXECDIR,
            CUBRIDGE_BUILD_TREE_SANDBOX_WORKER, true};
  if (which == helper_file::probation_entry)
    return {"libcubridge_probation_entry.so", "CUBRIDGE_PROBATION_ENTRY", CUBRIDGE_INSTALL_LIBDIR,
            CUBRIDGE_BUILD_TREE_PROBATION_ENTRY, false};
  return {"libcubridge_reset_guard.so", "CUBRIDGE_RESET_GUARD", CUBRIDGE_INSTALL_LIBDIR,
          CUBRIDGE_BUILD_TREE_RESET_GUARD, false};
}

bool usable(const fs::path& path, bool executable) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  return !executable || ::access(path.c_str(), X_OK) == 0;
}

// The prefix `directory` is installed under, when it ends with one of the install tree's
// directories (lib, bin, libexec as configured).
std::optional<fs::path> prefix_of(const fs::path& directory) {
  for (const fs::path relative :
       {CUBRIDGE_INSTALL_LIBDIR, CUBRIDGE_INSTALL_BINDIR, CUBRIDGE_INSTALL_LIBEXECDIR}) {
    if (relative.is_absolute() || relative.empty()) continue;
    auto prefix = directory;
    bool matches = true;
    std::vector<fs::path> parts(relative.begin(), relative.end());
    for (auto part = parts.rbegin(); part != parts.rend() && matches; ++part) {
      matches = prefix.filename() == *part;
      prefix = prefix.parent_path();
    }
    if (matches) return prefix;
  }
  return std::nullopt;
}

fs::path canonical_or_same(const fs::path& path) {
  std::error_code ec;
  auto canonical = fs::canonical(path, ec);
  return ec ? path : canonical;
}

constexpr std::array<detail::enum_name<helper_file>, 3> helper_file_names{{
    {helper_file::sandbox_worker, "sandbox_worker"},
    {helper_file::reset_guard, "reset_guard"},
    {helper_file::probation_entry, "probation_entry"},
}};
static_assert(detail::lists_values_in_order(helper_file_names));

}  // namespace

std::string_view to_string(helper_file which) noexcept {
  return detail::name_of(helper_file_names, which, "?");
}

fs::path code_location() {
  Dl_info info{};
  // Any function of this file: it is in the same program or shared library as the rest.
  if (::dladdr(reinterpret_cast<void*>(&code_location), &info) != 0 && info.dli_fname &&
      *info.dli_fname) {
    const fs::path file = info.dli_fname;
    // The main program is reported by the name it was started with; /proc/self/exe is exact.
    if (file.is_absolute()) return canonical_or_same(file);
  }
  std::error_code ec;
  return fs::read_symlink("/proc/self/exe", ec);
}

helper_location locate(helper_file which) {
  const auto f = facts(which);
  if (const char* given = std::getenv(f.variable); given && *given)
    return {given, f.variable, usable(given, f.executable)};
  const auto code = code_location();
  std::vector<std::pair<fs::path, std::string>> candidates;
  if (!code.empty()) {
    candidates.emplace_back(code.parent_path() / f.file_name, "beside " + code.string());
    if (const auto prefix = prefix_of(code.parent_path()))
      candidates.emplace_back(*prefix / f.directory / f.file_name,
                              "the install tree of " + code.string());
  }
  std::error_code ec;
  if (const auto program = fs::read_symlink("/proc/self/exe", ec); !ec && program != code)
    candidates.emplace_back(program.parent_path() / f.file_name, "beside the program");
  candidates.emplace_back(fs::path(CUBRIDGE_INSTALL_PREFIX) / f.directory / f.file_name,
                          "the configured prefix");
  const auto configured = candidates.size() - 1;  // reported when nothing is found
  if (*f.build_tree) candidates.emplace_back(f.build_tree, "the build tree");
  for (auto& [path, how] : candidates)
    if (usable(path, f.executable)) return {std::move(path), std::move(how), true};
  return {candidates[configured].first, candidates[configured].second, false};
}

}  // namespace cubridge
