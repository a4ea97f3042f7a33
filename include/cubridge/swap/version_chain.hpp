#pragma once
// The bookkeeping under hot swap, free of CUDA so that it is tested on CPUs and under TSan:
// which version is current, which launches still use which version, and when an old version
// may be destroyed (for a module: unloaded).
//
//   - acquire() pins the current version for one launch (host side): a lease. A version is never
//     destroyed while a lease on it exists, so no launch races an unload.
//   - lease::record(stream, token) notes the GPU work the launch queued (for CUDA: an event
//     recorded on the launch's stream). Work on one stream completes in order, so only the
//     latest token per stream is kept: memory stays bounded however many launches run.
//   - promote(payload) makes a new version current atomically: every acquire() that starts after
//     promote() returns sees it, on every thread. The version it replaces stays loaded as the
//     rollback target; the one before that is retired. promote(payload, prepare) runs `prepare`
//     first: if it throws, nothing switched (all or nothing); the switch itself never throws.
//   - rollback() swaps current and previous (rollback(prepare) likewise all or nothing).
//   - Each version carries its version_origin (where it came from: a bundle version, a signing
//     key, a source name, when it was staged). held() tells, at one instant, which version
//     serves, which one a rollback returns to and which are retired, each with its origin: the
//     chain is the one place that knows it (the update endpoint and its sink read it here).
//   - reclaim(done) destroys retired versions that no lease pins and whose every token is done.
//     Call it from a background thread (hot_module does, with detail::run_reclaimer below),
//     never from a serving thread.

#include <cubridge/core/error.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace cubridge {

/// Where a version came from. Versions promoted by a watched directory or by hand carry no
/// label (0) and no signer; the update layer's sink (hot_module_sink.hpp) stages each bundle
/// with its signed version as the label and its signing key as the signer.
struct version_origin {
  /// A number its promoter gives the version, to tell versions apart across restarts (the
  /// update layer: the signed bundle's version); 0: none.
  std::uint64_t label = 0;
  /// Who vouched for the code, in words (the update layer: the signing key's id in hex); empty
  /// when nobody did.
  std::string signer{};
  /// Where the code came from, in words: a file, "bundle v7", "load".
  std::string source{};
  /// When it was staged (loaded and validated); the epoch when unknown.
  std::chrono::system_clock::time_point staged_at{};
};

/// One version as version_chain::held() reports it: its chain id (grows with every promote,
/// never a bundle version) and where it came from.
struct held_version {
  std::uint64_t id = 0;
  version_origin origin{};
};

/// The versions of a chain at one instant.
struct held_versions {
  held_version serving{};                       ///< the current version
  std::optional<held_version> rollback_target;  ///< what rollback() would make current
  std::vector<held_version> retired;  ///< replaced, not yet destroyed (pinned or GPU work left)
};

/// Versions of a Payload (for hot swap: a loaded module). Thread-safe. `StreamKey` names where
/// GPU work was queued (a CUstream); `Token` marks its completion (a CUevent).
template <class Payload, class StreamKey, class Token>
class version_chain {
 public:
  /// One version: an id that grows with every promote, the payload and where it came from.
  struct version {
    version(std::uint64_t id_, Payload payload_, version_origin origin_)
        : id(id_),
          serial(next_serial()),
          payload(std::move(payload_)),
          origin(std::move(origin_)) {}
    const std::uint64_t id;
    /// Unique in the process, never reused (unlike the address): a key for per-thread caches.
    const std::uint64_t serial;
    const Payload payload;
    const version_origin origin;

   private:
    friend class version_chain;
    mutable std::atomic<long> leases{0};  // live leases; reclaim reads it with acquire
    mutable std::mutex mutex{};
    // Streams this version's launches used, each with the token of its latest work, or none
    // yet (then reclaim() makes one: an event recorded once no launch can add more work).
    mutable std::vector<std::pair<StreamKey, std::optional<Token>>> pending{};
  };

  /// A launch's pin on one version. Cheap to move; copy it into whatever outlives the launch.
  class lease {
   public:
    lease(const lease& other) noexcept : version_(other.version_) { pin(); }
    lease(lease&& other) noexcept : version_(std::move(other.version_)) {}
    lease& operator=(lease other) noexcept {
      std::swap(version_, other.version_);
      return *this;
    }
    ~lease() { unpin(); }

    [[nodiscard]] const version& get() const noexcept { return *version_; }
    [[nodiscard]] const Payload& payload() const noexcept { return version_->payload; }
    [[nodiscard]] std::uint64_t id() const noexcept { return version_->id; }
    [[nodiscard]] std::uint64_t serial() const noexcept { return version_->serial; }
    /// Notes that work using this version was queued on `stream` and is complete when `token`
    /// is; replaces an older token of the same stream.
    void record(const StreamKey& stream, Token token) const { set(stream, std::move(token)); }
    /// Notes that work using this version was queued on `stream`, without a token: reclaim()
    /// makes one later, after the last lease is gone (cheaper than an event per launch).
    void note(const StreamKey& stream) const { set(stream, std::nullopt); }

   private:
    friend class version_chain;
    explicit lease(std::shared_ptr<const version> v) noexcept : version_(std::move(v)) { pin(); }
    void set(const StreamKey& stream, std::optional<Token> token) const {
      std::lock_guard lock(version_->mutex);
      for (auto& [key, latest] : version_->pending)
        if (key == stream) {
          latest = std::move(token);
          return;
        }
      version_->pending.emplace_back(stream, std::move(token));
    }
    void pin() const noexcept {
      if (version_) version_->leases.fetch_add(1, std::memory_order_relaxed);
    }
    // Release: this lease's record() calls happen before reclaim() sees the count drop.
    void unpin() const noexcept {
      if (version_) version_->leases.fetch_sub(1, std::memory_order_release);
    }
    std::shared_ptr<const version> version_;
  };

  /// Counts for reports and tests.
  struct stats {
    std::uint64_t current_id = 0;
    std::uint64_t promotions = 0;
    std::size_t retired = 0;  ///< waiting for leases or GPU work, or being destroyed
    std::uint64_t reclaimed = 0;
  };

  /// A chain whose first version (id 1) holds `first`, which came from `origin`.
  explicit version_chain(Payload first, version_origin origin = {})
      : current_(std::make_shared<const version>(1, std::move(first), std::move(origin))),
        next_id_(2) {}

  version_chain(const version_chain&) = delete;
  version_chain& operator=(const version_chain&) = delete;

  /// Pins the current version: a pointer copy under a mutex of its own, held for nanoseconds.
  /// (std::atomic<std::shared_ptr> would do, but libstdc++ 12 implements it with a lock that
  /// ThreadSanitizer cannot see, and this code must be provably race-free under TSan.)
  [[nodiscard]] lease acquire() const {
    std::lock_guard lock(current_mutex_);
    return lease(current_);
  }

  /// Makes `payload` the current version; returns its id. The replaced version becomes the
  /// rollback target; the previous rollback target is retired.
  std::uint64_t promote(Payload payload) { return promote(std::move(payload), version_origin{}); }
  /// As promote(payload), for a version that came from `origin`.
  std::uint64_t promote(Payload payload, version_origin origin) {
    return promote(std::move(payload), std::move(origin), [](const version&, const version&) {});
  }

  /// As promote(payload), all or nothing: first `prepare(from, to)` runs, under the writers'
  /// lock (no other promote, rollback or reclaim meanwhile), with `from` the current version and
  /// `to` the new one, which acquire() cannot see yet. If it throws, nothing changed: the new
  /// version is destroyed (after the lock is released), its id is not used, and the exception
  /// propagates. The switch after it does not throw.
  template <class Prepare>
  std::uint64_t promote(Payload payload, Prepare&& prepare) {
    return promote(std::move(payload), version_origin{}, std::forward<Prepare>(prepare));
  }
  /// As promote(payload, prepare), for a version that came from `origin`.
  template <class Prepare>
  std::uint64_t promote(Payload payload, version_origin origin, Prepare&& prepare) {
    std::shared_ptr<const version> fresh;  // before the lock: if prepare throws, destroyed after it
    std::lock_guard lock(writer_mutex_);
    fresh = std::make_shared<const version>(next_id_, std::move(payload), std::move(origin));
    const auto from = current();
    // Room first: once prepare() returns, nothing may throw. A caller that switches several
    // chains together (hot_module_group) switches the others inside prepare().
    if (previous_) retired_.reserve(retired_.size() + 1);
    prepare(std::as_const(*from), std::as_const(*fresh));
    const auto id = next_id_++;
    auto replaced = exchange_current(std::move(fresh));
    if (previous_) retired_.push_back(std::move(previous_));
    previous_ = std::move(replaced);
    ++promotions_;
    return id;
  }

  /// Makes the previous version current again (and the current one the rollback target).
  /// @throws error (errc::precondition) when there is no previous version.
  std::uint64_t rollback() {
    return rollback([](const version&, const version&) {});
  }

  /// As rollback(), all or nothing: `prepare(from, to)` runs first, under the writers' lock,
  /// with `from` the current version and `to` the previous one; if it throws, nothing changed.
  /// @throws error (errc::precondition) when there is no previous version (prepare not run).
  template <class Prepare>
  std::uint64_t rollback(Prepare&& prepare) {
    std::lock_guard lock(writer_mutex_);
    CUBRIDGE_EXPECTS(previous_ != nullptr, "rollback with no previous version");
    const auto from = current();
    prepare(std::as_const(*from), std::as_const(*previous_));
    const auto id = previous_->id;
    previous_ = exchange_current(std::move(previous_));
    ++promotions_;
    return id;
  }

  /// Id of the version a rollback would return to, if any.
  [[nodiscard]] std::optional<std::uint64_t> previous_id() const {
    std::lock_guard lock(writer_mutex_);
    if (!previous_) return std::nullopt;
    return previous_->id;
  }

  /// The serving version, the rollback target and the retired versions (oldest first), each
  /// with its id and origin, all at one instant (no promote or rollback in between). Versions a
  /// reclaim() call is destroying right now are no longer listed.
  [[nodiscard]] held_versions held() const {
    std::lock_guard lock(writer_mutex_);
    held_versions out;
    {
      std::lock_guard current_lock(current_mutex_);
      out.serving = {current_->id, current_->origin};
    }
    if (previous_) out.rollback_target = held_version{previous_->id, previous_->origin};
    out.retired.reserve(retired_.size());
    for (const auto& v : retired_) out.retired.push_back({v->id, v->origin});
    return out;
  }

  /// Destroys retired versions that nothing pins and whose tokens are all done (`done(token)`
  /// returns true). A stream noted without a token gets one from `make_token(stream)` once the
  /// version is unpinned. `done` and `make_token` (driver calls, for CUDA) run without the
  /// chain's lock, so promote() never waits for them; payload destructors (module unloads) run
  /// here, on the caller's thread, outside every lock. If `done` or `make_token` throws for a
  /// version, `on_failure(id, exception)` is called (outside every lock) and that version stays
  /// retired for a later call; the others are still reclaimed. Returns how many were destroyed.
  template <class DonePredicate, class MakeToken, class OnFailure>
  std::size_t reclaim(DonePredicate&& done, MakeToken&& make_token, OnFailure&& on_failure) {
    // Unpinned retired versions stay unpinned: no lease on them can appear (a lease is pinned
    // under current_mutex_, before promote() swapped it out and retired it under writer_mutex_).
    std::vector<std::shared_ptr<const version>> candidates;
    {
      std::lock_guard lock(writer_mutex_);
      for (const auto& v : retired_)
        if (v->leases.load(std::memory_order_acquire) == 0) candidates.push_back(v);
    }
    std::vector<const version*> finished;
    for (const auto& v : candidates) {
      bool all = false;
      try {
        all = all_done(*v, done, make_token);
      } catch (...) {
        on_failure(v->id, std::current_exception());
      }
      if (all) finished.push_back(v.get());
    }
    std::vector<std::shared_ptr<const version>> doomed;
    if (!finished.empty()) {
      std::lock_guard lock(writer_mutex_);
      for (auto it = retired_.begin(); it != retired_.end();) {
        if (std::find(finished.begin(), finished.end(), it->get()) != finished.end()) {
          doomed.push_back(std::move(*it));
          it = retired_.erase(it);
        } else {
          ++it;
        }
      }
      unloading_ += doomed.size();
    }
    const auto n = doomed.size();
    candidates.clear();
    doomed.clear();  // the last references: destroy outside the lock
    if (n) {
      // Counted as reclaimed once destroyed, and as retired until then: the stats never show a
      // version that is in neither.
      std::lock_guard lock(writer_mutex_);
      unloading_ -= n;
      reclaimed_ += n;
    }
    return n;
  }

  /// As above; an exception from `done` or `make_token` propagates (later versions are left
  /// for the next call).
  template <class DonePredicate, class MakeToken>
  std::size_t reclaim(DonePredicate&& done, MakeToken&& make_token) {
    return reclaim(done, make_token,
                   [](std::uint64_t, const std::exception_ptr& e) { std::rethrow_exception(e); });
  }

  /// Gives every version that noted `stream` a fresh token from `make_token(stream)`, now. For a
  /// stream about to be destroyed: reclaim() could not make a token on it later.
  template <class MakeToken>
  void seal_stream(const StreamKey& stream, MakeToken&& make_token) {
    std::vector<std::shared_ptr<const version>> versions;
    {
      std::lock_guard lock(writer_mutex_);
      versions = retired_;
      if (previous_) versions.push_back(previous_);
    }
    {
      std::lock_guard lock(current_mutex_);
      versions.push_back(current_);
    }
    for (const auto& v : versions) {
      std::lock_guard lock(v->mutex);
      for (auto& [key, token] : v->pending)
        if (key == stream) token = make_token(stream);
    }
  }

  /// As above, for callers that record every token themselves.
  template <class DonePredicate>
  std::size_t reclaim(DonePredicate&& done) {
    return reclaim(done, [](const StreamKey&) -> Token {
      throw std::logic_error("version_chain: a stream was noted without a token");
    });
  }

  [[nodiscard]] stats get_stats() const {
    std::lock_guard lock(writer_mutex_);
    return {acquire().id(), promotions_, retired_.size() + unloading_, reclaimed_};
  }

 private:
  static std::uint64_t next_serial() noexcept {
    static std::atomic<std::uint64_t> counter{1};
    return counter.fetch_add(1, std::memory_order_relaxed);
  }

  template <class DonePredicate, class MakeToken>
  static bool all_done(const version& v, DonePredicate& done, MakeToken& make_token) {
    std::lock_guard lock(v.mutex);
    bool all = true;
    for (auto& [stream, token] : v.pending) {
      if (!token) token = make_token(stream);
      all = all && done(*token);
    }
    return all;
  }

  std::shared_ptr<const version> current() const {
    std::lock_guard lock(current_mutex_);
    return current_;
  }

  std::shared_ptr<const version> exchange_current(std::shared_ptr<const version> next) {
    std::lock_guard lock(current_mutex_);
    std::swap(current_, next);
    return next;
  }

  mutable std::mutex current_mutex_;  // guards current_ only; never held while calling out
  std::shared_ptr<const version> current_;
  mutable std::mutex writer_mutex_;  // promote, rollback, reclaim, stats
  std::shared_ptr<const version> previous_;
  std::vector<std::shared_ptr<const version>> retired_;
  std::uint64_t next_id_;
  std::uint64_t promotions_ = 0;
  std::uint64_t reclaimed_ = 0;
  std::size_t unloading_ = 0;  // taken off retired_, being destroyed by a reclaim() call
};

namespace detail {

/// Wakes a background reclaimer with no lost wake-up: notify() counts a generation under the
/// mutex that wait() checks, so a notify() that comes between the reclaimer's last look at the
/// chain and its wait still wakes it.
class reclaim_signal {
 public:
  /// There may be work (a version was retired): call after the change is made.
  void notify() {
    {
      std::lock_guard lock(mutex_);
      ++generation_;
    }
    wake_.notify_all();
  }

  /// Ends the reclaimer: every wait() from now on returns false at once.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
  }

  /// The number of notify() calls so far; the first `seen` to give wait().
  [[nodiscard]] std::uint64_t generation() const {
    std::lock_guard lock(mutex_);
    return generation_;
  }

  /// Blocks until notify() has been called since `seen` was read, stop() was called, or
  /// `timeout` (if any) passed; then sets `seen` to the generation now. Returns false once
  /// stop() was called.
  bool wait(std::uint64_t& seen, std::optional<std::chrono::milliseconds> timeout) {
    std::unique_lock lock(mutex_);
    const auto woken = [&] { return stopping_ || generation_ != seen; };
    if (timeout)
      wake_.wait_for(lock, *timeout, woken);
    else
      wake_.wait(lock, woken);
    seen = generation_;
    return !stopping_;
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::uint64_t generation_ = 0;
  bool stopping_ = false;
};

/// What one reclaim pass left behind.
struct reclaim_pass {
  bool waiting = false;  ///< retired versions remain (pinned, or their GPU work still runs)
  bool failed = false;   ///< a step failed (see hot_module_stats::reclaim_failures)
};

/// The background reclaimer's loop, until `signal.stop()`: runs `pass()` (returning a
/// reclaim_pass) at once and after every notify(); while versions are waiting it polls every
/// `poll`, after a failed pass every `failure_poll` (a stuck failure must not spin or flood the
/// failure report). `before_wait()` runs between a pass and the wait after it, where a wake-up
/// used to be lost: a seam for tests to force that interleaving.
template <class Pass, class BeforeWait>
void run_reclaimer(reclaim_signal& signal, Pass&& pass, std::chrono::milliseconds poll,
                   std::chrono::milliseconds failure_poll, BeforeWait&& before_wait) {
  // Read before the pass: a notify() after this point makes the next wait() return at once,
  // and the change it announces was made before it, so the pass after that wait sees it.
  auto seen = signal.generation();
  for (;;) {
    const reclaim_pass result = pass();
    before_wait();
    std::optional<std::chrono::milliseconds> timeout;
    if (result.failed)
      timeout = failure_poll;
    else if (result.waiting)
      timeout = poll;
    if (!signal.wait(seen, timeout)) return;
  }
}

}  // namespace detail

}  // namespace cubridge
