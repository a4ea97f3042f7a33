#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/swap/error.hpp>
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

std::uint64_t label_of_file(const std::filesystem::path& file) noexcept {
  // "filters.v12.cu": the stem's own extension is ".v12".
  const auto tag = file.stem().extension().string();
  if (tag.size() < 3 || tag[1] != 'v' || tag.size() > 2 + 19) return 0;
  std::uint64_t label = 0;
  for (std::size_t i = 2; i < tag.size(); ++i) {
    if (tag[i] < '0' || tag[i] > '9') return 0;
    label = label * 10 + static_cast<std::uint64_t>(tag[i] - '0');
  }
  return label;
}

// NOLINTNEXTLINE(performance-unnecessary-value-param): the public signature (hot_reload.hpp)
hot_reloader::hot_reloader(hot_module target, std::filesystem::path directory, options opts) {
  const auto device = target.context().device().capability();
  // The watcher's thread holds a handle of the module: it cannot outlive it.
  auto on_file = [target, device, opts](const std::filesystem::path& file) mutable {
    auto code = machine_code_from_file(file, device, opts.compile, opts.cache.get());
    auto stage = opts.stage;
    stage.source_name = file.string();
    stage.label = label_of_file(file);  // a signed bundle's never: whatever the options said
    stage.signer.clear();
    // A labelled file takes part in the compare-and-apply every other promoter makes.
    const auto condition =
        stage.label == 0 ? promote_condition::always : promote_condition::label_above_serving;
    const auto applied = target.stage_and_promote(code, nullptr, stage, condition);
    if (applied.outcome == apply_outcome::not_newer)
      throw version_rejected_error(
          "hot_reloader", "module '" + target.name() + "': " + file.string() + " is version " +
                              std::to_string(stage.label) + ", not above version " +
                              std::to_string(applied.serving_label) + ", which keeps serving");
    if (opts.on_promoted) opts.on_promoted(file, applied.serving_id);
  };
  watcher_ = std::make_unique<directory_watcher>(
      std::move(directory), opts.debounce, std::move(on_file),
      std::vector<std::string>{".cu", ".ptx", ".cubin", ".fatbin"}, opts.on_refused);
}

hot_reloader::~hot_reloader() = default;

}  // namespace cubridge
