#include <cubridge/core/module.hpp>
#include <cubridge/swap/hot_reload.hpp>

#include <fstream>
#include <sstream>

namespace cubridge {

namespace {
std::string read_text(const std::filesystem::path& file) {
  const auto bytes = read_file_bytes(file);
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}
}  // namespace

std::vector<std::byte> machine_code_from_file(const std::filesystem::path& file,
                                              const std::string& architecture,
                                              compile_options options, compile_cache* cache) {
  const auto ext = file.extension().string();
  if (ext == ".cubin" || ext == ".fatbin") return read_file_bytes(file);
  if (ext == ".ptx") {
    ptx_link_options link{.architecture = architecture, .name = file.filename().string()};
    const auto ptx = read_text(file);
    return (cache ? cache->get_or_link(ptx, link) : ptx_to_cubin(ptx, link)).cubin;
  }
  if (ext == ".cu") {
    options.architecture = architecture;
    // Quoted includes resolve next to the file, as they would for nvcc.
    options.include_paths.insert(options.include_paths.begin(), file.parent_path());
    const cuda_source source{file.filename().string(), read_text(file)};
    return (cache ? cache->get_or_compile(source, options) : nvrtc_compile(source, options)).cubin;
  }
  detail::throw_errc(errc::precondition, "machine_code_from_file",
                     file.string() + ": not a .cu, .ptx, .cubin or .fatbin file");
}

hot_reloader::hot_reloader(hot_module& target, std::filesystem::path directory, options opts) {
  const auto cc = target.context().device().capability();
  const std::string architecture = "sm_" + std::to_string(cc.major) + std::to_string(cc.minor);
  auto on_file = [&target, architecture, opts](const std::filesystem::path& file) {
    auto code = machine_code_from_file(file, architecture, opts.compile, opts.cache);
    auto stage = opts.stage;
    stage.source_name = file.string();
    stage.bundle_version = 0;  // not a signed bundle, whatever the options said
    stage.key_id.clear();
    const auto id = target.promote(target.stage(code, stage));
    if (opts.on_promoted) opts.on_promoted(file, id);
  };
  watcher_ = std::make_unique<directory_watcher>(
      std::move(directory), opts.debounce, std::move(on_file),
      std::vector<std::string>{".cu", ".ptx", ".cubin", ".fatbin"}, opts.on_refused);
}

hot_reloader::~hot_reloader() = default;

}  // namespace cubridge
