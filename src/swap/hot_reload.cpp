#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/swap/hot_reload.hpp>

#include <utility>

namespace cubridge {

std::vector<std::byte> machine_code_from_file(const std::filesystem::path& file,
                                              compute_capability target, compile_options options,
                                              compile_cache* cache) {
  const auto kind = source_kind_of(file);
  if (!kind)
    detail::throw_errc(errc::precondition, "machine_code_from_file",
                       file.string() + ": not a .cu, .ptx, .cubin or .fatbin file");
  // Quoted includes resolve next to the file, as they would for nvcc.
  if (*kind == source_kind::cuda_source)
    options.include_paths.insert(options.include_paths.begin(), file.parent_path());
  const auto bytes = detail::read_regular_file(file, detail::max_image_bytes, "kernel file");
  return build_machine_code(*kind, bytes, file.filename().string(), target,
                            {std::move(options), cache});
}

// NOLINTNEXTLINE(performance-unnecessary-value-param): the public signature (hot_reload.hpp)
hot_reloader::hot_reloader(hot_module target, std::filesystem::path directory, options opts) {
  const auto device = target.context().device().capability();
  // The watcher's thread holds a handle of the module: it cannot outlive it.
  auto on_file = [target, device, opts](const std::filesystem::path& file) mutable {
    auto code = machine_code_from_file(file, device, opts.compile, opts.cache.get());
    auto stage = opts.stage;
    stage.source_name = file.string();
    stage.label = 0;  // not a signed bundle, whatever the options said
    stage.signer.clear();
    const auto id = target.promote(target.stage(code, stage));
    if (opts.on_promoted) opts.on_promoted(file, id);
  };
  watcher_ = std::make_unique<directory_watcher>(
      std::move(directory), opts.debounce, std::move(on_file),
      std::vector<std::string>{".cu", ".ptx", ".cubin", ".fatbin"}, opts.on_refused);
}

hot_reloader::~hot_reloader() = default;

}  // namespace cubridge
