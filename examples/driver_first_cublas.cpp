// Driver first: cubridge creates a context; cuBLAS (a runtime-based library) works in it on
// driver-allocated memory, with no copy, and the device's primary context is never touched.
#include <cubridge/core/context.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/stream.hpp>

#include <cublas_v2.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  if (!cubridge::driver::available()) {
    std::printf("driver_first_cublas: no GPU: %s\n",
                cubridge::driver::unavailable_reason().c_str());
    return 77;  // skipped
  }
  const auto dev = cubridge::device::get(0);
  auto ctx = cubridge::context::create(dev);
  cubridge::scoped_current current(ctx);  // runtime calls and cuBLAS now use this context
  auto stream = cubridge::stream::create(ctx);

  constexpr int n = 512;  // cuBLAS takes int sizes
  constexpr std::size_t side = n, count = side * side;
  std::vector<float> a(count), b(count), c(count);
  for (std::size_t i = 0; i < count; ++i) {
    a[i] = std::sin(static_cast<float>(i) * 0.001f);
    b[i] = std::cos(static_cast<float>(i) * 0.002f);
  }
  auto da = cubridge::driver_buffer<float>::allocate(ctx, count);  // cuMemAlloc
  auto db = cubridge::driver_buffer<float>::allocate(ctx, count);
  auto dc = cubridge::driver_buffer<float>::allocate(ctx, count);
  cudaMemcpy(da.data(), a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(db.data(), b.data(), b.size() * sizeof(float), cudaMemcpyHostToDevice);

  cublasHandle_t blas = nullptr;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) return 1;
  cublasSetStream(blas, stream.runtime_handle());  // a cubridge stream is a cudaStream_t
  cublasSetMathMode(blas, CUBLAS_PEDANTIC_MATH);
  const float one = 1, zero = 0;
  cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, da.data(), n, db.data(), n, &zero,
              dc.data(), n);
  stream.synchronize();
  cudaMemcpy(c.data(), dc.data(), c.size() * sizeof(float), cudaMemcpyDeviceToHost);
  cublasDestroy(blas);

  double err = 0, ref_norm = 0;  // column-major C = A * B, checked on a sample of columns
  for (std::size_t col = 0; col < side; col += 37)
    for (std::size_t row = 0; row < side; ++row) {
      double ref = 0;
      for (std::size_t k = 0; k < side; ++k) ref += double(a[k * side + row]) * b[col * side + k];
      err += (c[col * side + row] - ref) * (c[col * side + row] - ref);
      ref_norm += ref * ref;
    }
  const double rel = std::sqrt(err / ref_norm);
  const bool primary_active = dev.primary_state().active;
  std::printf("driver_first_cublas: SGEMM %dx%d in %s, relative error %.2e, primary context %s\n",
              n, n, ctx.ref().describe().c_str(), rel, primary_active ? "ACTIVE" : "inactive");
  return rel < 1e-5 && !primary_active ? 0 : 1;
}
