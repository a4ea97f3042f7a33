// GPU image inspection without a GPU: the public entry points (inspect_image, can_run_on, ...)
// and what the readers share. The readers themselves are image_cubin.cpp (CUDA ELF),
// image_fatbin.cpp (the container and LZ4 / zstd decompression) and image_ptx.cpp; each file
// starts with the format facts it relies on.

#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/detail/hex.hpp>
#include <cubridge/core/detail/loaded_kernels.hpp>
#include <cubridge/core/image.hpp>
#include "image_internal.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cubridge {
namespace image_internal {

std::string hex(std::uint64_t v) {
  return detail::hex_number(v);
}

std::string first_bytes(byte_span d) {
  std::string s;
  for (std::size_t i = 0; i < d.size() && i < 8; ++i) {
    if (i != 0) s += ' ';
    detail::append_hex(s, std::to_integer<unsigned char>(d[i]));
  }
  if (d.size() > 8) s += " ...";
  return s;
}

void source::fail(const std::string& what) const {
  detail::throw_errc(errc::bad_image, "inspect_image", ctx.empty() ? what : ctx + ": " + what);
}

namespace {

std::string sizes_text(const std::vector<std::size_t>& sizes) {
  std::string s = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (i != 0) s += ", ";
    s += std::to_string(sizes[i]);
  }
  return s + "]";
}

}  // namespace

arch_variant stronger(arch_variant a, arch_variant b) {
  return static_cast<int>(a) >= static_cast<int>(b) ? a : b;
}

std::string arch_name_of(image_kind kind, compute_capability capability) {
  // The one spelling of sm_90a (compute_capability.hpp), with the prefix of the code's kind.
  std::string name = to_string(capability);  // not const: the last return moves it
  if (kind == image_kind::ptx) return "compute_" + name.substr(3);
  if (kind == image_kind::lto_ir) return "lto_" + name.substr(3);
  return name;
}

void kernel_set::add(image_kernel k, const source& s) {
  auto [it, inserted] = index_.try_emplace(k.name, kernels_.size());
  if (inserted) {
    kernels_.push_back(std::move(k));
    return;
  }
  auto& known = kernels_[it->second];
  if (!k.parameter_sizes) return;
  if (!known.parameter_sizes) {
    known.parameter_sizes = std::move(k.parameter_sizes);
  } else if (*known.parameter_sizes != *k.parameter_sizes) {
    s.fail("kernel '" + k.name + "' has parameter sizes " + sizes_text(*k.parameter_sizes) +
           " here but " + sizes_text(*known.parameter_sizes) + " in an earlier entry");
  }
}

}  // namespace image_internal

namespace {

using namespace image_internal;

std::atomic<std::uint64_t> inspect_calls{0};

[[noreturn]] void precondition_failed(compute_capability device) {
  detail::throw_errc(errc::precondition, "can_run_on",
                     "device compute capability " + std::to_string(device.major) + "." +
                         std::to_string(device.minor) + " (needs major >= 1 and minor 0..9)");
}

void check_capability(compute_capability device) {
  if (device.major < 1 || device.major > 99 || device.minor < 0 || device.minor > 9)
    precondition_failed(device);
}

// A cubin or PTX image on its own: one target.
image_info single_target(image_kind kind, parsed_code code, const source& s) {
  kernel_set kernels;
  for (auto& k : code.kernels) {
    code.target.kernel_names.push_back(k.name);
    kernels.add(std::move(k), s);
  }
  image_info info;
  info.kind = kind;
  info.targets.push_back(std::move(code.target));
  info.kernels = kernels.take();
  return info;
}

}  // namespace

std::string_view to_string(image_kind kind) noexcept {
  static constexpr std::array<detail::enum_name<image_kind>, 4> names{{
      {image_kind::cubin, "cubin"},
      {image_kind::fatbin, "fatbin"},
      {image_kind::ptx, "ptx"},
      {image_kind::lto_ir, "lto_ir"},
  }};
  static_assert(detail::lists_values_in_order(names));
  return detail::name_of(names, kind, "unknown");
}

const image_kernel* image_info::find_kernel(std::string_view name) const noexcept {
  for (const auto& k : kernels)
    if (k.name == name) return &k;
  return nullptr;
}

image_info inspect_image(std::span<const std::byte> bytes) {
  inspect_calls.fetch_add(1, std::memory_order_relaxed);
  if (bytes.empty())
    detail::throw_errc(errc::bad_image, "inspect_image",
                       "empty input (0 bytes): not a cubin, fatbin or PTX image");
  work_budget budget(bytes.size());
  if (bytes.size() >= 4 && rd32(bytes, 0) == elf_magic) {
    const source s{bytes, 0, "cubin"};
    return single_target(image_kind::cubin, parse_cubin(s, budget), s);
  }
  if (bytes.size() >= 4 && rd32(bytes, 0) == fatbin_magic) return parse_fatbin(bytes, budget);
  if (looks_like_ptx(bytes)) {
    const source s{bytes, 0, "PTX"};
    return single_target(image_kind::ptx, parse_ptx(s, budget), s);
  }
  detail::throw_errc(errc::bad_image, "inspect_image",
                     "not a cubin, fatbin or PTX image (" + std::to_string(bytes.size()) +
                         " bytes; first bytes: " + first_bytes(bytes) + ")");
}

image_info inspect_image_file(const std::filesystem::path& path) {
  // A regular file only (a FIFO or device would block or never end), sized before reading, and
  // read whole only when its first bytes can begin an image: a 2 GiB file of anything else is
  // refused after one chunk.
  detail::regular_file file(path, std::numeric_limits<std::uint64_t>::max(), "image");
  const auto size = static_cast<std::uint64_t>(file.status().st_size);
  if (size > detail::max_image_bytes)
    detail::throw_errc(errc::bad_image, "inspect_image_file",
                       "'" + path.string() + "' is larger than the 2 GiB an image may have (" +
                           std::to_string(size) + " bytes)");
  std::vector<std::byte> data;
  constexpr std::size_t chunk = std::size_t{1} << 20;
  file.read_some(data, chunk);
  const bool may_be_image =
      (data.size() >= 4 && (rd32(data, 0) == elf_magic || rd32(data, 0) == fatbin_magic)) ||
      looks_like_ptx(data);
  if (data.size() == chunk && !may_be_image) {
    // Not an image unless PTX text begins after more than a chunk of comments and spaces: a NUL
    // or anything else seen whole ends the question here.
    const std::string_view text(reinterpret_cast<const char*>(data.data()), data.size());
    const auto pos = skip_space_and_comments(text, 0);
    if (text.find('\0') != std::string_view::npos ||
        (pos != std::string_view::npos && pos + 9 <= text.size()))
      detail::throw_errc(errc::bad_image, "inspect_image_file",
                         "'" + path.string() + "': not a cubin, fatbin or PTX image (" +
                             std::to_string(size) + " bytes; first bytes: " + first_bytes(data) +
                             ")");
  }
  data.reserve(static_cast<std::size_t>(size) + chunk);  // room for the read that sees the end
  while (file.read_some(data, chunk) != 0)               // to its end, even if it grew since fstat
    if (data.size() > detail::max_image_bytes)
      detail::throw_errc(errc::bad_image, "inspect_image_file",
                         "'" + path.string() + "' is larger than the 2 GiB an image may have");
  try {
    return inspect_image(data);
  } catch (const image_error& e) {
    // Name the file: rethrow with the path in front of what was wrong.
    detail::throw_errc(errc::bad_image, "inspect_image_file",
                       "'" + path.string() + "': " + e.involved());
  }
}

bool can_run_on(const image_target& target, compute_capability device) {
  check_capability(device);
  const auto code = target.capability();
  const bool same = device.major == code.major && device.minor == code.minor;
  const bool same_family = device.major == code.major && device.minor >= code.minor;
  switch (target.kind) {
    case image_kind::cubin:
      return code.variant == arch_variant::arch_specific ? same : same_family;
    case image_kind::ptx:
      if (code.variant == arch_variant::arch_specific) return same;
      if (code.variant == arch_variant::family_specific) return same_family;
      return device.numbers() >= code.numbers();
    case image_kind::fatbin:
    case image_kind::lto_ir:
      break;
  }
  return false;
}

bool can_run_on(const image_info& image, compute_capability device) {
  check_capability(device);
  return std::any_of(image.targets.begin(), image.targets.end(),
                     [&](const image_target& t) { return can_run_on(t, device); });
}

void require_runs_on(const image_info& image, compute_capability device, std::string_view what) {
  if (image.checked_for && image.checked_for->numbers() == device.numbers()) return;
  if (can_run_on(image, device)) return;
  std::string targets;
  for (const auto& t : image.targets) {
    if (!targets.empty()) targets += ", ";
    targets += t.arch_name;
    if (t.kind == image_kind::lto_ir) targets += " (LTO IR, not loadable)";
  }
  std::string msg;
  if (!what.empty()) msg.append(what).append(": ");
  msg += std::string(to_string(image.kind)) + " has code for " +
         (targets.empty() ? "nothing" : targets) + ", none of which runs on a device of " +
         to_string(device.numbers()) + " (compute capability " + std::to_string(device.major) +
         "." + std::to_string(device.minor) + ")";
  detail::throw_errc(errc::incompatible_image, "require_runs_on", std::move(msg));
}

void check_runs_on(image_info& image, compute_capability device, std::string_view what) {
  require_runs_on(image, device, what);
  image.checked_for = device.numbers();
}

namespace detail {

std::uint64_t inspect_image_calls() noexcept {
  return inspect_calls.load(std::memory_order_relaxed);
}

std::vector<std::string> kernels_every_entry_defines(const image_info& info,
                                                     compute_capability device) {
  std::optional<std::vector<std::string>> common;
  for (const auto& t : info.targets) {
    if (t.kind == image_kind::lto_ir || !can_run_on(t, device)) continue;
    if (!common) {
      common = t.kernel_names;
      continue;
    }
    std::erase_if(*common, [&](const std::string& name) {
      return std::find(t.kernel_names.begin(), t.kernel_names.end(), name) == t.kernel_names.end();
    });
  }
  return common.value_or(std::vector<std::string>{});
}

void require_loaded_kernels(const std::vector<std::string>& expected,
                            const std::vector<std::string>& loaded, std::string_view call,
                            const std::string& what) {
  std::string missing;
  std::size_t count = 0;
  for (const auto& name : expected) {
    if (std::find(loaded.begin(), loaded.end(), name) != loaded.end()) continue;
    missing += (count++ == 0 ? "'" : ", '") + name + "'";
  }
  if (count == 0) return;
  throw_errc(errc::bad_image, std::string(call),
             what + ": the image defines kernel" + (count == 1 ? " " : "s ") + missing +
                 " that the driver's list of the loaded code lacks (it lists " +
                 std::to_string(loaded.size()) + " kernels)");
}

}  // namespace detail
}  // namespace cubridge
