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

/// Why the transport refused a request before httplib saw it: a closed set with one table
/// (http_framing.cpp) that gives each its HTTP status and its wire word, as gate_reason does
/// for the gate's refusals. The words are documented (docs/update-endpoint.md).
enum class transport_reason {
  bad_request,             ///< 400: the head does not parse strictly
  timeout,                 ///< 408: the request did not arrive in time
  length_required,         ///< 411: a body without a Content-Length
  too_large,               ///< 413: a body over the route's limit
  unsupported_encoding,    ///< 415: a Content-Encoding
  unsupported_media_type,  ///< 415: a multipart body
  headers_too_large,       ///< 431: too many or too long header lines
  busy,                    ///< 503: no room for the connection or its body now
};

/// "bad_request", "timeout", ... (the "error" field of the answer).
[[nodiscard]] std::string_view to_string(transport_reason reason) noexcept;
/// 400, 408, ... (the answer's status).
[[nodiscard]] int http_status(transport_reason reason) noexcept;

/// A refusal the reception thread writes itself, before httplib sees the request: JSON like
/// every other refusal, and the connection closes after it.
struct transport_refusal {
  transport_reason reason = transport_reason::bad_request;
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
