// A sandbox's calls: a free worker taken, the call message with the buffers that worker has
// not mapped yet, the reply or the failure, and the failed worker's replacement (sandbox_pool.cpp)
// before the failure is thrown.
#include "sandbox_state.hpp"

#include <cubridge/core/detail/describe.hpp>

#include <exception>
#include <system_error>

namespace cubridge {

namespace protocol = detail::sandbox_protocol;
using clock_type = std::chrono::steady_clock;
using sandbox_internal::call_name;

namespace {

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

/// One call in one worker's slot, held from acquire to the end: given back when the worker is
/// fit for more, replaced after a failure that ended it, abandoned (the worker retired) when an
/// unexpected exception leaves its state unknown.
class call_in_slot {
 public:
  call_in_slot(sandbox_internal::sandbox_state& s, std::string entry)
      : s_(s), entry_(std::move(entry)), index_(s.acquire(entry_)), held_(true) {}
  call_in_slot(const call_in_slot&) = delete;
  call_in_slot& operator=(const call_in_slot&) = delete;
  ~call_in_slot() {
    if (held_) s_.abandon(index_);
  }

  sandbox_reply run(const sandbox_request& request) {
    capacity_ = request.reply_capacity;
    const auto sent = send(request);
    const auto timeout = request.timeout.count() > 0 ? request.timeout : s_.options.call_timeout;
    const auto f = receive(timeout);
    return handle(f, sent);
  }

 private:
  // The holder alone touches its slot's worker: nobody else while the slot is busy.
  sandbox_internal::worker& w() const { return *s_.slots[index_].w; }
  void release() noexcept {
    held_ = false;
    s_.release(index_);
  }

  /// Sends the call; returns the ids of the buffers whose fds went with it.
  std::vector<std::uint64_t> send(const sandbox_request& request);
  protocol::frame receive(std::chrono::milliseconds timeout);
  sandbox_reply handle(const protocol::frame& f, const std::vector<std::uint64_t>& sent_ids);
  /// Reports a failure that ended the worker: it is replaced first. `fault`: what the worker
  /// reported with a cuda_fault or device_reset.
  [[noreturn]] void fail(sandbox_failure reason, const std::string& detail,
                         std::optional<sandbox_fault_report> fault = std::nullopt);
  /// The worker ended (EOF or a failed send): say how.
  [[noreturn]] void died();
  /// Reports a failure the worker survives: its slot is given back first.
  [[noreturn]] void refuse(sandbox_failure reason, const std::string& detail) {
    const std::string who = s_.who(w().process.pid());
    release();
    throw sandbox_error(reason, call_name(entry_), who + ": " + detail, false, {});
  }

  sandbox_internal::sandbox_state& s_;
  std::string entry_;
  std::size_t index_;
  bool held_;
  clock_type::time_point seen_ = clock_type::now();  // when the failure was seen
  std::size_t capacity_ = 0;                         // the reply room the call asked for
};

std::vector<std::uint64_t> call_in_slot::send(const sandbox_request& request) {
  protocol::call_message message;
  message.entry = entry_;
  message.request.assign(request.bytes.begin(), request.bytes.end());
  message.reply_capacity = request.reply_capacity;
  sandbox_internal::shared_buffers buffers;
  CUdeviceptr unknown = 0;
  {
    std::lock_guard lock(s_.mutex);
    for (const sandbox_share& share : request.buffers) {
      const auto it = s_.shares.find(share.id());
      if (it == s_.shares.end()) {
        unknown = share.host_address();
        break;
      }
      buffers.emplace_back(it->first, it->second);
    }
  }
  if (unknown != 0 || buffers.size() != request.buffers.size())
    refuse(sandbox_failure::buffer_import_failed,
           "buffer " + detail::hex(unknown) + " is not shared with this sandbox");
  std::vector<int> fds;
  std::vector<std::uint64_t> sent_ids;
  for (const auto& [id, b] : buffers) {
    const bool has_fd = !w().mapped.contains(id);
    message.buffers.push_back({id, b->size, b->host_address, has_fd, b->device});
    if (!has_fd) continue;
    fds.push_back(b->fd.get());
    sent_ids.push_back(id);
    w().sent.insert(id);
  }
  try {
    protocol::send_frame(w().process.socket(), protocol::message_type::call,
                         protocol::encode(message), fds);
  } catch (const std::system_error&) {
    seen_ = clock_type::now();
    died();
  } catch (const protocol::protocol_violation& e) {
    refuse(sandbox_failure::protocol, std::string("cannot send the call: ") + e.what());
  }
  return sent_ids;
}

protocol::frame call_in_slot::receive(std::chrono::milliseconds timeout) {
  protocol::frame f;
  protocol::receive_status status{};
  try {
    status = protocol::receive_frame(w().process.socket(), f, clock_type::now() + timeout,
                                     protocol::reply_payload_limit(capacity_));
    seen_ = clock_type::now();
  } catch (const protocol::protocol_violation& e) {
    seen_ = clock_type::now();
    fail(sandbox_failure::protocol,
         "malformed reply to '" + entry_ + "': " + e.what() + "; worker killed");
  } catch (const std::system_error&) {
    seen_ = clock_type::now();
    died();
  }
  if (status == protocol::receive_status::timed_out)
    fail(sandbox_failure::timed_out, "'" + entry_ + "' did not return within " +
                                         std::to_string(timeout.count()) + " ms; worker pid " +
                                         std::to_string(w().process.pid()) + " killed (SIGKILL)");
  if (status == protocol::receive_status::closed) died();
  return f;
}

sandbox_reply call_in_slot::handle(const protocol::frame& f,
                                   const std::vector<std::uint64_t>& sent_ids) {
  const pid_t pid = w().process.pid();
  try {
    switch (f.type) {
      case protocol::message_type::result: {
        auto result = protocol::decode_result(f.payload);
        // The worker clamps what a library claims; a longer reply is a worker not to trust.
        if (result.reply.size() > capacity_)
          fail(sandbox_failure::protocol, "'" + entry_ + "' replied " +
                                              std::to_string(result.reply.size()) +
                                              " bytes, more than the " + std::to_string(capacity_) +
                                              " bytes of room the call asked for; worker killed");
        for (auto id : sent_ids) w().mapped.insert(id);
        release();
        return {result.status, std::move(result.reply)};
      }
      case protocol::message_type::call_failed: {
        const auto failed = protocol::decode_call_failed(f.payload);
        const auto reason = failure_of(failed.reason);
        if (reason == sandbox_failure::protocol)
          fail(reason, "the worker refused the call: " + failed.detail);
        refuse(reason, failed.detail);
      }
      case protocol::message_type::cuda_fault: {
        const auto fault = protocol::decode_cuda_fault(f.payload);
        const std::string returned =
            "'" + fault.entry + "' (returned " + std::to_string(fault.entry_status) + ")";
        // The same facts as fields of the error, for callers that act on them (sandbox.hpp).
        const sandbox_fault_report report{static_cast<CUresult>(fault.code), fault.entry_status};
        if (fault.context_reset)
          fail(sandbox_failure::device_reset,
               returned + " reset the device in worker pid " + std::to_string(pid) + ": " +
                   fault.name +
                   "; the worker's mappings and the library's state went with it, "
                   "so it ended itself; the host's contexts are another process's",
               report);
        fail(sandbox_failure::cuda_fault,
             returned + " broke CUDA in worker pid " + std::to_string(pid) + ": " + fault.name +
                 " (CUresult " + std::to_string(fault.code) +
                 "); the worker ended itself, the host's contexts are another process's",
             report);
      }
      case protocol::message_type::dying: {
        const auto end = w().process.confirm_last_words(protocol::decode_dying(f.payload));
        fail(end.reason, end.text + " during '" + entry_ + "'");
      }
      default:
        break;
    }
  } catch (const protocol::protocol_violation& e) {
    fail(sandbox_failure::protocol,
         "malformed reply to '" + entry_ + "': " + e.what() + "; worker killed");
  }
  fail(sandbox_failure::protocol, "unexpected message type " +
                                      std::to_string(static_cast<int>(f.type)) + " in reply to '" +
                                      entry_ + "'; worker killed");
}

void call_in_slot::fail(sandbox_failure reason, const std::string& detail,
                        std::optional<sandbox_fault_report> fault) {
  held_ = false;
  const auto r = s_.replace(index_, seen_);
  throw sandbox_error(
      reason, call_name(entry_),
      "sandbox '" + s_.name + "' (library " + s_.options.library.string() + "): " + detail + r.note,
      r.how, r.duration, seen_, fault);
}

void call_in_slot::died() {
  auto& process = w().process;
  // Its last words may wait in the socket: a send that found it gone comes before the read.
  std::optional<sandbox_internal::worker_end> end;
  try {
    protocol::frame f;
    if (protocol::receive_frame(process.socket(), f,
                                clock_type::now() + std::chrono::milliseconds(1)) ==
            protocol::receive_status::ok &&
        f.type == protocol::message_type::dying)
      end = process.confirm_last_words(protocol::decode_dying(f.payload));
  } catch (const std::exception&) {
    // Nothing readable: its exit status tells.
  }
  if (!end) end = process.wait_for_exit(std::chrono::milliseconds(2000));
  if (!end) end = process.kill_and_reap();
  fail(end->reason, end->text + " during '" + entry_ + "'");
}

}  // namespace

std::string sandbox_internal::sandbox_state::who(pid_t pid) const {
  return "sandbox '" + name + "' (library " + options.library.string() + ", worker pid " +
         std::to_string(pid) + ")";
}

sandbox_reply sandbox_internal::sandbox_state::call(std::string_view entry,
                                                    const sandbox_request& request) {
  call_in_slot c(*this, std::string(entry));
  return c.run(request);
}

}  // namespace cubridge
