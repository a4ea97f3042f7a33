// The library's own copy of the version it was built as (version.hpp's macros are the headers').
#include <cubridge/version.hpp>

namespace cubridge {

std::string_view version() noexcept {
  return CUBRIDGE_VERSION_STRING;
}

}  // namespace cubridge
