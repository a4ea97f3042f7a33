#pragma once
// The reception thread, the workers and every connection of the update endpoint's transport
// (http_reception.hpp). The threads' lifecycle, the poll loop, accepting and the hand-over to the
// workers are in http_connection_service.cpp; what the reception thread does with one connection
// (handshake, receiving a request, refusing it, draining, closing) in http_connection_progress.cpp.
// Internal to cubridge_update; not installed.
#include "http_connection.hpp"
#include "http_framing.hpp"
#include "http_reception_options.hpp"

#include <openssl/ssl.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <poll.h>

namespace cubridge::http_internal {

/// Constructed running; the destructor stops it: closes every connection (a request being
/// handled finishes; its socket is shut down if its answer is not out within stop_grace) and
/// joins every thread.
class connection_service {
 public:
  /// Serves the bound, listening `listener` (taken over) with `server`; `tls` null for HTTP.
  /// `server`, `options` and `tls` must outlive it.
  /// @throws error (errc::io) when its wake-up eventfd cannot be made (`listener` is closed).
  connection_service(guarded_server& server, int listener, const reception_options& options,
                     SSL_CTX* tls, reception_counters counters);
  connection_service(const connection_service&) = delete;
  connection_service& operator=(const connection_service&) = delete;
  ~connection_service();

 private:
  using phase = connection::phase;
  static constexpr milliseconds drain_time{500};
  static constexpr std::size_t drain_limit = std::size_t{64} << 20;
  static constexpr std::size_t round_limit = std::size_t{1} << 20;  // per connection and poll
  static constexpr milliseconds stop_grace{300};

  // Threads (http_connection_service.cpp).
  void wake();
  void clear_wake();
  void stop_workers();
  void work();
  void serve(connection& c);
  bool submit(connection& c);
  void receive_loop();
  int prepare_poll(steady::time_point now);
  void progress_polled();
  short events_of(const connection& c) const;
  static steady::time_point deadline_of(const connection& c);
  void accept_all();
  void refuse_at_accept(int fd);
  void hold(int fd);
  void expire(steady::time_point now);
  void take_returned();
  void next_request(connection& c);
  void reap();
  void shut_down();
  void wait_for_workers();

  // One connection (http_connection_progress.cpp).
  void progress(connection& c);
  void handshake(connection& c);
  void receive(connection& c);
  bool read_request(connection& c);
  bool scan_head(connection& c);
  bool take_head(connection& c, std::size_t head_size);
  void release(connection& c);
  void refuse(connection& c, const transport_refusal& r);
  void begin_drain(connection& c);
  void drain(connection& c);
  void close_now(connection& c);

  guarded_server& server_;
  const int listener_;
  const reception_options& options_;
  SSL_CTX* tls_;
  reception_counters counters_;
  int wake_fd_ = -1;
  std::atomic<bool> stopping_{false};

  // The reception thread's own.
  std::map<std::uint64_t, std::unique_ptr<connection>> connections_;  // in accept order
  std::uint64_t next_id_ = 0;
  std::size_t held_ = 0;  // connections counted against max_connections (not draining)
  std::size_t draining_ = 0;
  std::size_t buffered_ = 0;  // body bytes reserved, all connections
  steady::time_point accept_paused_until_{};
  std::vector<pollfd> polled_;                   // this round: wake-up, listener, connections
  std::vector<connection*> polled_connections_;  // the connections of polled_[2...]

  // Shared with the workers.
  std::mutex jobs_mutex_;
  std::condition_variable jobs_ready_;
  std::deque<connection*> jobs_;
  std::vector<connection*> returned_;
  std::size_t busy_ = 0;
  bool workers_stopping_ = false;

  std::vector<std::thread> workers_;
  std::thread reception_;
};

}  // namespace cubridge::http_internal
