// detail/file_io.hpp and the core's file readers built on it: images and module files are regular
// files read within a limit, and files are written without following links. The key files'
// readers (bundle) are tested in tests/bundle/test_bundle.cpp.
#include "refused_files.hpp"
#include "temp_dir.hpp"

#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/image.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <fstream>
#include <functional>
#include <string>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using cubridge::testing::expect_io_error;
using cubridge::testing::make_fifo;
using cubridge::testing::temp_dir;
using cubridge::testing::thrown_reading_fifo;
using cubridge::testing::write_text;

std::string read_text(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::exception_ptr thrown_by(const std::function<void()>& f) {
  try {
    f();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

// The most memory this process has held so far, in bytes.
std::uint64_t peak_rss_bytes() {
  ::rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;
}

// A sparse file of `size` zero bytes (no disk used).
fs::path sparse_file(const fs::path& path, std::uint64_t size) {
  { std::ofstream(path, std::ios::binary); }
  EXPECT_EQ(::truncate(path.c_str(), static_cast<off_t>(size)), 0) << path;
  return path;
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(RegularFile, ReadsWholeFilesWithinTheLimit) {
  temp_dir dir;
  write_text(dir.path / "four_k", std::string(4096, 'x'));
  EXPECT_EQ(cubridge::detail::read_regular_file(dir.path / "four_k", 4096, "key file").size(),
            4096u);
  write_text(dir.path / "empty", "");
  EXPECT_TRUE(cubridge::detail::read_regular_file(dir.path / "empty", 4096, "key file").empty());
  cubridge::detail::regular_file file(dir.path / "four_k", 4096, "key file");
  EXPECT_TRUE(S_ISREG(file.status().st_mode));
  std::vector<std::byte> bytes;
  EXPECT_EQ(file.read_some(bytes, 10), 10u);
  file.read_rest(bytes);
  EXPECT_EQ(bytes.size(), 4096u);
  EXPECT_EQ(cubridge::detail::size_text(4096), "4 KiB");
  EXPECT_EQ(cubridge::detail::size_text(std::uint64_t{2} << 30), "2 GiB");
  EXPECT_EQ(cubridge::detail::size_text(4097), "4097 bytes");
}

TEST(RegularFile, RefusesWhatIsNotARegularFileSayingWhatItIs) {
  temp_dir dir;
  const auto fifo = make_fifo(dir.path / "fifo");
  expect_io_error(
      thrown_reading_fifo(
          fifo, [&] { (void)cubridge::detail::read_regular_file(fifo, 4096, "key file"); }),
      {"'" + fifo.string() + "' is a FIFO, not a regular file", "read key file"});
  expect_io_error(
      thrown_by([&] { (void)cubridge::detail::read_regular_file(dir.path, 4096, "image"); }),
      {"is a directory, not a regular file"});
  expect_io_error(
      thrown_by([&] { (void)cubridge::detail::read_regular_file("/dev/zero", 4096, "image"); }),
      {"'/dev/zero' is a character device, not a regular file"});
  expect_io_error(thrown_by([&] {
                    (void)cubridge::detail::read_regular_file(dir.path / "missing", 4096, "image");
                  }),
                  {"cannot open", "missing", "No such file"});
}

TEST(RegularFile, RefusesAnOversizedFileBeforeReadingIt) {
  temp_dir dir;
  write_text(dir.path / "big", std::string(4097, 'x'));
  expect_io_error(thrown_by([&] {
                    (void)cubridge::detail::read_regular_file(dir.path / "big", 4096, "key file");
                  }),
                  {"big' is over 4 KiB (4097 bytes), the most a key file may have"});
  // 64 GiB, sparse: refused from its size alone (reading it would take minutes and the memory).
  const auto huge = sparse_file(dir.path / "huge", std::uint64_t{64} << 30);
  const auto began = std::chrono::steady_clock::now();
  expect_io_error(thrown_by([&] {
                    (void)cubridge::detail::read_regular_file(huge, std::uint64_t{64} << 20,
                                                              "payload");
                  }),
                  {"is over 64 MiB"});
  EXPECT_LT(std::chrono::steady_clock::now() - began, 20s);
}

TEST(AtomicWrite, ReplacesASymlinkAtThePathWithoutWritingThroughIt) {
  temp_dir dir;
  write_text(dir.path / "victim", "precious");
  fs::create_symlink(dir.path / "victim", dir.path / "out");
  const std::string text = "new";
  cubridge::detail::write_file_atomically(dir.path / "out", std::as_bytes(std::span(text)), 0640,
                                          true, "bundle");
  EXPECT_EQ(read_text(dir.path / "victim"), "precious");
  EXPECT_FALSE(fs::is_symlink(dir.path / "out"));
  EXPECT_EQ(read_text(dir.path / "out"), "new");
  struct ::stat st {};
  ASSERT_EQ(::stat((dir.path / "out").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(entries(dir.path), (std::vector<std::string>{"out", "victim"})) << "no temporary left";
}

TEST(AtomicWrite, WithoutReplaceRefusesAnythingAtThePathEvenADanglingSymlink) {
  temp_dir dir;
  const std::string text = "new";
  const auto bytes = std::as_bytes(std::span(text));
  write_text(dir.path / "file", "old");
  fs::create_symlink(dir.path / "nowhere", dir.path / "dangling");
  for (const char* name : {"file", "dangling"}) {
    expect_io_error(thrown_by([&] {
                      cubridge::detail::write_file_atomically(dir.path / name, bytes, 0600, false,
                                                              "key file");
                    }),
                    {"'" + (dir.path / name).string() + "' exists", "write key file"});
  }
  EXPECT_EQ(read_text(dir.path / "file"), "old");
  EXPECT_FALSE(fs::exists(dir.path / "nowhere")) << "written through the dangling link";
  cubridge::detail::write_file_atomically(dir.path / "fresh", bytes, 0600, false, "key file");
  EXPECT_EQ(read_text(dir.path / "fresh"), "new");
  EXPECT_EQ(entries(dir.path), (std::vector<std::string>{"dangling", "file", "fresh"}));
}

TEST(ImageFiles, InspectRefusesAFifoAndReadsNoHugeNonImageWhole) {
  temp_dir dir;
  const auto fifo = make_fifo(dir.path / "k.cubin");
  expect_io_error(thrown_reading_fifo(fifo, [&] { (void)cubridge::inspect_image_file(fifo); }),
                  {"is a FIFO"});

  // Just under the 2 GiB limit, all zeros: refused after its first chunk, not read whole.
  const auto zeros = sparse_file(dir.path / "zeros.bin", (std::uint64_t{2} << 30) - 4096);
  const auto peak_before = peak_rss_bytes();
  try {
    (void)cubridge::inspect_image_file(zeros);
    ADD_FAILURE() << "zeros inspected";
  } catch (const cubridge::image_error& e) {
    EXPECT_NE(std::string(e.what()).find("zeros.bin': not a cubin, fatbin or PTX image (2147479552 "
                                         "bytes; first bytes: 00 00"),
              std::string::npos)
        << e.what();
  }
  // Over the limit: refused from its size.
  const auto over = sparse_file(dir.path / "over.bin", (std::uint64_t{2} << 30) + 1);
  try {
    (void)cubridge::inspect_image_file(over);
    ADD_FAILURE() << "a file over 2 GiB inspected";
  } catch (const cubridge::image_error& e) {
    EXPECT_NE(std::string(e.what()).find("larger than the 2 GiB"), std::string::npos) << e.what();
  }
  EXPECT_LT(peak_rss_bytes(), peak_before + (std::uint64_t{256} << 20))
      << "a 2 GiB file was read into memory";
  // A real image is still read whole.
  EXPECT_EQ(cubridge::inspect_image_file(CUBRIDGE_TEST_CUBIN).targets.at(0).arch_name, "sm_90");
}

// As module::load_file and library::load_file read an image.
TEST(ModuleFiles, ImagesAreReadWholeAndAFifoIsRefused) {
  temp_dir dir;
  const auto fifo = make_fifo(dir.path / "m.cubin");
  auto read_image = [](const fs::path& path) {
    return cubridge::detail::read_regular_file(path, cubridge::detail::max_image_bytes, "image");
  };
  expect_io_error(thrown_reading_fifo(fifo, [&] { (void)read_image(fifo); }), {"is a FIFO"});
  EXPECT_EQ(read_image(CUBRIDGE_TEST_CUBIN).size(), fs::file_size(CUBRIDGE_TEST_CUBIN));
}
