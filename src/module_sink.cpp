#include <cubridge/module_sink.hpp>

namespace cubridge {

std::string_view to_string(sink_outcome outcome) noexcept {
  switch (outcome) {
    case sink_outcome::done:
      return "done";
    case sink_outcome::unknown_module:
      return "unknown_module";
    case sink_outcome::rejected:
      return "rejected";
    case sink_outcome::no_previous_version:
      return "no_previous_version";
    case sink_outcome::failed:
      return "failed";
  }
  return "unknown";
}

}  // namespace cubridge
