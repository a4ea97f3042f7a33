#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/detail/describe.hpp>
#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/isolation/guest_context.hpp>

#include <algorithm>
#include <array>
#include <mutex>

namespace cubridge {

std::string_view to_string(guest_breakage what) noexcept {
  static constexpr std::array<detail::enum_name<guest_breakage>, 4> names{{
      {guest_breakage::context_stack, "context_stack"},
      {guest_breakage::primary_context_reset, "primary_context_reset"},
      {guest_breakage::host_buffer_lost, "host_buffer_lost"},
      {guest_breakage::sticky_error, "sticky_error"},
  }};
  static_assert(detail::lists_values_in_order(names));
  return detail::name_of(names, what, "unknown");
}

namespace {

std::string list_findings(const std::string& guest, const std::vector<guest_finding>& findings) {
  std::string text = "guest '" + guest + "' broke the host's state: ";
  for (std::size_t i = 0; i < findings.size(); ++i) {
    if (i) text += "; ";
    text += std::string(to_string(findings[i].what)) + ": " + findings[i].detail;
  }
  return text;
}

std::string describe_stack(const std::vector<CUcontext>& stack) {
  if (stack.empty()) return "[] (empty)";
  std::string text = "[";
  for (std::size_t i = 0; i < stack.size(); ++i) text += (i ? ", " : "") + detail::hex(stack[i]);
  return text + "] (top first)";
}

/// A watched host buffer: how it was identified when watching began.
struct watched_buffer {
  std::string name;
  CUdeviceptr address = 0;
  std::size_t bytes = 0;
  bool by_buffer_id = true;  // false: VMM memory, checked by CU_POINTER_ATTRIBUTE_MAPPED
  unsigned long long buffer_id = 0;

  [[nodiscard]] std::string describe() const {
    return "host buffer '" + name + "' (" + detail::hex(address) + ", " + std::to_string(bytes) +
           " bytes)";
  }
};

}  // namespace

guest_error::guest_error(std::string guest, std::vector<guest_finding> findings,
                         std::source_location where)
    : error(isolation_error_domain, static_cast<int>(isolation_errc::guest_damage), {},
            "guest_context::call", list_findings(guest, findings), where),
      guest_(std::move(guest)),
      findings_(std::move(findings)) {}

bool guest_error::broke(guest_breakage what) const noexcept {
  return std::any_of(findings_.begin(), findings_.end(),
                     [&](const guest_finding& f) { return f.what == what; });
}

struct guest_context::state {
  state(context c, guest_options o) : ctx(std::move(c)), options(std::move(o)) {}
  context ctx;
  guest_options options;
  cubridge::device dev = cubridge::device::from_native(0);
  mutable std::mutex mutex;  // guards the watch lists
  std::vector<primary_context> primaries;
  std::vector<watched_buffer> buffers;

  /// Findings about the guest context itself (sticky error), with it pushed for the check.
  void check_guest(std::vector<guest_finding>& findings) const noexcept {
    const auto& cu = driver::api();
    if (const CUresult r = cu.cuCtxPushCurrent(ctx.get()); r != CUDA_SUCCESS) {
      findings.push_back({guest_breakage::sticky_error, "cannot make guest context " +
                                                            detail::hex(ctx.get()) + " current (" +
                                                            detail::driver_error_name(r) + ")"});
      return;
    }
    if (const CUresult r = cu.cuCtxSynchronize(); r != CUDA_SUCCESS)
      findings.push_back(
          {guest_breakage::sticky_error,
           "guest context " + detail::hex(ctx.get()) + " on device " +
               std::to_string(dev.ordinal()) + " reports " + detail::driver_error_name(r) +
               " after the call; a fault poisons every context of the process, the host's too "
               "(run such a library in a sandbox)"});
    CUcontext popped = nullptr;
    cu.cuCtxPopCurrent(&popped);
  }

  /// Findings about the watched host state.
  void check_host(std::vector<guest_finding>& findings) const {
    const auto& cu = driver::api();
    std::lock_guard lock(mutex);
    for (const auto& primary : primaries) {
      unsigned long long id = 0;
      const CUresult r = cu.cuCtxGetId(primary.get(), &id);
      const std::string what = "primary context " + detail::hex(primary.get()) + " of device " +
                               std::to_string(primary.device().ordinal()) + " retained with id " +
                               std::to_string(primary.retained_id());
      if (r != CUDA_SUCCESS)
        findings.push_back({guest_breakage::primary_context_reset,
                            what + " cannot be queried any more (cuCtxGetId " +
                                detail::driver_error_name(r) + "): reset or destroyed"});
      else if (id != primary.retained_id())
        findings.push_back({guest_breakage::primary_context_reset,
                            what + " was reset and re-created with id " + std::to_string(id) +
                                "; its buffers and modules are gone"});
    }
    for (const auto& b : buffers) {
      if (b.by_buffer_id) {
        unsigned long long id = 0;
        const CUresult r = cu.cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, b.address);
        if (r != CUDA_SUCCESS)
          findings.push_back(
              {guest_breakage::host_buffer_lost, b.describe() + " is gone (cuPointerGetAttribute " +
                                                     detail::driver_error_name(r) + ")"});
        else if (id != b.buffer_id)
          findings.push_back({guest_breakage::host_buffer_lost,
                              b.describe() + " was freed and its address reused (buffer id " +
                                  std::to_string(b.buffer_id) + " is now " + std::to_string(id) +
                                  ")"});
      } else {
        int mapped = 0;
        const CUresult r =
            cu.cuPointerGetAttribute(&mapped, CU_POINTER_ATTRIBUTE_MAPPED, b.address);
        if (r != CUDA_SUCCESS || !mapped)
          findings.push_back({guest_breakage::host_buffer_lost,
                              b.describe() + " is no longer mapped (cuPointerGetAttribute " +
                                  detail::driver_error_name(r) + ", mapped " +
                                  std::to_string(mapped) + ")"});
      }
    }
  }
};

guest_context guest_context::create(cubridge::device dev, guest_options options) {
  enforce_mps_policy(options.mps, dev.ordinal(), "guest context '" + options.name + "'");
  auto ctx = context::create(dev, options.flags);
  auto s = std::make_unique<state>(std::move(ctx), std::move(options));
  s->dev = dev;
  guest_context guest(std::move(s));
  if (guest.state_->options.watch_active_primary && dev.primary_state().active)
    guest.watch(primary_context::retain(dev));
  return guest;
}

guest_context::guest_context(std::unique_ptr<state> s) noexcept : state_(std::move(s)) {}
guest_context::guest_context(guest_context&&) noexcept = default;
guest_context& guest_context::operator=(guest_context&&) noexcept = default;
guest_context::~guest_context() = default;

context_ref guest_context::ref() const noexcept {
  return state_ ? state_->ctx.ref() : context_ref::from_native(nullptr);
}
const std::string& guest_context::name() const noexcept {
  return state_->options.name;
}
device guest_context::device() const noexcept {
  return state_->dev;
}

guest_scope guest_context::enter() {
  CUBRIDGE_EXPECTS(state_ != nullptr, "entering a moved-from guest_context");
  return guest_scope(*state_);
}

void guest_context::watch(const primary_context& primary) {
  CUBRIDGE_EXPECTS(state_ != nullptr, "watching from a moved-from guest_context");
  primary.check_not_reset();
  auto own = primary_context::retain(primary.device());
  // Retaining again gives the same context; a different id means it was reset in between.
  own.check_not_reset();
  if (own.retained_id() != primary.retained_id())
    detail::throw_errc(errc::context_reset, "guest_context::watch",
                       "primary context of device " + std::to_string(primary.device().ordinal()) +
                           " has id " + std::to_string(own.retained_id()) +
                           " but was retained with id " + std::to_string(primary.retained_id()));
  std::lock_guard lock(state_->mutex);
  state_->primaries.push_back(std::move(own));
}

void guest_context::watch(std::string name, CUdeviceptr address, std::size_t bytes) {
  CUBRIDGE_EXPECTS(state_ != nullptr, "watching from a moved-from guest_context");
  watched_buffer b{std::move(name), address, bytes};
  const auto& cu = driver::api();
  if (cu.cuPointerGetAttribute(&b.buffer_id, CU_POINTER_ATTRIBUTE_BUFFER_ID, address) !=
      CUDA_SUCCESS) {
    b.by_buffer_id = false;
    int mapped = 0;
    const CUresult r = cu.cuPointerGetAttribute(&mapped, CU_POINTER_ATTRIBUTE_MAPPED, address);
    CUBRIDGE_EXPECTS(r == CUDA_SUCCESS && mapped, b.describe() + " for guest '" +
                                                      state_->options.name +
                                                      "' is not device memory the driver knows (" +
                                                      detail::driver_error_name(r) + ")");
  }
  std::lock_guard lock(state_->mutex);
  state_->buffers.push_back(std::move(b));
}

void guest_context::unwatch(CUdeviceptr address) noexcept {
  if (!state_) return;
  std::lock_guard lock(state_->mutex);
  std::erase_if(state_->buffers, [&](const watched_buffer& b) { return b.address == address; });
}

void guest_context::check_host() const {
  CUBRIDGE_EXPECTS(state_ != nullptr, "checking a moved-from guest_context");
  std::vector<guest_finding> findings;
  state_->check_host(findings);
  if (!findings.empty()) throw guest_error(state_->options.name, std::move(findings));
}

// --- the context stack --------------------------------------------------------------------------

namespace detail {

namespace {
// No real program nests contexts this deep; a stack that never empties means something else is
// wrong, and the loop must end.
constexpr std::size_t max_stack_depth = 256;
}  // namespace

std::vector<CUcontext> context_stack() {
  const auto& cu = driver::api();
  std::vector<CUcontext> stack;
  for (;;) {
    CUcontext top = nullptr;
    if (cu.cuCtxGetCurrent(&top) != CUDA_SUCCESS || !top || stack.size() == max_stack_depth) break;
    CUcontext popped = nullptr;
    if (cu.cuCtxPopCurrent(&popped) != CUDA_SUCCESS) break;
    stack.push_back(popped);
  }
  for (auto it = stack.rbegin(); it != stack.rend(); ++it)
    CUBRIDGE_CU(cuCtxPushCurrent, (*it),
                "restoring context " + detail::hex(*it) + " while reading the context stack " +
                    describe_stack(stack));
  return stack;
}

bool set_context_stack(const std::vector<CUcontext>& stack) noexcept {
  if (!driver::available()) return false;
  const auto& cu = driver::api();
  for (std::size_t i = 0; i < max_stack_depth; ++i) {
    CUcontext top = nullptr;
    if (cu.cuCtxGetCurrent(&top) != CUDA_SUCCESS || !top) break;
    CUcontext popped = nullptr;
    if (cu.cuCtxPopCurrent(&popped) != CUDA_SUCCESS) break;
  }
  bool ok = true;
  for (auto it = stack.rbegin(); it != stack.rend(); ++it)
    ok = cu.cuCtxPushCurrent(*it) == CUDA_SUCCESS && ok;
  return ok;
}

}  // namespace detail

guest_scope::guest_scope(const guest_context::state& guest)
    : guest_(&guest), caller_stack_(detail::context_stack()) {
  CUBRIDGE_CU(cuCtxPushCurrent, (guest.ctx.get()),
              "entering guest '" + guest.options.name + "' " + guest.ctx.ref().describe());
}

guest_scope::~guest_scope() {
  if (!left_) (void)restore();
}

std::vector<guest_finding> guest_scope::restore() noexcept {
  left_ = true;
  std::vector<guest_finding> findings;
  try {
    const CUcontext guest = guest_->ctx.get();
    const auto actual = detail::context_stack();
    if (!actual.empty() && actual.front() == guest &&
        std::equal(actual.begin() + 1, actual.end(), caller_stack_.begin(), caller_stack_.end())) {
      CUcontext popped = nullptr;
      detail::check_release(driver::api().cuCtxPopCurrent(&popped), "cuCtxPopCurrent");
      return findings;
    }
    std::vector<CUcontext> expected{guest};
    expected.insert(expected.end(), caller_stack_.begin(), caller_stack_.end());
    std::string what;
    const auto at = std::find(actual.begin(), actual.end(), guest);
    if (at == actual.end()) {
      what = "the guest popped its own context " + detail::hex(guest);
    } else {
      const auto above = static_cast<std::size_t>(at - actual.begin());
      const auto below = static_cast<std::size_t>(actual.end() - at - 1);
      if (above) what = "the guest left " + std::to_string(above) + " context(s) pushed";
      if (below < caller_stack_.size())
        what += (what.empty() ? "" : " and ") + std::string("the guest popped ") +
                std::to_string(caller_stack_.size() - below) + " of the caller's context(s)";
      else if (below > caller_stack_.size())
        what += (what.empty() ? "" : " and ") + std::string("the guest pushed ") +
                std::to_string(below - caller_stack_.size()) + " context(s) under its own";
      if (what.empty()) what = "the guest replaced contexts of the caller's stack";
    }
    const bool repaired = detail::set_context_stack(caller_stack_);
    findings.push_back(
        {guest_breakage::context_stack,
         what + ": the stack after the call was " + describe_stack(actual) + ", expected " +
             describe_stack(expected) + "; " +
             (repaired ? "restored the caller's " + describe_stack(caller_stack_)
                       : "could NOT restore the caller's " + describe_stack(caller_stack_))});
  } catch (const std::exception& e) {
    const bool repaired = detail::set_context_stack(caller_stack_);
    findings.push_back({guest_breakage::context_stack,
                        std::string("reading the stack after the call failed (") + e.what() +
                            "); " + (repaired ? "restored" : "could NOT restore") +
                            " the caller's " + describe_stack(caller_stack_)});
  }
  return findings;
}

void guest_scope::leave() {
  CUBRIDGE_EXPECTS(!left_,
                   "guest_scope::leave called twice for guest '" + guest_->options.name + "'");
  auto findings = restore();
  if (guest_->options.synchronize_after_call) guest_->check_guest(findings);
  guest_->check_host(findings);
  if (!findings.empty()) throw guest_error(guest_->options.name, std::move(findings));
}

}  // namespace cubridge
