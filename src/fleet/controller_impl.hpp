#pragma once
// What controller's two source files share (fleet_controller.cpp: the connection, publishing,
// the bucket and reading the streams; fleet_rollout.cpp: the canary policy and waiting for
// results).

#include "fleet/nats.hpp"

#include <cubridge/fleet/controller.hpp>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace cubridge::fleet {

struct controller::impl {
  controller_options options;
  detail::connection_ptr connection;
  detail::jetstream_ptr js;
  detail::kv_store_ptr desired;

  /// Puts `value` under `key` of the desired bucket.
  void put(const std::string& key, const std::string& value);
  /// The value under `key`; nullopt when there is none (or it was deleted).
  [[nodiscard]] std::optional<std::string> get(const std::string& key) const;
  void remove(const std::string& key);
  /// Publishes on `subject`, after checking the payload limit; `what` names it in errors.
  void send(const std::string& subject, std::span<const std::byte> data, std::string_view what);
};

/// The results of one module as they arrive (a core subscription to cubridge.result.<m>.*,
/// flushed to the server before the constructor returns, so a result published after it is
/// seen).
class result_watch {
 public:
  result_watch(natsConnection* connection, std::string_view module);
  /// The next result that parses, or nullopt at `deadline`.
  /// @throws cubridge::error (fleet_errc::unreachable) when the connection is lost.
  [[nodiscard]] std::optional<result_record> next(std::chrono::steady_clock::time_point deadline);

 private:
  std::string module_;
  detail::subscription_ptr subscription_;
};

}  // namespace cubridge::fleet
