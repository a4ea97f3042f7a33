#pragma once
// GPU image inspection without a GPU: tells what a cubin, fatbin or PTX image is, which
// architectures it carries code for, and which kernels it defines, by parsing the bytes on the
// CPU (no CUDA driver, no NVRTC). Used to refuse an image built for another GPU before the
// driver sees it.
//
// Every function here is safe on untrusted input: offsets and sizes read from the image are
// bounds-checked, work is linear in the input size, and malformed input raises
// cubridge::image_error (errc::bad_image) naming what was wrong and where.

#include <compare>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <cubridge/core/compute_capability.hpp>
#include <cubridge/core/error.hpp>

namespace cubridge {

/// What an image, or one entry of a fatbin, holds.
enum class image_kind {
  cubin,   ///< an ELF of SASS (machine code) for one real architecture, e.g. sm_90
  fatbin,  ///< a fat binary container of cubin/PTX entries (only ever image_info::kind)
  ptx,     ///< PTX assembly text for one virtual architecture, e.g. compute_90
  lto_ir,  ///< NVVM IR for link-time optimisation; only seen as a fatbin entry, which the
           ///< driver cannot load (it needs nvJitLink)
};

/// "cubin", "fatbin", "ptx" or "lto_ir".
[[nodiscard]] std::string_view to_string(image_kind kind) noexcept;

/// A PTX ISA version, e.g. 9.0 for ".version 9.0".
struct ptx_isa_version {
  int major = 0;
  int minor = 0;
  friend auto operator<=>(const ptx_isa_version&, const ptx_isa_version&) = default;
};

/// One kernel (entry function) defined by an image.
struct image_kernel {
  /// Name as in the image (mangled for C++ kernels, e.g. "_Z5scaleIfEvPT_S0_").
  std::string name{};
  /// Size in bytes of each parameter, in declaration order, where the image records them:
  /// from the EIATTR_KPARAM_INFO records of a cubin or the .param list of PTX. An empty
  /// vector means the kernel takes no parameters; nullopt means the image does not say (e.g.
  /// ptxas omits the per-parameter records when the parameters total more than 4 KiB).
  std::optional<std::vector<std::size_t>> parameter_sizes{};
};

/// One piece of code in an image: the cubin or PTX itself, or one entry of a fatbin.
struct image_target {
  /// cubin, ptx or (fatbin entries only) lto_ir.
  image_kind kind = image_kind::cubin;
  /// Compute capability as major * 10 + minor, e.g. 90 for 9.0 and 120 for 12.0.
  int sm = 0;
  /// Suffix of the architecture name.
  arch_variant variant = arch_variant::generic;
  /// "sm_90a" for SASS, "compute_90" for PTX, "lto_90" for LTO IR.
  std::string arch_name{};
  /// True for a fatbin entry stored compressed (LZ4 or zstd; both are decompressed and read).
  bool compressed = false;
  /// Device address size in bits: 64, or 32 for old 32-bit code.
  int address_bits = 64;
  /// For PTX: the ISA version (".version"); nullopt for other kinds.
  std::optional<ptx_isa_version> ptx_version{};
  /// Names of the kernels this cubin or PTX defines, in image order (parameters are in
  /// image_info::kernels); empty for LTO IR.
  std::vector<std::string> kernel_names{};

  /// The architecture as a compute capability with its variant: {9, 0, arch_specific} for
  /// sm_90a and compute_90a alike (`sm` is its as_int()).
  [[nodiscard]] compute_capability capability() const noexcept {
    return {sm / 10, sm % 10, variant};
  }
  /// Major compute capability (capability().major).
  [[nodiscard]] int sm_major() const noexcept { return capability().major; }
  /// Minor compute capability (capability().minor).
  [[nodiscard]] int sm_minor() const noexcept { return capability().minor; }
};

/// What inspect_image found.
struct image_info {
  /// cubin, fatbin or ptx.
  image_kind kind = image_kind::cubin;
  /// For a cubin or PTX image: exactly one; for a fatbin: one per entry, in file order
  /// (entries of unknown kinds are skipped).
  std::vector<image_target> targets{};
  /// Kernels defined by the image: the union over all readable cubin and PTX entries,
  /// deduplicated by name, in order of first appearance.
  std::vector<image_kernel> kernels{};
  /// False when some cubin or PTX entry could not be read, so `kernels` may miss some. Every
  /// cubin and PTX entry, compressed (LZ4, zstd) or not, is read or refused with an image_error,
  /// so as built this is always true; kept for callers that check it.
  bool kernels_complete = true;
  /// The device compute capability this image was found to run on by a check on the way here
  /// (check_runs_on; verify_bundle with verify_limits::device), so that "does it run here?" is
  /// decided once: require_runs_on, and so module::load and library::load, answer a repeat
  /// for the same numbers with one compare. nullopt: not checked. Set only by such a check.
  std::optional<compute_capability> checked_for{};

  /// The kernel named `name`, or nullptr.
  [[nodiscard]] const image_kernel* find_kernel(std::string_view name) const noexcept;
};

/// Inspects the bytes of a cubin (ELF), fatbin (as written by `nvcc -fatbin`) or PTX text
/// (possibly NUL-terminated). Pure CPU parsing; linear in the input size.
/// Throws cubridge::image_error (errc::bad_image) for empty, truncated, malformed or
/// unrecognised input, naming the problem and where it is (byte offset, section, entry).
[[nodiscard]] image_info inspect_image(std::span<const std::byte> bytes);

/// Reads the file at `path` and inspects it with inspect_image.
/// Throws cubridge::error (errc::io) when the file cannot be opened or read, and
/// cubridge::image_error (errc::bad_image) as inspect_image does, or when the file is larger
/// than 2 GiB.
[[nodiscard]] image_info inspect_image_file(const std::filesystem::path& path);

/// True if code of `target` can run on a device of compute capability `device` (its variant is
/// not looked at: a device has none): SASS (cubin) of a generic or "f" architecture sm_XY runs
/// on major X with minor >= Y, of an "a" architecture only on exactly X.Y; generic PTX
/// compute_XY can be JIT-compiled for any device >= X.Y, "f" PTX for major X with minor >= Y,
/// "a" PTX only for exactly X.Y; LTO IR never runs as is.
/// Throws cubridge::error (errc::precondition) unless 1 <= device.major <= 99 and
/// 0 <= device.minor <= 9.
[[nodiscard]] bool can_run_on(const image_target& target, compute_capability device);

/// True if some target of `image` can run on a device of compute capability `device` (see the
/// image_target overload for the rules).
/// Throws cubridge::error (errc::precondition) unless 1 <= device.major <= 99 and
/// 0 <= device.minor <= 9.
[[nodiscard]] bool can_run_on(const image_info& image, compute_capability device);

/// Does nothing if can_run_on(image, device); otherwise throws cubridge::image_error
/// (errc::incompatible_image) whose message names `what` (e.g. the module's name), the image's
/// targets and the device, e.g. "module 'filters': cubin has code for sm_80, compute_90a, none
/// of which runs on a device of sm_86 (compute capability 8.6)".
/// Throws cubridge::error (errc::precondition) unless 1 <= device.major <= 99 and
/// 0 <= device.minor <= 9.
/// Nothing to do, too, when image.checked_for has the numbers of `device`: a check on the way
/// here decided it.
void require_runs_on(const image_info& image, compute_capability device, std::string_view what);

/// As require_runs_on, then records `device` in image.checked_for, so that a later check for the
/// same device (module::load of this image and info) is one compare. @throws as require_runs_on;
/// image.checked_for is unchanged when it throws.
void check_runs_on(image_info& image, compute_capability device, std::string_view what);

namespace detail {
/// Test seam: how many times inspect_image has run in this process (inspect_image_file
/// included), so tests can tell that a path parses its bytes once. One relaxed atomic increment
/// per call.
[[nodiscard]] std::uint64_t inspect_image_calls() noexcept;
}  // namespace detail

}  // namespace cubridge
