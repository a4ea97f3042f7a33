// hot_module::stage: a new version loaded and checked against the interface (the same kernels
// with the same parameters, fitting the launches in use, carried globals, the smoke test) before
// it can be promoted. The serving version is untouched whatever happens.
#include "hot_module_state.hpp"
#include "swap_trace.hpp"

#include <cubridge/core/image.hpp>
#include <cubridge/swap/hot_module.hpp>

#include <chrono>
#include <exception>

namespace cubridge {

namespace hot_module_internal {

kernel_limits limits_of(const kernel& k) {
  return {static_cast<unsigned long long>(k.attribute(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)),
          static_cast<unsigned>(k.attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES))};
}

}  // namespace hot_module_internal

void hot_module::state::reject(const std::string& source, const std::string& cause) {
  rejected.fetch_add(1);
  throw version_rejected_error("hot_module::stage", "module '" + name + "' version from " + source +
                                                        ": " + cause +
                                                        "; the current version keeps serving");
}

std::string hot_module::state::misfit(const hot_version& v, const std::string& who) const {
  for (std::size_t i = 0; i < kernel_names.size(); ++i) {
    const auto threads = usage[i].threads_per_block.load();
    if (threads > v.limits[i].max_threads_per_block)
      return "kernel '" + kernel_names[i] + "' is launched with " + std::to_string(threads) +
             " threads per block, " + who + " allows " +
             std::to_string(v.limits[i].max_threads_per_block);
    const auto shared = usage[i].dynamic_shared_bytes.load();
    if (shared > v.limits[i].max_dynamic_shared_bytes)
      return "kernel '" + kernel_names[i] + "' is launched with " + std::to_string(shared) +
             " bytes of dynamic shared memory, " + who + " allows " +
             std::to_string(v.limits[i].max_dynamic_shared_bytes);
  }
  return {};
}

kernel hot_module::state::staged_kernel(const module& staged, std::size_t index,
                                        const kernel& serving, const std::string& source) {
  const auto& kname = kernel_names[index];
  std::optional<kernel> k;
  try {
    k.emplace(staged.get_kernel(kname));
  } catch (const error&) {
    reject(source, "kernel '" + kname + "' is missing");
  }
  const auto before = serving.parameters();
  const auto after = k->parameters();
  if (before.size() != after.size())
    reject(source, "kernel '" + kname + "' took " + std::to_string(before.size()) +
                       " parameters, now " + std::to_string(after.size()));
  for (std::size_t p = 0; p < before.size(); ++p)
    if (before[p].size != after[p].size || before[p].offset != after[p].offset)
      reject(source, "kernel '" + kname + "' parameter " + std::to_string(p) + " was " +
                         std::to_string(before[p].size) + " bytes at offset " +
                         std::to_string(before[p].offset) + ", now " +
                         std::to_string(after[p].size) + " bytes at offset " +
                         std::to_string(after[p].offset));
  return std::move(*k);
}

void hot_module::state::check_carried_globals(const module& serving, const module& staged,
                                              const std::vector<std::string>& variables,
                                              const std::string& source) {
  for (const auto& variable : variables) {
    std::optional<device_span<std::byte>> old_bytes, new_bytes;
    try {
      old_bytes.emplace(serving.get_global(variable));
      new_bytes.emplace(staged.get_global(variable));
    } catch (const error&) {
      reject(source, "__device__ variable '" + variable + "' to carry over is missing");
    }
    if (old_bytes->size() != new_bytes->size())
      reject(source, "__device__ variable '" + variable + "' to carry over was " +
                         std::to_string(old_bytes->size()) + " bytes, now " +
                         std::to_string(new_bytes->size()));
  }
}

void hot_module::state::run_smoke_test(const stage_options& options, const module& staged,
                                       const std::string& source) {
  if (!options.smoke_test) return;
  try {
    options.smoke_test(staged);
  } catch (const std::exception& e) {
    reject(source, std::string("smoke test failed: ") + e.what());
  } catch (...) {
    reject(source, "smoke test failed");
  }
}

staged_version hot_module::stage(std::span<const std::byte> image,
                                 const stage_options& options) const {
  auto& s = checked();
  std::optional<image_info> info;
  try {
    info.emplace(inspect_image(image));
  } catch (const image_error&) {
    s.rejected.fetch_add(1);
    throw;
  }
  return stage(image, *info, options);
}

staged_version hot_module::stage(std::span<const std::byte> image, const image_info& info,
                                 const stage_options& options) const {
  auto& s = checked();
  const std::string source = options.source_name.empty() ? "memory" : options.source_name;
  const std::string trace =
      "stage module '" + s.name + "' from " + source + swap_trace::label_suffix(options.label);
  const swap_trace::scoped_range range{trace};
  std::optional<module> loaded;
  try {
    loaded.emplace(
        module::load(s.ctx, image, info, {.name = s.name + " (staged from " + source + ")"}));
  } catch (const image_error&) {
    s.rejected.fetch_add(1);
    throw;
  }
  // The interface: the same kernels with the same parameters, fitting the launches in use.
  const auto current = s.versions.acquire();
  hot_version staged{std::move(*loaded), {}, {}};
  for (std::size_t i = 0; i < s.kernel_names.size(); ++i) {
    auto k = s.staged_kernel(staged.loaded, i, current.payload().kernels[i], source);
    staged.limits.push_back(hot_module_internal::limits_of(k));
    staged.kernels.push_back(std::move(k));
  }
  if (const auto why = s.misfit(staged, "the new version"); !why.empty()) s.reject(source, why);
  s.check_carried_globals(current.payload().loaded, staged.loaded, options.carry_globals, source);
  s.run_smoke_test(options, staged.loaded, source);
  staged.image = std::make_shared<const std::vector<std::byte>>(image.begin(), image.end());
  s.run_probation(options, current.payload(), image, source);
  version_origin origin{options.label, options.signer, source, std::chrono::system_clock::now()};
  return staged_version(std::move(staged), options.carry_globals, source, std::move(origin),
                        s.serial, "module '" + s.name + "' in " + s.ctx.ref().describe());
}

}  // namespace cubridge
