// The probation entry library: what a sandbox worker runs for a hot module's probation
// (swap/probation.hpp). It loads the serving and the candidate image, runs each on its own copy
// of a mirrored launch's inputs (from the shared snapshot buffer), and compares what they wrote.
// The worker ends itself after a sticky error, which is how a candidate's fault reaches the host;
// so nothing here needs to survive one. Protocol: swap/detail/probation_protocol.hpp.
#include <cubridge/core/driver.hpp>
#include <cubridge/isolation/sandbox_entry.hpp>
#include <cubridge/swap/detail/probation_protocol.hpp>
#include <cubridge/swap/probation.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace protocol = cubridge::detail::probation_protocol;

struct loaded_pair {
  std::uint64_t session = 0;
  CUmodule serving = nullptr;
  CUmodule candidate = nullptr;
};

// One worker serves one probation at a time; a new load replaces the pair.
loaded_pair pair;

// The serving run's copies, kept for run_candidate's compare.
struct kept_run {
  std::vector<CUdeviceptr> copies;
  std::vector<std::uint64_t> sizes;
};
kept_run serving_outputs;

void free_copies(kept_run& run) {
  auto& cu = cubridge::driver::api();
  for (const auto p : run.copies) (void)cu.cuMemFree(p);
  run.copies.clear();
  run.sizes.clear();
}

// Reads a T at `at` of the request, if it fits.
template <class T>
std::optional<T> read(const cubridge_sandbox_args* args, std::size_t at) {
  if (at > args->request_bytes || args->request_bytes - at < sizeof(T)) return std::nullopt;
  T value;
  std::memcpy(&value, static_cast<const std::byte*>(args->request) + at, sizeof(T));
  return value;
}

// A run request, checked against the request's size.
struct run_request {
  protocol::run_header header;
  std::string name;
  std::vector<std::byte> params;
  std::vector<protocol::allocation> allocations;
  std::vector<protocol::pointer_argument> pointers;
};

std::optional<run_request> parse_run(const cubridge_sandbox_args* args) {
  run_request r;
  auto header = read<protocol::run_header>(args, 0);
  if (!header) return std::nullopt;
  r.header = *header;
  std::size_t at = sizeof(protocol::run_header);
  const auto* bytes = static_cast<const std::byte*>(args->request);
  const std::size_t total = args->request_bytes;
  const std::size_t fixed = std::size_t{r.header.name_bytes} + r.header.param_bytes;
  const std::size_t records = std::size_t{r.header.allocations} * sizeof(protocol::allocation) +
                              std::size_t{r.header.pointers} * sizeof(protocol::pointer_argument);
  if (total < at || total - at != fixed + records) return std::nullopt;
  r.name.assign(reinterpret_cast<const char*>(bytes + at), r.header.name_bytes);
  at += r.header.name_bytes;
  r.params.assign(bytes + at, bytes + at + r.header.param_bytes);
  at += r.header.param_bytes;
  r.allocations.resize(r.header.allocations);
  std::memcpy(r.allocations.data(), bytes + at,
              r.allocations.size() * sizeof(protocol::allocation));
  at += r.allocations.size() * sizeof(protocol::allocation);
  r.pointers.resize(r.header.pointers);
  std::memcpy(r.pointers.data(), bytes + at,
              r.pointers.size() * sizeof(protocol::pointer_argument));
  for (const auto& a : r.allocations) {
    if (args->buffer_count < 1 || a.snapshot_offset > args->buffers[0].size_bytes ||
        args->buffers[0].size_bytes - a.snapshot_offset < a.size)
      return std::nullopt;
  }
  for (const auto& p : r.pointers) {
    if (p.allocation >= r.allocations.size() || p.param_offset > r.params.size() ||
        r.params.size() - p.param_offset < sizeof(CUdeviceptr))
      return std::nullopt;
  }
  return r;
}

// Copies the snapshot into fresh allocations and runs `module`'s kernel on them, pointers
// rebased. Synchronizes: a fault shows here (and the worker ends itself after the call).
int run_on_copies(const cubridge_sandbox_args* args, CUmodule module, const run_request& r,
                  kept_run& out) {
  auto& cu = cubridge::driver::api();
  CUfunction function = nullptr;
  if (cu.cuModuleGetFunction(&function, module, r.name.c_str()) != CUDA_SUCCESS)
    return protocol::bad_request;
  const auto snapshot = reinterpret_cast<CUdeviceptr>(args->buffers[0].data);
  for (const auto& a : r.allocations) {
    CUdeviceptr copy = 0;
    if (cu.cuMemAlloc(&copy, a.size) != CUDA_SUCCESS) return protocol::cuda_failed;
    out.copies.push_back(copy);
    out.sizes.push_back(a.size);
    if (cu.cuMemcpyDtoD(copy, snapshot + a.snapshot_offset, a.size) != CUDA_SUCCESS)
      return protocol::cuda_failed;
  }
  std::vector<std::byte> params = r.params;
  for (const auto& p : r.pointers) {
    const CUdeviceptr rebased = out.copies[p.allocation] + p.offset;
    std::memcpy(params.data() + p.param_offset, &rebased, sizeof rebased);
  }
  // Each parameter's address in `params`, as cuLaunchKernel's kernelParams want: the extra
  // form takes the packed buffer whole.
  std::size_t size = params.size();
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, params.data(), CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &size, CU_LAUNCH_PARAM_END};
  const auto& h = r.header;
  if (cu.cuLaunchKernel(function, h.grid[0], h.grid[1], h.grid[2], h.block[0], h.block[1],
                        h.block[2], h.shared_bytes, nullptr, nullptr,
                        params.empty() ? nullptr : extra) != CUDA_SUCCESS)
    return protocol::cuda_failed;
  return cu.cuCtxSynchronize() == CUDA_SUCCESS ? protocol::ok : protocol::cuda_failed;
}

// The first byte offset where `a` and `b` differ under `check`, if any.
std::optional<std::uint64_t> first_difference(const std::vector<unsigned char>& a,
                                              const std::vector<unsigned char>& b,
                                              const protocol::run_header& h) {
  if (h.check == static_cast<std::uint32_t>(cubridge::output_check::float_tolerance)) {
    const std::size_t n = a.size() / sizeof(float);
    for (std::size_t i = 0; i < n; ++i) {
      float x = 0;
      float y = 0;
      std::memcpy(&x, a.data() + i * sizeof(float), sizeof x);
      std::memcpy(&y, b.data() + i * sizeof(float), sizeof y);
      if (std::isnan(x) && std::isnan(y)) continue;
      if (!(std::fabs(double{x} - double{y}) <= h.absolute + h.relative * std::fabs(double{x})))
        return i * sizeof(float);
    }
    return std::nullopt;
  }
  const auto mismatch = std::mismatch(a.begin(), a.end(), b.begin());
  if (mismatch.first == a.end()) return std::nullopt;
  return static_cast<std::uint64_t>(mismatch.first - a.begin());
}

}  // namespace

CUBRIDGE_SANDBOX_EXPORT int cubridge_probation_load(cubridge_sandbox_args* args) {
  const auto header = read<protocol::load_header>(args, 0);
  if (!header) return protocol::bad_request;
  const std::size_t at = sizeof(protocol::load_header);
  if (args->request_bytes - at != header->serving_bytes + header->candidate_bytes)
    return protocol::bad_request;
  auto& cu = cubridge::driver::api();
  if (pair.serving) (void)cu.cuModuleUnload(pair.serving);
  if (pair.candidate) (void)cu.cuModuleUnload(pair.candidate);
  pair = {};
  free_copies(serving_outputs);
  // Module loads want their image aligned as the driver reads it: copy into owned storage.
  const auto* bytes = static_cast<const unsigned char*>(args->request) + at;
  std::vector<std::uint64_t> serving((header->serving_bytes + 7) / 8 + 1, 0);
  std::vector<std::uint64_t> candidate((header->candidate_bytes + 7) / 8 + 1, 0);
  std::memcpy(serving.data(), bytes, header->serving_bytes);
  std::memcpy(candidate.data(), bytes + header->serving_bytes, header->candidate_bytes);
  if (cu.cuModuleLoadDataEx(&pair.serving, serving.data(), 0, nullptr, nullptr) != CUDA_SUCCESS ||
      cu.cuModuleLoadDataEx(&pair.candidate, candidate.data(), 0, nullptr, nullptr) != CUDA_SUCCESS)
    return protocol::cuda_failed;
  pair.session = header->session;
  return protocol::ok;
}

CUBRIDGE_SANDBOX_EXPORT int cubridge_probation_run_serving(cubridge_sandbox_args* args) {
  const auto r = parse_run(args);
  if (!r) return protocol::bad_request;
  if (pair.session != r->header.session || !pair.serving) return protocol::not_loaded;
  free_copies(serving_outputs);
  return run_on_copies(args, pair.serving, *r, serving_outputs);
}

CUBRIDGE_SANDBOX_EXPORT int cubridge_probation_run_candidate(cubridge_sandbox_args* args) {
  const auto r = parse_run(args);
  if (!r) return protocol::bad_request;
  if (pair.session != r->header.session || !pair.candidate ||
      serving_outputs.copies.size() != r->allocations.size())
    return protocol::not_loaded;
  kept_run candidate;
  const int status = run_on_copies(args, pair.candidate, *r, candidate);
  protocol::run_reply reply;
  if (status == protocol::ok &&
      r->header.check != static_cast<std::uint32_t>(cubridge::output_check::fault_only)) {
    auto& cu = cubridge::driver::api();
    for (std::size_t i = 0; i < candidate.copies.size() && !reply.differs; ++i) {
      if (!r->allocations[i].compared) continue;
      std::vector<unsigned char> a(candidate.sizes[i]);
      std::vector<unsigned char> b(candidate.sizes[i]);
      if (cu.cuMemcpyDtoH(a.data(), serving_outputs.copies[i], a.size()) != CUDA_SUCCESS ||
          cu.cuMemcpyDtoH(b.data(), candidate.copies[i], b.size()) != CUDA_SUCCESS) {
        free_copies(candidate);
        return protocol::cuda_failed;
      }
      if (const auto offset = first_difference(a, b, r->header)) {
        reply.differs = 1;
        reply.allocation = static_cast<std::uint32_t>(i);
        reply.offset = *offset;
      }
    }
  }
  free_copies(candidate);
  free_copies(serving_outputs);
  if (args->reply_capacity >= sizeof reply) {
    std::memcpy(args->reply, &reply, sizeof reply);
    args->reply_bytes = sizeof reply;
  }
  return status;
}
