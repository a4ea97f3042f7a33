// Driver first and runtime first, with the libraries people actually use: cuBLAS, cuFFT and
// <<<>>> kernels in a cubridge context, and driver-loaded kernels on runtime memory and streams.
//
// Every scenario runs in a child process of its own (threadsafe death-test style): several need
// the device's primary context inactive, and the runtime-first ones activate it, so no scenario
// may see what another left behind, whatever the order or filter the tests run with. A child
// exits 0 on success; otherwise it prints what failed and exits 1, which the parent reports.
#include <cubridge/core/context.hpp>
#include <cubridge/core/copy.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/event.hpp>
#include <cubridge/core/module.hpp>
#include <cubridge/core/pointer.hpp>
#include <cubridge/core/primary_context.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/stream.hpp>

#include "driver_helpers.hpp"
#include "gpu_test.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cufft.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <numbers>
#include <random>
#include <string>
#include <vector>

namespace {

using cubridge::testing::as_address;
using cubridge::testing::cu;
using cubridge::testing::raw_current;

// --- kernels of this file (runtime API, <<<>>>) -------------------------------------------------

__global__ void affine(const float* in, float* out, float a, float b, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = fmaf(a, in[i], b);
}

__global__ void square_plus_index(const unsigned* in, unsigned* out, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = in[i] * in[i] + static_cast<unsigned>(i);
}

// --- helpers ------------------------------------------------------------------------------------

/// Failures of one scenario, collected as text (gtest assertions do not report from a child).
class outcome {
 public:
  void check(bool ok, const std::string& what, int line) {
    if (!ok) text_ += "line " + std::to_string(line) + ": " + what + "\n";
  }
  [[nodiscard]] const std::string& text() const { return text_; }

 private:
  std::string text_;
};
#define CHECK(out, condition) (out).check((condition), #condition, __LINE__)
#define CHECK_MSG(out, condition, message) \
  (out).check((condition), std::string(#condition) + " (" + (message) + ")", __LINE__)

/// Runs `scenario` (which returns its failures, empty when it passed) and ends the process:
/// exit code 0 when it passed, 1 with the failures on stderr otherwise.
template <class Scenario>
[[noreturn]] void run_and_exit(Scenario scenario) {
  std::string failures;
  try {
    failures = scenario();
  } catch (const std::exception& e) {
    failures = std::string("exception: ") + e.what();
  } catch (...) {
    failures = "unknown exception";
  }
  if (!failures.empty()) {
    std::fprintf(stderr, "scenario failed:\n%s\n", failures.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(0);
}

bool primary_active() {
  return cubridge::device::get(0).primary_state().active;
}

std::vector<float> random_floats(std::size_t n, unsigned seed, float low = -1.0f,
                                 float high = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

std::vector<unsigned> random_u32(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<unsigned> v(n);
  for (auto& x : v) x = static_cast<unsigned>(gen());
  return v;
}

std::string cublas_text(cublasStatus_t s) {
  return cublasGetStatusString(s);
}

/// Destroys a cuBLAS handle at scope exit (with the context it was made in still current).
struct cublas_handle {
  cublasHandle_t handle = nullptr;
  cublas_handle() = default;
  cublas_handle(const cublas_handle&) = delete;
  cublas_handle& operator=(const cublas_handle&) = delete;
  ~cublas_handle() {
    if (handle) cublasDestroy(handle);
  }
};

struct cufft_plan {
  cufftHandle plan = 0;
  bool made = false;
  cufft_plan() = default;
  cufft_plan(const cufft_plan&) = delete;
  cufft_plan& operator=(const cufft_plan&) = delete;
  ~cufft_plan() {
    if (made) cufftDestroy(plan);
  }
};

class Interop : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// --- (1) driver first + cuBLAS -------------------------------------------------------------------

std::string cublas_sgemm_in_a_driver_context() {
  outcome out;
  CHECK_MSG(out, !primary_active(), "the primary context must be inactive at the start");
  const auto dev = cubridge::device::get(0);
  auto ctx = cubridge::context::create(dev);

  constexpr int m = 256, n = 192, k = 128;
  const float alpha = 1.25f, beta = 0.5f;
  const auto a = random_floats(std::size_t{m} * k, 501);
  const auto b = random_floats(std::size_t{k} * n, 502);
  const auto c0 = random_floats(std::size_t{m} * n, 503);
  std::vector<float> c(std::size_t{m} * n, 0.0f);
  {
    auto da = cubridge::driver_buffer<float>::allocate(ctx, a.size());
    auto db = cubridge::driver_buffer<float>::allocate(ctx, b.size());
    auto dc = cubridge::driver_buffer<float>::allocate(ctx, c0.size());
    auto stream = cubridge::stream::create(ctx);
    cubridge::scoped_current guard(ctx);
    cubridge::copy<float>(da, a);
    cubridge::copy<float>(db, b);
    cubridge::copy<float>(dc, c0);

    cublas_handle blas;
    const cublasStatus_t created = cublasCreate(&blas.handle);
    CHECK_MSG(out, created == CUBLAS_STATUS_SUCCESS, cublas_text(created));
    if (created != CUBLAS_STATUS_SUCCESS) return out.text();
    CHECK_MSG(out, raw_current() == ctx.get(), "cublasCreate must not change the current context");
    CHECK(out, cublasSetStream(blas.handle, stream.runtime_handle()) == CUBLAS_STATUS_SUCCESS);
    cudaStream_t used = nullptr;
    CHECK(out, cublasGetStream(blas.handle, &used) == CUBLAS_STATUS_SUCCESS);
    CHECK(out, used == stream.get());
    CHECK(out, cublasSetMathMode(blas.handle, CUBLAS_PEDANTIC_MATH) == CUBLAS_STATUS_SUCCESS);
    // Column-major: C (m x n) = alpha * A (m x k) * B (k x n) + beta * C.
    const cublasStatus_t gemm = cublasSgemm(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha,
                                            da.data(), m, db.data(), k, &beta, dc.data(), m);
    CHECK_MSG(out, gemm == CUBLAS_STATUS_SUCCESS, cublas_text(gemm));
    stream.synchronize();
    CHECK_MSG(out, !primary_active(), "cuBLAS activated the primary context");
    CHECK(out, cubridge::context_of(dc.data()) == ctx.ref());
    cubridge::copy<float>(c, dc);
    const cublasStatus_t destroyed = cublasDestroy(blas.handle);
    blas.handle = nullptr;
    CHECK_MSG(out, destroyed == CUBLAS_STATUS_SUCCESS, cublas_text(destroyed));
    CHECK(out, raw_current() == ctx.get());
  }
  CHECK_MSG(out, !primary_active(), "the primary context is active after the scenario");
  CHECK(out, raw_current() == nullptr);

  double error = 0.0, norm = 0.0;
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      double sum = 0.0;
      for (int l = 0; l < k; ++l)
        sum += static_cast<double>(a[i + std::size_t{m} * l]) * b[l + std::size_t{k} * j];
      const std::size_t at = i + std::size_t{m} * j;
      const double expected = alpha * sum + beta * static_cast<double>(c0[at]);
      const double diff = c[at] - expected;
      error += diff * diff;
      norm += expected * expected;
    }
  }
  const double relative = std::sqrt(error / norm);
  CHECK_MSG(out, norm > 0.0 && relative < 1e-4,
            "relative Frobenius error " + std::to_string(relative));
  return out.text();
}

TEST_F(Interop, CublasSgemmInADriverContextLeavesThePrimaryInactive) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(run_and_exit(cublas_sgemm_in_a_driver_context), "");
}

// --- (2) driver first + cuFFT
// ---------------------------------------------------------------------

std::string cufft_in_a_driver_context() {
  outcome out;
  CHECK_MSG(out, !primary_active(), "the primary context must be inactive at the start");
  auto ctx = cubridge::context::create(cubridge::device::get(0));

  constexpr int points = 1024, batch = 4;
  constexpr std::size_t total = std::size_t{points} * batch;
  const auto parts = random_floats(2 * total, 601);
  std::vector<cufftComplex> input(total);
  for (std::size_t i = 0; i < total; ++i) input[i] = cufftComplex{parts[2 * i], parts[2 * i + 1]};
  std::vector<cufftComplex> output(total, cufftComplex{0.0f, 0.0f});
  {
    auto din = cubridge::driver_buffer<cufftComplex>::allocate(ctx, total);
    auto dout = cubridge::driver_buffer<cufftComplex>::allocate(ctx, total);
    auto stream = cubridge::stream::create(ctx);
    cubridge::scoped_current guard(ctx);
    cubridge::copy<cufftComplex>(din, input);

    cufft_plan fft;
    const cufftResult planned = cufftPlan1d(&fft.plan, points, CUFFT_C2C, batch);
    CHECK_MSG(out, planned == CUFFT_SUCCESS, "cufftPlan1d returned " + std::to_string(planned));
    if (planned != CUFFT_SUCCESS) return out.text();
    fft.made = true;
    CHECK(out, cufftSetStream(fft.plan, stream.runtime_handle()) == CUFFT_SUCCESS);
    const cufftResult executed = cufftExecC2C(fft.plan, din.data(), dout.data(), CUFFT_FORWARD);
    CHECK_MSG(out, executed == CUFFT_SUCCESS, "cufftExecC2C returned " + std::to_string(executed));
    stream.synchronize();
    CHECK_MSG(out, !primary_active(), "cuFFT activated the primary context");
    cubridge::copy<cufftComplex>(output, dout);
    CHECK(out, cufftDestroy(fft.plan) == CUFFT_SUCCESS);
    fft.made = false;
    CHECK(out, raw_current() == ctx.get());
  }
  CHECK_MSG(out, !primary_active(), "the primary context is active after the scenario");

  // Reference DFT in double: X[f] = sum_t x[t] exp(-2 pi i f t / N).
  std::vector<double> cosines(points), sines(points);
  for (int t = 0; t < points; ++t) {
    const double angle = 2.0 * std::numbers::pi * t / points;
    cosines[t] = std::cos(angle);
    sines[t] = std::sin(angle);
  }
  double error = 0.0, norm = 0.0;
  for (int s = 0; s < batch; ++s) {
    const cufftComplex* x = input.data() + std::size_t{points} * s;
    const cufftComplex* y = output.data() + std::size_t{points} * s;
    for (int f = 0; f < points; ++f) {
      double re = 0.0, im = 0.0;
      for (int t = 0; t < points; ++t) {
        const int w = static_cast<int>((static_cast<long long>(f) * t) % points);
        // (xr + i xi)(cos - i sin)
        re += x[t].x * cosines[w] + x[t].y * sines[w];
        im += x[t].y * cosines[w] - x[t].x * sines[w];
      }
      const double dr = y[f].x - re, di = y[f].y - im;
      error += dr * dr + di * di;
      norm += re * re + im * im;
    }
  }
  const double relative = std::sqrt(error / norm);
  CHECK_MSG(out, norm > 0.0 && relative < 1e-4, "relative L2 error " + std::to_string(relative));
  return out.text();
}

TEST_F(Interop, CufftInADriverContextLeavesThePrimaryInactive) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(run_and_exit(cufft_in_a_driver_context), "");
}

// --- (3) a <<<>>> kernel in a driver context on driver memory
// -------------------------------------

std::string runtime_kernel_in_a_driver_context() {
  outcome out;
  CHECK_MSG(out, !primary_active(), "the primary context must be inactive at the start");
  auto ctx = cubridge::context::create(cubridge::device::get(0));
  constexpr std::size_t n = (1 << 20) + 3;
  const auto input = random_floats(n, 701, -100.0f, 100.0f);
  const float a = 1.75f, b = -3.5f;
  const auto integers = random_u32(n, 702);
  std::vector<float> output(n, 0.0f);
  std::vector<unsigned> integer_output(n, 0);
  {
    auto din = cubridge::driver_buffer<float>::allocate(ctx, n);
    auto dout = cubridge::driver_buffer<float>::allocate(ctx, n);
    auto iin = cubridge::driver_buffer<unsigned>::allocate(ctx, n);
    auto iout = cubridge::driver_buffer<unsigned>::allocate(ctx, n);
    auto stream = cubridge::stream::create(ctx);
    cubridge::scoped_current guard(ctx);
    CHECK(out,
          cu().cuMemcpy(din.address(), as_address(input.data()), din.size_bytes()) == CUDA_SUCCESS);
    CHECK(out, cu().cuMemcpy(iin.address(), as_address(integers.data()), iin.size_bytes()) ==
                   CUDA_SUCCESS);
    const auto blocks = static_cast<unsigned>((n + 255) / 256);
    // On a cubridge stream...
    affine<<<blocks, 256, 0, stream.runtime_handle()>>>(din.data(), dout.data(), a, b, n);
    const cudaError_t launched = cudaGetLastError();
    CHECK_MSG(out, launched == cudaSuccess, cudaGetErrorString(launched));
    stream.synchronize();
    // ... and on the context's legacy default stream.
    square_plus_index<<<blocks, 256>>>(iin.data(), iout.data(), n);
    const cudaError_t launched_default = cudaGetLastError();
    CHECK_MSG(out, launched_default == cudaSuccess, cudaGetErrorString(launched_default));
    const cudaError_t synchronized = cudaDeviceSynchronize();  // the current (driver) context
    CHECK_MSG(out, synchronized == cudaSuccess, cudaGetErrorString(synchronized));
    CHECK_MSG(out, !primary_active(), "a <<<>>> launch activated the primary context");
    // Read back through the driver.
    CHECK(out, cu().cuMemcpy(as_address(output.data()), dout.address(), dout.size_bytes()) ==
                   CUDA_SUCCESS);
    CHECK(out, cu().cuMemcpy(as_address(integer_output.data()), iout.address(),
                             iout.size_bytes()) == CUDA_SUCCESS);
    CHECK(out, raw_current() == ctx.get());
  }
  CHECK_MSG(out, !primary_active(), "the primary context is active after the scenario");
  std::size_t wrong = 0, first_wrong = n;
  for (std::size_t i = 0; i < n; ++i) {
    const float expected = std::fma(a, input[i], b);
    const bool close = std::fabs(output[i] - expected) <= 1e-6f * std::fabs(expected) + 1e-6f;
    const unsigned expected_integer = integers[i] * integers[i] + static_cast<unsigned>(i);
    if (!close || integer_output[i] != expected_integer) {
      if (wrong++ == 0) first_wrong = i;
    }
  }
  CHECK_MSG(out, wrong == 0,
            std::to_string(wrong) + " wrong elements, the first at " + std::to_string(first_wrong));
  return out.text();
}

TEST_F(Interop, RuntimeKernelRunsInADriverContextOnDriverMemory) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(run_and_exit(runtime_kernel_in_a_driver_context), "");
}

// --- (4) runtime first: adopt the primary, driver kernels on cudaMalloc memory
// --------------------

std::string driver_kernel_on_runtime_memory() {
  outcome out;
  const cudaError_t init = cudaFree(nullptr);
  CHECK_MSG(out, init == cudaSuccess, cudaGetErrorString(init));
  if (init != cudaSuccess) return out.text();
  const CUcontext runtime_context = raw_current();
  CHECK(out, runtime_context != nullptr);

  auto adopted = cubridge::primary_context::adopt_runtime();
  CHECK(out, adopted.get() == runtime_context);
  CHECK(out, cubridge::context_ref::current() == adopted.ref());
  CHECK(out, primary_active());
  CHECK(out, adopted.device() == cubridge::device::get(0));

  auto module = cubridge::module::load_file(adopted, cubridge::testing::test_cubin_path());
  const auto add = module.get_kernel("add_f32");
  CHECK_MSG(out, raw_current() == runtime_context, "module loading changed the current context");

  constexpr std::size_t n = 300'001;
  const auto input = random_floats(n, 801, -1000.0f, 1000.0f);
  const float addend = 0.375f;
  float* data = nullptr;
  const cudaError_t allocated = cudaMalloc(&data, n * sizeof(float));
  CHECK_MSG(out, allocated == cudaSuccess, cudaGetErrorString(allocated));
  if (allocated != cudaSuccess) return out.text();
  CHECK(out, cubridge::context_of(data) == adopted.ref());
  CHECK(out,
        cudaMemcpy(data, input.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  add.launch(cubridge::launch_config{.grid = {static_cast<unsigned>((n + 255) / 256)},
                                     .block = {256},
                                     .stream = cubridge::stream_ref::legacy_default()},
             data, addend, std::size_t{n});
  CHECK(out, cudaDeviceSynchronize() == cudaSuccess);
  std::vector<float> output(n, 0.0f);
  CHECK(out,
        cudaMemcpy(output.data(), data, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(out, cudaFree(data) == cudaSuccess);

  std::size_t wrong = 0, first_wrong = n;
  for (std::size_t i = 0; i < n; ++i) {
    const float expected = input[i] + addend;  // one IEEE addition on either side
    if (output[i] != expected && wrong++ == 0) first_wrong = i;
  }
  CHECK_MSG(out, wrong == 0,
            std::to_string(wrong) + " wrong elements, the first at " + std::to_string(first_wrong));
  return out.text();
}

TEST_F(Interop, RuntimeFirstAdoptedPrimaryRunsDriverKernelsOnCudaMallocMemory) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(run_and_exit(driver_kernel_on_runtime_memory), "");
}

// --- (5) a cudaStreamCreate stream adopted for driver launches
// ------------------------------------

/// Fills `n` u32 at `out` with `value` by a driver launch of `fill` on `s`, then checks them with
/// a cubridge copy (the caller has the right context current).
void driver_fill_on_runtime_stream(outcome& out, const cubridge::kernel& fill,
                                   cubridge::stream_ref s, unsigned* device_out, std::size_t n,
                                   unsigned value) {
  fill.launch(
      cubridge::launch_config{
          .grid = {static_cast<unsigned>((n + 255) / 256)}, .block = {256}, .stream = s},
      device_out, value, std::size_t{n});
  auto done = cubridge::event::create(s.context());
  done.record(s);
  done.synchronize();
  CHECK(out, s.ready());
  std::vector<unsigned> host(n, 0);
  cubridge::copy<unsigned>(host, cubridge::device_span<const unsigned>(device_out, n));
  std::size_t wrong = 0;
  for (const unsigned v : host) wrong += v != value;
  CHECK_MSG(out, wrong == 0, std::to_string(wrong) + " wrong elements");
}

std::string runtime_stream_in_the_primary_context() {
  outcome out;
  CHECK(out, cudaFree(nullptr) == cudaSuccess);
  auto adopted = cubridge::primary_context::adopt_runtime();
  cudaStream_t raw = nullptr;
  const cudaError_t created = cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking);
  CHECK_MSG(out, created == cudaSuccess, cudaGetErrorString(created));
  if (created != cudaSuccess) return out.text();
  const auto s = cubridge::stream_ref::from_native(raw);
  CHECK(out, s.get() == raw);
  CHECK(out, s.context() == adopted.ref());

  auto module = cubridge::module::load_file(adopted, cubridge::testing::test_cubin_path());
  const auto fill = module.get_kernel("fill_u32");
  constexpr std::size_t n = 1 << 20;
  unsigned* data = nullptr;
  CHECK(out, cudaMalloc(&data, n * sizeof(unsigned)) == cudaSuccess);
  if (!data) return out.text();
  std::mt19937 gen(901);
  const auto background = random_u32(n, 902);
  CHECK(out, cudaMemcpy(data, background.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice) ==
                 cudaSuccess);
  driver_fill_on_runtime_stream(out, fill, s, data, n, static_cast<unsigned>(gen() | 1u));
  CHECK(out, cudaFree(data) == cudaSuccess);
  CHECK(out, cudaStreamDestroy(raw) == cudaSuccess);
  return out.text();
}

TEST_F(Interop, CudaStreamOfThePrimaryContextTakesDriverLaunches) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(run_and_exit(runtime_stream_in_the_primary_context), "");
}

std::string runtime_stream_in_a_driver_context() {
  outcome out;
  CHECK_MSG(out, !primary_active(), "the primary context must be inactive at the start");
  auto ctx = cubridge::context::create(cubridge::device::get(0));
  auto module = cubridge::module::load_file(ctx, cubridge::testing::test_cubin_path());
  const auto fill = module.get_kernel("fill_u32");
  constexpr std::size_t n = 1 << 20;
  auto buffer = cubridge::driver_buffer<unsigned>::allocate(ctx, n);
  cubridge::scoped_current guard(ctx);
  cudaStream_t raw = nullptr;
  const cudaError_t created = cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking);
  CHECK_MSG(out, created == cudaSuccess, cudaGetErrorString(created));
  if (created != cudaSuccess) return out.text();
  const auto s = cubridge::stream_ref::from_native(raw);
  CHECK_MSG(out, s.context() == ctx.ref(),
            "a runtime stream made in a driver context belongs to it");
  const auto background = random_u32(n, 903);
  cubridge::copy<unsigned>(buffer, background);
  driver_fill_on_runtime_stream(out, fill, s, buffer.data(), n, 0xC0FFEEu);
  CHECK(out, cudaStreamDestroy(raw) == cudaSuccess);
  CHECK_MSG(out, !primary_active(), "the primary context is active after the scenario");
  return out.text();
}

TEST_F(Interop, CudaStreamOfADriverContextTakesDriverLaunches) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(run_and_exit(runtime_stream_in_a_driver_context), "");
}

}  // namespace
