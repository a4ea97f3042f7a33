#pragma once
// Makes a context current for a scope and restores the caller's context stack exactly.

#include <cubridge/core/context_ref.hpp>

#include <cuda.h>

namespace cubridge {

/// Pushes `ctx` on the calling thread's context stack; the destructor pops it, leaving the stack
/// as it was. Neither copyable nor movable: it belongs to one scope on one thread.
class scoped_current {
 public:
  /// @throws error naming the context if cuCtxPushCurrent fails.
  explicit scoped_current(context_ref ctx) : pop_(push(ctx)) {}
  // Inline, through the entry point push() looked up: the guard costs what the two driver
  // calls cost and little more (bench_core's BM_scoped_current against BM_push_pop_raw).
  ~scoped_current() {
    CUcontext popped = nullptr;
    if (const CUresult r = pop_(&popped); r != CUDA_SUCCESS) [[unlikely]]
      pop_failed(r);
  }
  scoped_current(const scoped_current&) = delete;
  scoped_current& operator=(const scoped_current&) = delete;
  scoped_current(scoped_current&&) = delete;
  scoped_current& operator=(scoped_current&&) = delete;

 private:
  using pop_function = decltype(&::cuCtxPopCurrent);
  /// Pushes `ctx`, and returns cuCtxPopCurrent for the destructor: one look-up of the driver's
  /// entry points for both halves. @throws error naming the context.
  static pop_function push(context_ref ctx);
  /// Reports a failed pop as every destructor's release does (detail::check_release).
  static void pop_failed(CUresult result) noexcept;

  pop_function pop_;
};

}  // namespace cubridge
