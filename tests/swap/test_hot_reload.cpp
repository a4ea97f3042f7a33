#include <cubridge/core/context.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/image.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/swap/hot_reload.hpp>

#include "gpu_test.hpp"
#include "temp_dir.hpp"

#include <condition_variable>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

namespace {

using cubridge::testing::temp_dir;
using cubridge::testing::write_text;

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr cubridge::compute_capability sm90{9, 0};

std::string kernel_source(unsigned answer) {
  return "#include \"answer.h\"\nextern \"C\" __global__ void write_version(unsigned* out) {\n"
         "  out[blockIdx.x * blockDim.x + threadIdx.x] = ANSWER_BASE + " +
         std::to_string(answer) + ";\n}\n";
}

bool has_kernel(const std::vector<std::byte>& code, const char* name) {
  const auto info = cubridge::inspect_image(code);
  return info.kind == cubridge::image_kind::cubin && info.find_kernel(name) != nullptr;
}

TEST(MachineCodeFromFile, CompilesCudaSourceWithIncludesNextToIt) {
  temp_dir dir;
  write_text(dir.path / "answer.h", "#define ANSWER_BASE 40\n");
  write_text(dir.path / "v2.cu", kernel_source(2));
  const auto code = cubridge::machine_code_from_file(dir.path / "v2.cu", sm90);
  EXPECT_TRUE(has_kernel(code, "write_version"));
  EXPECT_EQ(cubridge::inspect_image(code).targets.front().arch_name, "sm_90");
}

TEST(MachineCodeFromFile, LinksPtxAndPassesMachineCodeThrough) {
  const auto from_ptx = cubridge::machine_code_from_file(cubridge::testing::test_ptx_path(), sm90);
  EXPECT_TRUE(has_kernel(from_ptx, "fill_u32"));
  const auto cubin = cubridge::machine_code_from_file(cubridge::testing::test_cubin_path(), sm90);
  EXPECT_EQ(cubin, cubridge::testing::read_bytes(cubridge::testing::test_cubin_path()));
  // Machine code for another GPU is refused here, naming the file, not by the loader later.
  try {
    (void)cubridge::machine_code_from_file(cubridge::testing::test_cubin_other_path(), sm90);
    FAIL() << "an sm_80 cubin passed for sm_90";
  } catch (const cubridge::image_error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::incompatible_image)) << e.what();
    EXPECT_NE(std::string(e.what()).find("test_kernels.sm_80.cubin: cubin has code for sm_80"),
              std::string::npos)
        << e.what();
  }
}

TEST(MachineCodeFromFile, UsesTheCacheWhenGiven) {
  temp_dir dir, cache_dir;
  write_text(dir.path / "answer.h", "#define ANSWER_BASE 40\n");
  write_text(dir.path / "v3.cu", kernel_source(3));
  auto cache = cubridge::compile_cache::open(cache_dir.path);
  const auto first = cubridge::machine_code_from_file(dir.path / "v3.cu", sm90, {}, &cache);
  const auto second = cubridge::machine_code_from_file(dir.path / "v3.cu", sm90, {}, &cache);
  EXPECT_EQ(first, second);
  EXPECT_EQ(cache.stats().misses, 1u);
  EXPECT_EQ(cache.stats().hits, 1u);
  // The header next to the source is part of the key.
  write_text(dir.path / "answer.h", "#define ANSWER_BASE 50\n");
  (void)cubridge::machine_code_from_file(dir.path / "v3.cu", sm90, {}, &cache);
  EXPECT_EQ(cache.stats().misses, 2u);
}

TEST(MachineCodeFromFile, RefusesOtherFilesAndCarriesCompilerLogs) {
  temp_dir dir;
  write_text(dir.path / "notes.txt", "hello");
  try {
    (void)cubridge::machine_code_from_file(dir.path / "notes.txt", sm90);
    FAIL() << "no throw";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::precondition));
    EXPECT_NE(std::string(e.what()).find("notes.txt: not a .cu, .ptx, .cubin or .fatbin"),
              std::string::npos);
  }
  write_text(dir.path / "broken.cu", "extern \"C\" __global__ void k() { undeclared = 1; }\n");
  try {
    (void)cubridge::machine_code_from_file(dir.path / "broken.cu", sm90);
    FAIL() << "no throw";
  } catch (const cubridge::compile_error& e) {
    EXPECT_NE(e.log().find("undeclared"), std::string::npos) << e.log();
  }
}

// On the GPU: a .cu dropped into the directory becomes the serving version; a broken one is
// refused and the current version keeps serving.
TEST(HotReloader, PromotesWhatIsDroppedAndRefusesWhatIsBroken) {
  CUBRIDGE_REQUIRE_GPU();
  if (cubridge::device::get(0).capability().major != 9) GTEST_SKIP() << "first image is sm_90";
  temp_dir dir;
  write_text(dir.path / "answer.h", "#define ANSWER_BASE 40\n");
  auto ctx = cubridge::context::create(cubridge::device::get(0));
  cubridge::scoped_current current(ctx);
  auto hot = cubridge::hot_module::load(
      ctx, "versions",
      cubridge::testing::read_bytes(std::string(CUBRIDGE_TEST_HOT_DIR) + "/hot_v1.sm_90.cubin"));
  // The interface of hot_v1 has two kernels; a source with only write_version is refused...
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::string> events;
  cubridge::hot_reloader::options opts;
  opts.debounce = 50ms;
  opts.on_promoted = [&](const fs::path& f, std::uint64_t id) {
    std::lock_guard lock(m);
    events.push_back("promoted " + f.filename().string() + " as " + std::to_string(id));
    cv.notify_all();
  };
  opts.on_refused = [&](const fs::path& f, std::exception_ptr) {
    std::lock_guard lock(m);
    events.push_back("refused " + f.filename().string());
    cv.notify_all();
  };
  cubridge::hot_reloader reloader(hot, dir.path, opts);
  write_text(dir.path / "partial.cu", kernel_source(7));
  {
    std::unique_lock lock(m);
    ASSERT_TRUE(cv.wait_for(lock, 30s, [&] { return events.size() >= 1; }));
  }
  EXPECT_EQ(events.front(), "refused partial.cu");
  // ...and the v2 cubin is promoted.
  fs::copy_file(std::string(CUBRIDGE_TEST_HOT_DIR) + "/hot_v2.sm_90.cubin", dir.path / "v2.cubin");
  {
    std::unique_lock lock(m);
    ASSERT_TRUE(cv.wait_for(lock, 30s, [&] { return events.size() >= 2; }));
  }
  EXPECT_EQ(events[1], "promoted v2.cubin as 2");
  EXPECT_EQ(hot.stats().current_id, 2u);
}

// The reloader holds a handle of its module: the service's own handle may go first, and a
// dropped file is still promoted into the module its kernels launch.
TEST(HotReloader, KeepsItsModuleAlive) {
  CUBRIDGE_REQUIRE_GPU();
  if (cubridge::device::get(0).capability().major != 9) GTEST_SKIP() << "first image is sm_90";
  temp_dir dir;
  auto ctx = cubridge::context::create(cubridge::device::get(0));
  cubridge::scoped_current current(ctx);
  std::optional<cubridge::hot_module> hot = cubridge::hot_module::load(
      ctx, "versions",
      cubridge::testing::read_bytes(std::string(CUBRIDGE_TEST_HOT_DIR) + "/hot_v1.sm_90.cubin"));
  const auto kernel = hot->get_kernel("write_version");
  std::mutex m;
  std::condition_variable cv;
  std::uint64_t promoted = 0;
  cubridge::hot_reloader::options opts;
  opts.debounce = 50ms;
  opts.on_promoted = [&](const fs::path&, std::uint64_t id) {
    std::lock_guard lock(m);
    promoted = id;
    cv.notify_all();
  };
  cubridge::hot_reloader reloader(*hot, dir.path, opts);
  hot.reset();  // the service's handle, gone before the reloader
  fs::copy_file(std::string(CUBRIDGE_TEST_HOT_DIR) + "/hot_v2.sm_90.cubin", dir.path / "v2.cubin");
  {
    std::unique_lock lock(m);
    ASSERT_TRUE(cv.wait_for(lock, 30s, [&] { return promoted != 0; }));
  }
  EXPECT_EQ(promoted, 2u);
  auto out = cubridge::driver_buffer<unsigned>::allocate(ctx, 256);
  EXPECT_EQ(
      kernel.launch({.block = {256}, .stream = cubridge::stream_ref::legacy_default()}, out.span()),
      2u)
      << "the kernel launches the version the reloader promoted";
  EXPECT_EQ(cubridge::driver::api().cuCtxSynchronize(), CUDA_SUCCESS);
}

}  // namespace
