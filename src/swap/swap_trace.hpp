#pragma once
// NVTX ranges of the swap layer, in the domain "cubridge": stage, promote, rollback and the
// reclaimer's unloads of a hot module, so that a swap shows up in Nsight Systems. NVTX3 is
// header-only (no library to link): without a tool attached a range costs a call through a null
// hook. Ranges are only on these rare paths, never on the launch path. Internal to the swap
// layer; not installed.
#include <nvtx3/nvtx3.hpp>

#include <cstdint>
#include <string>

namespace cubridge::swap_trace {

struct domain {
  static constexpr const char* name{"cubridge"};
};

/// A range of the "cubridge" domain; its message must outlive it (nvtx3 keeps a pointer).
using scoped_range = nvtx3::scoped_range_in<domain>;

/// " (label N)" for a labelled version (the update layer: from bundle version N), else empty.
inline std::string label_suffix(std::uint64_t label) {
  return label == 0 ? std::string() : " (label " + std::to_string(label) + ")";
}

}  // namespace cubridge::swap_trace
