// copy / copy_async / copy_bytes: unified-addressing copies between host and device memory.
#include <cubridge/core/context.hpp>
#include <cubridge/core/copy.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/pinned_buffer.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/stream.hpp>

#include "driver_helpers.hpp"
#include "gpu_test.hpp"

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

using cubridge::testing::as_address;
using cubridge::testing::cu;
using cubridge::testing::make_context;

using cubridge::device_span;
using cubridge::driver_buffer;
using cubridge::runtime_buffer;

std::vector<std::uint32_t> random_u32(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<std::uint32_t> v(n);
  for (auto& x : v) x = static_cast<std::uint32_t>(gen());
  return v;
}

std::vector<double> random_doubles(std::size_t n, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(-1e6, 1e6);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

/// Reads device memory with a raw cuMemcpy (the current context must be set).
template <class T>
std::vector<T> read_back(device_span<const T> source) {
  std::vector<T> out(source.size());
  EXPECT_EQ(cu().cuMemcpy(as_address(out.data()), source.address(), source.size_bytes()),
            CUDA_SUCCESS);
  return out;
}

/// Writes device memory with a raw cuMemcpy (the current context must be set).
template <class T>
void write(device_span<T> destination, const std::vector<T>& values) {
  ASSERT_EQ(values.size(), destination.size());
  ASSERT_EQ(
      cu().cuMemcpy(destination.address(), as_address(values.data()), destination.size_bytes()),
      CUDA_SUCCESS);
}

TEST(Copy, HostDeviceDeviceHostRoundTrip) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  constexpr std::size_t n = (1 << 20) + 17;
  const auto input = random_u32(n, 101);
  auto first = driver_buffer<std::uint32_t>::allocate(ctx, n);
  auto second = driver_buffer<std::uint32_t>::allocate(ctx, n);
  std::vector<std::uint32_t> output(n, 0);
  cubridge::scoped_current guard(ctx);
  cubridge::copy<std::uint32_t>(first, input);
  EXPECT_EQ(read_back<std::uint32_t>(first), input) << "host -> device";
  cubridge::copy<std::uint32_t>(second, first);
  cubridge::copy<std::uint32_t>(output, second);
  EXPECT_EQ(output, input);
}

TEST(Copy, ExactSpanTypesNeedNoTemplateArgument) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  constexpr std::size_t n = 1000;
  const auto input = random_doubles(n, 102);
  auto a = driver_buffer<double>::allocate(ctx, n);
  auto b = driver_buffer<double>::allocate(ctx, n);
  std::vector<double> output(n, 0.0);
  cubridge::scoped_current guard(ctx);
  // With exactly the parameter types no template argument is needed.
  cubridge::copy(a.span(), std::span<const double>(input));
  cubridge::copy(b.span(), device_span<const double>(a.span()));
  cubridge::copy(std::span<double>(output), device_span<const double>(b.span()));
  EXPECT_EQ(output, input);
}

TEST(Copy, DriverAndRuntimeBuffersCopyBothWays) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  constexpr std::size_t n = 65'537;
  const auto input = random_doubles(n, 103);
  auto driver_memory = driver_buffer<double>::allocate(ctx, n);
  auto runtime_memory = runtime_buffer<double>::allocate(ctx, n);
  auto back = driver_buffer<double>::allocate(ctx, n);
  std::vector<double> output(n, 0.0);
  cubridge::scoped_current guard(ctx);
  cubridge::copy<double>(driver_memory, input);
  cubridge::copy<double>(runtime_memory, driver_memory);  // driver -> runtime
  EXPECT_EQ(read_back<double>(runtime_memory), input);
  cubridge::copy<double>(back, runtime_memory);  // runtime -> driver
  cubridge::copy<double>(output, back);
  EXPECT_EQ(output, input);
}

TEST(Copy, AsyncRoundTripOnAStream) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  auto stream = cubridge::stream::create(ctx);
  constexpr std::size_t n = 1 << 20;
  const auto input = random_u32(n, 104);
  auto host_in = cubridge::pinned_buffer<std::uint32_t>::allocate(ctx, n);
  auto host_out = cubridge::pinned_buffer<std::uint32_t>::allocate(ctx, n);
  for (std::size_t i = 0; i < n; ++i) {
    host_in[i] = input[i];
    host_out[i] = ~input[i];
  }
  auto a = driver_buffer<std::uint32_t>::allocate(ctx, n);
  auto b = runtime_buffer<std::uint32_t>::allocate(ctx, n);
  cubridge::scoped_current guard(ctx);
  const std::span<const std::uint32_t> in_span(host_in.data(), n);
  cubridge::copy_async<std::uint32_t>(a, in_span, stream);
  cubridge::copy_async<std::uint32_t>(b, a, stream);
  cubridge::copy_async<std::uint32_t>(host_out.span(), b, stream);
  stream.synchronize();
  EXPECT_TRUE(stream.ready());
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(host_out[i], input[i]) << "at " << i;
}

TEST(Copy, AsyncFromPageableMemory) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  auto stream = cubridge::stream::create(ctx);
  constexpr std::size_t n = 12'345;
  const auto input = random_doubles(n, 105);
  std::vector<double> output(n, 0.0);
  auto a = driver_buffer<double>::allocate(ctx, n);
  cubridge::scoped_current guard(ctx);
  cubridge::copy_async<double>(a, input, stream);
  cubridge::copy_async<double>(output, a, stream);
  stream.synchronize();
  EXPECT_EQ(output, input);
}

TEST(Copy, IntoASubspanLeavesTheRestAlone) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  constexpr std::size_t n = 1024;
  const auto background = random_u32(n, 106);
  const auto patch = random_u32(100, 107);
  auto buffer = driver_buffer<std::uint32_t>::allocate(ctx, n);
  cubridge::scoped_current guard(ctx);
  write<std::uint32_t>(buffer, background);
  cubridge::copy<std::uint32_t>(buffer.span().subspan(300, 100), patch);
  auto expected = background;
  for (std::size_t i = 0; i < patch.size(); ++i) expected[300 + i] = patch[i];
  EXPECT_EQ(read_back<std::uint32_t>(buffer), expected);
  // A larger destination is fine: only the source's elements are copied.
  std::vector<std::uint32_t> wide(2 * n, 7u);
  cubridge::copy<std::uint32_t>(wide, buffer.span().subspan(300, 100));
  for (std::size_t i = 0; i < wide.size(); ++i) {
    if (i < patch.size())
      ASSERT_EQ(wide[i], patch[i]) << "at " << i;
    else
      ASSERT_EQ(wide[i], 7u) << "at " << i;
  }
}

/// Runs `attempt`, which must throw errc::precondition naming both sizes.
template <class F>
void expect_too_small(F attempt, std::size_t destination_bytes, std::size_t source_bytes) {
  try {
    attempt();
    ADD_FAILURE() << "a copy into a too-small destination did not throw";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();
    const std::string text = e.what();
    EXPECT_NE(text.find(std::to_string(destination_bytes)), std::string::npos) << text;
    EXPECT_NE(text.find(std::to_string(source_bytes)), std::string::npos) << text;
  }
}

TEST(Copy, TooSmallDestinationThrowsBeforeCopying) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  auto stream = cubridge::stream::create(ctx);
  constexpr std::size_t small_n = 100;
  constexpr std::size_t large_n = 101;
  const auto small_contents = random_u32(small_n, 108);
  const auto large_contents = random_u32(large_n, 109);
  auto small = driver_buffer<std::uint32_t>::allocate(ctx, small_n);
  auto large = driver_buffer<std::uint32_t>::allocate(ctx, large_n);
  cubridge::scoped_current guard(ctx);
  write<std::uint32_t>(small, small_contents);
  write<std::uint32_t>(large, large_contents);
  std::vector<std::uint32_t> small_host = small_contents;
  constexpr std::size_t small_bytes = small_n * sizeof(std::uint32_t);
  constexpr std::size_t large_bytes = large_n * sizeof(std::uint32_t);

  // host -> device
  expect_too_small([&] { cubridge::copy<std::uint32_t>(small, large_contents); }, small_bytes,
                   large_bytes);
  expect_too_small([&] { cubridge::copy_async<std::uint32_t>(small, large_contents, stream); },
                   small_bytes, large_bytes);
  // device -> device
  expect_too_small([&] { cubridge::copy<std::uint32_t>(small, large); }, small_bytes, large_bytes);
  expect_too_small([&] { cubridge::copy_async<std::uint32_t>(small, large, stream); }, small_bytes,
                   large_bytes);
  // device -> host
  expect_too_small([&] { cubridge::copy<std::uint32_t>(small_host, large); }, small_bytes,
                   large_bytes);
  expect_too_small([&] { cubridge::copy_async<std::uint32_t>(small_host, large, stream); },
                   small_bytes, large_bytes);

  stream.synchronize();
  EXPECT_EQ(read_back<std::uint32_t>(small), small_contents) << "a refused copy wrote the device";
  EXPECT_EQ(small_host, small_contents) << "a refused copy wrote the host";
  EXPECT_EQ(read_back<std::uint32_t>(large), large_contents);
}

TEST(Copy, CopyBytesRoundTripAndZeroBytesIsANoOp) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  auto stream = cubridge::stream::create(ctx);
  constexpr std::size_t n = 4099;  // an odd number of bytes
  std::mt19937 gen(110);
  std::vector<unsigned char> input(n), output(n, 0);
  for (auto& b : input) b = static_cast<unsigned char>(gen());
  auto a = driver_buffer<unsigned char>::allocate(ctx, n);
  auto b = runtime_buffer<unsigned char>::allocate(ctx, n);
  cubridge::scoped_current guard(ctx);
  cubridge::copy_bytes(a.data(), input.data(), n);
  cubridge::copy_bytes_async(b.data(), a.data(), n, stream);
  cubridge::copy_bytes_async(output.data(), b.data(), n, stream);
  stream.synchronize();
  EXPECT_EQ(output, input);
  EXPECT_NO_THROW(cubridge::copy_bytes(nullptr, nullptr, 0));
  EXPECT_NO_THROW(cubridge::copy_bytes_async(nullptr, nullptr, 0, stream));
  EXPECT_NO_THROW(cubridge::copy<std::uint32_t>(device_span<std::uint32_t>{},
                                                std::span<const std::uint32_t>{}));
}

TEST(Copy, WorksInTheContextOfEachBuffer) {
  // Memory of two contexts on one device: a copy between them works with either current.
  CUBRIDGE_REQUIRE_GPU();
  auto a = make_context();
  auto b = make_context();
  constexpr std::size_t n = 50'000;
  const auto input = random_u32(n, 111);
  auto in_a = driver_buffer<std::uint32_t>::allocate(a, n);
  auto in_b = driver_buffer<std::uint32_t>::allocate(b, n);
  std::vector<std::uint32_t> output(n, 0);
  {
    cubridge::scoped_current guard(a);
    cubridge::copy<std::uint32_t>(in_a, input);
    cubridge::copy<std::uint32_t>(in_b, in_a);
  }
  {
    cubridge::scoped_current guard(b);
    cubridge::copy<std::uint32_t>(output, in_b);
  }
  EXPECT_EQ(output, input);
}

}  // namespace
