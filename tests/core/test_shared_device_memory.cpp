// shared_device_memory: VMM memory usable from every context of a device, owned by none.
#include <cubridge/core/context.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/module.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/shared_device_memory.hpp>
#include <cubridge/core/stream.hpp>

#include "driver_helpers.hpp"
#include "gpu_test.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using cubridge::testing::as_address;
using cubridge::testing::cu;
using cubridge::testing::make_context;

using cubridge::shared_device_memory;

static_assert(!std::is_copy_constructible_v<shared_device_memory>);
static_assert(std::is_nothrow_move_constructible_v<shared_device_memory>);
static_assert(std::is_nothrow_move_assignable_v<shared_device_memory>);

/// Skips the test unless device 0 supports the VMM API.
#define REQUIRE_VMM()                                                      \
  do {                                                                     \
    if (cubridge::device::get(0).attribute(                                \
            CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) == 0) \
      GTEST_SKIP() << "device 0 has no VMM support";                       \
  } while (false)

/// The allocation granularity that shared_device_memory rounds to (minimum, device-pinned).
std::size_t granularity(const cubridge::device& dev) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev.ordinal();
  std::size_t g = 0;
  EXPECT_EQ(cu().cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_SUCCESS);
  return g;
}

std::vector<std::uint32_t> random_u32(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<std::uint32_t> v(n);
  for (auto& x : v) x = static_cast<std::uint32_t>(gen());
  return v;
}

/// Fills the first `n` u32 of `memory` with `value` by a driver kernel loaded into `ctx`,
/// launched with `ctx` current on a stream of `ctx`, and waits for it.
void fill_in(const cubridge::context& ctx, const shared_device_memory& memory, std::size_t n,
             std::uint32_t value) {
  auto module = cubridge::module::load_file(ctx, cubridge::testing::test_cubin_path());
  const auto fill = module.get_kernel("fill_u32");
  auto stream = cubridge::stream::create(ctx);
  cubridge::scoped_current guard(ctx);
  const auto blocks = static_cast<unsigned>((n + 255) / 256);
  fill.launch(cubridge::launch_config{.grid = {blocks}, .block = {256}, .stream = stream},
              memory.span<unsigned>(), static_cast<unsigned>(value), std::size_t{n});
  stream.synchronize();
}

/// Reads `n` u32 of `memory` with `ctx` current.
std::vector<std::uint32_t> read_in(const cubridge::context& ctx, const shared_device_memory& memory,
                                   std::size_t n) {
  std::vector<std::uint32_t> out(n, 0);
  cubridge::scoped_current guard(ctx);
  EXPECT_EQ(cu().cuMemcpy(as_address(out.data()), memory.address(), n * sizeof(std::uint32_t)),
            CUDA_SUCCESS);
  return out;
}

/// Writes `values` to the start of `memory` with `ctx` current.
void write_in(const cubridge::context& ctx, const shared_device_memory& memory,
              const std::vector<std::uint32_t>& values) {
  cubridge::scoped_current guard(ctx);
  ASSERT_EQ(cu().cuMemcpy(memory.address(), as_address(values.data()),
                          values.size() * sizeof(std::uint32_t)),
            CUDA_SUCCESS);
}

TEST(SharedDeviceMemory, RoundsUpToTheGranularity) {
  CUBRIDGE_REQUIRE_GPU();
  REQUIRE_VMM();
  const auto dev = cubridge::device::get(0);
  const std::size_t g = granularity(dev);
  ASSERT_GT(g, 0u);
  {
    auto one = shared_device_memory::allocate(dev, 1);
    EXPECT_EQ(one.size_bytes(), g);
    EXPECT_NE(one.address(), CUdeviceptr{0});
    EXPECT_EQ(one.address() % g, 0u) << "the reservation is aligned to the granularity";
    EXPECT_NE(one.handle(), CUmemGenericAllocationHandle{0});
    EXPECT_EQ(one.device(), dev);
  }
  {
    auto exact = shared_device_memory::allocate(dev, g);
    EXPECT_EQ(exact.size_bytes(), g);
  }
  {
    auto more = shared_device_memory::allocate(dev, g + 1);
    EXPECT_EQ(more.size_bytes(), 2 * g);
  }
  {
    auto odd = shared_device_memory::allocate(dev, 5 * g - 3);
    EXPECT_EQ(odd.size_bytes(), 5 * g);
    EXPECT_EQ(odd.span<std::uint32_t>().size(), 5 * g / sizeof(std::uint32_t));
    EXPECT_EQ(odd.span<std::uint32_t>().address(), odd.address());
    EXPECT_EQ(odd.span<double>().size_bytes(), 5 * g);
  }
}

TEST(SharedDeviceMemory, ZeroBytesIsAPreconditionError) {
  CUBRIDGE_REQUIRE_GPU();
  try {
    auto none = shared_device_memory::allocate(cubridge::device::get(0), 0);
    ADD_FAILURE() << "allocating 0 bytes succeeded at " << none.address();
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();
  }
}

TEST(SharedDeviceMemory, WrittenInOneContextReadInAnother) {
  CUBRIDGE_REQUIRE_GPU();
  REQUIRE_VMM();
  const auto dev = cubridge::device::get(0);
  auto a = make_context();
  auto b = make_context();
  constexpr std::size_t n = 1 << 20;
  auto memory = shared_device_memory::allocate(dev, n * sizeof(std::uint32_t));
  ASSERT_GE(memory.size_bytes(), n * sizeof(std::uint32_t));

  // A writes random data; B's kernel overwrites the first half; A reads it all back.
  const auto background = random_u32(n, 201);
  write_in(a, memory, background);
  std::mt19937 gen(202);
  const auto value = static_cast<std::uint32_t>(gen() | 1u);
  fill_in(b, memory, n / 2, value);
  const auto seen = read_in(a, memory, n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t expected = i < n / 2 ? value : background[i];
    ASSERT_EQ(seen[i], expected) << "at " << i;
  }
}

TEST(SharedDeviceMemory, StaysValidAfterTheWritingContextIsDestroyed) {
  CUBRIDGE_REQUIRE_GPU();
  REQUIRE_VMM();
  const auto dev = cubridge::device::get(0);
  auto a = make_context();
  constexpr std::size_t n = 300'000;
  auto memory = shared_device_memory::allocate(dev, n * sizeof(std::uint32_t));
  write_in(a, memory, random_u32(n, 203));
  const std::uint32_t first_value = 0x5eed1234u;
  {
    auto b = make_context();
    fill_in(b, memory, n, first_value);
  }  // B, its module and its stream are gone
  auto seen = read_in(a, memory, n);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], first_value) << "at " << i;

  // The memory is still writable by a kernel in A.
  const std::uint32_t second_value = 0xa5a5f00du;
  fill_in(a, memory, n, second_value);
  seen = read_in(a, memory, n);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], second_value) << "at " << i;
}

TEST(SharedDeviceMemory, OutlivesEveryContext) {
  CUBRIDGE_REQUIRE_GPU();
  REQUIRE_VMM();
  const auto dev = cubridge::device::get(0);
  constexpr std::size_t n = 4096;
  const auto values = random_u32(n, 204);
  auto memory = shared_device_memory::allocate(dev, n * sizeof(std::uint32_t));
  {
    auto a = make_context();
    write_in(a, memory, values);
  }
  auto c = make_context();  // a context made after the memory
  EXPECT_EQ(read_in(c, memory, n), values);
}

TEST(SharedDeviceMemory, MovedFromObjectDoesNotFree) {
  CUBRIDGE_REQUIRE_GPU();
  REQUIRE_VMM();
  const auto dev = cubridge::device::get(0);
  auto ctx = make_context();
  constexpr std::size_t n = 10'000;
  const auto values = random_u32(n, 205);
  std::unique_ptr<shared_device_memory> moved;
  CUdeviceptr address = 0;
  std::size_t size = 0;
  CUmemGenericAllocationHandle handle = 0;
  {
    auto original = shared_device_memory::allocate(dev, n * sizeof(std::uint32_t));
    address = original.address();
    size = original.size_bytes();
    handle = original.handle();
    write_in(ctx, original, values);
    moved = std::make_unique<shared_device_memory>(std::move(original));
    // NOLINTBEGIN(bugprone-use-after-move): the moved-from state is what is tested
    EXPECT_EQ(original.address(), CUdeviceptr{0});
    EXPECT_EQ(original.size_bytes(), 0u);
    EXPECT_EQ(original.handle(), CUmemGenericAllocationHandle{0});
    // NOLINTEND(bugprone-use-after-move)
  }  // the moved-from object is destroyed here
  EXPECT_EQ(moved->address(), address);
  EXPECT_EQ(moved->size_bytes(), size);
  EXPECT_EQ(moved->handle(), handle);
  EXPECT_EQ(moved->device(), dev);
  EXPECT_EQ(read_in(ctx, *moved, n), values) << "the moved-from object unmapped the memory";

  // Move assignment releases the target's old mapping and takes over the source's.
  auto other = shared_device_memory::allocate(dev, 1);
  other = std::move(*moved);
  EXPECT_EQ(other.address(), address);
  EXPECT_EQ(moved->address(), CUdeviceptr{0});  // NOLINT(bugprone-use-after-move)
  moved.reset();
  EXPECT_EQ(read_in(ctx, other, n), values);
  fill_in(ctx, other, n, 77u);
  const auto seen = read_in(ctx, other, n);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 77u) << "at " << i;
}

// Export to another process (the sandbox's route): only allocations made exportable export, and
// what comes out is a file descriptor the driver imports again.
TEST(SharedDeviceMemory, ExportsAFileDescriptorOnlyWhenAllocatedExportable) {
  CUBRIDGE_REQUIRE_GPU();
  const auto dev = cubridge::device::get(0);
  auto plain = shared_device_memory::allocate(dev, 1 << 20);
  EXPECT_EQ(plain.exportable(), cubridge::memory_export::none);
  try {
    (void)plain.export_fd();
    FAIL() << "exported memory allocated without memory_export::posix_fd";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();
  }
  auto exportable = shared_device_memory::allocate(dev, 1 << 20, cubridge::memory_export::posix_fd);
  EXPECT_EQ(exportable.exportable(), cubridge::memory_export::posix_fd);
  auto fd = exportable.export_fd();
  ASSERT_TRUE(fd);
  CUmemGenericAllocationHandle imported = 0;
  ASSERT_EQ(cubridge::driver::api().cuMemImportFromShareableHandle(
                &imported, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd.get())),
                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            CUDA_SUCCESS);
  EXPECT_EQ(cubridge::driver::api().cuMemRelease(imported), CUDA_SUCCESS);
  auto moved = std::move(exportable);
  EXPECT_EQ(moved.exportable(), cubridge::memory_export::posix_fd);
}

}  // namespace
