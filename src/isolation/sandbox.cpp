// The sandbox's public face: starting, calling, sharing, restarting, the accessors, the error
// and its names. The worker process is sandbox_worker_process.cpp, the calls sandbox_call.cpp.
#include "sandbox_state.hpp"

#include <cubridge/core/detail/describe.hpp>
#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/isolation/sandbox.hpp>

#include <unistd.h>

#include <array>
#include <cstdlib>
#include <system_error>

#ifndef CUBRIDGE_SANDBOX_WORKER_INSTALLED
#define CUBRIDGE_SANDBOX_WORKER_INSTALLED "/usr/local/libexec/cubridge-sandbox-worker"
#endif

namespace cubridge {

std::string_view to_string(sandbox_failure reason) noexcept {
  static constexpr std::array<detail::enum_name<sandbox_failure>, 8> names{{
      {sandbox_failure::crashed, "crashed"},
      {sandbox_failure::aborted, "aborted"},
      {sandbox_failure::timed_out, "timed_out"},
      {sandbox_failure::cuda_fault, "cuda_fault"},
      {sandbox_failure::protocol, "protocol"},
      {sandbox_failure::start_failed, "start_failed"},
      {sandbox_failure::no_such_entry, "no_such_entry"},
      {sandbox_failure::buffer_import_failed, "buffer_import_failed"},
  }};
  static_assert(detail::lists_values_in_order(names));
  return detail::name_of(names, reason, "unknown");
}

namespace {

std::string restart_text(bool restarted, std::chrono::nanoseconds duration) {
  if (!restarted) return "";
  return "; worker restarted in " +
         std::to_string(std::chrono::duration<double, std::milli>(duration).count()) + " ms";
}

bool is_executable(const std::filesystem::path& p) {
  return !p.empty() && ::access(p.c_str(), X_OK) == 0 && !std::filesystem::is_directory(p);
}

}  // namespace

sandbox_error::sandbox_error(sandbox_failure reason, std::string call, std::string detail,
                             bool restarted, std::chrono::nanoseconds restart_duration,
                             std::source_location where)
    : error(isolation_error_domain, static_cast<int>(isolation_errc::sandbox_failure),
            "sandbox " + std::string(cubridge::to_string(reason)), std::move(call),
            std::move(detail) + restart_text(restarted, restart_duration), where),
      reason_(reason),
      restarted_(restarted),
      restart_duration_(restart_duration) {}

// --- sandbox ------------------------------------------------------------------------------------

std::filesystem::path sandbox::default_worker() {
  if (const char* env = std::getenv("CUBRIDGE_SANDBOX_WORKER"); env && *env) return env;
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    auto beside = self.parent_path() / "cubridge-sandbox-worker";  // not const: returned by move
    if (is_executable(beside)) return beside;
  }
  return CUBRIDGE_SANDBOX_WORKER_INSTALLED;
}

sandbox sandbox::start(sandbox_options options) {
  auto s = std::make_shared<state>(std::move(options));
  s->name = s->options.name.empty() ? s->options.library.filename().string() : s->options.name;
  s->worker_path = s->options.worker.empty() ? default_worker() : s->options.worker;
  const std::string call = "sandbox::start";
  if (!is_executable(s->worker_path))
    throw sandbox_error(sandbox_failure::start_failed, call,
                        "sandbox '" + s->name + "': worker " + s->worker_path.string() +
                            " is not an executable file (set sandbox_options::worker or "
                            "CUBRIDGE_SANDBOX_WORKER)",
                        false, {});
  if (!std::filesystem::exists(s->options.library))
    throw sandbox_error(
        sandbox_failure::start_failed, call,
        "sandbox '" + s->name + "': library " + s->options.library.string() + " does not exist",
        false, {});
  std::lock_guard lock(s->mutex);
  if (auto failure = s->start_worker(); !failure.empty())
    throw sandbox_error(sandbox_failure::start_failed, call,
                        "sandbox '" + s->name + "': worker " + s->worker_path.string() + " for " +
                            s->options.library.string() + ": " + failure,
                        false, {});
  return sandbox(std::move(s));
}

sandbox::sandbox(std::shared_ptr<state> s) noexcept : state_(std::move(s)) {}
sandbox::sandbox(sandbox&&) noexcept = default;
sandbox& sandbox::operator=(sandbox&& other) noexcept {
  if (this != &other) {
    if (state_) {
      std::lock_guard lock(state_->mutex);
      state_->worker.stop();
    }
    state_ = std::move(other.state_);
  }
  return *this;
}

sandbox::~sandbox() {
  if (!state_) return;
  std::lock_guard lock(state_->mutex);
  state_->worker.stop();
}

sandbox_reply sandbox::call(std::string_view entry, const sandbox_request& request) {
  CUBRIDGE_EXPECTS(state_ != nullptr, "calling a moved-from sandbox");
  for (const sandbox_share& share : request.buffers)
    CUBRIDGE_EXPECTS(share.state_ == state_, "buffer " + detail::hex(share.host_address()) +
                                                 " passed to sandbox '" + state_->name +
                                                 "' is not shared with it (share it with this "
                                                 "sandbox's share())");
  return state_->call(entry, request);
}

sandbox_share sandbox::share(const shared_device_memory& memory) {
  CUBRIDGE_EXPECTS(state_ != nullptr, "sharing with a moved-from sandbox");
  auto fd = memory.export_fd();
  std::lock_guard lock(state_->mutex);
  const std::uint64_t id = state_->next_share_id++;
  state_->shares.emplace(id, state::shared_buffer{std::move(fd), memory.size_bytes(),
                                                  memory.address(), memory.device().ordinal(), 0});
  return sandbox_share(state_, id, memory.address(), memory.size_bytes());
}

void sandbox::restart() {
  CUBRIDGE_EXPECTS(state_ != nullptr, "restarting a moved-from sandbox");
  std::lock_guard lock(state_->mutex);
  if (auto outcome = state_->restart(); !outcome.failure.empty())
    throw sandbox_error(sandbox_failure::start_failed, "sandbox::restart",
                        "sandbox '" + state_->name + "': " + outcome.failure, false,
                        outcome.duration);
}

pid_t sandbox::worker_pid() const noexcept {
  if (!state_) return 0;
  std::lock_guard lock(state_->mutex);
  return state_->worker.pid();
}

std::size_t sandbox::restarts() const noexcept {
  if (!state_) return 0;
  std::lock_guard lock(state_->mutex);
  return state_->restarts;
}

std::chrono::nanoseconds sandbox::last_start_duration() const noexcept {
  if (!state_) return {};
  std::lock_guard lock(state_->mutex);
  return state_->last_start;
}

std::string sandbox::worker_cuda_status() const {
  CUBRIDGE_EXPECTS(state_ != nullptr, "reading a moved-from sandbox");
  std::lock_guard lock(state_->mutex);
  return state_->cuda_status;
}

const std::string& sandbox::name() const noexcept {
  return state_->name;
}

// --- sandbox_share ------------------------------------------------------------------------------

sandbox_share::sandbox_share(sandbox_share&& o) noexcept
    : state_(std::move(o.state_)),
      id_(std::exchange(o.id_, 0)),
      host_address_(std::exchange(o.host_address_, 0)),
      size_(std::exchange(o.size_, 0)) {}

sandbox_share& sandbox_share::operator=(sandbox_share&& o) noexcept {
  if (this != &o) {
    reset();
    state_ = std::move(o.state_);
    id_ = std::exchange(o.id_, 0);
    host_address_ = std::exchange(o.host_address_, 0);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

sandbox_share::~sandbox_share() {
  reset();
}

void sandbox_share::reset() noexcept {
  if (state_) state_->unshare(id_);
  state_.reset();
  id_ = 0;
}

}  // namespace cubridge
