// An entry library that uses cubridge itself (docs/isolation.md, "An entry library may use
// cubridge"): cubridge::core is linked into it statically, its symbols hidden, so it carries a
// copy of its own beside the worker's. CPU entries (an error made and caught, an image read)
// and one that finds the worker's CUDA context through cubridge (GPU).
#include <cubridge/core/context_ref.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/image.hpp>
#include <cubridge/core/primary_context.hpp>
#include <cubridge/isolation/sandbox_entry.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <span>
#include <string>

namespace {

/// Copies `text` into the reply (clamped to its room).
void reply_with(cubridge_sandbox_args* args, const std::string& text) {
  const std::size_t n = std::min(text.size(), args->reply_capacity);
  std::memcpy(args->reply, text.data(), n);
  args->reply_bytes = n;
}

/// Runs `body`; an exception must not cross the C entry point (it would abort the worker), so
/// one is replied as its what() with status -1.
template <class Body>
int entry(cubridge_sandbox_args* args, Body body) {
  try {
    return body();
  } catch (const std::exception& e) {
    reply_with(args, e.what());
    return -1;
  }
}

}  // namespace

/// A precondition of cubridge's, failed and caught here: replies with the error's text and
/// returns its code (errc::precondition) when the request is empty.
CUBRIDGE_SANDBOX_EXPORT int cubridge_precondition(cubridge_sandbox_args* args) {
  try {
    CUBRIDGE_EXPECTS(args->request_bytes > 0, "the request of cubridge_precondition is empty");
    return 0;
  } catch (const cubridge::error& e) {
    reply_with(args, e.what());
    return e.code();
  }
}

/// Reads the request as an image with cubridge's reader; replies "<kind> <kernel count>".
CUBRIDGE_SANDBOX_EXPORT int cubridge_inspect(cubridge_sandbox_args* args) {
  return entry(args, [&] {
    const auto info = cubridge::inspect_image(
        std::span(static_cast<const std::byte*>(args->request), args->request_bytes));
    reply_with(args, std::string(cubridge::to_string(info.kind)) + " " +
                         std::to_string(info.kernels.size()));
    return 0;
  });
}

/// The worker's CUDA context, as this library's cubridge sees it: the current context must be
/// the primary context of args->device (the worker makes it current). Replies with its
/// description; returns 1 when it is that primary context.
CUBRIDGE_SANDBOX_EXPORT int cubridge_current_context(cubridge_sandbox_args* args) {
  return entry(args, [&] {
    const auto current = cubridge::context_ref::current();
    if (!current) {
      reply_with(args, "no current context");
      return 0;
    }
    current.synchronize();
    const auto primary = cubridge::primary_context::retain(cubridge::device::get(args->device));
    reply_with(args, current.describe());
    return current == primary.ref() ? 1 : 0;
  });
}
