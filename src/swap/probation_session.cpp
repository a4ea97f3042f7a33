// One probation: sampling, snapshots into shared memory, the worker's runs and the verdict
// (probation_session.hpp; the model in swap/probation.hpp).
#include "probation_session.hpp"

#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/installation.hpp>
#include <cubridge/core/scoped_current.hpp>

#include <algorithm>
#include <cstring>
#include <utility>

namespace cubridge::swap_internal {
namespace {

namespace protocol = detail::probation_protocol;

std::uint64_t next_session_id() noexcept {
  static std::atomic<std::uint64_t> counter{1};
  return counter.fetch_add(1, std::memory_order_relaxed);
}

template <class T>
void append(std::vector<std::byte>& out, const T& value) {
  const auto at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &value, sizeof(T));
}

sandbox start_worker(const probation_policy& policy, const std::string& module, int device) {
  sandbox_options o;
  o.library = policy.entry_library.empty() ? locate(helper_file::probation_entry).path
                                           : policy.entry_library;
  o.worker = policy.worker;
  o.name = "probation of module '" + module + "'";
  o.call_timeout = policy.run_timeout;
  o.device = device;
  o.workers = 1;
  o.standby = 1;  // a fault costs a worker; the spare takes the next run at once
  return sandbox::start(std::move(o));
}

// `policy`, refused before anything starts if it cannot decide anything.
probation_policy checked(probation_policy policy, const std::string& module) {
  CUBRIDGE_EXPECTS(
      (policy.required_launches > 0 || !policy.replays.empty()) && policy.sample_every > 0,
      "probation of module '" + module +
          "': sample_every must be at least 1, and required_launches too unless "
          "replays are given");
  return policy;
}

// How a kernel's outputs are compared: its own check, else the policy's default.
output_check check_of(const probation_policy& policy, const kernel_check* check) {
  return check ? check->check : policy.default_check;
}

// Whether the allocation behind pointer parameter `parameter` is compared (not ignored).
bool compares(const kernel_check* check, std::size_t parameter) {
  return !check ||
         std::find(check->ignored_parameters.begin(), check->ignored_parameters.end(),
                   static_cast<std::uint32_t>(parameter)) == check->ignored_parameters.end();
}

// The bytes of an argument list packed as the kernel's parameters lay it out.
std::size_t packed_size(std::span<const parameter_info> params) {
  std::size_t end = 0;
  for (const auto& p : params) end = std::max(end, p.offset + p.size);
  return end;
}

const kernel_check* check_for(const probation_policy& policy, const std::string& kernel) {
  for (const auto& c : policy.checks)
    if (c.kernel == kernel) return &c;
  return nullptr;
}

}  // namespace

probation_session::probation_session(context_arg ctx, std::string module,
                                     std::vector<std::string> kernel_names,
                                     std::span<const std::byte> serving_image,
                                     std::span<const std::byte> candidate_image,
                                     probation_policy policy)
    : ctx_(std::move(ctx)),
      module_(std::move(module)),
      kernel_names_(std::move(kernel_names)),
      serving_image_(serving_image.begin(), serving_image.end()),
      candidate_image_(candidate_image.begin(), candidate_image.end()),
      policy_(checked(std::move(policy), module_)),
      session_id_(next_session_id()),
      snapshot_(shared_device_memory::allocate(ctx_.ref().device(), policy_.max_snapshot_bytes,
                                               memory_export::posix_fd)),
      worker_(start_worker(policy_, module_, ctx_.ref().device().ordinal())),
      share_(worker_.share(snapshot_)),
      side_(stream::create(ctx_)),
      ready_(event::create(ctx_)),
      copied_(event::create(ctx_)),
      runner_([this] { run(); }) {
  // The deadline counts from here, with the worker ready: its start (seconds under a
  // sanitizer) is no time the serving version could have given launches in.
  started_ = std::chrono::steady_clock::now();
}

probation_session::~probation_session() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  runner_.join();
}

bool probation_session::sampled() noexcept {
  // The rate was applied by the launch (hot_kernel::sampled); here: one snapshot at a time.
  if (decided_.load(std::memory_order_relaxed)) return false;
  bool idle = false;
  return in_flight_.compare_exchange_strong(idle, true, std::memory_order_acq_rel);
}

void probation_session::mirror(std::uint32_t index, const kernel& k, const launch_config& config,
                               void** arguments) noexcept {
  if (!sampled()) return;
  try {
    auto launch = snapshot(index, k, config, arguments);
    if (!launch) {
      in_flight_.store(false, std::memory_order_release);
      return;
    }
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(*launch));
    }
    changed_.notify_all();
  } catch (const std::exception& e) {
    not_mirrorable(std::string("the snapshot failed: ") + e.what());
    in_flight_.store(false, std::memory_order_release);
  }
}

std::optional<mirrored_launch> probation_session::snapshot(std::uint32_t index, const kernel& k,
                                                           const launch_config& config,
                                                           void** arguments) {
  const auto& name = kernel_names_[index];
  const auto* check = check_for(policy_, name);
  if (check_of(policy_, check) == output_check::never_mirror) {
    not_mirrorable("kernel '" + name + "' is declared never_mirror");
    return std::nullopt;
  }
  if (config.cluster.volume() > 1) {
    not_mirrorable("kernel '" + name + "' is launched with a cluster");
    return std::nullopt;
  }
  auto& cu = driver::api();
  scoped_current current(ctx_.ref());
  const auto params = k.parameters();
  std::vector<std::byte> packed;
  std::vector<protocol::allocation> allocations;
  std::vector<protocol::pointer_argument> pointers;
  std::vector<std::uint32_t> first_parameter;
  packed.resize(packed_size(params));
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    std::memcpy(packed.data() + params[i].offset, arguments[i], params[i].size);
    if (params[i].size != sizeof(CUdeviceptr)) continue;
    CUdeviceptr value = 0;
    std::memcpy(&value, arguments[i], sizeof value);
    CUdeviceptr base = 0;
    std::size_t size = 0;
    // Not a device address (a scalar, a host pointer): taken as it is.
    if (value == 0 || cu.cuMemGetAddressRange(&base, &size, value) != CUDA_SUCCESS) continue;
    const bool compared = compares(check, i);
    auto found = std::find_if(allocations.begin(), allocations.end(),
                              [&](const auto& a) { return a.base == base; });
    if (found != allocations.end() && compared) found->compared = 1;
    if (found == allocations.end()) {
      if (total + size > snapshot_.size_bytes()) {
        not_mirrorable("kernel '" + name + "': its allocations exceed max_snapshot_bytes (" +
                       std::to_string(policy_.max_snapshot_bytes) + ")");
        return std::nullopt;
      }
      allocations.push_back({total, size, base, compared ? 1u : 0u, 0});
      first_parameter.push_back(static_cast<std::uint32_t>(i));
      total += size;
      found = allocations.end() - 1;
    }
    pointers.push_back({static_cast<std::uint32_t>(params[i].offset), static_cast<std::uint32_t>(i),
                        static_cast<std::uint32_t>(found - allocations.begin()), 0, value - base});
  }
  mirrored_launch launch{index, {}, std::move(first_parameter), copied_};
  // Ordered after the inputs are ready (what the launch's stream queued so far), copied on the
  // side stream, and the serving launch waits for the copies only.
  ready_.record(config.stream);
  side_.wait(ready_);
  for (const auto& a : allocations)
    CUBRIDGE_CU(cuMemcpyDtoDAsync,
                (snapshot_.address() + a.snapshot_offset, a.base, a.size, side_.get()),
                "snapshot of kernel '" + name + "' for probation");
  launch.copied.record(side_);
  config.stream.wait(launch.copied);

  launch.request = request_of(name, config, check, packed, allocations, pointers);
  return launch;
}

std::vector<std::byte> probation_session::request_of(
    const std::string& name, const launch_config& config, const kernel_check* check,
    std::span<const std::byte> packed, std::span<const protocol::allocation> allocations,
    std::span<const protocol::pointer_argument> pointers) const {
  protocol::run_header h;
  h.session = session_id_;
  h.name_bytes = static_cast<std::uint32_t>(name.size());
  h.param_bytes = static_cast<std::uint32_t>(packed.size());
  h.allocations = static_cast<std::uint32_t>(allocations.size());
  h.pointers = static_cast<std::uint32_t>(pointers.size());
  h.grid[0] = config.grid.x, h.grid[1] = config.grid.y, h.grid[2] = config.grid.z;
  h.block[0] = config.block.x, h.block[1] = config.block.y, h.block[2] = config.block.z;
  h.shared_bytes = config.dynamic_shared_bytes;
  h.check = static_cast<std::uint32_t>(check_of(policy_, check));
  if (check) h.absolute = check->absolute, h.relative = check->relative;
  // Sized once and filled in place (GCC 12 misreads growing inserts into a fresh vector).
  std::vector<std::byte> request(sizeof h + name.size() + packed.size() + allocations.size_bytes() +
                                 pointers.size_bytes());
  std::size_t at = 0;
  const auto put = [&](const void* bytes, std::size_t size) {
    if (size != 0) std::memcpy(request.data() + at, bytes, size);
    at += size;
  };
  put(&h, sizeof h);
  put(name.data(), name.size());
  put(packed.data(), packed.size());
  put(allocations.data(), allocations.size_bytes());
  put(pointers.data(), pointers.size_bytes());
  return request;
}

bool probation_session::replay(std::span<const kernel> kernels) {
  for (std::uint32_t r = 0; r < policy_.replays.size(); ++r) {
    const auto& launch = policy_.replays[r];
    const auto at = std::find(kernel_names_.begin(), kernel_names_.end(), launch.kernel);
    const std::string which = "replay " + std::to_string(r + 1) + " ('" + launch.kernel + "')";
    if (at == kernel_names_.end()) {
      decide(probation_verdict::incomplete, which + ": the module has no such kernel");
      return false;
    }
    const auto index = static_cast<std::uint32_t>(at - kernel_names_.begin());
    const auto params = kernels[index].parameters();
    if (params.size() != launch.arguments.size()) {
      decide(probation_verdict::incomplete, which + ": " + std::to_string(launch.arguments.size()) +
                                                " arguments for " + std::to_string(params.size()) +
                                                " parameters");
      return false;
    }
    const auto* check = check_for(policy_, launch.kernel);
    std::vector<std::byte> packed(packed_size(params));
    std::vector<protocol::allocation> allocations;
    std::vector<protocol::pointer_argument> pointers;
    std::vector<std::uint32_t> first_parameter;
    std::uint64_t total = 0;
    scoped_current current(ctx_.ref());
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto& a = launch.arguments[i];
      if (a.buffer.empty()) {
        if (a.scalar.size() != params[i].size) {
          decide(probation_verdict::incomplete, which + ": argument " + std::to_string(i) +
                                                    " has " + std::to_string(a.scalar.size()) +
                                                    " bytes, the parameter " +
                                                    std::to_string(params[i].size));
          return false;
        }
        std::memcpy(packed.data() + params[i].offset, a.scalar.data(), a.scalar.size());
        continue;
      }
      if (params[i].size != sizeof(CUdeviceptr) ||
          total + a.buffer.size() > snapshot_.size_bytes()) {
        decide(probation_verdict::incomplete,
               which + ": argument " + std::to_string(i) +
                   (params[i].size != sizeof(CUdeviceptr) ? " is no pointer parameter"
                                                          : " exceeds max_snapshot_bytes"));
        return false;
      }
      CUBRIDGE_CU(cuMemcpy,
                  (snapshot_.address() + total, reinterpret_cast<CUdeviceptr>(a.buffer.data()),
                   a.buffer.size()),
                  "the inputs of " + which + " for probation");
      pointers.push_back({static_cast<std::uint32_t>(params[i].offset),
                          static_cast<std::uint32_t>(i),
                          static_cast<std::uint32_t>(allocations.size()), 0, 0});
      allocations.push_back({total, a.buffer.size(), 0, compares(check, i) ? 1u : 0u, 0});
      first_parameter.push_back(static_cast<std::uint32_t>(i));
      total += (a.buffer.size() + 255) / 256 * 256;  // each buffer aligned as cuMemAlloc's
    }
    launch_config config{launch.grid, launch.block, launch.dynamic_shared_bytes,
                         stream_ref::legacy_default()};
    mirrored_launch m{index,
                      request_of(launch.kernel, config, check, packed, allocations, pointers),
                      std::move(first_parameter), copied_};
    m.copied.record(side_);
    judge(m, r + 1);
    if (decided_.load()) return false;
    std::lock_guard lock(mutex_);
    ++result_.replays_passed;
  }
  if (policy_.required_launches == 0)
    decide(probation_verdict::passed,
           std::to_string(policy_.replays.size()) + " replays matched the serving version");
  return true;
}

void probation_session::not_mirrorable(std::string why) noexcept {
  try {
    std::lock_guard lock(mutex_);
    ++result_.not_mirrorable;
    if (result_.detail.empty()) result_.detail = "not mirrorable: " + std::move(why);
  } catch (...) {
  }
}

void probation_session::load() {
  std::vector<std::byte> request;
  append(request,
         protocol::load_header{session_id_, serving_image_.size(), candidate_image_.size()});
  request.insert(request.end(), serving_image_.begin(), serving_image_.end());
  request.insert(request.end(), candidate_image_.begin(), candidate_image_.end());
  const auto reply = worker_.call(protocol::load_entry, {.bytes = request});
  if (reply.status != protocol::ok)
    detail::throw_errc(errc::precondition, "probation",
                       "the probation worker could not load module '" + module_ + "' (status " +
                           std::to_string(reply.status) + ")");
}

sandbox_reply probation_session::call(const char* entry, std::span<const std::byte> request) {
  auto reply = worker_.call(entry, {.bytes = request, .buffers = {std::cref(share_)}});
  if (reply.status == protocol::not_loaded) {
    load();
    reply = worker_.call(entry, {.bytes = request, .buffers = {std::cref(share_)}});
  }
  return reply;
}

void probation_session::decide(probation_verdict verdict, std::string detail) {
  {
    std::lock_guard lock(mutex_);
    if (decided_.load()) return;
    result_.verdict = verdict;
    result_.detail = std::move(detail);
    decided_.store(true);
  }
  changed_.notify_all();
}

bool probation_session::serving_ran(const mirrored_launch& launch, const std::string& which,
                                    std::uint32_t replay) {
  const auto& name = kernel_names_[launch.kernel];
  try {
    const auto serving = call(protocol::run_serving_entry, launch.request);
    if (serving.status == protocol::ok) return true;
    const std::string why = "the serving version's run of '" + name + "' on " + which +
                            " failed in the worker (status " + std::to_string(serving.status) + ")";
    if (replay)
      decide(probation_verdict::incomplete, why);
    else
      not_mirrorable(why);
  } catch (const sandbox_error&) {
    {
      std::lock_guard lock(mutex_);
      ++result_.serving_faulted;  // inconclusive: the serving version's own fault
    }
    if (replay)
      decide(probation_verdict::incomplete,
             "the serving version itself faulted on " + which + ": its inputs are not valid");
  }
  return false;
}

void probation_session::refuse(probation_verdict verdict, const mirrored_launch& launch,
                               std::uint32_t number, std::uint32_t replay,
                               const protocol::run_reply& reply, std::string detail) {
  {
    std::lock_guard lock(mutex_);
    result_.kernel = kernel_names_[launch.kernel];
    result_.launch = replay ? 0 : number;
    result_.replay = replay;
    if (verdict == probation_verdict::mismatch) {
      result_.parameter = reply.allocation < launch.pointer_parameters.size()
                              ? launch.pointer_parameters[reply.allocation]
                              : 0;
      result_.offset = reply.offset;
    }
  }
  decide(verdict, std::move(detail));
}

void probation_session::judge(mirrored_launch& launch, std::uint32_t replay) {
  const auto& name = kernel_names_[launch.kernel];
  launch.copied.synchronize();
  std::uint32_t number = 0;
  {
    std::lock_guard lock(mutex_);
    number = result_.passed + 1;
  }
  const std::string which =
      replay ? "replay " + std::to_string(replay) : "mirrored launch " + std::to_string(number);
  if (!serving_ran(launch, which, replay)) return;
  sandbox_reply reply;
  try {
    reply = call(protocol::run_candidate_entry, launch.request);
  } catch (const sandbox_error& e) {
    refuse(probation_verdict::faulted, launch, number, replay, {},
           "kernel '" + name + "' faulted on " + which + " in the probation worker: " + e.what());
    return;
  }
  protocol::run_reply r;
  if (reply.status != protocol::ok || reply.bytes.size() != sizeof r) {
    const std::string why = "the candidate's run of '" + name + "' on " + which +
                            " failed in the worker (status " + std::to_string(reply.status) + ")";
    if (replay)
      decide(probation_verdict::incomplete, why);
    else
      not_mirrorable(why);
    return;
  }
  std::memcpy(&r, reply.bytes.data(), sizeof r);
  if (r.differs) {
    const auto parameter = r.allocation < launch.pointer_parameters.size()
                               ? launch.pointer_parameters[r.allocation]
                               : 0;
    refuse(probation_verdict::mismatch, launch, number, replay, r,
           "kernel '" + name + "' wrote different bytes than the serving version on " + which +
               ": the buffer of parameter " + std::to_string(parameter) +
               " differs first at byte offset " + std::to_string(r.offset));
    return;
  }
  if (replay) return;  // replay() counts it
  bool passed = false;
  {
    std::lock_guard lock(mutex_);
    passed = ++result_.passed >= policy_.required_launches;
  }
  if (passed)
    decide(probation_verdict::passed, std::to_string(policy_.required_launches) +
                                          " mirrored launches matched the serving version");
}

void probation_session::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    auto launch = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    if (!decided_.load()) {
      try {
        judge(launch);
      } catch (const std::exception& e) {
        not_mirrorable(std::string("the worker could not run it: ") + e.what());
      }
    }
    in_flight_.store(false, std::memory_order_release);
    lock.lock();
  }
}

probation_result probation_session::wait() {
  std::unique_lock lock(mutex_);
  changed_.wait_until(lock, started_ + policy_.deadline, [&] { return decided_.load(); });
  if (!decided_.load()) {
    result_.verdict = probation_verdict::incomplete;
    result_.detail = std::to_string(result_.passed) + " of " +
                     std::to_string(policy_.required_launches) +
                     " mirrored launches passed within the deadline (" +
                     std::to_string(policy_.deadline.count()) + " ms)" +
                     (result_.detail.empty() ? std::string() : "; " + result_.detail);
    decided_.store(true);
  }
  result_.duration = std::chrono::steady_clock::now() - started_;
  return result_;
}

}  // namespace cubridge::swap_internal
