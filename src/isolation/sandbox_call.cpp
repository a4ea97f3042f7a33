// A sandbox's calls: the call message with the buffers the worker has not mapped yet, the reply
// or the failure, and the restart of the worker after each failure that ends it.
#include "sandbox_state.hpp"

#include <cubridge/core/detail/describe.hpp>

#include <exception>
#include <system_error>

namespace cubridge {

namespace protocol = detail::sandbox_protocol;
using clock_type = std::chrono::steady_clock;

namespace {

std::string call_name(const std::string& entry) {
  return "sandbox::call(\"" + entry + "\")";
}

sandbox_failure failure_of(protocol::call_failure reason) noexcept {
  switch (reason) {
    case protocol::call_failure::no_such_entry:
      return sandbox_failure::no_such_entry;
    case protocol::call_failure::buffer_import:
      return sandbox_failure::buffer_import_failed;
    case protocol::call_failure::bad_request:
      break;
  }
  return sandbox_failure::protocol;
}

}  // namespace

std::string sandbox::state::who() const {
  return "sandbox '" + name + "' (library " + options.library.string() + ", worker pid " +
         std::to_string(worker.pid()) + ")";
}

std::string sandbox::state::start_worker() {
  const auto started = clock_type::now();
  ++generation;
  auto failure = worker.start({worker_path, options.library, options.device,
                               options.initialize_cuda, options.start_timeout},
                              cuda_status);
  if (failure.empty()) last_start = clock_type::now() - started;
  return failure;
}

sandbox::state::restart_outcome sandbox::state::restart() {
  const auto started = clock_type::now();
  if (worker.running()) worker.kill_and_reap();
  ++restarts;
  auto failure = start_worker();
  return {std::move(failure), clock_type::now() - started};
}

void sandbox::state::fail(sandbox_failure reason, const std::string& entry,
                          const std::string& detail) {
  const auto outcome = restart();
  const bool restarted = outcome.failure.empty();
  throw sandbox_error(reason, call_name(entry),
                      "sandbox '" + name + "' (library " + options.library.string() +
                          "): " + detail + (restarted ? "" : "; the worker could NOT be restarted"),
                      restarted, outcome.duration);
}

void sandbox::state::worker_died(const std::string& entry) {
  auto end = worker.wait_for_exit(std::chrono::milliseconds(2000));
  if (!end) end = worker.kill_and_reap();
  fail(end->reason, entry, end->text + " during '" + entry + "'");
}

void sandbox::state::ensure_worker(const std::string& entry) {
  if (worker.running()) return;
  const auto started = clock_type::now();
  if (auto failure = start_worker(); !failure.empty())
    throw sandbox_error(sandbox_failure::start_failed, call_name(entry),
                        "sandbox '" + name + "': starting worker " + worker_path.string() +
                            " for " + options.library.string() + " failed: " + failure,
                        false, clock_type::now() - started);
}

std::vector<std::uint64_t> sandbox::state::send_call(const std::string& entry,
                                                     const sandbox_request& request) {
  protocol::call_message message;
  message.entry = entry;
  message.request.assign(request.bytes.begin(), request.bytes.end());
  message.reply_capacity = request.reply_capacity;
  std::vector<int> fds;
  std::vector<std::uint64_t> sent_ids;
  for (const sandbox_share& share : request.buffers) {
    const auto it = shares.find(share.id());
    if (it == shares.end())
      throw sandbox_error(sandbox_failure::buffer_import_failed, call_name(entry),
                          who() + ": buffer " + detail::hex(share.host_address()) +
                              " is not shared with this sandbox",
                          false, {});
    auto& b = it->second;
    const bool has_fd = b.mapped_generation != generation;
    message.buffers.push_back({it->first, b.size, b.host_address, has_fd, b.device});
    if (has_fd) {
      fds.push_back(b.fd.get());
      sent_ids.push_back(it->first);
    }
  }
  try {
    protocol::send_frame(worker.socket(), protocol::message_type::call, protocol::encode(message),
                         fds);
  } catch (const std::system_error&) {
    worker_died(entry);
  } catch (const protocol::protocol_violation& e) {
    throw sandbox_error(sandbox_failure::protocol, call_name(entry),
                        who() + ": cannot send the call: " + e.what(), false, {});
  }
  return sent_ids;
}

protocol::frame sandbox::state::receive_reply(const std::string& entry,
                                              std::chrono::milliseconds timeout) {
  protocol::frame f;
  protocol::receive_status status;
  try {
    status = protocol::receive_frame(worker.socket(), f, clock_type::now() + timeout);
  } catch (const protocol::protocol_violation& e) {
    fail(sandbox_failure::protocol, entry,
         "malformed reply to '" + entry + "': " + e.what() + "; worker killed");
  } catch (const std::system_error&) {
    worker_died(entry);
  }
  if (status == protocol::receive_status::timed_out) {
    const pid_t pid = worker.pid();  // fail() kills it
    fail(sandbox_failure::timed_out, entry,
         "'" + entry + "' did not return within " + std::to_string(timeout.count()) +
             " ms; worker pid " + std::to_string(pid) + " killed (SIGKILL)");
  }
  if (status == protocol::receive_status::closed) worker_died(entry);
  return f;
}

sandbox_reply sandbox::state::handle_reply(const std::string& entry, const protocol::frame& f,
                                           const std::vector<std::uint64_t>& sent_ids) {
  try {
    switch (f.type) {
      case protocol::message_type::result: {
        auto result = protocol::decode_result(f.payload);
        for (auto id : sent_ids)
          if (auto it = shares.find(id); it != shares.end())
            it->second.mapped_generation = generation;
        return {result.status, std::move(result.reply)};
      }
      case protocol::message_type::call_failed: {
        const auto failed = protocol::decode_call_failed(f.payload);
        const auto reason = failure_of(failed.reason);
        if (reason == sandbox_failure::protocol)
          fail(reason, entry, "the worker refused the call: " + failed.detail);
        throw sandbox_error(reason, call_name(entry), who() + ": " + failed.detail, false, {});
      }
      case protocol::message_type::cuda_fault: {
        const auto fault = protocol::decode_cuda_fault(f.payload);
        const pid_t pid = worker.pid();
        if (!worker.wait_for_exit(std::chrono::milliseconds(5000))) worker.kill_and_reap();
        fail(sandbox_failure::cuda_fault, entry,
             "'" + fault.entry + "' (returned " + std::to_string(fault.entry_status) +
                 ") broke CUDA in worker pid " + std::to_string(pid) + ": " + fault.name +
                 " (CUresult " + std::to_string(fault.code) +
                 "); the worker ended itself, the host's contexts are another process's");
      }
      default:
        break;
    }
  } catch (const protocol::protocol_violation& e) {
    fail(sandbox_failure::protocol, entry,
         "malformed reply to '" + entry + "': " + e.what() + "; worker killed");
  }
  fail(sandbox_failure::protocol, entry,
       "unexpected message type " + std::to_string(static_cast<int>(f.type)) + " in reply to '" +
           entry + "'; worker killed");
}

sandbox_reply sandbox::state::call(std::string_view entry_view, const sandbox_request& request) {
  const std::string entry(entry_view);
  std::lock_guard lock(mutex);
  ensure_worker(entry);
  const auto sent_ids = send_call(entry, request);
  const auto timeout = request.timeout.count() > 0 ? request.timeout : options.call_timeout;
  const auto reply = receive_reply(entry, timeout);
  return handle_reply(entry, reply, sent_ids);
}

void sandbox::state::unshare(std::uint64_t id) noexcept {
  std::lock_guard lock(mutex);
  const auto it = shares.find(id);
  if (it == shares.end()) return;
  if (worker.running() && it->second.mapped_generation == generation) {
    try {
      protocol::send_frame(worker.socket(), protocol::message_type::unshare,
                           protocol::encode(protocol::unshare_message{id}));
    } catch (...) {
      // A dead worker took its mappings with it; the next call notices the death.
    }
  }
  shares.erase(it);
}

}  // namespace cubridge
