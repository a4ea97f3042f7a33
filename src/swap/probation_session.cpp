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
  const auto* p = reinterpret_cast<const std::byte*>(&value);
  out.insert(out.end(), p, p + sizeof(T));
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
      policy_(std::move(policy)),
      session_id_(next_session_id()),
      snapshot_(shared_device_memory::allocate(ctx_.ref().device(), policy_.max_snapshot_bytes,
                                               memory_export::posix_fd)),
      worker_(start_worker(policy_, module_, ctx_.ref().device().ordinal())),
      share_(worker_.share(snapshot_)),
      side_(stream::create(ctx_)),
      runner_([this] { run(); }) {
  CUBRIDGE_EXPECTS(policy_.required_launches > 0 && policy_.sample_every > 0,
                   "probation of module '" + module_ +
                       "': required_launches and sample_every must be at least 1");
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
  const auto n = launches_.fetch_add(1, std::memory_order_relaxed);
  if (n % policy_.sample_every != 0 || decided_.load(std::memory_order_relaxed)) return false;
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
  const auto how = check ? check->check : policy_.default_check;
  if (how == output_check::never_mirror) {
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
  std::size_t end = 0;
  for (const auto& p : params) end = std::max(end, p.offset + p.size);
  packed.resize(end);
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
    auto found = std::find_if(allocations.begin(), allocations.end(),
                              [&](const auto& a) { return a.base == base; });
    if (found == allocations.end()) {
      if (total + size > snapshot_.size_bytes()) {
        not_mirrorable("kernel '" + name + "': its allocations exceed max_snapshot_bytes (" +
                       std::to_string(policy_.max_snapshot_bytes) + ")");
        return std::nullopt;
      }
      allocations.push_back({total, size, base});
      first_parameter.push_back(static_cast<std::uint32_t>(i));
      total += size;
      found = allocations.end() - 1;
    }
    pointers.push_back({static_cast<std::uint32_t>(params[i].offset), static_cast<std::uint32_t>(i),
                        static_cast<std::uint32_t>(found - allocations.begin()), 0, value - base});
  }
  mirrored_launch launch{index, {}, std::move(first_parameter), event::create(ctx_)};
  // Ordered after the inputs are ready (what the launch's stream queued so far), copied on the
  // side stream, and the serving launch waits for the copies only.
  const auto ready = event::create(ctx_);
  ready.record(config.stream);
  side_.wait(ready);
  for (const auto& a : allocations)
    CUBRIDGE_CU(cuMemcpyDtoDAsync,
                (snapshot_.address() + a.snapshot_offset, a.base, a.size, side_.get()),
                "snapshot of kernel '" + name + "' for probation");
  launch.copied.record(side_);
  config.stream.wait(launch.copied);

  protocol::run_header h;
  h.session = session_id_;
  h.name_bytes = static_cast<std::uint32_t>(name.size());
  h.param_bytes = static_cast<std::uint32_t>(packed.size());
  h.allocations = static_cast<std::uint32_t>(allocations.size());
  h.pointers = static_cast<std::uint32_t>(pointers.size());
  h.grid[0] = config.grid.x, h.grid[1] = config.grid.y, h.grid[2] = config.grid.z;
  h.block[0] = config.block.x, h.block[1] = config.block.y, h.block[2] = config.block.z;
  h.shared_bytes = config.dynamic_shared_bytes;
  h.check = static_cast<std::uint32_t>(how);
  if (check) h.absolute = check->absolute, h.relative = check->relative;
  append(launch.request, h);
  const auto* n = reinterpret_cast<const std::byte*>(name.data());
  launch.request.insert(launch.request.end(), n, n + name.size());
  launch.request.insert(launch.request.end(), packed.begin(), packed.end());
  for (const auto& a : allocations) append(launch.request, a);
  for (const auto& p : pointers) append(launch.request, p);
  return launch;
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

void probation_session::judge(mirrored_launch& launch) {
  const auto& name = kernel_names_[launch.kernel];
  launch.copied.synchronize();
  std::uint32_t number = 0;
  {
    std::lock_guard lock(mutex_);
    number = result_.passed + 1;
  }
  try {
    const auto serving = call(protocol::run_serving_entry, launch.request);
    if (serving.status != protocol::ok) {
      not_mirrorable("the serving version's run of '" + name + "' failed in the worker (status " +
                     std::to_string(serving.status) + ")");
      return;
    }
  } catch (const sandbox_error& e) {
    std::lock_guard lock(mutex_);
    ++result_.serving_faulted;  // inconclusive: the serving version's own fault
    return;
  }
  sandbox_reply reply;
  try {
    reply = call(protocol::run_candidate_entry, launch.request);
  } catch (const sandbox_error& e) {
    {
      std::lock_guard lock(mutex_);
      result_.kernel = name;
      result_.launch = number;
    }
    decide(probation_verdict::faulted, "kernel '" + name + "' faulted on mirrored launch " +
                                           std::to_string(number) +
                                           " in the probation worker: " + e.what());
    return;
  }
  protocol::run_reply r;
  if (reply.status != protocol::ok || reply.bytes.size() != sizeof r) {
    not_mirrorable("the candidate's run of '" + name + "' failed in the worker (status " +
                   std::to_string(reply.status) + ")");
    return;
  }
  std::memcpy(&r, reply.bytes.data(), sizeof r);
  if (r.differs) {
    const auto parameter = r.allocation < launch.pointer_parameters.size()
                               ? launch.pointer_parameters[r.allocation]
                               : 0;
    {
      std::lock_guard lock(mutex_);
      result_.kernel = name;
      result_.launch = number;
      result_.parameter = parameter;
      result_.offset = r.offset;
    }
    decide(probation_verdict::mismatch,
           "kernel '" + name +
               "' wrote different bytes than the serving version on mirrored "
               "launch " +
               std::to_string(number) + ": the buffer of parameter " + std::to_string(parameter) +
               " differs first at byte offset " + std::to_string(r.offset));
    return;
  }
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
  result_.launches_seen = launches_.load(std::memory_order_relaxed);
  result_.duration = std::chrono::steady_clock::now() - started_;
  return result_;
}

}  // namespace cubridge::swap_internal
