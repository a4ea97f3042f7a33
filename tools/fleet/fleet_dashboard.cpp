// The fleet dashboard (fleet_dashboard.hpp). One thread reads the fleet every refresh (a
// controller is used by one thread) into a snapshot; the HTTP threads only hand out the latest
// snapshot, so a page costs the bus nothing, and the number of pages listening is bounded.
#include "fleet/fleet_dashboard.hpp"

#include "fleet/fleet_status.hpp"

#include <cubridge/bundle/bundle.hpp>  // detail::format_time, parse_time
#include <cubridge/fleet/desired_state.hpp>
#include <cubridge/fleet/records.hpp>

#include <httplib.h>
#include <signal.h>

#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>

namespace cubridge::tool {
namespace {

using json = nlohmann::json;
using system_clock = std::chrono::system_clock;

// What the page shows of a record is its wire JSON, as the library writes it (records.hpp,
// desired_state.hpp): one writer of each record, however many readers.
json wire_field(const std::string& record, const char* field) {
  const auto parsed = json::parse(record, nullptr, false);
  return parsed.is_object() && parsed.contains(field) ? parsed[field] : json(nullptr);
}

json timeline_json(const std::vector<fleet::desired_state>& history) {
  json out = json::array();
  for (const auto& s : history)
    out.push_back({{"time", s.time},
                   {"revision", s.revision},
                   {"phase", std::string(to_string(s.phase))},
                   {"wave", s.waves ? s.waves->wave + 1 : 0},
                   {"stable", s.stable ? s.stable->version : 0},
                   {"candidate", s.candidate ? s.candidate->version : 0},
                   {"reason", s.reason}});
  return out;
}

// The running wave's figures since it started (the controller's own analysis starts at the
// wave's apply; this is the view of someone watching).
json analysis_json(const fleet::desired_state& s, const std::vector<fleet::node_state>& nodes) {
  if (!s.waves) return nullptr;
  const auto started = cubridge::detail::parse_time(s.waves->started);
  const auto samples = fleet::sample_wave(
      s, nodes, started ? system_clock::time_point(*started) : system_clock::now());
  const auto v = fleet::analyse_wave(
      samples.canaries, samples.baseline, {},
      {s.waves->max_failure_rate, s.waves->max_metrics, s.waves->baseline_breach_halts});
  return {{"canary", v.canary},
          {"baseline", v.baseline},
          {"canaries", samples.canaries.size()},
          {"baseline_nodes", samples.baseline.size()},
          {"failing", v.failed},
          {"reason", v.reason}};
}

std::atomic<bool> stopping{false};
extern "C" void on_stop(int) {
  stopping = true;
}

// The latest snapshot and its number; listeners wait for a newer one.
class snapshot_board {
 public:
  void put(std::string text) {
    {
      std::lock_guard lock(mutex_);
      text_ = std::move(text);
      ++number_;
    }
    changed_.notify_all();
  }
  /// The snapshot after `seen` (waiting at most `wait`), and its number; the same one when
  /// nothing newer came.
  std::pair<std::string, std::uint64_t> after(std::uint64_t seen, std::chrono::milliseconds wait) {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, wait, [&] { return number_ != seen || stopping; });
    return {text_, number_};
  }
  void wake() { changed_.notify_all(); }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::string text_ = "{}";
  std::uint64_t number_ = 0;
};

}  // namespace

json dashboard_state(const fleet::controller& control) {
  auto reading = read_fleet(control);
  auto state = fleet_status_json(reading);
  state["time"] =
      cubridge::detail::format_time(std::chrono::floor<std::chrono::seconds>(system_clock::now()));
  state["server"] = control.connected_server();
  for (std::size_t i = 0; i < reading.nodes.size(); ++i) {
    const auto& beat = reading.nodes[i].beat;
    auto health = beat ? wire_field(fleet::to_json(*beat), "health") : json(nullptr);
    state["nodes"][i]["health"] = health.is_object() ? std::move(health) : json::object();
  }
  for (std::size_t i = 0; i < reading.modules.size(); ++i) {
    const auto& s = reading.modules[i].state;
    auto& m = state["modules"][i];
    m["waves"] = wire_field(fleet::to_json(s), "waves");
    m["analysis"] =
        s.phase == fleet::rollout_phase::canary ? analysis_json(s, reading.nodes) : json(nullptr);
    m["timeline"] = timeline_json(control.desired_history(s.module));
  }
  return state;
}

namespace {

// A thread per connection, at most `cap` at once (over it the acceptor serves the connection
// itself). A connection that sends nothing holds only its own thread, until the read timeout:
// /state never waits behind idle connections, as it would behind a fixed pool they fill.
class connection_threads : public httplib::TaskQueue {
 public:
  explicit connection_threads(std::size_t cap) : cap_(cap) {}
  void enqueue(std::function<void()> serve) override {
    {
      std::lock_guard lock(mutex_);
      if (running_ < cap_) {
        ++running_;
        std::thread([this, serve = std::move(serve)] {
          serve();
          std::lock_guard done(mutex_);
          if (--running_ == 0) idle_.notify_all();
        }).detach();
        return;
      }
    }
    serve();
  }
  void shutdown() override {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [&] { return running_ == 0; });
  }

 private:
  std::size_t cap_;
  std::mutex mutex_;
  std::condition_variable idle_;
  std::size_t running_ = 0;
};

// The pages listening, in all and per client address.
class listener_slots {
 public:
  listener_slots(int total, int per_address) : total_(total), per_address_(per_address) {}
  /// Takes a slot for `address`; false when it has its share or all are taken.
  bool take(const std::string& address) {
    std::lock_guard lock(mutex_);
    auto& mine = by_address_[address];
    if (count_ >= total_ || mine >= per_address_) {
      if (mine == 0) by_address_.erase(address);
      return false;
    }
    ++mine;
    ++count_;
    return true;
  }
  void give_back(const std::string& address) {
    std::lock_guard lock(mutex_);
    --count_;
    if (--by_address_[address] <= 0) by_address_.erase(address);
  }

 private:
  int total_, per_address_;
  std::mutex mutex_;
  int count_ = 0;
  std::map<std::string, int> by_address_;
};

// Reads the fleet into the board; on a lost server, says so on the board (the page shows it)
// and on stderr, and connects again until it answers.
class fleet_reader {
 public:
  fleet_reader(const controller_factory& connect, std::unique_ptr<fleet::controller> control,
               snapshot_board& board)
      : connect_(connect), control_(std::move(control)), board_(board) {}
  [[nodiscard]] std::string server() const {
    return control_ ? control_->connected_server() : std::string("(not connected)");
  }
  void refresh() {
    try {
      if (!control_) {
        control_ = connect_();
        std::cerr << "cubridge: fleet dashboard: connected again to "
                  << control_->connected_server() << "\n";
      }
      last_ = dashboard_state(*control_);
      board_.put(last_.dump(-1, ' ', false, json::error_handler_t::replace));
    } catch (const std::exception& e) {
      const auto* x = dynamic_cast<const error*>(&e);
      if (!x || !x->is(fleet_errc::unreachable)) {
        std::cerr << "cubridge: fleet dashboard: reading the fleet: " << e.what() << "\n";
        return;
      }
      if (control_)
        std::cerr << "cubridge: fleet dashboard: lost the server (" << e.what()
                  << "): connecting again\n";
      control_.reset();
      if (!last_.is_object()) last_ = json::object();
      last_["disconnected"] = std::string("lost the server: connecting again (") + e.what() + ")";
      board_.put(last_.dump(-1, ' ', false, json::error_handler_t::replace));
    }
  }

 private:
  const controller_factory& connect_;
  std::unique_ptr<fleet::controller> control_;
  snapshot_board& board_;
  json last_;
};

}  // namespace

int serve_dashboard(const controller_factory& connect, const dashboard_options& options) {
  snapshot_board board;
  fleet_reader reader(connect, connect(), board);
  reader.refresh();
  listener_slots slots(options.max_listeners, options.max_listeners_per_address);

  httplib::Server server;
  server.new_task_queue = [] { return new connection_threads(256); };
  // Only SO_REUSEADDR: with httplib's default SO_REUSEPORT a second dashboard on the same port
  // would bind too and share its connections.
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  // A connection that sends no request within 2 s, or idles 2 s between requests, is closed.
  server.set_read_timeout(2, 0);
  server.set_keep_alive_timeout(2);
  server.set_write_timeout(5, 0);
  server.set_payload_max_length(1024);  // it takes no bodies
  const auto common = [](httplib::Response& res) {
    res.set_header("Cache-Control", "no-store");
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("Content-Security-Policy",
                   "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                   "connect-src 'self'; img-src 'self'");
  };
  server.Get("/", [&](const httplib::Request&, httplib::Response& res) {
    common(res);
    res.set_content(std::string(dashboard_page()), "text/html; charset=utf-8");
  });
  server.Get("/state", [&](const httplib::Request&, httplib::Response& res) {
    common(res);
    res.set_content(board.after(0, std::chrono::milliseconds(0)).first, "application/json");
  });
  server.Get("/events", [&](const httplib::Request& req, httplib::Response& res) {
    common(res);
    if (!slots.take(req.remote_addr)) {
      res.status = 503;
      res.set_content("too many pages listening (at most " +
                          std::to_string(options.max_listeners_per_address) + " per address, " +
                          std::to_string(options.max_listeners) + " in all)\n",
                      "text/plain");
      return;
    }
    auto seen = std::make_shared<std::uint64_t>(0);
    res.set_chunked_content_provider(
        "text/event-stream",
        [&board, seen](std::size_t, httplib::DataSink& sink) {
          if (stopping) return false;
          const auto [text, number] = board.after(*seen, std::chrono::seconds(15));
          const std::string event =
              number == *seen ? std::string(": still here\n\n") : "data: " + text + "\n\n";
          *seen = number;
          return sink.write(event.data(), event.size());
        },
        [&slots, address = req.remote_addr](bool) { slots.give_back(address); });
  });

  if (!server.bind_to_port(options.host, options.port)) {
    const int why = errno;
    std::cerr << "cubridge: fleet dashboard cannot listen on " << options.host << ":"
              << options.port << ": "
              << (why == EADDRINUSE ? std::string("the port is in use (another dashboard?)")
                                    : std::string(std::strerror(why)))
              << "\n";
    return 1;
  }
  ::signal(SIGINT, on_stop);
  ::signal(SIGTERM, on_stop);
  std::thread http([&] { server.listen_after_bind(); });
  std::cout << "dashboard at http://" << options.host << ":" << options.port << "/ (reading "
            << reader.server() << ")" << std::endl;
  while (!stopping) {
    std::this_thread::sleep_for(options.refresh);
    reader.refresh();
  }
  board.wake();
  server.stop();
  http.join();
  return 0;
}

}  // namespace cubridge::tool
