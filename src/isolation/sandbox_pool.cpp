// A sandbox's workers: the slots that serve calls, the spares kept ready beside them, the
// background thread that starts spares and reaps failed workers, the replacement of a failed
// worker, restart, the shares mapped ahead in idle workers and spares, the stats and the shutdown.
#include "sandbox_state.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

namespace cubridge {

namespace protocol = detail::sandbox_protocol;
using sandbox_internal::worker;
using clock_type = std::chrono::steady_clock;

namespace {
// A spare that cannot start (the worker or library gone, the device full) is retried, less and
// less often, rather than in a tight loop.
constexpr std::chrono::milliseconds first_retry{100};
constexpr std::chrono::milliseconds last_retry{30'000};
}  // namespace

bool sandbox_internal::map_buffers(worker& w, const shared_buffers& buffers,
                                   std::chrono::milliseconds timeout, int cancel_fd) noexcept {
  try {
    for (std::size_t from = 0; from < buffers.size(); from += protocol::max_fds) {
      protocol::map_message message;
      std::vector<int> fds;
      const std::size_t to = std::min(buffers.size(), from + protocol::max_fds);
      for (std::size_t i = from; i < to; ++i) {
        const auto& [id, b] = buffers[i];
        message.buffers.push_back({id, b->size, b->host_address, true, b->device});
        fds.push_back(b->fd.get());
        w.sent.insert(id);
      }
      protocol::send_frame(w.process.socket(), protocol::message_type::map,
                           protocol::encode(message), fds);
      const auto deadline = clock_type::now() + timeout;
      if (wait_socket_or_cancel(w.process.socket(), cancel_fd, deadline) <= 0) return false;
      protocol::frame f;
      if (protocol::receive_frame(w.process.socket(), f, deadline) !=
              protocol::receive_status::ok ||
          f.type != protocol::message_type::mapped)
        return false;
      // A buffer it could not map stays unmapped: the first call that uses it sends the fd
      // again and reports why it fails (buffer_import_failed), as it would without a spare.
      for (const auto id : protocol::decode_mapped(f.payload).ids) w.mapped.insert(id);
    }
    return true;
  } catch (...) {
    return false;  // a dead socket, a malformed answer
  }
}

std::unique_ptr<worker> sandbox_internal::sandbox_state::start_worker(std::string& failure,
                                                                      int cancel_fd) {
  auto w = std::make_unique<worker>();
  const auto started = clock_type::now();
  failure = w->process.start({worker_path, options.library, options.device, options.initialize_cuda,
                              options.start_timeout, worker_environment, cancel_fd},
                             w->cuda_status);
  if (!failure.empty()) return nullptr;
  w->start_duration = clock_type::now() - started;
  return w;
}

void sandbox_internal::sandbox_state::note_started(const worker& w) {
  last_start = w.start_duration;
  cuda_status = w.cuda_status;
}

void sandbox_internal::sandbox_state::start_pool() {
  slots.resize(options.workers);
  for (auto& s : slots) {
    std::string failure;
    auto w = start_worker(failure);
    if (!w)
      throw sandbox_error(sandbox_failure::start_failed, "sandbox::start",
                          "sandbox '" + name + "': worker " + worker_path.string() + " for " +
                              options.library.string() + ": " + failure,
                          false, {});
    std::lock_guard lock(mutex);
    note_started(*w);
    s.w = std::move(w);
  }
  if (options.standby == 0) return;
  // Without an eventfd the destructor still works; it may wait for a spare's start to end.
  cancel.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  reaps_in_background = true;
  background = std::thread([this] { background_loop(); });
}

void sandbox_internal::sandbox_state::background_loop() noexcept {
  std::unique_lock lock(mutex);
  auto retry_after = first_retry;
  auto retry_at = clock_type::time_point::min();
  while (!stopping) {
    if (!retired.empty()) {
      // Reaped first: a dead worker's device memory is freed before a new context is made.
      auto batch = std::exchange(retired, {});
      lock.unlock();
      for (auto& w : batch) (void)w->process.kill_and_reap();
      batch.clear();
      lock.lock();
      continue;
    }
    const bool wanted = spares.size() + spares_starting < options.standby;
    if (wanted && clock_type::now() >= retry_at) {
      if (start_spare(lock)) {
        retry_after = first_retry;
      } else {
        retry_at = clock_type::now() + retry_after;
        retry_after = std::min(retry_after * 2, last_retry);
      }
      continue;
    }
    if (wanted)
      background_wake.wait_until(lock, retry_at);
    else
      background_wake.wait(lock);
  }
}

bool sandbox_internal::sandbox_state::start_spare(std::unique_lock<std::mutex>& lock) {
  ++spares_starting;
  lock.unlock();
  std::string failure;
  auto w = start_worker(failure, cancel.get());
  lock.lock();
  const bool ready = w && map_missing(*w, lock, cancel.get()) && !stopping;
  --spares_starting;
  if (!ready) {
    if (!w && !stopping) ++counters.spare_start_failures;
    dispose(std::move(w), lock);
    spares_changed.notify_all();
    return false;
  }
  note_started(*w);
  forget_unshared(*w);  // shares that ended while it was being mapped
  spares.push_back(std::move(w));
  ++counters.spares_started;
  spares_changed.notify_all();
  return true;
}

bool sandbox_internal::sandbox_state::map_missing(worker& w, std::unique_lock<std::mutex>& lock,
                                                  int cancel_fd) {
  for (;;) {
    sandbox_internal::shared_buffers todo;
    for (const auto& [id, b] : shares)
      if (!w.sent.contains(id)) todo.emplace_back(id, b);
    if (todo.empty()) return true;
    lock.unlock();
    const bool alive = sandbox_internal::map_buffers(w, todo, options.start_timeout, cancel_fd);
    lock.lock();
    if (!alive) return false;
  }
}

void sandbox_internal::sandbox_state::dispose(std::unique_ptr<worker> w,
                                              std::unique_lock<std::mutex>& lock) noexcept {
  if (!w) return;
  w->process.signal_kill();  // at once: a hung or dying worker must not run on meanwhile
  if (reaps_in_background && !stopping) {
    retired.push_back(std::move(w));
    background_wake.notify_one();
    return;
  }
  lock.unlock();
  (void)w->process.kill_and_reap();
  w.reset();
  lock.lock();
}

std::unique_ptr<worker> sandbox_internal::sandbox_state::take_spare(
    std::unique_lock<std::mutex>& lock) {
  while (!spares.empty()) {
    auto spare = std::move(spares.front());
    spares.erase(spares.begin());
    background_wake.notify_one();  // a replacement is wanted
    spares_changed.notify_all();
    // A spare can die idle (a library thread of its own crashed): then it cannot take over.
    if (spare->process.idle_and_alive()) return spare;
    dispose(std::move(spare), lock);
  }
  return nullptr;
}

void sandbox_internal::sandbox_state::forget_unshared(worker& w) noexcept {
  for (auto it = w.sent.begin(); it != w.sent.end();) {
    if (shares.contains(*it)) {
      ++it;
      continue;
    }
    try {
      protocol::send_frame(w.process.socket(), protocol::message_type::unshare,
                           protocol::encode(protocol::unshare_message{*it}));
    } catch (...) {
      // A dead worker took its mappings with it; the next call notices the death.
    }
    w.mapped.erase(*it);
    it = w.sent.erase(it);
  }
}

std::size_t sandbox_internal::sandbox_state::acquire(const std::string& entry) {
  std::unique_lock lock(mutex);
  for (;;) {
    for (std::size_t i = 0; i < slots.size(); ++i)
      if (slots[i].w && !slots[i].busy) {
        slots[i].busy = true;
        return i;
      }
    for (std::size_t i = 0; i < slots.size(); ++i)
      if (!slots[i].w && !slots[i].busy) {
        slots[i].busy = true;
        fill(i, lock, entry);
        return i;
      }
    slot_freed.wait(lock);
  }
}

void sandbox_internal::sandbox_state::fill(std::size_t index, std::unique_lock<std::mutex>& lock,
                                           const std::string& entry) {
  if (auto spare = take_spare(lock)) {
    slots[index].w = std::move(spare);
    return;
  }
  const auto started = clock_type::now();
  lock.unlock();
  std::string failure;
  auto w = start_worker(failure);
  lock.lock();
  if (!w) {
    slots[index].busy = false;
    slot_freed.notify_all();
    throw sandbox_error(sandbox_failure::start_failed, sandbox_internal::call_name(entry),
                        "sandbox '" + name + "': starting worker " + worker_path.string() +
                            " for " + options.library.string() + " failed: " + failure,
                        false, clock_type::now() - started);
  }
  note_started(*w);
  slots[index].w = std::move(w);
}

void sandbox_internal::sandbox_state::release(std::size_t index) noexcept {
  std::lock_guard lock(mutex);
  if (slots[index].w) forget_unshared(*slots[index].w);
  slots[index].busy = false;
  slot_freed.notify_all();
}

void sandbox_internal::sandbox_state::abandon(std::size_t index) noexcept {
  std::unique_lock lock(mutex);
  dispose(std::move(slots[index].w), lock);
  slots[index].busy = false;
  slot_freed.notify_all();
}

sandbox_internal::replacement sandbox_internal::sandbox_state::replace(
    std::size_t index, clock_type::time_point seen) {
  std::unique_lock lock(mutex);
  auto& s = slots[index];  // slots never grow or shrink while calls run
  dispose(std::move(s.w), lock);
  ++counters.failures;
  sandbox_internal::replacement r;
  if (options.standby > 0) {
    if (auto spare = take_spare(lock)) {
      r.how = sandbox_recovery::spare_promoted;
      r.duration = clock_type::now() - seen;
      r.note =
          "; standby worker pid " + std::to_string(spare->process.pid()) + " serves the next call";
      s.w = std::move(spare);
      ++counters.failovers;
      s.busy = false;
      slot_freed.notify_all();
      return r;
    }
  }
  // No spare ready: started here, as without standby; the slot stays held meanwhile.
  lock.unlock();
  std::string failure;
  auto fresh = start_worker(failure);
  lock.lock();
  ++counters.restarts;
  r.duration = clock_type::now() - seen;
  if (fresh) {
    note_started(*fresh);
    r.how = sandbox_recovery::restarted;
    s.w = std::move(fresh);
  } else {
    r.note = "; the worker could NOT be restarted: " + failure;
  }
  s.busy = false;
  slot_freed.notify_all();
  return r;
}

std::pair<std::string, std::chrono::nanoseconds> sandbox_internal::sandbox_state::restart_all() {
  const auto started = clock_type::now();
  std::unique_lock lock(mutex);
  slot_freed.wait(lock, [&] {
    return std::none_of(slots.begin(), slots.end(), [](const slot& s) { return s.busy; });
  });
  std::vector<std::unique_ptr<worker>> old;
  for (auto& s : slots) {
    s.busy = true;
    if (s.w) old.push_back(std::move(s.w));
  }
  for (auto& spare : spares) old.push_back(std::move(spare));
  spares.clear();
  spares_changed.notify_all();
  lock.unlock();
  for (auto& w : old) w->process.signal_kill();
  old.clear();  // each reaped by its destructor
  std::string first_failure;
  std::vector<std::unique_ptr<worker>> fresh(slots.size());
  for (auto& w : fresh) {
    std::string failure;
    w = start_worker(failure);
    if (!w && first_failure.empty()) first_failure = failure;
  }
  lock.lock();
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (fresh[i]) note_started(*fresh[i]);
    slots[i].w = std::move(fresh[i]);
    slots[i].busy = false;
    ++counters.restarts;
  }
  slot_freed.notify_all();
  background_wake.notify_one();
  return {first_failure, clock_type::now() - started};
}

void sandbox_internal::sandbox_state::map_ahead(std::uint64_t id,
                                                std::unique_lock<std::mutex>& lock) {
  const sandbox_internal::shared_buffers one{{id, shares.at(id)}};
  // Under the lock: no call takes an idle worker, no failure a spare, while its socket is in use
  // here. A worker that dies meanwhile is replaced as after a failure.
  std::vector<std::unique_ptr<worker>> dead;
  for (auto& s : slots)
    if (s.w && !s.busy && !sandbox_internal::map_buffers(*s.w, one, options.start_timeout, -1))
      dead.push_back(std::move(s.w));  // the slot is filled again by the next call
  for (auto it = spares.begin(); it != spares.end();) {
    if (sandbox_internal::map_buffers(**it, one, options.start_timeout, -1)) {
      ++it;
    } else {
      dead.push_back(std::move(*it));
      it = spares.erase(it);
    }
  }
  if (dead.empty()) return;
  for (auto& w : dead) dispose(std::move(w), lock);
  slot_freed.notify_all();
  spares_changed.notify_all();
  background_wake.notify_one();
}

void sandbox_internal::sandbox_state::unshare(std::uint64_t id) noexcept {
  std::lock_guard lock(mutex);
  if (shares.erase(id) == 0) return;
  // A busy worker forgets it when its call ends (release), a starting spare when it is ready.
  for (auto& s : slots)
    if (s.w && !s.busy) forget_unshared(*s.w);
  for (auto& spare : spares) forget_unshared(*spare);
}

bool sandbox_internal::sandbox_state::wait_for_standby(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mutex);
  return spares_changed.wait_for(lock, timeout, [&] {
    return spares.size() >= options.standby || stopping;
  }) && spares.size() >= options.standby;
}

sandbox_stats sandbox_internal::sandbox_state::stats() const {
  std::lock_guard lock(mutex);
  sandbox_stats st = counters;
  st.workers = st.busy = 0;
  for (const auto& s : slots) {
    st.worker_pids.push_back(s.w ? s.w->process.pid() : 0);
    if (!s.w) continue;
    ++st.workers;
    if (s.busy) ++st.busy;
  }
  st.spares_ready = spares.size();
  st.spares_starting = spares_starting;
  for (const auto& spare : spares) st.spare_pids.push_back(spare->process.pid());
  return st;
}

void sandbox_internal::sandbox_state::shutdown() noexcept {
  std::unique_lock lock(mutex);
  if (shut_down) return;
  shut_down = stopping = true;
  if (cancel) {
    const std::uint64_t one = 1;
    (void)!::write(cancel.get(), &one, sizeof one);
  }
  background_wake.notify_all();
  spares_changed.notify_all();
  lock.unlock();
  if (background.joinable()) background.join();
  lock.lock();
  std::vector<std::unique_ptr<worker>> all = std::exchange(retired, {});
  for (auto& s : slots)
    if (s.w) all.push_back(std::move(s.w));
  for (auto& spare : spares) all.push_back(std::move(spare));
  spares.clear();
  lock.unlock();
  // Every socket closed first, so that the workers exit side by side, then each reaped.
  for (auto& w : all) w->process.close_socket();
  for (auto& w : all) w->process.stop();
}

}  // namespace cubridge
