// The on-disk compile cache: hits and misses, what the key covers, corrupt and interrupted
// entries, eviction, and concurrent use by threads and processes. CPU only.
#include <cubridge/compile/compile_cache.hpp>
#include <cubridge/core/image.hpp>

#include <gtest/gtest.h>

#include "scoped_env.hpp"
#include "temp_dir.hpp"

#include <sodium.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using cubridge::testing::temp_dir;
using cubridge::testing::write_text;

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr const char* scale_source = R"(
extern "C" __global__ void scale(float* data, float factor, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] *= factor;
}
)";

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

cubridge::image_info inspect(const std::vector<std::byte>& bytes) {
  return cubridge::inspect_image(std::span<const std::byte>(bytes));
}

/// A kernel whose name says which variant it is, so a wrong hit is visible.
std::string named_kernel(std::string_view name) {
  return "extern \"C\" __global__ void " + std::string(name) +
         "(float* p, int n) { if (n) p[0] = 1; }\n";
}

struct files_in_dir {
  int entries = 0;
  int temps = 0;
  std::uintmax_t entry_bytes = 0;
};

files_in_dir list(const fs::path& dir) {
  files_in_dir out;
  for (const auto& f : fs::directory_iterator(dir)) {
    const auto name = f.path().filename().string();
    if (name.ends_with(".entry")) {
      ++out.entries;
      out.entry_bytes += f.file_size();
    } else if (name.starts_with(".tmp-")) {
      ++out.temps;
    }
  }
  return out;
}

void set_age(const fs::path& path, std::chrono::seconds age) {
  fs::last_write_time(path, fs::file_time_type::clock::now() - age);
}

/// The permission bits of `path` itself (a link is not followed).
unsigned mode_of(const fs::path& path) {
  struct stat info {};
  EXPECT_EQ(::lstat(path.c_str(), &info), 0) << path;
  return info.st_mode & 07777;
}

TEST(CompileCache, MissThenHitReturnsIdenticalBytes) {
  temp_dir dir;
  auto cache = cubridge::compile_cache::open(dir.path);
  const cubridge::cuda_source source{.name = "scale.cu", .text = scale_source};

  const auto first = cache.get_or_compile(source);
  EXPECT_EQ(cache.stats().misses, 1u);
  EXPECT_EQ(cache.stats().hits, 0u);
  const auto key = cache.key_for(source, {});
  EXPECT_EQ(key.size(), 64u);
  EXPECT_TRUE(fs::is_regular_file(cache.entry_path(key)));
  EXPECT_EQ(list(dir.path).entries, 1);
  EXPECT_EQ(list(dir.path).temps, 0);

  const auto second = cache.get_or_compile(source);
  EXPECT_EQ(cache.stats().misses, 1u);
  EXPECT_EQ(cache.stats().hits, 1u);
  EXPECT_EQ(second.cubin, first.cubin);
  EXPECT_EQ(second.log, first.log);

  // What a fresh process finds: the same bytes, from disk.
  auto reopened = cubridge::compile_cache::open(dir.path);
  const auto third = reopened.get_or_compile(source);
  EXPECT_EQ(reopened.stats().hits, 1u);
  EXPECT_EQ(reopened.stats().misses, 0u);
  EXPECT_EQ(third.cubin, first.cubin);

  const auto info = inspect(third.cubin);
  ASSERT_EQ(info.targets.size(), 1u);
  EXPECT_EQ(info.targets[0].arch_name, "sm_90");
  ASSERT_NE(info.find_kernel("scale"), nullptr);
}

TEST(CompileCache, LoweredNamesAndLogAreCached) {
  temp_dir dir;
  auto cache = cubridge::compile_cache::open(dir.path);
  const std::string source =
      "template <typename T> __global__ void fill(T* p, T v) { p[0] = v; }\n"
      "__global__ void unused_var_warning() { int x; }\n";
  const cubridge::compile_options options{.name_expressions = {"fill<int>", "fill<double>"}};
  const auto first = cache.get_or_compile({.name = "fill.cu", .text = source}, options);
  const auto second = cache.get_or_compile({.name = "fill.cu", .text = source}, options);
  EXPECT_EQ(cache.stats().hits, 1u);
  EXPECT_EQ(second.lowered_names, first.lowered_names);
  EXPECT_EQ(second.lowered_names.at("fill<int>"), "_Z4fillIiEvPT_S0_");
  EXPECT_EQ(second.log, first.log);
  EXPECT_FALSE(second.log.empty());  // the unused variable's warning
  const auto info = inspect(second.cubin);
  EXPECT_NE(info.find_kernel(second.lowered_names.at("fill<double>")), nullptr);
}

TEST(CompileCache, EverythingThatChangesTheOutputChangesTheKey) {
  temp_dir dir;
  auto cache = cubridge::compile_cache::open(dir.path / "cache");
  write_text(dir.path / "inc" / "name.cuh", "#define KERNEL_NAME from_disk_v1\n");
  const std::string source =
      "#include \"name.cuh\"\n#include \"mem.cuh\"\n"
      "extern \"C\" __global__ void KERNEL_NAME(int* p) { p[0] = VALUE; }\n";
  const cubridge::compile_options base{
      .include_paths = {dir.path / "inc"},
      .headers = {{"mem.cuh", "#define VALUE 1\n"}, {"other.cuh", ""}},
      .defines = {{"A", "1"}, {"B", "2"}},
      .name_expressions = {},
      .extra_options = {"-std=c++17", "-lineinfo"}};
  const cubridge::cuda_source src{.name = "k.cu", .text = source};
  const std::string base_key = cache.key_for(src, base);
  EXPECT_EQ(cache.key_for(src, base), base_key);
  (void)cache.get_or_compile(src, base);
  (void)cache.get_or_compile(src, base);
  EXPECT_EQ(cache.stats().misses, 1u);
  EXPECT_EQ(cache.stats().hits, 1u);

  // Order that does not matter is normalised: headers and defines are sets.
  auto reordered = base;
  std::swap(reordered.headers[0], reordered.headers[1]);
  reordered.defines = {{"B", "2"}, {"A", "1"}};
  EXPECT_EQ(cache.key_for(src, reordered), base_key);

  std::vector<std::pair<std::string, cubridge::compile_options>> variants;
  auto add = [&](std::string what, auto change) {
    auto options = base;
    change(options);
    variants.emplace_back(std::move(what), std::move(options));
  };
  add("in-memory header content", [](auto& o) { o.headers[0].content = "#define VALUE 2\n"; });
  add("in-memory header added", [](auto& o) { o.headers.push_back({"extra.cuh", ""}); });
  add("define value", [](auto& o) { o.defines["B"] = "3"; });
  add("define added", [](auto& o) { o.defines["C"] = ""; });
  add("option", [](auto& o) { o.extra_options.push_back("--use_fast_math"); });
  add("option order", [](auto& o) { std::swap(o.extra_options[0], o.extra_options[1]); });
  add("target", [](auto& o) { o.architecture = "sm_80"; });
  add("target variant", [](auto& o) { o.architecture = "sm_90a"; });
  add("include path", [&](auto& o) { o.include_paths.push_back(dir.path / "more"); });
  add("name expression", [](auto& o) { o.name_expressions.push_back("KERNEL_NAME"); });
  std::set<std::string> keys{base_key};
  for (const auto& [what, options] : variants) {
    const auto before = cache.stats().misses;
    EXPECT_TRUE(keys.insert(cache.key_for(src, options)).second) << what;
    (void)cache.get_or_compile(src, options);
    EXPECT_EQ(cache.stats().misses, before + 1) << what;
  }
  EXPECT_NE(cache.key_for({.name = "k.cu", .text = source + "\n"}, base), base_key);
  EXPECT_NE(cache.key_for({.name = "other.cu", .text = source}, base), base_key);
  EXPECT_NE(cache.key_for({.name = "k.cu", .text = source}, base),
            cache.key_for({.name = "k.cu", .text = source}, {}));
}

TEST(CompileCache, ChangedHeaderOnDiskIsAMissWithTheNewContent) {
  temp_dir dir;
  auto cache = cubridge::compile_cache::open(dir.path / "cache");
  // Reached through two levels: source -> include path -> nested quoted include.
  write_text(dir.path / "inc" / "outer.cuh", "#include \"nested/inner.cuh\"\n");
  write_text(dir.path / "inc" / "nested" / "inner.cuh", "#define KERNEL_NAME version_one\n");
  const std::string source =
      "#include <outer.cuh>\n"
      "extern \"C\" __global__ void KERNEL_NAME(int* p) { p[0] = 1; }\n";
  const cubridge::cuda_source src{.name = "k.cu", .text = source};
  const cubridge::compile_options options{.include_paths = {dir.path / "inc"}};

  const auto v1 = cache.get_or_compile(src, options);
  EXPECT_NE(inspect(v1.cubin).find_kernel("version_one"), nullptr);
  const auto key1 = cache.key_for(src, options);

  write_text(dir.path / "inc" / "nested" / "inner.cuh", "#define KERNEL_NAME version_two\n");
  EXPECT_NE(cache.key_for(src, options), key1);
  const auto v2 = cache.get_or_compile(src, options);
  EXPECT_EQ(cache.stats().misses, 2u);
  const auto info = inspect(v2.cubin);
  EXPECT_NE(info.find_kernel("version_two"), nullptr);
  EXPECT_EQ(info.find_kernel("version_one"), nullptr);

  // Back to the first content: the first entry is still there.
  write_text(dir.path / "inc" / "nested" / "inner.cuh", "#define KERNEL_NAME version_one\n");
  EXPECT_EQ(cache.key_for(src, options), key1);
  const auto again = cache.get_or_compile(src, options);
  EXPECT_EQ(cache.stats().hits, 1u);
  EXPECT_EQ(again.cubin, v1.cubin);
}

TEST(CompileCache, HeaderAppearingEarlierInTheSearchChangesTheKey) {
  temp_dir dir;
  auto cache = cubridge::compile_cache::open(dir.path / "cache");
  write_text(dir.path / "second" / "name.cuh", "#define KERNEL_NAME from_second\n");
  fs::create_directories(dir.path / "first");
  const std::string source =
      "#include <name.cuh>\n"
      "extern \"C\" __global__ void KERNEL_NAME(int* p) { p[0] = 1; }\n";
  const cubridge::cuda_source src{.name = "k.cu", .text = source};
  const cubridge::compile_options options{
      .include_paths = {dir.path / "first", dir.path / "second"}};
  const auto a = cache.get_or_compile(src, options);
  EXPECT_NE(inspect(a.cubin).find_kernel("from_second"), nullptr);

  // The compiler now finds this one first.
  write_text(dir.path / "first" / "name.cuh", "#define KERNEL_NAME from_first\n");
  const auto b = cache.get_or_compile(src, options);
  EXPECT_EQ(cache.stats().misses, 2u);
  EXPECT_NE(inspect(b.cubin).find_kernel("from_first"), nullptr);
}

TEST(CompileCache, IncludeOptionsInExtraOptionsAreScannedToo) {
  temp_dir dir;
  auto cache = cubridge::compile_cache::open(dir.path / "cache");
  write_text(dir.path / "inc" / "name.cuh", "#define KERNEL_NAME v1\n");
  write_text(dir.path / "pre" / "pre.cuh", "#define PRE 1\n");
  const cubridge::cuda_source src{.name = "k.cu",
                                  .text =
                                      "#include \"name.cuh\"\nextern \"C\" __global__ void "
                                      "KERNEL_NAME(int* p) { p[0] = PRE; }\n"};
  const cubridge::compile_options options{
      .extra_options = {"-I" + (dir.path / "inc").string(),
                        "--pre-include=" + (dir.path / "pre" / "pre.cuh").string()}};
  const auto key1 = cache.key_for(src, options);
  EXPECT_NE(inspect(cache.get_or_compile(src, options).cubin).find_kernel("v1"), nullptr);
  write_text(dir.path / "inc" / "name.cuh", "#define KERNEL_NAME v2\n");
  const auto key2 = cache.key_for(src, options);
  EXPECT_NE(key2, key1);
  write_text(dir.path / "pre" / "pre.cuh", "#define PRE 2\n");
  EXPECT_NE(cache.key_for(src, options), key2);
  EXPECT_NE(inspect(cache.get_or_compile(src, options).cubin).find_kernel("v2"), nullptr);
}

TEST(CompileCache, RemovedHeaderChangesTheKey) {
  temp_dir dir;
  auto cache = cubridge::compile_cache::open(dir.path / "cache");
  write_text(dir.path / "inc" / "a.cuh", "#define X 1\n");
  const cubridge::cuda_source src{.name = "k.cu", .text = "#include <a.cuh>\n"};
  const cubridge::compile_options options{.include_paths = {dir.path / "inc"}};
  const auto key = cache.key_for(src, options);
  // Replaced by a dangling link: no longer a file the compile could read.
  fs::remove(dir.path / "inc" / "a.cuh");
  fs::create_symlink(dir.path / "nowhere", dir.path / "inc" / "a.cuh");
  EXPECT_NE(cache.key_for(src, options), key);
}

void corrupt_and_expect_rebuild(const std::function<void(const fs::path&)>& damage) {
  temp_dir dir;
  auto cache = cubridge::compile_cache::open(dir.path);
  const cubridge::cuda_source src{.name = "scale.cu", .text = scale_source};
  const auto good = cache.get_or_compile(src);
  const fs::path entry = cache.entry_path(cache.key_for(src, {}));
  const std::string original = read_text(entry);
  damage(entry);
  ASSERT_NE(read_text(entry), original);

  const auto rebuilt = cache.get_or_compile(src);
  EXPECT_EQ(cache.stats().corrupt_dropped, 1u);
  EXPECT_EQ(cache.stats().misses, 2u);
  EXPECT_EQ(cache.stats().hits, 0u);
  EXPECT_EQ(rebuilt.cubin, good.cubin);
  EXPECT_EQ(read_text(entry), original);  // written anew
  const auto served = cache.get_or_compile(src);
  EXPECT_EQ(cache.stats().hits, 1u);
  EXPECT_EQ(served.cubin, good.cubin);
}

TEST(CompileCache, IncludedFileOverTheLimitIsRefusedNamingIt) {
  // The scan reads included files through detail::read_regular_file: one over 256 MiB (sparse
  // here, so it costs no disk) is an errc::io error naming it, not read into memory and hashed.
  temp_dir dir;
  auto cache = cubridge::compile_cache::open(dir.path / "cache");
  fs::create_directories(dir.path / "inc");
  const fs::path huge = dir.path / "inc" / "huge.cuh";
  { std::ofstream(huge).put('\n'); }
  fs::resize_file(huge, (std::uintmax_t{256} << 20) + 1);
  const cubridge::cuda_source src{.name = "k.cu", .text = "#include \"huge.cuh\"\n"};
  const cubridge::compile_options options{.include_paths = {dir.path / "inc"}};
  try {
    (void)cache.key_for(src, options);
    ADD_FAILURE() << "an included file over the limit was read";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::io)) << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find("read included file"), std::string::npos) << what;
    EXPECT_NE(what.find(huge.string()), std::string::npos) << what;
    EXPECT_NE(what.find("256 MiB"), std::string::npos) << what;
  }
}

TEST(CompileCache, FlippedPayloadByteIsDroppedAndRebuilt) {
  corrupt_and_expect_rebuild([](const fs::path& entry) {
    std::string bytes = read_text(entry);
    bytes[bytes.size() / 2] ^= 0x01;  // inside the cubin
    write_text(entry, bytes);
  });
}

TEST(CompileCache, FlippedHeaderByteIsDroppedAndRebuilt) {
  corrupt_and_expect_rebuild([](const fs::path& entry) {
    std::string bytes = read_text(entry);
    bytes[0] ^= 0x20;  // the magic
    write_text(entry, bytes);
  });
}

TEST(CompileCache, FlippedStoredHashIsDroppedAndRebuilt) {
  corrupt_and_expect_rebuild([](const fs::path& entry) {
    std::string bytes = read_text(entry);
    bytes[bytes.size() > 90 ? 80 : 0] ^= 0x01;  // the payload hash (bytes 56..87)
    write_text(entry, bytes);
  });
}

TEST(CompileCache, TruncatedEntryIsDroppedAndRebuilt) {
  corrupt_and_expect_rebuild(
      [](const fs::path& entry) { fs::resize_file(entry, fs::file_size(entry) - 1); });
  corrupt_and_expect_rebuild([](const fs::path& entry) { fs::resize_file(entry, 10); });
  corrupt_and_expect_rebuild([](const fs::path& entry) { fs::resize_file(entry, 0); });
}

TEST(CompileCache, AppendedBytesAreDroppedAndRebuilt) {
  corrupt_and_expect_rebuild(
      [](const fs::path& entry) { std::ofstream(entry, std::ios::binary | std::ios::app) << "x"; });
}

TEST(CompileCache, EntryOfAnotherKeyUnderThisNameIsDropped) {
  temp_dir dir;
  auto cache = cubridge::compile_cache::open(dir.path);
  const cubridge::cuda_source a{.name = "a.cu", .text = named_kernel("kernel_a")};
  const cubridge::cuda_source b{.name = "b.cu", .text = named_kernel("kernel_b")};
  (void)cache.get_or_compile(a);
  (void)cache.get_or_compile(b);
  // A valid entry, but for b: copied over a's name it must not be served as a's.
  fs::copy_file(cache.entry_path(cache.key_for(b, {})), cache.entry_path(cache.key_for(a, {})),
                fs::copy_options::overwrite_existing);
  const auto got = cache.get_or_compile(a);
  EXPECT_EQ(cache.stats().corrupt_dropped, 1u);
  EXPECT_NE(inspect(got.cubin).find_kernel("kernel_a"), nullptr);
  EXPECT_EQ(inspect(got.cubin).find_kernel("kernel_b"), nullptr);
}

TEST(CompileCache, InterruptedWritesAreNeverServed) {
  temp_dir dir;
  const cubridge::cuda_source src{.name = "scale.cu", .text = scale_source};
  std::vector<std::byte> good_cubin;
  std::string good_entry;
  std::string key;
  {
    // The reference entry, made with this directory's secret, then removed again.
    auto cache = cubridge::compile_cache::open(dir.path);
    good_cubin = cache.get_or_compile(src).cubin;
    key = cache.key_for(src, {});
    good_entry = read_text(cache.entry_path(key));
    fs::remove(cache.entry_path(key));
  }
  // A writer that died before its rename: a partial temp file (fresh, so not yet cleaned).
  const fs::path temp = dir.path / (".tmp-cubridge-" + key + "-99999-0-deadbeefdeadbeef");
  write_text(temp, good_entry.substr(0, good_entry.size() / 2));
  {
    auto cache = cubridge::compile_cache::open(dir.path);
    EXPECT_TRUE(fs::exists(temp));  // young: may belong to a live writer
    const auto got = cache.get_or_compile(src);
    EXPECT_EQ(cache.stats().misses, 1u);
    EXPECT_EQ(cache.stats().hits, 0u);
    EXPECT_EQ(got.cubin, good_cubin);
  }
  // A partial entry under the final name (as a non-atomic writer would leave it).
  fs::remove(dir.path / (key + ".entry"));
  write_text(dir.path / (key + ".entry"), good_entry.substr(0, good_entry.size() - 100));
  {
    auto cache = cubridge::compile_cache::open(dir.path);
    const auto got = cache.get_or_compile(src);
    EXPECT_EQ(cache.stats().corrupt_dropped, 1u);
    EXPECT_EQ(cache.stats().misses, 1u);
    EXPECT_EQ(got.cubin, good_cubin);
    EXPECT_EQ(read_text(dir.path / (key + ".entry")), good_entry);
  }
  // A temp file left by a writer that crashed long ago is removed on open.
  set_age(temp, 2h);
  const fs::path young = dir.path / (".tmp-cubridge-" + key + "-99999-1-feedfeedfeedfeed");
  write_text(young, "partial");
  (void)cubridge::compile_cache::open(dir.path);
  EXPECT_FALSE(fs::exists(temp));
  EXPECT_TRUE(fs::exists(young));
}

TEST(CompileCache, EvictionKeepsUnderTheLimitLeastRecentlyUsedFirst) {
  temp_dir dir;
  const cubridge::cuda_source a{.name = "a.cu", .text = named_kernel("kernel_a")};
  const cubridge::cuda_source b{.name = "b.cu", .text = named_kernel("kernel_b")};
  const cubridge::cuda_source c{.name = "c.cu", .text = named_kernel("kernel_c")};
  const cubridge::cuda_source d{.name = "d.cu", .text = named_kernel("kernel_d")};
  auto big = cubridge::compile_cache::open(dir.path);
  (void)big.get_or_compile(a);
  (void)big.get_or_compile(b);
  (void)big.get_or_compile(c);
  const fs::path path_a = big.entry_path(big.key_for(a, {}));
  const fs::path path_b = big.entry_path(big.key_for(b, {}));
  const fs::path path_c = big.entry_path(big.key_for(c, {}));
  const fs::path path_d = big.entry_path(big.key_for(d, {}));
  // Stored in the order a, b, c; then a is used again, so b is the least recently used.
  set_age(path_a, 300s);
  set_age(path_b, 200s);
  set_age(path_c, 100s);
  (void)big.get_or_compile(a);
  EXPECT_EQ(big.stats().hits, 1u);
  EXPECT_GT(fs::last_write_time(path_a), fs::last_write_time(path_c));

  const auto size_a = fs::file_size(path_a);
  const auto size_b = fs::file_size(path_b);
  const auto size_c = fs::file_size(path_c);
  // Room for two entries and a half.
  const std::uint64_t limit = size_a + size_c + size_b / 2;
  auto small = cubridge::compile_cache::open(dir.path, limit);  // trims on open
  EXPECT_EQ(small.stats().evicted, 1u);
  EXPECT_TRUE(fs::exists(path_a));
  EXPECT_FALSE(fs::exists(path_b));
  EXPECT_TRUE(fs::exists(path_c));
  EXPECT_LE(list(dir.path).entry_bytes, limit);

  // A store over the limit evicts the least recently used: c (a was used after c).
  (void)small.get_or_compile(d);
  EXPECT_EQ(small.stats().evicted, 2u);
  EXPECT_TRUE(fs::exists(path_a));
  EXPECT_FALSE(fs::exists(path_c));
  EXPECT_TRUE(fs::exists(path_d));
  EXPECT_LE(list(dir.path).entry_bytes, limit);

  // Evicted entries are compiled again.
  const auto again = small.get_or_compile(b);
  EXPECT_NE(inspect(again.cubin).find_kernel("kernel_b"), nullptr);
  EXPECT_LE(list(dir.path).entry_bytes, limit);
  EXPECT_EQ(list(dir.path).temps, 0);
}

TEST(CompileCache, EntryLargerThanTheLimitIsServedButNotKept) {
  temp_dir dir;
  auto cache = cubridge::compile_cache::open(dir.path, 100);
  const auto got = cache.get_or_compile({.name = "scale.cu", .text = scale_source});
  EXPECT_NE(inspect(got.cubin).find_kernel("scale"), nullptr);
  EXPECT_EQ(cache.stats().evicted, 1u);
  EXPECT_EQ(list(dir.path).entries, 0);
}

TEST(CompileCache, ThreadsAskingForOneKeyCompileOnce) {
  temp_dir dir;
  auto cache = cubridge::compile_cache::open(dir.path);
  const cubridge::cuda_source src{.name = "scale.cu", .text = scale_source};
  const auto expected = cubridge::nvrtc_compile(src).cubin;
  constexpr std::size_t thread_count = 4;
  std::vector<std::vector<std::byte>> results(thread_count);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < thread_count; ++i)
    threads.emplace_back([&, i] { results[i] = cache.get_or_compile(src).cubin; });
  for (auto& t : threads) t.join();
  for (const auto& r : results) EXPECT_EQ(r, expected);
  EXPECT_EQ(cache.stats().misses, 1u);
  EXPECT_EQ(cache.stats().hits, thread_count - 1u);
  EXPECT_EQ(list(dir.path).entries, 1);
  EXPECT_EQ(list(dir.path).temps, 0);
}

TEST(CompileCache, TwoCachesOnOneDirectoryRacingForOneKey) {
  temp_dir dir;
  const cubridge::cuda_source src{.name = "scale.cu", .text = scale_source};
  const auto expected = cubridge::nvrtc_compile(src).cubin;
  for (int round = 0; round < 3; ++round) {
    fs::remove_all(dir.path);
    auto first = cubridge::compile_cache::open(dir.path);
    auto second = cubridge::compile_cache::open(dir.path);
    std::vector<std::byte> r1;
    std::vector<std::byte> r2;
    std::thread t1([&] { r1 = first.get_or_compile(src).cubin; });
    std::thread t2([&] { r2 = second.get_or_compile(src).cubin; });
    t1.join();
    t2.join();
    EXPECT_EQ(r1, expected);
    EXPECT_EQ(r2, expected);
    EXPECT_EQ(list(dir.path).entries, 1);
    EXPECT_EQ(list(dir.path).temps, 0);
    auto third = cubridge::compile_cache::open(dir.path);
    EXPECT_EQ(third.get_or_compile(src).cubin, expected);
    EXPECT_EQ(third.stats().hits, 1u);
  }
}

// Run by TwoProcessesRacingForOneKey in child processes; skipped when run on its own.
TEST(CompileCache, ChildProcessCompilesIntoSharedDirectory) {
  const char* dir = std::getenv("CUBRIDGE_TEST_CACHE_CHILD_DIR");
  if (!dir) GTEST_SKIP() << "only runs as a child of TwoProcessesRacingForOneKey";
  auto cache = cubridge::compile_cache::open(dir);
  const auto got = cache.get_or_compile({.name = "scale.cu", .text = scale_source});
  const auto info = inspect(got.cubin);
  ASSERT_EQ(info.targets.size(), 1u);
  EXPECT_EQ(info.targets[0].arch_name, "sm_90");
  EXPECT_NE(info.find_kernel("scale"), nullptr);
  EXPECT_EQ(cache.stats().hits + cache.stats().misses, 1u);
  EXPECT_EQ(cache.stats().corrupt_dropped, 0u);
}

/// Starts this test binary again running only `test`, with `env` ("NAME=value") added.
pid_t spawn_self(const std::string& test, const std::string& env) {
  std::vector<char*> child_env;
  for (char** e = environ; *e; ++e) child_env.push_back(*e);
  child_env.push_back(const_cast<char*>(env.c_str()));
  child_env.push_back(nullptr);
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=CompileCache." + test;
  char* argv[] = {self.data(), filter.data(), nullptr};
  pid_t pid = -1;
  if (::posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, child_env.data()) != 0) return -1;
  return pid;
}

/// Waits for `pid` at most `limit`; kills it past that. The exit status, or nullopt if killed.
std::optional<int> wait_at_most(pid_t pid, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) return status;
    if (done < 0 || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(20ms);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return std::nullopt;
}

TEST(CompileCache, TwoProcessesRacingForOneKey) {
  temp_dir dir;
  const std::string env = "CUBRIDGE_TEST_CACHE_CHILD_DIR=" + dir.path.string();
  constexpr int child_count = 2;
  pid_t children[child_count];
  for (auto& pid : children) {
    pid = spawn_self("ChildProcessCompilesIntoSharedDirectory", env);
    ASSERT_GT(pid, 0);
  }
  for (pid_t pid : children) {
    const auto status = wait_at_most(pid, 300s);
    ASSERT_TRUE(status.has_value()) << "child still running after 300 s";
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "child status " << *status;
  }
  EXPECT_EQ(list(dir.path).entries, 1);
  EXPECT_EQ(list(dir.path).temps, 0);
  auto cache = cubridge::compile_cache::open(dir.path);
  const cubridge::cuda_source src{.name = "scale.cu", .text = scale_source};
  EXPECT_EQ(cache.get_or_compile(src).cubin, cubridge::nvrtc_compile(src).cubin);
  EXPECT_EQ(cache.stats().hits, 1u);
}

TEST(CompileCache, CompileErrorsAreThrownAndNotCached) {
  temp_dir dir;
  auto cache = cubridge::compile_cache::open(dir.path);
  const cubridge::cuda_source broken{.name = "broken.cu", .text = "this is not CUDA;\n"};
  EXPECT_THROW((void)cache.get_or_compile(broken), cubridge::compile_error);
  EXPECT_THROW((void)cache.get_or_compile(broken), cubridge::compile_error);
  EXPECT_EQ(cache.stats().misses, 0u);
  EXPECT_EQ(cache.stats().hits, 0u);
  EXPECT_EQ(list(dir.path).entries, 0);
  EXPECT_EQ(list(dir.path).temps, 0);
}

TEST(CompileCache, PtxLinksAreCachedPerArchitecture) {
  temp_dir dir;
  auto cache = cubridge::compile_cache::open(dir.path);
  const auto ptx = cubridge::nvrtc_compile_ptx({.name = "scale.cu", .text = scale_source},
                                               {.architecture = "compute_80"});
  const auto first = cache.get_or_link(ptx.ptx, {.architecture = "sm_90", .name = "scale.ptx"});
  const auto second = cache.get_or_link(ptx.ptx, {.architecture = "sm_90", .name = "scale.ptx"});
  EXPECT_EQ(cache.stats().misses, 1u);
  EXPECT_EQ(cache.stats().hits, 1u);
  EXPECT_EQ(second.cubin, first.cubin);
  EXPECT_EQ(inspect(second.cubin).targets.at(0).arch_name, "sm_90");

  const auto other = cache.get_or_link(ptx.ptx, {.architecture = "sm_80", .name = "scale.ptx"});
  EXPECT_EQ(cache.stats().misses, 2u);
  EXPECT_EQ(inspect(other.cubin).targets.at(0).arch_name, "sm_80");
  const auto optimised = cache.get_or_link(
      ptx.ptx, {.architecture = "sm_90", .name = "scale.ptx", .extra_options = {"-O0"}});
  EXPECT_EQ(cache.stats().misses, 3u);
  EXPECT_NE(inspect(optimised.cubin).find_kernel("scale"), nullptr);
  EXPECT_NE(cache.key_for(ptx.ptx, {}), cache.key_for(ptx.ptx + "\n", {}));
}

TEST(CompileCache, StoreFailureStillReturnsTheResult) {
  temp_dir dir;
  auto cache = cubridge::compile_cache::open(dir.path / "cache");
  // The directory is replaced by a file: nothing can be written there.
  fs::remove_all(dir.path / "cache");
  write_text(dir.path / "cache", "not a directory");
  const auto got = cache.get_or_compile({.name = "scale.cu", .text = scale_source});
  EXPECT_NE(inspect(got.cubin).find_kernel("scale"), nullptr);
  EXPECT_EQ(cache.stats().store_failures, 1u);
  EXPECT_EQ(cache.stats().misses, 1u);
}

TEST(CompileCache, OpenChecksItsArguments) {
  temp_dir dir;
  write_text(dir.path / "file", "x");
  try {
    (void)cubridge::compile_cache::open(dir.path / "file");
    FAIL() << "expected an io error";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::io)) << e.what();
    EXPECT_NE(std::string(e.what()).find("file"), std::string::npos);
  }
  try {
    (void)cubridge::compile_cache::open(dir.path / "cache", 0);
    FAIL() << "expected a precondition error";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();
  }
  auto nested = cubridge::compile_cache::open(dir.path / "a" / "b" / "c", 12345);
  EXPECT_TRUE(fs::is_directory(dir.path / "a" / "b" / "c"));
  // Directories the cache creates are its user's alone.
  for (const auto& made : {dir.path / "a", dir.path / "a" / "b", dir.path / "a" / "b" / "c"})
    EXPECT_EQ(mode_of(made), 0700u) << made;
  EXPECT_EQ(nested.directory(), dir.path / "a" / "b" / "c");
  EXPECT_EQ(nested.max_bytes(), 12345u);
  auto moved = std::move(nested);
  EXPECT_EQ(moved.max_bytes(), 12345u);
}

using cubridge::testing::scoped_env;

TEST(CompileCache, DefaultDirectoryFollowsTheEnvironment) {
  {
    scoped_env cubridge_dir("CUBRIDGE_CACHE_DIR", "/tmp/explicit");
    scoped_env xdg("XDG_CACHE_HOME", "/tmp/xdg");
    scoped_env home("HOME", "/tmp/home");
    EXPECT_EQ(cubridge::compile_cache::default_directory(), fs::path("/tmp/explicit"));
  }
  {
    scoped_env cubridge_dir("CUBRIDGE_CACHE_DIR", "");
    scoped_env xdg("XDG_CACHE_HOME", "/tmp/xdg");
    scoped_env home("HOME", "/tmp/home");
    EXPECT_EQ(cubridge::compile_cache::default_directory(), fs::path("/tmp/xdg/cubridge"));
  }
  {
    scoped_env cubridge_dir("CUBRIDGE_CACHE_DIR", nullptr);
    scoped_env xdg("XDG_CACHE_HOME", "relative/ignored");
    scoped_env home("HOME", "/tmp/home");
    EXPECT_EQ(cubridge::compile_cache::default_directory(), fs::path("/tmp/home/.cache/cubridge"));
  }
  {
    scoped_env cubridge_dir("CUBRIDGE_CACHE_DIR", nullptr);
    scoped_env xdg("XDG_CACHE_HOME", nullptr);
    scoped_env home("HOME", nullptr);
    try {
      (void)cubridge::compile_cache::default_directory();
      FAIL() << "expected an io error";
    } catch (const cubridge::error& e) {
      EXPECT_TRUE(e.is(cubridge::errc::io)) << e.what();
    }
  }
  temp_dir dir;
  scoped_env cubridge_dir("CUBRIDGE_CACHE_DIR", (dir.path / "env").c_str());
  auto cache = cubridge::compile_cache::open_default();
  EXPECT_EQ(cache.directory(), dir.path / "env");
  EXPECT_EQ(cache.max_bytes(), cubridge::compile_cache::default_max_bytes);
}

// ---- the trust model (docs/compile-cache.md) ------------------------------------------------

constexpr std::size_t entry_header_bytes = 88;  // magic, version, reserved, length, key, tag

std::array<unsigned char, 32> from_hex(std::string_view hex) {
  std::array<unsigned char, 32> out{};
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<unsigned char>(std::stoi(std::string(hex.substr(2 * i, 2)), nullptr, 16));
  return out;
}

/// An entry in the cache's layout whose integrity field is the UNKEYED BLAKE2b-256 of the
/// payload: what anyone able to write into the directory can compute.
std::string forged_entry(std::uint32_t version, std::string_view key_hex,
                         std::string_view payload) {
  EXPECT_GE(sodium_init(), 0);
  std::string entry = "CUBRCCHE";
  auto put_le = [&entry](std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) entry += static_cast<char>((v >> (8 * i)) & 0xff);
  };
  put_le(version, 4);
  put_le(0, 4);
  put_le(payload.size(), 8);
  const auto key = from_hex(key_hex);
  entry.append(reinterpret_cast<const char*>(key.data()), key.size());
  std::array<unsigned char, 32> hash{};
  crypto_generichash(hash.data(), hash.size(),
                     reinterpret_cast<const unsigned char*>(payload.data()), payload.size(),
                     nullptr, 0);
  entry.append(reinterpret_cast<const char*>(hash.data()), hash.size());
  entry.append(payload);
  return entry;
}

TEST(CompileCache, PlantedEntryWithAnUnkeyedHashIsNotLoaded) {
  temp_dir dir;
  const cubridge::cuda_source a{.name = "a.cu", .text = named_kernel("kernel_a")};
  const cubridge::cuda_source b{.name = "b.cu", .text = named_kernel("kernel_b")};
  std::string key_a;
  std::string payload_b;  // b's code, lowered names and log, in the entry's payload layout
  {
    auto cache = cubridge::compile_cache::open(dir.path);
    (void)cache.get_or_compile(b);
    key_a = cache.key_for(a, {});
    payload_b = read_text(cache.entry_path(cache.key_for(b, {}))).substr(entry_header_bytes);
  }
  // The old format, the current one and a later one: none is trusted on an unkeyed hash.
  for (std::uint32_t version : {1u, 2u, 3u}) {
    write_text(dir.path / (key_a + ".entry"), forged_entry(version, key_a, payload_b));
    auto cache = cubridge::compile_cache::open(dir.path);
    const auto got = cache.get_or_compile(a);
    EXPECT_NE(inspect(got.cubin).find_kernel("kernel_a"), nullptr) << "format " << version;
    EXPECT_EQ(inspect(got.cubin).find_kernel("kernel_b"), nullptr) << "format " << version;
    EXPECT_EQ(cache.stats().hits, 0u) << "format " << version;
    EXPECT_EQ(cache.stats().misses, 1u) << "format " << version;
    EXPECT_EQ(cache.stats().corrupt_dropped, 1u) << "format " << version;
  }
}

TEST(CompileCache, SymlinkedEntryIsNotFollowed) {
  temp_dir dir;
  const cubridge::cuda_source src{.name = "scale.cu", .text = scale_source};
  auto cache = cubridge::compile_cache::open(dir.path / "cache");
  const auto good = cache.get_or_compile(src).cubin;
  const fs::path entry = cache.entry_path(cache.key_for(src, {}));
  // A valid entry, even, but outside the directory: the link is not followed.
  const fs::path outside = dir.path / "outside.entry";
  fs::rename(entry, outside);
  set_age(outside, 2h);
  const auto outside_time = fs::last_write_time(outside);
  fs::create_symlink(outside, entry);

  auto fresh = cubridge::compile_cache::open(dir.path / "cache");
  const auto got = fresh.get_or_compile(src);
  EXPECT_EQ(fresh.stats().hits, 0u);
  EXPECT_EQ(fresh.stats().misses, 1u);
  EXPECT_EQ(fresh.stats().refused, 1u);
  EXPECT_EQ(fresh.stats().corrupt_dropped, 0u);
  EXPECT_EQ(got.cubin, good);
  EXPECT_EQ(fs::last_write_time(outside), outside_time);  // not touched through the link
  EXPECT_FALSE(fs::is_symlink(entry));                    // replaced by a real entry
  EXPECT_TRUE(fs::exists(outside));
}

// Run by FifoEntryDoesNotBlock in a child process; skipped when run on its own.
TEST(CompileCache, ChildReadsPastAFifoEntry) {
  const char* dir = std::getenv("CUBRIDGE_TEST_CACHE_FIFO_DIR");
  if (!dir) GTEST_SKIP() << "only runs as a child of FifoEntryDoesNotBlock";
  auto cache = cubridge::compile_cache::open(dir);
  const auto got = cache.get_or_compile({.name = "scale.cu", .text = scale_source});
  EXPECT_NE(inspect(got.cubin).find_kernel("scale"), nullptr);
  EXPECT_EQ(cache.stats().hits, 0u);
  EXPECT_EQ(cache.stats().misses, 1u);
  EXPECT_EQ(cache.stats().refused, 1u);
}

TEST(CompileCache, FifoEntryDoesNotBlock) {
  temp_dir dir;
  const cubridge::cuda_source src{.name = "scale.cu", .text = scale_source};
  fs::path entry;
  {
    auto cache = cubridge::compile_cache::open(dir.path);
    entry = cache.entry_path(cache.key_for(src, {}));
  }
  ASSERT_EQ(::mkfifo(entry.c_str(), 0600), 0);
  // In a child, so a read that blocks on the FIFO cannot hang this test: it is killed.
  const pid_t child =
      spawn_self("ChildReadsPastAFifoEntry", "CUBRIDGE_TEST_CACHE_FIFO_DIR=" + dir.path.string());
  ASSERT_GT(child, 0);
  const auto status = wait_at_most(child, 120s);
  ASSERT_TRUE(status.has_value()) << "get_or_compile blocked on a FIFO named as an entry";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "child status " << *status;
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(entry)));
}

/// open() must refuse `directory` with an io error naming `named` and containing `found`.
void expect_refused(const fs::path& directory, const fs::path& named, const std::string& found) {
  try {
    (void)cubridge::compile_cache::open(directory);
    ADD_FAILURE() << "opened " << directory;
  } catch (const cubridge::error& e) {
    const std::string what = e.what();
    EXPECT_TRUE(e.is(cubridge::errc::io)) << what;
    EXPECT_NE(what.find("'" + named.string() + "'"), std::string::npos) << what;
    EXPECT_NE(what.find(found), std::string::npos) << what;
    EXPECT_NE(what.find("required"), std::string::npos) << what;
  }
}

TEST(CompileCache, DirectoryWritableByOthersIsRefused) {
  temp_dir dir;
  const fs::path cache_dir = dir.path / "cache";
  fs::create_directory(cache_dir);
  ::chmod(cache_dir.c_str(), 0777);
  expect_refused(cache_dir, cache_dir, "mode 0777");
  ::chmod(cache_dir.c_str(), 0770);
  expect_refused(cache_dir, cache_dir, "mode 0770");
  ::chmod(cache_dir.c_str(), 0755);  // readable by others is allowed: the key is 0600
  EXPECT_NO_THROW((void)cubridge::compile_cache::open(cache_dir));

  // A directory above it that others may write to could swap the cache for another.
  const fs::path shared = dir.path / "shared";
  fs::create_directories(shared / "cache");
  ::chmod((shared / "cache").c_str(), 0700);
  ::chmod(shared.c_str(), 0777);
  expect_refused(shared / "cache", shared, "mode 0777");
  // Unless it is sticky, as /tmp is: others cannot rename or remove what is not theirs.
  ::chmod(shared.c_str(), 01777);
  EXPECT_NO_THROW((void)cubridge::compile_cache::open(shared / "cache"));
}

TEST(CompileCache, DirectoryOwnedByAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to another user";
  temp_dir dir;
  constexpr uid_t other = 54321;
  const fs::path theirs = dir.path / "theirs";
  fs::create_directory(theirs);
  ::chmod(theirs.c_str(), 0700);
  ASSERT_EQ(::chown(theirs.c_str(), other, other), 0);
  expect_refused(theirs, theirs, "uid 54321");

  // Above the cache: a directory of another (non-root) user.
  const fs::path above = dir.path / "above";
  fs::create_directories(above / "cache");
  ::chmod((above / "cache").c_str(), 0700);
  ::chmod(above.c_str(), 0755);
  ASSERT_EQ(::chown(above.c_str(), other, other), 0);
  expect_refused(above / "cache", above, "uid 54321");
}

TEST(CompileCache, EntriesWritableByOthersOrNotOursAreRecompiled) {
  temp_dir dir;
  const cubridge::cuda_source src{.name = "scale.cu", .text = scale_source};
  std::vector<std::byte> good;
  fs::path entry;
  {
    auto cache = cubridge::compile_cache::open(dir.path);
    good = cache.get_or_compile(src).cubin;
    entry = cache.entry_path(cache.key_for(src, {}));
  }
  EXPECT_EQ(mode_of(entry), 0600u);
  ::chmod(entry.c_str(), 0666);
  {
    auto cache = cubridge::compile_cache::open(dir.path);
    EXPECT_EQ(cache.get_or_compile(src).cubin, good);
    EXPECT_EQ(cache.stats().hits, 0u);
    EXPECT_EQ(cache.stats().misses, 1u);
    EXPECT_EQ(cache.stats().refused, 1u);
    EXPECT_EQ(mode_of(entry), 0600u);  // written anew
  }
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(entry.c_str(), 54321, 54321), 0);
    auto cache = cubridge::compile_cache::open(dir.path);
    EXPECT_EQ(cache.get_or_compile(src).cubin, good);
    EXPECT_EQ(cache.stats().hits, 0u);
    EXPECT_EQ(cache.stats().misses, 1u);
    EXPECT_EQ(cache.stats().refused, 1u);
  }
}

TEST(CompileCache, CleanupTouchesOnlyTheCachesOwnFiles) {
  temp_dir dir;
  const std::string hex64(64, 'a');
  const fs::path foreign_temp = dir.path / ".tmp-foo";
  const fs::path old_style_temp = dir.path / (".tmp-" + hex64 + "-99999-0-deadbeefdeadbeef");
  const fs::path notes = dir.path / "notes.txt";
  const fs::path backup = dir.path / (hex64 + ".entry.bak");
  const fs::path own_stale = dir.path / (".tmp-cubridge-" + hex64 + "-99999-0-0123456789abcdef");
  const fs::path own_name_dir = dir.path / (".tmp-cubridge-" + hex64 + "-99999-1-0123456789abcdef");
  const fs::path outside = dir.path / "outside" / "precious";
  const fs::path own_name_link =
      dir.path / (".tmp-cubridge-" + hex64 + "-99999-2-0123456789abcdef");
  const fs::path entry_link = dir.path / (std::string(64, 'b') + ".entry");
  for (const auto& file : {foreign_temp, old_style_temp, notes, backup, own_stale, outside})
    write_text(file, std::string(4096, 'x'));
  fs::create_directory(own_name_dir);
  fs::create_symlink(outside, own_name_link);
  fs::create_symlink(outside, entry_link);
  for (const auto& file :
       {foreign_temp, old_style_temp, notes, backup, own_stale, outside, own_name_dir})
    set_age(file, 2h);

  // Opening cleans up stale temporary files, and a limit of 1 byte evicts every entry.
  auto cache = cubridge::compile_cache::open(dir.path, 1);
  EXPECT_FALSE(fs::exists(own_stale));  // the cache's own, an hour old: a crashed writer's
  for (const auto& kept : {foreign_temp, old_style_temp, notes, backup, own_name_dir, outside})
    EXPECT_TRUE(fs::exists(kept)) << kept;
  EXPECT_TRUE(fs::is_symlink(own_name_link));
  EXPECT_TRUE(fs::is_symlink(entry_link));
  (void)cache.get_or_compile({.name = "scale.cu", .text = scale_source});
  EXPECT_EQ(cache.stats().evicted, 1u);  // its own entry only
  for (const auto& kept : {foreign_temp, old_style_temp, notes, backup, own_name_dir, outside})
    EXPECT_TRUE(fs::exists(kept)) << kept;
  EXPECT_TRUE(fs::is_symlink(entry_link));
}

TEST(CompileCache, KeyFileIsPrivateAndAnotherKeyRecompiles) {
  temp_dir dir;
  const cubridge::cuda_source src{.name = "scale.cu", .text = scale_source};
  const fs::path key_file = dir.path / "cubridge-mac.key";
  std::vector<std::byte> good;
  {
    auto cache = cubridge::compile_cache::open(dir.path);
    EXPECT_EQ(cache.key_path(), key_file);
    good = cache.get_or_compile(src).cubin;
  }
  ASSERT_TRUE(fs::is_regular_file(fs::symlink_status(key_file)));
  EXPECT_EQ(mode_of(key_file), 0600u);
  EXPECT_EQ(fs::file_size(key_file), 32u);
  const std::string first_key = read_text(key_file);
  {
    auto cache = cubridge::compile_cache::open(dir.path);  // the same key: a hit
    EXPECT_EQ(cache.get_or_compile(src).cubin, good);
    EXPECT_EQ(cache.stats().hits, 1u);
  }
  // Another key (as another user's cache, or a fresh one, would have) does not trust the
  // entries made with the first: each is dropped and compiled again.
  fs::remove(key_file);
  {
    auto cache = cubridge::compile_cache::open(dir.path);
    EXPECT_NE(read_text(key_file), first_key);
    EXPECT_EQ(cache.get_or_compile(src).cubin, good);
    EXPECT_EQ(cache.stats().hits, 0u);
    EXPECT_EQ(cache.stats().misses, 1u);
    EXPECT_EQ(cache.stats().corrupt_dropped, 1u);
  }
  // A key others may read, or a link, is refused rather than used.
  ::chmod(key_file.c_str(), 0644);
  expect_refused(dir.path, key_file, "mode 0644");
  ::chmod(key_file.c_str(), 0600);
  fs::rename(key_file, dir.path / "elsewhere.key");
  fs::create_symlink(dir.path / "elsewhere.key", key_file);
  expect_refused(dir.path, key_file, "symbolic link");
}

}  // namespace
