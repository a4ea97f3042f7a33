// The transport's threads: the reception thread's poll loop and accepting, the workers and the
// hand-over of complete requests between them, stopping; see http_connection_service.hpp.
#include "http_connection_service.hpp"

#include <cubridge/core/error.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

namespace cubridge::http_internal {
namespace {

// Per-request state a handler can reach: a request is handled on one worker thread.
struct connection_state {
  bool close_after_response = false;
};
thread_local connection_state* current_connection = nullptr;

}  // namespace

void close_after_response() {
  if (current_connection) current_connection->close_after_response = true;
}

connection_service::connection_service(guarded_server& server, int listener,
                                       const reception_options& options, SSL_CTX* tls,
                                       reception_counters counters)
    : server_(server),
      listener_(listener),
      options_(options),
      tls_(tls),
      counters_(std::move(counters)) {
  try {
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0)
      detail::throw_errc(errc::io, "update_endpoint::start",
                         std::string("eventfd: ") + std::strerror(errno));
    ::fcntl(listener_, F_SETFL, ::fcntl(listener_, F_GETFL) | O_NONBLOCK);
    for (std::size_t i = 0; i < options_.threads; ++i) workers_.emplace_back([this] { work(); });
    reception_ = std::thread([this] { receive_loop(); });
  } catch (...) {
    stop_workers();
    if (wake_fd_ >= 0) ::close(wake_fd_);
    ::close(listener_);
    throw;
  }
}

connection_service::~connection_service() {
  stopping_ = true;
  wake();
  reception_.join();
  stop_workers();
  ::close(wake_fd_);
}

void connection_service::wake() {
  const std::uint64_t one = 1;
  [[maybe_unused]] const auto n = ::write(wake_fd_, &one, sizeof one);
}

void connection_service::clear_wake() {
  std::uint64_t count;
  [[maybe_unused]] const auto n = ::read(wake_fd_, &count, sizeof count);
}

void connection_service::stop_workers() {
  {
    std::lock_guard lock(jobs_mutex_);
    workers_stopping_ = true;
  }
  jobs_ready_.notify_all();
  for (auto& w : workers_) w.join();
  workers_.clear();
}

// --- workers ---

void connection_service::work() {
  block_sigpipe();
  for (;;) {
    connection* c = nullptr;
    {
      std::unique_lock lock(jobs_mutex_);
      jobs_ready_.wait(lock, [&] { return workers_stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      c = jobs_.front();
      jobs_.pop_front();
      ++busy_;
    }
    serve(*c);
    {
      std::lock_guard lock(jobs_mutex_);
      --busy_;
      returned_.push_back(c);
    }
    wake();
  }
}

// httplib parses, routes and answers the buffered request. The connection serves another only
// if httplib consumed exactly this request (nothing it did not read can be taken for the next
// one) and neither side asked to close.
void connection_service::serve(connection& c) {
  const std::size_t size = c.framing->head_size + c.framing->body_size;
  request_stream stream(c, std::string_view(c.in).substr(0, size), options_.write_timeout,
                        options_.request_timeout);
  connection_state state;
  current_connection = &state;
  const bool last = c.served + 1 >= options_.keep_alive_max_requests || c.peer_closed || stopping_;
  bool closed = false;
  bool ok = false;
  try {
    ok = server_.serve(stream, last, closed);
  } catch (...) {
    ok = false;  // e.g. out of memory; httplib answers routing exceptions itself
  }
  current_connection = nullptr;
  c.keep = ok && !last && !closed && !state.close_after_response && stream.consumed() == size;
  c.in = std::string(std::string_view(c.in).substr(size));  // frees a large body's buffer
  ++c.served;
}

// Hands a complete request to a worker: an idle one, or the queue of max_queued_connections.
bool connection_service::submit(connection& c) {
  {
    std::lock_guard lock(jobs_mutex_);
    if (jobs_.size() >= options_.threads - busy_ + options_.max_queued_connections) return false;
    c.at = phase::with_worker;
    jobs_.push_back(&c);
  }
  jobs_ready_.notify_one();
  return true;
}

// --- reception ---

void connection_service::receive_loop() {
  block_sigpipe();
  while (!stopping_) {
    const int timeout = prepare_poll(steady::now());
    if (::poll(polled_.data(), polled_.size(), timeout) < 0 && errno != EINTR) {
      std::this_thread::sleep_for(milliseconds(1));  // not expected; never spin
      continue;
    }
    if (stopping_) break;
    if (polled_[0].revents) clear_wake();
    take_returned();
    progress_polled();
    expire(steady::now());
    reap();
    if (polled_[1].revents) accept_all();
    counters_.open_connections = held_;
  }
  shut_down();
}

// This round's poll set (the wake-up, the listener unless accepting is paused, every connection
// no worker has) and how long the poll may wait: until the nearest deadline, not at all when a
// connection stopped reading at the round's cap.
int connection_service::prepare_poll(steady::time_point now) {
  const bool accepting = now >= accept_paused_until_;
  polled_.assign({{wake_fd_, POLLIN, 0}, {accepting ? listener_ : -1, POLLIN, 0}});
  polled_connections_.clear();
  auto next = accepting ? steady::time_point::max() : accept_paused_until_;
  bool at_once = false;
  for (auto& [id, c] : connections_) {
    if (c->at == phase::with_worker) continue;
    at_once = at_once || c->more;
    polled_.push_back({c->fd, events_of(*c), 0});
    polled_connections_.push_back(c.get());
    next = std::min(next, deadline_of(*c));
  }
  if (at_once) return 0;
  if (next == steady::time_point::max()) return -1;
  const auto left = std::chrono::ceil<milliseconds>(next - now).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 3'600'000));
}

// Connections before new ones: a connection that closed frees its slot for the next.
void connection_service::progress_polled() {
  for (std::size_t i = 0; i < polled_connections_.size(); ++i) {
    auto& c = *polled_connections_[i];
    if ((polled_[i + 2].revents || c.more) && c.at != phase::with_worker) progress(c);
  }
}

short connection_service::events_of(const connection& c) const {
  switch (c.at) {
    case phase::handshake:
      return c.want_write ? POLLOUT : POLLIN;
    case phase::receiving: {
      const bool complete = c.framing && c.in.size() >= c.framing->head_size + c.framing->body_size;
      short events = complete ? 0 : POLLIN;
      if (!c.out.empty() || c.want_write) events |= POLLOUT;
      return events;
    }
    case phase::answering:
      return POLLOUT;
    case phase::draining:
      return POLLIN;
    default:
      return 0;
  }
}

steady::time_point connection_service::deadline_of(const connection& c) {
  if (c.at == phase::handshake || c.at == phase::receiving)
    return std::min(c.request_deadline, c.silence_deadline);
  return c.silence_deadline;
}

void connection_service::accept_all() {
  for (int i = 0; i < 64; ++i) {
    const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        accept_paused_until_ = steady::now() + milliseconds(100);  // try again then
      return;                                                      // EAGAIN: nothing more to accept
    }
    if (held_ >= options_.max_connections)
      refuse_at_accept(fd);
    else
      hold(fd);
  }
}

// Answers 503 busy to a connection over max_connections and closes it. Never blocks. A client
// that sent its request already may see a reset instead.
void connection_service::refuse_at_accept(int fd) {
  static const std::string busy = refusal_text(
      {transport_reason::busy, "the endpoint holds max_connections connections already"});
  ++counters_.connections_refused;  // counted before the client can see the answer
  ::send(fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
}

// Takes an accepted connection in: its TLS handshake, or its first request, is due within
// request_timeout.
void connection_service::hold(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  SSL* ssl = nullptr;
  if (tls_) {
    ssl = SSL_new(tls_);
    if (!ssl || SSL_set_fd(ssl, fd) != 1) {
      if (ssl) SSL_free(ssl);
      ::close(fd);
      return;
    }
    SSL_set_accept_state(ssl);
  }
  auto c = std::make_unique<connection>(fd, ssl);
  const auto now = steady::now();
  c->at = ssl ? phase::handshake : phase::receiving;
  c->request_deadline = now + options_.request_timeout;  // the handshake counts
  c->silence_deadline = now + options_.read_timeout;
  ++held_;
  connections_.emplace(next_id_++, std::move(c));
}

void connection_service::expire(steady::time_point now) {
  for (auto& [id, c] : connections_) {
    if (c->at == phase::with_worker || c->at == phase::closed || now < deadline_of(*c)) continue;
    if (c->at != phase::receiving || (c->in.empty() && !c->framing)) {
      close_now(*c);  // idle between requests, handshake, or an answer nobody reads
      continue;
    }
    const bool whole = now >= c->request_deadline;
    refuse(*c, {transport_reason::timeout,
                whole ? "request not complete within request_timeout (" +
                            std::to_string(options_.request_timeout.count()) + " ms) of " +
                            (c->served == 0 ? "accepting the connection" : "the previous answer")
                      : "nothing received for read_timeout (" +
                            std::to_string(options_.read_timeout.count()) + " ms)"});
  }
}

// Connections whose worker is done: next request, or close.
void connection_service::take_returned() {
  std::vector<connection*> done;
  {
    std::lock_guard lock(jobs_mutex_);
    done.swap(returned_);
  }
  for (connection* c : done) {
    release(*c);
    c->framing.reset();
    c->scanned = 0;
    c->lines = 0;
    if (stopping_) {
      c->at = phase::receiving;
      close_now(*c);
      continue;
    }
    if (!c->keep) {
      c->at = phase::answering;  // the answer is out: drain and close
      begin_drain(*c);
      continue;
    }
    next_request(*c);
  }
}

void connection_service::next_request(connection& c) {
  const auto now = steady::now();
  c.at = phase::receiving;
  c.request_deadline = now + options_.request_timeout;
  c.silence_deadline = now + (c.in.empty() ? options_.keep_alive_timeout : options_.read_timeout);
  // Pipelined bytes may hold the next request already, and TLS may hold decrypted bytes that
  // poll cannot see.
  receive(c);
}

void connection_service::reap() {
  std::erase_if(connections_, [](const auto& e) { return e.second->at == phase::closed; });
}

// Stopping: every connection closes now, except those a worker is answering, which get
// stop_grace to finish before their sockets are shut down (so their writes fail at once).
void connection_service::shut_down() {
  ::close(listener_);
  {
    std::lock_guard lock(jobs_mutex_);
    for (connection* c : jobs_) c->at = phase::receiving;  // taken back, never started
    jobs_.clear();
  }
  for (auto& [id, c] : connections_)
    if (c->at != phase::with_worker) close_now(*c);
  reap();
  wait_for_workers();
  counters_.open_connections = 0;
}

void connection_service::wait_for_workers() {
  const auto cut_at = steady::now() + stop_grace;
  bool cut = false;
  for (;;) {
    take_returned();
    reap();
    const bool serving = std::any_of(connections_.begin(), connections_.end(), [](const auto& e) {
      return e.second->at == phase::with_worker;
    });
    if (!serving) break;
    if (!cut && steady::now() >= cut_at) {
      for (auto& [id, c] : connections_) ::shutdown(c->fd, SHUT_RDWR);
      cut = true;
    }
    pollfd p{wake_fd_, POLLIN, 0};
    const auto left = std::chrono::ceil<milliseconds>(cut_at - steady::now()).count();
    ::poll(&p, 1, cut ? 100 : static_cast<int>(std::max<long long>(left, 0)));
    clear_wake();
  }
}

}  // namespace cubridge::http_internal
