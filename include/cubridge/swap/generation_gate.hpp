#pragma once
// Switching several version chains (one per device) as one: the bookkeeping of a
// hot_module_group (hot_module_group.hpp), kept apart from CUDA so that CI tests it.
//
// A group switch runs every member's fallible work first, nested: member 0's step checks its
// version, then calls `inner`, which runs member 1's step, and so on; the innermost `inner` closes
// the gate; then each step switches its member on the way out (a pointer swap that cannot fail),
// member n-1 first, member 0 last; then the gate opens. If any step throws before the gate
// closes, every step before it undoes its own work as the exception passes, and no member has
// switched. Switches of a group are serialised.
//
// Readers pin one generation: pin(acquire) runs `acquire` (which takes each member's current
// version) while the gate is open and retries it if a switch closed the gate meanwhile (a
// sequence lock: the writer never waits for readers, readers wait only for the switch itself,
// microseconds). So a pin never mixes the versions of two generations.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

namespace cubridge {

/// One generation of a group: its id and each member's version (chain id), in member order.
struct generation {
  /// 1 for the versions loaded first, +1 per promote; a rollback returns to the previous id.
  std::uint64_t id = 0;
  std::vector<std::uint64_t> member_versions{};
  friend bool operator==(const generation&, const generation&) = default;
};

/// The generations of a group and the gate its switches close. Thread-safe.
class generation_gate {
 public:
  /// One member's switch: does the member's fallible work, calls `inner` (the members after
  /// it), switches the member once `inner` returned and returns the member's new version id.
  /// If `inner` throws it undoes its own work and lets the exception pass.
  using step = std::function<std::uint64_t(std::size_t member, const std::function<void()>& inner)>;

  /// A group whose members serve `first_versions` (generation 1).
  explicit generation_gate(std::vector<std::uint64_t> first_versions)
      : current_{1, std::move(first_versions)}, current_id_(1) {}

  generation_gate(const generation_gate&) = delete;
  generation_gate& operator=(const generation_gate&) = delete;

  /// Switches every member to a new generation through `member_step` (see step), all or nothing.
  /// Returns the new generation. @throws what a step throws; then nothing switched.
  generation promote(const step& member_step) {
    std::lock_guard lock(writer_);
    auto next = switch_all(member_step, next_id_);
    ++next_id_;
    previous_ = std::exchange(current_, std::move(next));
    return current_;
  }

  /// Switches every member back to the previous generation through `member_step`, all or
  /// nothing, and returns it; nullopt, with no step run, when there is none.
  /// @throws what a step throws; then nothing switched.
  std::optional<generation> rollback(const step& member_step) {
    std::lock_guard lock(writer_);
    if (!previous_) return std::nullopt;
    auto back = switch_all(member_step, previous_->id);
    previous_ = std::exchange(current_, std::move(back));
    return current_;
  }

  /// Runs `acquire()` (which pins each member's current version) with no switch under way, and
  /// returns what it returned together with the id of the generation it pinned. `acquire` may
  /// run more than once (what an earlier run returned is dropped first).
  template <class Acquire>
  auto pin(Acquire&& acquire) const -> std::pair<decltype(acquire()), std::uint64_t> {
    for (;;) {
      const auto before = sequence_.load(std::memory_order_acquire);
      if (before % 2 == 1) {  // a switch is closing the gate: its members are changing now
        std::this_thread::yield();
        continue;
      }
      // No fences (ThreadSanitizer cannot see them): the members' versions are read under their
      // chains' mutexes, which a switch takes after closing the gate, and the id is an acquire
      // load of a release store made while closed; either way a reader that saw anything of a
      // switch sees the gate's count moved on below and tries again.
      auto pinned = acquire();
      const auto id = current_id_.load(std::memory_order_acquire);
      if (sequence_.load(std::memory_order_acquire) == before) return {std::move(pinned), id};
    }
  }

  /// The serving generation.
  [[nodiscard]] generation current() const {
    std::lock_guard lock(writer_);
    return current_;
  }
  /// What rollback() returns to, if anything.
  [[nodiscard]] std::optional<generation> previous() const {
    std::lock_guard lock(writer_);
    return previous_;
  }
  /// Switches made so far (promotes and rollbacks); a test and report counter.
  [[nodiscard]] std::uint64_t switches() const noexcept {
    return sequence_.load(std::memory_order_relaxed) / 2;
  }

 private:
  generation switch_all(const step& member_step, std::uint64_t id) {
    const std::size_t members = current_.member_versions.size();
    generation next{id, std::vector<std::uint64_t>(members, 0)};
    bool closed = false;
    std::function<void(std::size_t)> run = [&](std::size_t i) {
      if (i == members) {
        // Every member's fallible work is done: close the gate; the steps switch as they return.
        sequence_.fetch_add(1, std::memory_order_acq_rel);
        closed = true;
        return;
      }
      next.member_versions[i] = member_step(i, [&] { run(i + 1); });
    };
    try {
      run(0);
    } catch (...) {
      // Only before the gate closed can a step throw (after, each only switches); should one
      // break that promise, the gate must still open.
      if (closed) open();
      throw;
    }
    current_id_.store(id, std::memory_order_release);
    open();
    return next;
  }
  void open() noexcept { sequence_.fetch_add(1, std::memory_order_release); }

  mutable std::mutex writer_;  // one switch at a time; guards current_, previous_, next_id_
  generation current_;
  std::optional<generation> previous_;
  std::uint64_t next_id_ = 2;
  std::atomic<std::uint64_t> sequence_{0};  // odd while a switch is closing the gate
  std::atomic<std::uint64_t> current_id_;
};

}  // namespace cubridge
