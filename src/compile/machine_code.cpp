// Machine code from any source; see machine_code.hpp.
#include <cubridge/compile/machine_code.hpp>
#include <cubridge/core/image.hpp>

#include <string>

namespace cubridge {

namespace {

std::string_view as_text(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

image_info inspect_named(std::span<const std::byte> bytes, std::string_view name) {
  try {
    return inspect_image(bytes);
  } catch (const image_error& e) {
    detail::throw_errc(errc::bad_image, "build_machine_code",
                       std::string(name) + ": " + e.involved());
  }
}

}  // namespace

std::optional<source_kind> source_kind_of(const std::filesystem::path& file) {
  const auto ext = file.extension().string();
  if (ext == ".cu") return source_kind::cuda_source;
  if (ext == ".ptx") return source_kind::ptx;
  if (ext == ".cubin") return source_kind::cubin;
  if (ext == ".fatbin") return source_kind::fatbin;
  return std::nullopt;
}

std::vector<std::byte> build_machine_code(source_kind kind, std::span<const std::byte> bytes,
                                          std::string_view name, compute_capability target,
                                          const build_options& options) {
  switch (kind) {
    case source_kind::cuda_source: {
      auto compile = options.compile;
      compile.architecture = to_string(target);
      const cuda_source source{std::string(name), std::string(as_text(bytes))};
      return (options.cache ? options.cache->get_or_compile(source, compile)
                            : nvrtc_compile(source, compile))
          .cubin;
    }
    case source_kind::ptx: {
      const ptx_link_options link{.architecture = to_string(target), .name = std::string(name)};
      return (options.cache ? options.cache->get_or_link(as_text(bytes), link)
                            : ptx_to_cubin(as_text(bytes), link))
          .cubin;
    }
    case source_kind::cubin:
    case source_kind::fatbin:
      // Refused here, naming the source, rather than by the loader later.
      require_runs_on(inspect_named(bytes, name), target, name);
      return {bytes.begin(), bytes.end()};
  }
  detail::throw_errc(
      errc::precondition, "build_machine_code",
      std::string(name) + ": unknown source kind " + std::to_string(static_cast<int>(kind)));
}

}  // namespace cubridge
