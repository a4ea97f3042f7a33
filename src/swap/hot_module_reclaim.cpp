// The reclaim path of a hot module: the reclaimer thread's pass (and hot_module::reclaim) that
// unloads retired versions once their last events completed, and the sealing of a stream about to
// be destroyed. Nothing here throws: failures are counted and reported (hot_module_stats).
#include "hot_module_state.hpp"
#include "swap_trace.hpp"

#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/detail/describe.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/swap/hot_module.hpp>

#include <exception>
#include <mutex>
#include <optional>
#include <string>

namespace cubridge {

namespace {

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace

void hot_module::state::report_reclaim_failure(const std::string& what) noexcept {
  reclaim_failures.fetch_add(1);
  try {
    const std::string message = "module '" + name + "': " + what;
    {
      std::lock_guard lock(failure_mutex);
      last_reclaim_failure = message;
    }
    if (options.on_reclaim_failure) options.on_reclaim_failure(message);
  } catch (...) {
    // Out of memory, or the callback threw: the count above still shows it.
  }
}

// "unload module 'filters': retired versions 2, 3" when any is retired (the range of a pass
// that may unload), else empty (no range).
std::string hot_module::state::unload_trace() const {
  if (versions.get_stats().retired == 0) return {};
  std::string text = "unload module '" + name + "': retired versions";
  const char* separator = " ";
  for (const auto& v : versions.held().retired) {
    text.append(separator).append(std::to_string(v.id));
    separator = ", ";
  }
  return text;
}

detail::reclaim_pass hot_module::state::reclaim_now(std::size_t* unloaded) noexcept {
  detail::reclaim_pass pass;
  try {
    const auto trace = unload_trace();
    std::optional<swap_trace::scoped_range> range;
    if (!trace.empty()) range.emplace(trace);
    scoped_current current(ctx.ref());
    const auto n = versions.reclaim(
        [](const event& e) {
          // Done, or failed for good (a sticky fault): either way nothing more will run.
          return driver::api().cuEventQuery(e.get()) != CUDA_ERROR_NOT_READY;
        },
        [this](const CUstream& s) { return last_event_on(s); },
        [&](std::uint64_t id, const std::exception_ptr& e) {
          pass.failed = true;
          report_reclaim_failure("retired version " + std::to_string(id) +
                                 " stays loaded for now: " + what_of(e));
        });
    if (unloaded) *unloaded = n;
  } catch (...) {
    pass.failed = true;
    report_reclaim_failure("reclaiming retired versions: " + what_of(std::current_exception()));
  }
  try {
    pass.waiting = versions.get_stats().retired != 0;
  } catch (...) {
    pass.waiting = true;  // a mutex failure: poll rather than sleep for good
  }
  return pass;
}

event hot_module::state::last_event_on(CUstream s) {
  if (const auto fault = detail::reclaim_event_fault.load()) [[unlikely]]
    fault(s);
  auto e = event::create(ctx);
  // If the driver refuses (a raw stream destroyed without before_stream_destroy()), its queued
  // work still runs to the end: wait for the whole context, on this (non-serving) thread, and
  // return the never-recorded event, which queries as complete. Failing would pin the version.
  if (const CUresult r = driver::api().cuEventRecord(e.get(), s); r != CUDA_SUCCESS) {
    report_reclaim_failure("cuEventRecord " + detail::driver_error_name(r) +
                           ": recording the last event of a retired version on stream " +
                           detail::hex(s) +
                           " (destroyed without before_stream_destroy()?); waited for the "
                           "whole context instead");
    (void)driver::api().cuCtxSynchronize();
  }
  return e;
}

void hot_module::state::seal(CUstream s) noexcept {
  try {
    // Most destroyed streams never launched this module: push its context only for one that did.
    versions.seal_stream(s, [this](const CUstream& stream) {
      scoped_current current(ctx.ref());
      return last_event_on(stream);
    });
  } catch (...) {
    // Out of events or a broken context: the reclaimer records on the dead handle later and,
    // refused, waits for the whole context.
    report_reclaim_failure("sealing stream " + detail::hex(s) +
                           " before its destruction: " + what_of(std::current_exception()));
  }
}

std::size_t hot_module::reclaim() const {
  std::size_t unloaded = 0;
  (void)checked().reclaim_now(&unloaded);
  return unloaded;
}

}  // namespace cubridge
