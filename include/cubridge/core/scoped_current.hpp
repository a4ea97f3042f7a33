#pragma once
// Makes a context current for a scope and restores the caller's context stack exactly.

#include <cubridge/core/context_ref.hpp>

namespace cubridge {

/// Pushes `ctx` on the calling thread's context stack; the destructor pops it, leaving the stack
/// as it was. Neither copyable nor movable: it belongs to one scope on one thread.
class scoped_current {
 public:
  /// @throws error naming the context if cuCtxPushCurrent fails.
  explicit scoped_current(context_ref ctx);
  ~scoped_current();
  scoped_current(const scoped_current&) = delete;
  scoped_current& operator=(const scoped_current&) = delete;
  scoped_current(scoped_current&&) = delete;
  scoped_current& operator=(scoped_current&&) = delete;

 private:
  context_ref ctx_;
};

}  // namespace cubridge
