// The online-service demo (issue 6): a long-running HTTP service that answers every request with
// a hot-swappable GPU kernel, cuBLAS and a third-party library, all on one device, and takes new
// kernel versions over the network while it serves.
//
//   POST /v1/infer  {"seed": K}  -> {"version": V, "result": R, "expected": E, "latency_us": L}
//   GET  /v1/status              -> {"module": "kernels", "version": V, "served": {...}, "failed":
//   F}
//
// Per request, on a stream of its own (one per worker, from a pool), in one driver context
// (cubridge::context):
//   1. `respond` of the hot module `kernels`: out[i] = 2 * in[i] + 1, in[i] = K; it also writes
//      its own VERSION, which is what "version" reports;
//   2. cuBLAS through the runtime, in the same context: y = A * out with A = 1/n everywhere, so
//      every y[j] = 2K + 1;
//   3. the "vendor" library (examples/kernels/vendor_library.cu, static cudart) in a guest context
//      of its own: y[j] += 1, in place on VMM memory both contexts use;
//   and checks that every y[j] = 2K + 2 ("expected").
//
// The update endpoint (update_endpoint.hpp) listens on a second port and promotes pushed bundles
// signed by a trusted key; every promotion is logged on stdout in one line:
//   t=+12.345s module kernels: version 1 -> 2 (pushed, key 3f9a0c2d11e4b6a7)
// With --fleet-server and --node it is also a fleet node (docs/fleet.md): a fleet_agent beside
// the endpoint, over the same update_gate (one update authority: one lock per module, one replay
// record); a fleet node's promotions read "(fleet, key ...)". The replay state is kept in memory
// (the demo runs again and again from v1) unless --state-file names a file.
// New versions must pass a smoke test (respond on known input) before they can serve.
//
// A version that faults poisons the process: every later CUDA call fails, so every request
// answers 500, until a new process starts; /readyz (update endpoint) answers 503, and one line
// says when ("online_service: poisoned at unix T: ...", service_log.hpp). --exit-when-poisoned
// MS ends the process MS ms later with exit code 75, for its supervisor to start a fresh one
// (cubridge::exit_when_poisoned). --probation N puts each pushed version on probation
// (stage_options::probation): its smoke test runs as a replay in a sandbox worker (never in this
// process), then one in --probation-sample-every K of the serving
// version's `respond` launches is mirrored to a sandbox worker and run there by both versions;
// N matching (all but version_out, meant to differ) let it through, one fault or difference
// refuses it (422 faulted_in_probation, mismatch_in_probation; probation_incomplete when N did
// not come within 30 s). scripts/demo --bad-versions runs them all.
//
//   online_service --trusted-key release.pub [--port 8080] [--update-port 7070] [--duration S]
//                  [--log requests.csv] [--module kernels_v1.cubin] [--threads 8]
//                  [--state-file replay.json] [--probation N [--probation-sample-every K]]
//                  [--exit-when-poisoned MS]
//                  [--fleet-server nats://127.0.0.1:4222 --node node-1 --node-key node-1.key
//                   [--fleet-credentials F --fleet-ca F] [--fleet-heartbeat S]]
// Port 0 picks a free port; the "ready" line says which. Exit: 0 after --duration or
// SIGINT/SIGTERM, 1 on failure, 64 bad command line, 75 poisoned (--exit-when-poisoned), 77 no
// GPU (one line).
#include <cubridge/bundle/bundle.hpp>
#include <cubridge/core/context.hpp>
#include <cubridge/core/copy.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/pinned_buffer.hpp>
#include <cubridge/core/process_health.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/shared_device_memory.hpp>
#include <cubridge/core/stream.hpp>
#include <cubridge/isolation/guest_context.hpp>
#include <cubridge/isolation/sandbox_entry.hpp>
#include <cubridge/swap/hot_module.hpp>
#include <cubridge/swap/probation.hpp>
#include <cubridge/update/update_endpoint.hpp>
#include <cubridge/update/update_gate.hpp>
#include <cubridge/update_swap/hot_module_sink.hpp>

#include "fleet_node.hpp"
#include "service_log.hpp"

#include <cublas_v2.h>
#include <httplib.h>
#include <sys/socket.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

extern "C" int vendor_add_one(cubridge_sandbox_args* args);  // the vendor library, linked

namespace {

using online_service::first_line;
using online_service::line_log;
using online_service::unix_seconds;
using json = nlohmann::json;
using wall_clock = online_service::wall_clock;
using steady_clock = std::chrono::steady_clock;

constexpr unsigned input_size = 256;   // n: elements of `in` and `out`
constexpr unsigned output_size = 256;  // m: rows of A, elements of y
constexpr auto gpu_timeout = std::chrono::seconds(10);
constexpr auto probation_deadline = std::chrono::seconds(30);  // --probation: N launches by then

/// The bytes of a file the example was given (a cubin): read whole with std::ifstream.
std::vector<std::byte> read_file(const std::filesystem::path& path) {
  std::vector<std::byte> bytes(std::filesystem::file_size(path));
  std::ifstream in(path, std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size())))
    throw std::runtime_error("cannot read " + path.string());
  return bytes;
}

volatile std::sig_atomic_t stop_requested = 0;
void on_stop_signal(int) {
  stop_requested = 1;
}

// Waits for `stream`, at most `timeout`: a hung GPU becomes an error, not a hung request.
void synchronize_within(cubridge::stream_ref stream, std::chrono::milliseconds timeout) {
  const auto deadline = steady_clock::now() + timeout;
  while (!stream.ready()) {
    if (steady_clock::now() > deadline)
      throw std::runtime_error("GPU work did not finish within " + std::to_string(timeout.count()) +
                               " ms");
    std::this_thread::yield();
  }
}

// cublasDestroy in the handle's context (it frees the handle's workspace there).
struct blas_destroy {
  cubridge::context_ref ctx;
  void operator()(cublasHandle_t handle) const noexcept {
    try {
      cubridge::scoped_current current(ctx);
      cublasDestroy(handle);
    } catch (...) {
      // The context cannot be made current (process exit): nothing left to free.
    }
  }
};
using blas_handle = std::unique_ptr<cublasContext, blas_destroy>;

void check_blas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(call) + " failed: " + cublasGetStatusName(status));
}

// Everything one request needs; used by one request at a time.
struct slot {
  cubridge::stream stream;
  blas_handle blas;
  cubridge::driver_buffer<float> in, out;
  cubridge::driver_buffer<unsigned> version;
  cubridge::shared_device_memory y;  // VMM: written by cuBLAS here, by the vendor in its context
  cubridge::pinned_buffer<float> host_in, host_y;
  cubridge::pinned_buffer<unsigned> host_version;

  static std::unique_ptr<slot> create(const cubridge::context& ctx) {
    cubridge::scoped_current current(ctx.ref());  // cuBLAS binds to the current context
    cublasHandle_t raw = nullptr;
    check_blas(cublasCreate(&raw), "cublasCreate");
    blas_handle blas(raw, blas_destroy{ctx.ref()});
    auto stream = cubridge::stream::create(ctx);
    check_blas(cublasSetStream(raw, stream.runtime_handle()), "cublasSetStream");
    return std::unique_ptr<slot>(new slot{
        std::move(stream), std::move(blas),
        cubridge::driver_buffer<float>::allocate(ctx, input_size),
        cubridge::driver_buffer<float>::allocate(ctx, input_size),
        cubridge::driver_buffer<unsigned>::allocate(ctx, 1),
        cubridge::shared_device_memory::allocate(ctx.device(), output_size * sizeof(float)),
        cubridge::pinned_buffer<float>::allocate(ctx, input_size),
        cubridge::pinned_buffer<float>::allocate(ctx, output_size),
        cubridge::pinned_buffer<unsigned>::allocate(ctx, 1)});
  }
};

// Slots for requests in flight: taken by a request, given back after (made when none is free).
class slot_pool {
 public:
  explicit slot_pool(const cubridge::context& ctx) : ctx_(ctx) {}

  std::unique_ptr<slot> take() {
    {
      std::lock_guard lock(mutex_);
      if (!free_.empty()) {
        auto s = std::move(free_.back());
        free_.pop_back();
        return s;
      }
    }
    return slot::create(ctx_);
  }
  void give_back(std::unique_ptr<slot> s) {
    std::lock_guard lock(mutex_);
    free_.push_back(std::move(s));
  }

 private:
  const cubridge::context& ctx_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<slot>> free_;
};

struct answer {
  unsigned version = 0;        // what the kernel reported
  std::uint64_t launched = 0;  // the hot module's version id that was launched
  float result = 0;            // y[0]
  float expected = 0;
  bool correct = false;
};

// The whole service state the handlers share.
class service {
 public:
  service(const cubridge::context& ctx, cubridge::hot_module& kernels,
          cubridge::guest_context& vendor)
      : ctx_(ctx),
        respond_(kernels.get_kernel("respond")),
        vendor_(vendor),
        matrix_(
            cubridge::driver_buffer<float>::allocate(ctx, std::size_t{output_size} * input_size)),
        pool_(ctx) {
    // A = 1/n everywhere (a power of two: every sum is exact), column-major m x n.
    const std::vector<float> a(std::size_t{output_size} * input_size, 1.0f / input_size);
    cubridge::scoped_current current(ctx.ref());
    cubridge::copy_bytes(matrix_.data(), a.data(), a.size() * sizeof(float));
  }

  slot_pool& pool() { return pool_; }

  // One request on slot `s`. @throws on any failure (the caller answers 500).
  answer serve(slot& s, unsigned seed) {
    cubridge::scoped_current current(ctx_.ref());
    std::fill_n(s.host_in.data(), input_size, static_cast<float>(seed));
    cubridge::copy_bytes_async(s.in.data(), s.host_in.data(), input_size * sizeof(float), s.stream);
    answer a;
    a.launched =
        respond_.launch({.grid = {(input_size + 255) / 256}, .block = {256}, .stream = s.stream},
                        s.out.span(), s.in.span(), input_size, s.version.span());
    const float one = 1, zero = 0;
    float* y = s.y.span<float>().data();
    check_blas(cublasSgemv(s.blas.get(), CUBLAS_OP_N, output_size, input_size, &one, matrix_.data(),
                           output_size, s.out.data(), 1, &zero, y, 1),
               "cublasSgemv");
    cubridge::copy_bytes_async(s.host_version.data(), s.version.data(), sizeof(unsigned), s.stream);
    synchronize_within(s.stream, gpu_timeout);

    // The vendor runs in its own context, on its own stream: our work on y is complete by now.
    cubridge_sandbox_buffer buffer{y, output_size * sizeof(float)};
    cubridge_sandbox_args args{.struct_size = sizeof(cubridge_sandbox_args),
                               .abi_version = CUBRIDGE_SANDBOX_ABI_VERSION,
                               .buffers = &buffer,
                               .buffer_count = 1};
    const int status = vendor_.call([&] { return vendor_add_one(&args); });
    if (status != 0)
      throw std::runtime_error("vendor_add_one returned CUDA error " + std::to_string(status));

    cubridge::copy_bytes_async(s.host_y.data(), y, output_size * sizeof(float), s.stream);
    synchronize_within(s.stream, gpu_timeout);
    a.version = *s.host_version.data();
    a.expected = 2.0f * static_cast<float>(seed) + 2.0f;
    a.result = s.host_y.data()[0];
    a.correct = a.version != 0;
    for (unsigned j = 0; j < output_size; ++j)
      a.correct =
          a.correct && std::fabs(s.host_y.data()[j] - a.expected) <= 1e-3f * (1 + a.expected);
    return a;
  }

  // Takes a slot, serves, gives the slot back (after its work finished, even on failure).
  answer serve(unsigned seed) {
    auto s = pool_.take();
    try {
      auto a = serve(*s, seed);
      pool_.give_back(std::move(s));
      return a;
    } catch (...) {
      try {
        cubridge::scoped_current current(ctx_.ref());
        synchronize_within(s->stream, gpu_timeout);
        pool_.give_back(std::move(s));
      } catch (...) {
        // The slot's stream is broken: drop it (a new one is made when needed).
      }
      throw;
    }
  }

  void count(unsigned version, bool ok) {
    std::lock_guard lock(counts_mutex_);
    if (ok)
      ++served_[version];
    else
      ++failed_;
  }
  json counts() const {
    std::lock_guard lock(counts_mutex_);
    json served = json::object();
    for (const auto& [v, n] : served_) served[std::to_string(v)] = n;
    return {{"served", served}, {"failed", failed_}};
  }

 private:
  const cubridge::context& ctx_;
  cubridge::hot_kernel respond_;
  cubridge::guest_context& vendor_;
  cubridge::driver_buffer<float> matrix_;
  slot_pool pool_;
  mutable std::mutex counts_mutex_;
  std::map<unsigned, std::uint64_t> served_;
  std::uint64_t failed_ = 0;
};

// Launches a staged version's `respond` on known input: wrong answers never serve.
void smoke_test(const cubridge::context& ctx, const cubridge::module& staged) {
  cubridge::scoped_current current(ctx.ref());
  auto respond = staged.get_kernel("respond");
  auto stream = cubridge::stream::create(ctx);
  auto in = cubridge::driver_buffer<float>::allocate(ctx, input_size);
  auto out = cubridge::driver_buffer<float>::allocate(ctx, input_size);
  auto version = cubridge::driver_buffer<unsigned>::allocate(ctx, 1);
  std::vector<float> host_in(input_size), host_out(input_size);
  for (unsigned i = 0; i < input_size; ++i) host_in[i] = 0.5f * static_cast<float>(i);
  unsigned host_version = 0;
  cubridge::copy_bytes(in.data(), host_in.data(), input_size * sizeof(float));
  cubridge::copy_bytes(version.data(), &host_version, sizeof host_version);
  respond.launch({.grid = {(input_size + 255) / 256}, .block = {256}, .stream = stream}, out.span(),
                 in.span(), input_size, version.span());
  synchronize_within(stream, gpu_timeout);
  cubridge::copy_bytes(host_out.data(), out.data(), input_size * sizeof(float));
  cubridge::copy_bytes(&host_version, version.data(), sizeof host_version);
  for (unsigned i = 0; i < input_size; ++i)
    if (host_out[i] != 2.0f * host_in[i] + 1.0f)
      throw std::runtime_error("respond(" + std::to_string(host_in[i]) + ") gave " +
                               std::to_string(host_out[i]) + ", expected " +
                               std::to_string(2.0f * host_in[i] + 1.0f));
  if (host_version == 0) throw std::runtime_error("respond did not write its version");
}

// The request server's listening thread; stops it and joins it (and its workers) when destroyed.
class listening {
 public:
  explicit listening(httplib::Server& server)
      : server_(server), thread_([&server] { server.listen_after_bind(); }) {
    // stop() before the accept loop runs would be lost: wait until it runs (or gave up).
    for (int i = 0; i < 500 && !server_.is_running(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  listening(const listening&) = delete;
  listening& operator=(const listening&) = delete;
  ~listening() {
    server_.stop();
    thread_.join();
  }
  [[nodiscard]] bool started() const { return server_.is_running(); }

 private:
  httplib::Server& server_;
  std::thread thread_;
};

struct options {
  std::uint16_t port = 8080;
  std::uint16_t update_port = 7070;
  std::vector<std::string> trusted_keys;
  double duration = 0;
  std::string log;
  std::string module = ONLINE_SERVICE_V1_CUBIN;
  std::size_t threads = 8;
  std::string state_file;       // empty: the replay state in memory only
  std::uint32_t probation = 0;  // mirrored launches a new version must pass; 0: none
  std::uint32_t probation_sample_every = 10;
  std::optional<std::chrono::milliseconds> exit_when_poisoned;  // the grace; none: keep running
  online_service::fleet_node_options fleet;                     // server empty: no fleet agent
};

// The smoke test as a replay for the probation worker: `respond` on the same known input, its
// outputs compared with the serving version's there (never run in this process).
cubridge::replay_launch smoke_replay() {
  std::vector<float> in(input_size);
  for (unsigned i = 0; i < input_size; ++i) in[i] = 0.5f * static_cast<float>(i);
  const std::vector<float> out(input_size, 0.0f);
  const unsigned version = 0;
  cubridge::replay_launch r;
  r.kernel = "respond";
  r.grid = {(input_size + 255) / 256};
  r.block = {256};
  r.arguments = {cubridge::replay_argument::buffer_of(std::span<const float>(out)),
                 cubridge::replay_argument::buffer_of(std::span<const float>(in)),
                 cubridge::replay_argument::scalar_of(input_size),
                 cubridge::replay_argument::buffer_of(std::span<const unsigned>(&version, 1))};
  return r;
}

// What a pushed version must pass before it serves: the smoke test, in this process; with
// --probation, the smoke test as a replay in a sandbox worker, then the serving version's live
// launches mirrored to it.
cubridge::stage_options stage_options_for(const cubridge::context& ctx, const options& o) {
  cubridge::stage_options stage;
  if (o.probation == 0) {
    stage.smoke_test = [&ctx](const cubridge::module& m) { smoke_test(ctx, m); };
    return stage;
  }
  cubridge::probation_policy policy;
  policy.replays = {smoke_replay()};
  policy.required_launches = o.probation;
  policy.sample_every = o.probation_sample_every;
  policy.deadline = probation_deadline;
  // `respond` writes its own VERSION to version_out (parameter 3): the one output meant to differ.
  policy.checks.push_back({.kernel = "respond", .ignored_parameters = {3}});
  stage.probation = std::move(policy);
  return stage;
}

int run(const options& o) {
  const auto shared_log = std::make_shared<line_log>();
  line_log& log = *shared_log;
  const online_service::poison_logging poison_line(shared_log);
  if (o.exit_when_poisoned) cubridge::exit_when_poisoned({.grace = *o.exit_when_poisoned});
  cubridge::trusted_keys keys;
  for (const auto& file : o.trusted_keys) keys.add(cubridge::read_public_key_file(file));
  online_service::request_log requests(o.log);

  const auto dev = cubridge::device::get(0);
  auto ctx = cubridge::context::create(dev);
  // Its image is bundle version 1: the module's chain records that, and the update endpoint
  // reads it there (pushes must be above it).
  auto kernels = cubridge::hot_module::load(ctx, "kernels", read_file(o.module),
                                            {.origin = {.label = 1, .source = o.module}});
  auto vendor = cubridge::guest_context::create(dev, {.name = "vendor"});
  service svc(ctx, kernels, vendor);
  log.line("online_service: " + dev.name() + ", " + ctx.ref().describe() +
           "; module kernels v1 from " + o.module +
           "; cuBLAS in the same context; vendor library in the guest's " +
           vendor.ref().describe());
  if (o.exit_when_poisoned)
    log.line("online_service: exits with " + std::to_string(cubridge::poisoned_exit_code) + " " +
             std::to_string(o.exit_when_poisoned->count()) + " ms after the process is poisoned");

  // One slot per server worker, each warmed by a full request (cuBLAS, the vendor's runtime and
  // the kernels initialise lazily; the first requests should not pay for it).
  {
    std::vector<std::unique_ptr<slot>> warm;
    for (std::size_t i = 0; i < o.threads; ++i) {
      warm.push_back(svc.pool().take());
      const auto a = svc.serve(*warm.back(), 1);
      if (!a.correct)
        throw std::runtime_error("warm-up request answered " + std::to_string(a.result) +
                                 " (version " + std::to_string(a.version) + "), expected " +
                                 std::to_string(a.expected));
    }
    for (auto& s : warm) svc.pool().give_back(std::move(s));
  }

  auto modules = std::make_shared<cubridge::hot_module_sink>();
  modules->add(kernels, stage_options_for(ctx, o));
  if (o.probation != 0)
    log.line("online_service: new versions on probation: " + std::to_string(o.probation) +
             " mirrored launches of `respond` (1 in " + std::to_string(o.probation_sample_every) +
             " sampled) must match v" + std::to_string(modules->current_version("kernels")) +
             "'s within " + std::to_string(probation_deadline.count()) + " s");
  // One gate for both doors, so one sink: it cannot tell them apart. A fleet node takes its
  // versions from the fleet (scripts/demo --fleet reads "(fleet, ..."), a plain service from
  // pushes ("(pushed, ...").
  const auto applied = std::make_shared<online_service::logged_sink>(
      modules, log, o.fleet.server.empty() ? "pushed" : "fleet");
  cubridge::update_gate_options policy;
  policy.keys = keys;
  policy.state_file = o.state_file;
  // A demo: without --state-file each run starts from v1 and accepts v2 again, so the replay
  // state is not persisted in the default directory.
  policy.persist_state = false;
  const auto gate = cubridge::update_gate::create(applied, policy);
  cubridge::update_endpoint_options endpoint_options;
  endpoint_options.port = o.update_port;
  cubridge::update_endpoint endpoint(gate, endpoint_options);
  // The service's output check as the fleet's health probe: wrong answers since the last
  // heartbeat make this node unhealthy (a version can pass its smoke test and be wrong on real
  // requests).
  std::atomic<std::uint64_t> answered{0}, wrong_answers{0};
  auto fleet_options = o.fleet;
  fleet_options.health = [&] {
    online_service::service_health h;
    const auto wrong = wrong_answers.exchange(0);
    const auto all = answered.exchange(0);
    h.healthy = wrong == 0;
    h.values = {{"wrong_answers", static_cast<double>(wrong)},
                {"answers", static_cast<double>(all)}};
    if (wrong != 0)
      h.detail = "output check: " + std::to_string(wrong) + " of " + std::to_string(all) +
                 " answers wrong since the last heartbeat";
    return h;
  };
  std::optional<online_service::fleet_node> fleet;
  if (!o.fleet.server.empty()) fleet.emplace(gate, fleet_options);

  httplib::Server server;
  server.new_task_queue = [n = o.threads] { return new httplib::ThreadPool(n); };
  server.set_socket_options([](int sock) {  // SO_REUSEADDR only, as the update endpoint
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  server.set_tcp_nodelay(true);
  server.set_keep_alive_max_count(1000000);
  server.set_keep_alive_timeout(5);
  server.set_read_timeout(5, 0);
  server.set_write_timeout(5, 0);
  server.set_payload_max_length(4096);
  server.Post("/v1/infer", [&](const httplib::Request& request, httplib::Response& response) {
    const auto started = wall_clock::now();
    const auto t0 = steady_clock::now();
    unsigned seed = 0;
    if (!request.body.empty()) {
      const auto body = json::parse(request.body, nullptr, false);
      const bool has_seed = body.is_object() && body.contains("seed");
      if (!body.is_object() || (has_seed && !(body.at("seed").is_number_unsigned() &&
                                              body.at("seed").get<std::uint64_t>() <= 1000000))) {
        response.status = 400;
        response.set_content(
            R"({"error":"bad_request","detail":"the body is {\"seed\": 0..1000000}"})",
            "application/json");
        return;
      }
      if (has_seed) seed = static_cast<unsigned>(body.at("seed").get<std::uint64_t>());
    }
    answer a;
    json reply;
    try {
      a = svc.serve(seed);
      answered.fetch_add(1, std::memory_order_relaxed);
      if (!a.correct) {
        wrong_answers.fetch_add(1, std::memory_order_relaxed);
        reply = {{"error", "wrong_result"},
                 {"version", a.version},
                 {"result", a.result},
                 {"expected", a.expected}};
      }
    } catch (const std::exception& e) {
      reply = {{"error", "failed"}, {"detail", e.what()}};
    }
    const double latency_us =
        std::chrono::duration<double, std::micro>(steady_clock::now() - t0).count();
    const bool ok = reply.empty();
    if (ok)
      reply = {{"version", a.version},
               {"result", a.result},
               {"expected", a.expected},
               {"latency_us", std::round(latency_us * 10) / 10}};
    response.status = ok ? 200 : 500;
    response.set_content(reply.dump(), "application/json");
    svc.count(a.version, ok);
    requests.add(started, a.version, latency_us, ok);
  });
  server.Get("/v1/status", [&](const httplib::Request&, httplib::Response& response) {
    auto reply = svc.counts();
    reply["module"] = "kernels";
    reply["version"] = modules->current_version("kernels");
    if (fleet) reply["fleet"] = fleet->status();
    response.set_content(reply.dump(), "application/json");
  });

  const int port = o.port == 0 ? server.bind_to_any_port("127.0.0.1")
                               : (server.bind_to_port("127.0.0.1", o.port) ? o.port : -1);
  if (port <= 0)
    throw std::runtime_error("cannot listen on 127.0.0.1:" + std::to_string(o.port) + " (in use?)");
  std::optional<listening> listener(std::in_place, server);
  bool failed = !listener->started();
  if (!failed) {
    try {
      endpoint.start();
    } catch (const std::exception& e) {
      log.line(std::string("online_service: the update endpoint did not start: ") + e.what());
      failed = true;
    }
  }
  if (!failed && fleet) {
    try {
      fleet->start();  // returns at once; the agent connects by itself
    } catch (const std::exception& e) {
      log.line("online_service: the fleet agent did not start: " + first_line(e.what()));
      failed = true;
    }
  }
  if (!failed) {
    const std::string fleet_part =
        fleet ? ", fleet node " + o.fleet.node + " at " + online_service::shown_servers(o.fleet)
              : "";
    char ready[768];
    std::snprintf(ready, sizeof ready,
                  "online_service: ready: requests on http://127.0.0.1:%d/v1/infer, updates on "
                  "%s (%zu trusted key(s))%s; start unix %.6f",
                  port, endpoint.url().c_str(), keys.size(), fleet_part.c_str(),
                  unix_seconds(log.start()));
    log.line(ready);
    std::signal(SIGINT, on_stop_signal);
    std::signal(SIGTERM, on_stop_signal);
    while (!stop_requested && server.is_running() &&
           (o.duration <= 0 || log.seconds_since_start() < o.duration))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!server.is_running()) {
      log.line("online_service: the request server stopped by itself");
      failed = true;
    }
  }
  listener.reset();  // joins the workers: no request runs after this
  if (fleet) fleet->stop();
  endpoint.stop();
  const auto counts = svc.counts();
  log.line("online_service: stopped; served " + counts["served"].dump() + ", failed " +
           counts["failed"].dump());
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"online_service: a GPU service that takes new kernel versions while it serves"};
  app.add_option("--port", o.port, "Port for POST /v1/infer on 127.0.0.1 (0: a free one)");
  app.add_option("--update-port", o.update_port, "Port of the update endpoint (0: a free one)");
  app.add_option("--trusted-key", o.trusted_keys, "Public key file (cubridge keygen) to trust")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--duration", o.duration, "Exit after this many seconds (0: at SIGINT/SIGTERM)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--log", o.log, "Write one CSV line per request: unix_time,version,latency_us,ok");
  app.add_option("--module", o.module, "The first version of the module `kernels` (a cubin)")
      ->check(CLI::ExistingFile);
  app.add_option("--threads", o.threads, "Request workers (each with its stream and cuBLAS handle)")
      ->check(CLI::Range(1, 256));
  app.add_option("--state-file", o.state_file,
                 "Keep the replay state in this file across restarts (default: in memory only)");
  auto* probation = app.add_option("--probation", o.probation,
                                   "Put pushed versions on probation: N live launches mirrored to "
                                   "a sandbox worker must match the serving version's (0: none)");
  probation->check(CLI::Range(0u, 10000000u));
  app.add_option("--probation-sample-every", o.probation_sample_every,
                 "On probation, mirror one launch in K (default 10)")
      ->check(CLI::Range(1u, 1000000u))
      ->needs(probation);
  std::int64_t exit_grace_ms = 0;
  auto* exit_option =
      app.add_option("--exit-when-poisoned", exit_grace_ms,
                     "Exit with 75 this many ms after a sticky CUDA error poisons the process "
                     "(default: keep running; /readyz answers 503)")
          ->check(CLI::Range(std::int64_t{0}, std::int64_t{600000}));
  double heartbeat_s = 5;
  auto* fleet_server =
      app.add_option("--fleet-server", o.fleet.server,
                     "Also a fleet node: the NATS server (nats://HOST:PORT) of the fleet");
  auto* node = app.add_option("--node", o.fleet.node, "This fleet node's id ([A-Za-z0-9_-]{1,64})");
  fleet_server->needs(node);
  node->needs(fleet_server);
  app.add_option("--fleet-heartbeat", heartbeat_s, "Seconds between the fleet node's heartbeats")
      ->check(CLI::Range(0.05, 3600.0))
      ->needs(fleet_server);
  app.add_option("--node-key", o.fleet.node_key,
                 "The fleet node's secret key file: signs its results and heartbeats")
      ->needs(fleet_server);
  app.add_option("--fleet-credentials", o.fleet.credentials,
                 "The fleet node's credentials file (cubridge fleet init)")
      ->needs(fleet_server);
  app.add_option("--fleet-ca", o.fleet.ca, "The fleet's CA certificate (TLS)")->needs(fleet_server);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 64;
  }
  o.fleet.heartbeat_interval =
      std::chrono::milliseconds(static_cast<std::int64_t>(heartbeat_s * 1000));
  if (exit_option->count() > 0) o.exit_when_poisoned = std::chrono::milliseconds(exit_grace_ms);
  if (!o.fleet.server.empty()) {
    auto problem = online_service::check_fleet_node_options(o.fleet);
    if (problem.empty() && !online_service::fleet_supported())
      problem = "--fleet-server: this online_service was built without libnats (no fleet agent)";
    if (!problem.empty()) {
      std::fprintf(stderr, "online_service: %s\n", problem.c_str());
      return 64;
    }
  }
  std::signal(SIGPIPE, SIG_IGN);  // a client gone away is an error on its socket, not an exit
  if (!cubridge::driver::available()) {
    std::printf("online_service: no GPU: %s\n", cubridge::driver::unavailable_reason().c_str());
    return 77;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::printf("online_service: %s\n", first_line(e.what()).c_str());
    std::fflush(stdout);
    return 1;
  }
}
