// Is the reset guard in this process (reset_guard_status.hpp)? The guard exports
// cubridge_reset_guard_policy() for exactly this question.
#include <cubridge/core/detail/printable.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/log.hpp>
#include <cubridge/core/reset_guard_status.hpp>

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <string_view>

namespace cubridge {
namespace {

using policy_fn = const char* (*)();

std::string environment_request() {
  if (const char* preload = std::getenv("LD_PRELOAD");
      preload && std::string_view(preload).find("cubridge_reset_guard") != std::string_view::npos)
    return "LD_PRELOAD=" + detail::printable(preload, {.quoted = false});
  if (const char* policy = std::getenv("CUBRIDGE_RESET_POLICY"); policy && *policy)
    return "CUBRIDGE_RESET_POLICY=" + detail::printable(policy, {.quoted = false});
  return {};
}

}  // namespace

reset_guard_status reset_guard_state() {
  reset_guard_status s;
  s.requested_by = environment_request();
  auto* symbol = ::dlsym(RTLD_DEFAULT, "cubridge_reset_guard_policy");
  if (!symbol) return s;
  s.loaded = true;
  const auto policy = reinterpret_cast<policy_fn>(symbol);
  s.policy = policy() ? policy() : "";
  Dl_info info{};
  if (::dladdr(symbol, &info) != 0 && info.dli_fname) s.library = info.dli_fname;
  return s;
}

void require_reset_guard() {
  const auto s = reset_guard_state();
  if (s.loaded) return;
  detail::throw_errc(
      errc::precondition, "require_reset_guard",
      "the reset guard is not loaded in this process" +
          (s.requested_by.empty() ? std::string() : " though " + s.requested_by + " asks for it") +
          ": preload it by its full path (LD_PRELOAD=/path/to/libcubridge_reset_guard.so) or run "
          "the program under `cubridge guard -- PROGRAM`");
}

void warn_if_reset_guard_missing() noexcept {
  static std::atomic<bool> warned{false};
  try {
    const auto s = reset_guard_state();
    if (!s.missing() || warned.exchange(true)) return;
    log::warn("the reset guard is asked for (" + s.requested_by +
              ") but is not loaded: this process runs UNGUARDED (ld.so ignores an LD_PRELOAD it "
              "cannot find: give the full path, or run under `cubridge guard --`)");
  } catch (...) {  // nothing to report with
  }
}

}  // namespace cubridge
