// launch_config in words (launch_config.hpp).
#include <cubridge/core/detail/describe.hpp>
#include <cubridge/core/launch_config.hpp>

#include <string>

namespace cubridge {

std::string launch_config::describe() const {
  auto d = [](const dims& v) {
    return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")";
  };
  std::string text = "grid " + d(grid) + " block " + d(block) + " shared " +
                     std::to_string(dynamic_shared_bytes) + " B";
  if (cluster.x) text += " cluster " + d(cluster);
  if (stream.is_moved_from()) return text + " on a moved-from stream";
  return text + " on stream " + detail::hex(stream.get());
}

}  // namespace cubridge
