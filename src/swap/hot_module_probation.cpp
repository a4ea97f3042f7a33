// Probation of a staged version on the serving version's live launches (swap/probation.hpp):
// arming it for hot_kernel::launch, the wait for its verdict in stage(), the refusal.
#include "hot_module_state.hpp"
#include "probation_session.hpp"

#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/swap/hot_module.hpp>
#include <cubridge/swap/probation.hpp>

namespace cubridge {
namespace {

constexpr std::array<detail::enum_name<output_check>, 4> output_check_names{{
    {output_check::bitwise, "bitwise"},
    {output_check::float_tolerance, "float_tolerance"},
    {output_check::fault_only, "fault_only"},
    {output_check::never_mirror, "never_mirror"},
}};
static_assert(detail::lists_values_in_order(output_check_names));

constexpr std::array<detail::enum_name<probation_verdict>, 4> verdict_names{{
    {probation_verdict::passed, "passed"},
    {probation_verdict::faulted, "faulted_in_probation"},
    {probation_verdict::mismatch, "mismatch_in_probation"},
    {probation_verdict::incomplete, "probation_incomplete"},
}};
static_assert(detail::lists_values_in_order(verdict_names));

}  // namespace

std::string_view to_string(output_check check) noexcept {
  return detail::name_of(output_check_names, check, "?");
}

std::string_view to_string(probation_verdict verdict) noexcept {
  return detail::name_of(verdict_names, verdict, "?");
}

hot_kernel::hot_kernel(std::shared_ptr<hot_module::state> s, std::size_t index,
                       std::string name) noexcept
    : state_(std::move(s)),
      probation_every_(&state_->probation_every),
      index_(index),
      name_(std::move(name)) {}

bool hot_kernel::sampled() const noexcept {
  const auto every = state_->probation_every.load(std::memory_order_relaxed);
  const auto n = state_->probation_launches.fetch_add(1, std::memory_order_relaxed);
  return every != 0 && n % every == 0;
}

void hot_kernel::mirror_raw(const chain::lease& lease, const launch_config& config,
                            void** arguments) const {
  // Only the serving version's launches are compared with the candidate: a launch pinned to an
  // older version runs other code.
  if (lease.id() != state_->serving_id.load(std::memory_order_relaxed)) return;
  std::shared_ptr<swap_internal::probation_session> session;
  {
    std::lock_guard lock(state_->probation_mutex);
    session = state_->probation;
  }
  if (session)
    session->mirror(static_cast<std::uint32_t>(index_), lease.payload().kernels[index_], config,
                    arguments);
}

void hot_module::state::run_probation(const stage_options& options, const hot_version& serving,
                                      std::span<const std::byte> image, const std::string& source) {
  if (!options.probation) return;
  if (!serving.image) reject(source, "probation needs the serving version's image");
  auto session = std::make_shared<swap_internal::probation_session>(
      ctx, name, kernel_names, *serving.image, image, *options.probation);
  {
    std::lock_guard lock(probation_mutex);
    if (probation) reject(source, "another version of this module is on probation now");
    probation = session;
  }
  // Disarmed whichever way this ends (a verdict, or a worker that could not start).
  struct disarm {
    state& s;
    ~disarm() {
      s.probation_every.store(0, std::memory_order_relaxed);
      std::lock_guard lock(s.probation_mutex);
      s.probation.reset();
    }
  } disarmed{*this};
  // The replays first (the smoke test in the worker), then the mirrored launches.
  if (session->replay(serving.kernels) && options.probation->required_launches > 0) {
    probation_launches.store(0, std::memory_order_relaxed);  // the first launch is mirrored
    probation_every.store(options.probation->sample_every, std::memory_order_relaxed);
  }
  auto result = session->wait();
  result.launches_seen = probation_launches.load(std::memory_order_relaxed);
  if (result.verdict == probation_verdict::passed) return;
  rejected.fetch_add(1);
  throw probation_error("module '" + name + "' version from " + source + ": " +
                            std::string(to_string(result.verdict)) + ": " + result.detail +
                            "; the current version keeps serving",
                        result);
}

}  // namespace cubridge
