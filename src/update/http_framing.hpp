#pragma once
// The update endpoint's request framing, decided from a request's head alone before any body
// byte is read, and the refusals the transport answers itself (http_reception.hpp). Internal to
// cubridge_update; not installed.

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <variant>

namespace cubridge::http_internal {

/// A refusal the reception thread writes itself, before httplib sees the request: JSON like
/// every other refusal, and the connection closes after it.
struct transport_refusal {
  int status;
  std::string error;
  std::string detail;
};

/// The whole answer to send for `r`: status line, headers (Connection: close, Retry-After for a
/// 503) and the JSON body {"error", "detail"}.
std::string refusal_text(const transport_refusal& r);

/// The interim answer to Expect: 100-continue.
inline constexpr std::string_view continue_line = "HTTP/1.1 100 Continue\r\n\r\n";

/// What a request may carry, decided from its head alone.
struct request_framing {
  std::size_t head_size = 0;  // request line and headers, through the empty line
  std::size_t body_size = 0;  // the Content-Length; 0 without one
  bool expect_continue = false;
};

/// The largest body of a request by its method and path (percent-decoded, as httplib routes
/// it): what the route reads, 0 for a route that takes none.
using body_limit_function =
    std::function<std::size_t(std::string_view method, std::string_view path)>;

/// Checks a complete head (through the empty line) strictly, so that httplib, which parses it
/// again, sees the same request, and decides the framing: a Content-Length within the route's
/// `body_limit` or no body; no Transfer-Encoding (chunked bodies cannot be bounded up front), no
/// Content-Encoding (httplib would inflate a small body into a huge one), no multipart (httplib
/// would parse a form); at most `max_header_count` header lines. The refusal otherwise.
std::variant<request_framing, transport_refusal> decide_framing(
    std::string_view head, std::size_t max_header_count, const body_limit_function& body_limit);

}  // namespace cubridge::http_internal
