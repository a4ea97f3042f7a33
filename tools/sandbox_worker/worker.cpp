// cubridge-sandbox-worker: runs a third-party library's entry points for a cubridge::sandbox host.
//
//   cubridge-sandbox-worker --socket=FD --library=PATH [--device=N] [--cuda=0|1]
//
// Started by the host (posix_spawn, core/detail/child_process.hpp) with its end of a Unix stream
// socket at FD. It dlopens the library, optionally initialises CUDA (the device's primary context
// retained and made current, so the library's runtime uses it too), reports ready, then serves
// calls one at a time: maps the shared buffers it has not seen (buffer_mappings.hpp; a spare
// gets them ahead of any call, in a map message), calls the entry, and checks its primary
// context (reset?) and the current context (a sticky CUDA error?). After either it reports
// cuda_fault and exits: a poisoned process cannot be repaired. A fatal signal or a library's
// exit() is reported as the worker's last words (last_words.hpp). It exits when the host closes
// the socket, also while an entry still runs (a watchdog thread sees the hang-up).
#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/detail/describe.hpp>
#include <cubridge/core/detail/process_tree.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/unique_fd.hpp>
#include <cubridge/isolation/detail/sandbox_protocol.hpp>
#include <cubridge/isolation/sandbox_entry.hpp>

#include "buffer_mappings.hpp"
#include "last_words.hpp"

#include <dlfcn.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace protocol = cubridge::detail::sandbox_protocol;

struct worker_options {
  int socket = -1;
  std::string library;
  int device = 0;
  bool cuda = true;
};

std::optional<worker_options> parse(int argc, char** argv) {
  worker_options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* prefix) -> std::optional<std::string> {
      const std::size_t n = std::strlen(prefix);
      if (a.compare(0, n, prefix) == 0) return a.substr(n);
      return std::nullopt;
    };
    if (auto v = value("--socket="))
      o.socket = std::atoi(v->c_str());
    else if (auto v2 = value("--library="))
      o.library = *v2;
    else if (auto v3 = value("--device="))
      o.device = std::atoi(v3->c_str());
    else if (auto v4 = value("--cuda="))
      o.cuda = *v4 != "0";
    else
      return std::nullopt;
  }
  if (o.socket < 0 || o.library.empty()) return std::nullopt;
  return o;
}

/// What a call did to CUDA here: the code, its description, and whether the primary context
/// was reset.
struct cuda_damage_found {
  CUresult code = CUDA_SUCCESS;
  std::string description;
  bool context_reset = false;
};

class worker {
 public:
  explicit worker(worker_options o) : options_(std::move(o)) {}

  int run() {
    library_ = ::dlopen(options_.library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!library_) {
      const char* why = ::dlerror();
      send(protocol::message_type::start_failed,
           protocol::encode(protocol::start_failed_message{"cannot load " + options_.library +
                                                           ": " + (why ? why : "dlopen failed")}));
      return protocol::worker_exit_start_failed;
    }
    std::string cuda_status;
    if (options_.cuda) cuda_status = initialise_cuda();
    cubridge_worker::report_exit(options_.socket);
    send(protocol::message_type::ready, protocol::encode(protocol::ready_message{
                                            static_cast<std::int32_t>(::getpid()), cuda_status}));
    for (;;) {
      protocol::frame f;
      try {
        if (protocol::receive_frame(options_.socket, f, std::nullopt) !=
            protocol::receive_status::ok)
          return 0;  // the host closed the socket: done
        switch (f.type) {
          case protocol::message_type::call:
            if (const int code = serve(f); code != 0) return code;
            break;
          case protocol::message_type::unshare:
            if (cuda_ready_) buffers_.unmap(protocol::decode_unshare(f.payload).id);
            break;
          case protocol::message_type::map:
            map_ahead(f);
            break;
          default:
            std::fprintf(stderr, "cubridge-sandbox-worker: unexpected message type %d\n",
                         static_cast<int>(f.type));
            return protocol::worker_exit_protocol;
        }
      } catch (const protocol::protocol_violation& e) {
        std::fprintf(stderr, "cubridge-sandbox-worker: protocol violation: %s\n", e.what());
        return protocol::worker_exit_protocol;
      } catch (const std::system_error&) {
        return 0;  // the socket is gone
      }
    }
  }

 private:
  void send(protocol::message_type type, const std::vector<std::byte>& payload) {
    protocol::send_frame(options_.socket, type, payload);
  }

  void refuse(protocol::call_failure reason, std::string detail) {
    send(protocol::message_type::call_failed,
         protocol::encode(protocol::call_failed_message{reason, std::move(detail)}));
  }

  /// Initialises CUDA: the device's primary context retained and current. Returns "" or why not.
  std::string initialise_cuda() {
    if (cuda_ready_) return {};
    try {
      const auto& cu = cubridge::driver::api();
      CUdevice dev{};
      CUBRIDGE_CU(cuDeviceGet, (&dev, options_.device),
                  "device " + std::to_string(options_.device));
      CUcontext primary = nullptr;
      CUBRIDGE_CU(cuDevicePrimaryCtxRetain, (&primary, dev),
                  "primary context of device " + std::to_string(options_.device));
      if (const CUresult r = cu.cuCtxSetCurrent(primary); r != CUDA_SUCCESS) {
        cu.cuDevicePrimaryCtxRelease(dev);
        cubridge::detail::throw_driver_error(r, "cuCtxSetCurrent", "primary context",
                                             std::source_location::current());
      }
      CUBRIDGE_CU(cuCtxGetId, (primary, &primary_id_), "primary context");
      primary_ = primary;
      CUmemAllocationProp prop{};
      prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
      prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      prop.location.id = options_.device;
      prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
      CUBRIDGE_CU(cuMemGetAllocationGranularity,
                  (&granularity_, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                  "device " + std::to_string(options_.device));
      cuda_ready_ = true;
      return {};
    } catch (const std::exception& e) {
      return e.what();
    }
  }

  /// Maps the buffer `d` from `fd`. Returns "" or why it failed.
  std::string map(const protocol::buffer_descriptor& d, cubridge::unique_fd fd) {
    if (buffers_.find(d.id)) return {};  // mapped already (a re-sent fd is simply closed)
    if (!cuda_ready_)
      if (auto why = initialise_cuda(); !why.empty())
        return "CUDA is unavailable in the worker: " + why;
    return buffers_.map(d, std::move(fd), options_.device, granularity_);
  }

  /// Maps the buffers of a map message (a spare's, ahead of any call) and says which it mapped.
  void map_ahead(protocol::frame& f) {
    const auto message = protocol::decode_map(f.payload);
    if (protocol::fd_count(message) != message.buffers.size() ||
        f.fds.size() != message.buffers.size())
      throw protocol::protocol_violation("map message has " +
                                         std::to_string(message.buffers.size()) + " buffers but " +
                                         std::to_string(f.fds.size()) + " fds");
    protocol::mapped_message answer;
    for (std::size_t i = 0; i < message.buffers.size(); ++i) {
      if (auto why = map(message.buffers[i], std::move(f.fds[i])); !why.empty()) {
        if (answer.failure.empty()) answer.failure = why;
        continue;
      }
      answer.ids.push_back(message.buffers[i].id);
    }
    send(protocol::message_type::mapped, protocol::encode(answer));
  }

  /// Serves one call. Returns 0 to go on, or the exit status to end the worker with.
  int serve(protocol::frame& f) {
    const auto call = protocol::decode_call(f.payload);
    if (protocol::fd_count(call) != f.fds.size())
      throw protocol::protocol_violation(
          "call '" + call.entry + "' has " + std::to_string(protocol::fd_count(call)) +
          " new buffers but " + std::to_string(f.fds.size()) + " fds");
    if (call.reply_capacity > protocol::max_reply_capacity) {
      refuse(protocol::call_failure::bad_request,
             "reply capacity " + std::to_string(call.reply_capacity) + " exceeds the limit");
      return 0;
    }
    auto entry = reinterpret_cast<cubridge_sandbox_entry>(::dlsym(library_, call.entry.c_str()));
    if (!entry) {
      refuse(protocol::call_failure::no_such_entry,
             "library " + options_.library + " has no entry point '" + call.entry + "'");
      return 0;
    }
    std::vector<cubridge_sandbox_buffer> buffers;
    std::size_t next_fd = 0;
    for (const auto& d : call.buffers) {
      if (d.has_fd) {
        if (auto why = map(d, std::move(f.fds[next_fd++])); !why.empty()) {
          refuse(protocol::call_failure::buffer_import, why);
          return 0;
        }
      }
      const auto* m = buffers_.find(d.id);
      if (!m) {
        refuse(protocol::call_failure::buffer_import,
               "buffer " + std::to_string(d.id) + " was never sent to this worker");
        return 0;
      }
      buffers.push_back(
          {reinterpret_cast<void*>(static_cast<std::uintptr_t>(m->address)), m->size});
    }
    std::vector<std::byte> reply(call.reply_capacity);
    cubridge_sandbox_args args{};
    args.struct_size = sizeof args;
    args.abi_version = CUBRIDGE_SANDBOX_ABI_VERSION;
    args.device = options_.device;
    args.request = call.request.data();
    args.request_bytes = call.request.size();
    args.buffers = buffers.data();
    args.buffer_count = buffers.size();
    args.reply = reply.data();
    args.reply_capacity = reply.size();
    const int status = entry(&args);

    if (const auto fault = cuda_damage()) {
      send(protocol::message_type::cuda_fault,
           protocol::encode(protocol::cuda_fault_message{static_cast<std::int32_t>(fault->code),
                                                         fault->description, call.entry, status,
                                                         fault->context_reset}));
      return protocol::worker_exit_cuda_fault;
    }
    reply.resize(std::min(args.reply_bytes, reply.size()));
    send(protocol::message_type::result,
         protocol::encode(protocol::result_message{status, std::move(reply)}));
    return 0;
  }

  /// What the call did to this process's CUDA state, if CUDA is in use here (by us or by the
  /// library's own runtime): the worker's primary context reset (a library's cudaDeviceReset:
  /// the shared buffers' mappings and the library's state are no longer trustworthy), or a sticky
  /// error in the current context. Either ends the worker.
  std::optional<cuda_damage_found> cuda_damage() {
    if (!cuda_ready_) {
      void* loaded = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
      if (!loaded) return std::nullopt;  // nobody touched CUDA
      ::dlclose(loaded);
      if (!cubridge::driver::available()) return std::nullopt;
    }
    const auto& cu = cubridge::driver::api();
    if (primary_) {
      unsigned long long id = 0;
      const CUresult r = cu.cuCtxGetId(primary_, &id);
      if (r != CUDA_SUCCESS || id != primary_id_)
        return cuda_damage_found{r != CUDA_SUCCESS ? r : CUDA_ERROR_CONTEXT_IS_DESTROYED,
                                 "the worker's primary context of device " +
                                     std::to_string(options_.device) + " was reset (" +
                                     (r != CUDA_SUCCESS ? "cuCtxGetId " + name(r)
                                                        : "id " + std::to_string(primary_id_) +
                                                              " -> " + std::to_string(id)) +
                                     "), as cudaDeviceReset does",
                                 true};
    }
    CUcontext current = nullptr;
    if (cu.cuCtxGetCurrent(&current) != CUDA_SUCCESS || !current) return std::nullopt;
    const CUresult r = cu.cuCtxSynchronize();
    if (r == CUDA_SUCCESS) return std::nullopt;
    return cuda_damage_found{r, name(r), false};
  }

  static std::string name(CUresult r) { return cubridge::detail::driver_error_name(r); }

  worker_options options_;
  void* library_ = nullptr;
  bool cuda_ready_ = false;
  CUcontext primary_ = nullptr;  // retained for the worker's life
  unsigned long long primary_id_ = 0;
  std::size_t granularity_ = 0;
  cubridge_worker::buffer_mappings buffers_;
};

/// Kills (SIGKILL) what the library started and left running, before the worker goes: such a
/// process may hold a CUDA context and GPU memory. As a child subreaper the worker is the parent
/// of every orphan its library's processes left (a daemon forked twice, setsid()), so all of
/// them are its descendants.
void end_children() noexcept {
  (void)cubridge::detail::kill_descendants(::getpid());
}

/// Ends the process when the host hangs up, also while an entry runs (a hung library would
/// otherwise outlive its host).
void watch_for_hangup(int socket) {
  std::thread([socket] {
    for (;;) {
      pollfd p{socket, POLLRDHUP, 0};
      if (::poll(&p, 1, -1) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
        end_children();
        _exit(0);
      }
    }
  }).detach();
}

}  // namespace

int main(int argc, char** argv) {
  const auto options = parse(argc, argv);
  if (!options) {
    std::fprintf(stderr,
                 "usage: cubridge-sandbox-worker --socket=FD --library=PATH [--device=N] "
                 "[--cuda=0|1]\n(started by cubridge::sandbox, not by hand)\n");
    return 64;
  }
  // Orphans of the library's processes become the worker's, not init's: the host (and the
  // worker on its way out) can then find and end them.
  (void)::prctl(PR_SET_CHILD_SUBREAPER, 1);
  cubridge_worker::report_fatal_signals(options->socket);
  watch_for_hangup(options->socket);
  const int status = worker(*options).run();
  end_children();
  // No exit handlers: a third-party library's teardown (a static runtime's, after a fault) must
  // not run, hang or reset anything on the way out.
  std::fflush(nullptr);
  _exit(status);
}
