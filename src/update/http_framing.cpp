// The update endpoint's request framing: a head checked strictly and the body it may carry
// decided before any body byte is read; see http_framing.hpp.
#include "http_framing.hpp"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace cubridge::http_internal {
namespace {

struct transport_word {
  transport_reason reason;
  int status;
  std::string_view name;    // the "error" field
  std::string_view phrase;  // the status line's reason phrase
};

// The one table: every transport_reason with its status and words.
constexpr std::array<transport_word, 8> transport_words{{
    {transport_reason::bad_request, 400, "bad_request", "Bad Request"},
    {transport_reason::timeout, 408, "timeout", "Request Timeout"},
    {transport_reason::length_required, 411, "length_required", "Length Required"},
    {transport_reason::too_large, 413, "too_large", "Payload Too Large"},
    {transport_reason::unsupported_encoding, 415, "unsupported_encoding", "Unsupported Media Type"},
    {transport_reason::unsupported_media_type, 415, "unsupported_media_type",
     "Unsupported Media Type"},
    {transport_reason::headers_too_large, 431, "headers_too_large",
     "Request Header Fields Too Large"},
    {transport_reason::busy, 503, "busy", "Service Unavailable"},
}};

constexpr bool table_in_enum_order() {
  for (std::size_t i = 0; i < transport_words.size(); ++i)
    if (static_cast<std::size_t>(transport_words[i].reason) != i) return false;
  return true;
}
static_assert(table_in_enum_order(), "transport_words lists every reason in enum order");

const transport_word& word_of(transport_reason reason) noexcept {
  return transport_words[static_cast<std::size_t>(reason)];
}

using json = nlohmann::json;

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

bool istarts_with(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() && iequals(text.substr(0, prefix.size()), prefix);
}

// RFC 9110 token characters: what a method or a header name is made of.
bool is_token_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

std::string_view trim_whitespace(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A piece of the request for a refusal's detail: bounded (JSON escapes the rest).
std::string excerpt(std::string_view text) {
  return text.size() <= 64 ? std::string(text) : std::string(text.substr(0, 64)) + "...";
}

transport_refusal bad_request(std::string detail) {
  return transport_refusal{transport_reason::bad_request, std::move(detail)};
}

// Every line ends in CRLF and there is no NUL: httplib would read anything else differently.
std::optional<transport_refusal> check_line_ends(std::string_view head) {
  for (std::size_t i = 0; i < head.size(); ++i) {
    if (head[i] == '\0') return bad_request("NUL byte in the request head");
    if (head[i] == '\n' && (i == 0 || head[i - 1] != '\r'))
      return bad_request("a line of the request head ends in LF without CR");
    if (head[i] == '\r' && (i + 1 == head.size() || head[i + 1] != '\n'))
      return bad_request("CR without LF in the request head");
  }
  return std::nullopt;
}

// The request line and the header lines, without the empty line that ends the head.
std::vector<std::string_view> head_lines(std::string_view head) {
  std::vector<std::string_view> lines;
  for (std::size_t at = 0; at < head.size();) {
    const auto end = head.find("\r\n", at);
    lines.push_back(head.substr(at, end - at));
    at = end + 2;
  }
  lines.pop_back();
  return lines;
}

struct request_line {
  std::string_view method;
  std::string_view version;
  std::string path;  // percent-decoded, without query or fragment: what httplib routes
};

// METHOD SP /path[?query] SP HTTP/1.x, nothing else.
std::variant<request_line, transport_refusal> parse_request_line(std::string_view line) {
  const auto first = line.find(' ');
  const auto second = first == std::string_view::npos ? first : line.find(' ', first + 1);
  if (second == std::string_view::npos || line.find(' ', second + 1) != std::string_view::npos)
    return bad_request("malformed request line '" + excerpt(line) + "'");
  const auto method = line.substr(0, first);
  const auto target = line.substr(first + 1, second - first - 1);
  const auto version = line.substr(second + 1);
  if (method.empty() || !std::all_of(method.begin(), method.end(), is_token_char) ||
      (version != "HTTP/1.1" && version != "HTTP/1.0"))
    return bad_request("malformed request line '" + excerpt(line) + "'");
  if (!target.starts_with('/') || !std::all_of(target.begin(), target.end(), [](char c) {
        const auto u = static_cast<unsigned char>(c);
        return u > 0x20 && u < 0x7f;
      }))
    return bad_request("request target '" + excerpt(target) + "' is not a path");
  return request_line{method, version,
                      httplib::detail::decode_url(
                          std::string(target.substr(0, target.find_first_of("?#"))), false)};
}

// What the header lines say about the body. httplib percent-decodes header values, so the
// values it acts on are kept decoded.
struct body_headers {
  std::size_t lengths = 0;  // Content-Length headers
  std::string_view length;  // the last one's value
  bool transfer_encoding = false;
  std::vector<std::string> encodings, types;  // Content-Encoding, Content-Type
  std::string expect;                         // the first Expect
};

std::variant<body_headers, transport_refusal> read_headers(
    std::span<const std::string_view> lines) {
  body_headers out;
  for (const std::string_view header : lines) {
    const auto colon = header.find(':');
    const auto name = header.substr(0, colon);
    if (colon == std::string_view::npos || name.empty() ||
        !std::all_of(name.begin(), name.end(), is_token_char))
      return bad_request("malformed header line '" + excerpt(header) + "'");
    const auto value = trim_whitespace(header.substr(colon + 1));
    if (std::any_of(value.begin(), value.end(), [](char c) {
          const auto u = static_cast<unsigned char>(c);
          return (u < 0x20 && u != '\t') || u == 0x7f;
        }))
      return bad_request("control character in header '" + excerpt(name) + "'");
    const auto decoded = [&] { return httplib::detail::decode_url(std::string(value), false); };
    if (iequals(name, "Content-Length")) {
      ++out.lengths;
      out.length = value;
    } else if (iequals(name, "Transfer-Encoding")) {
      out.transfer_encoding = true;
    } else if (iequals(name, "Content-Encoding")) {
      out.encodings.push_back(decoded());
    } else if (iequals(name, "Content-Type")) {
      out.types.push_back(decoded());
    } else if (iequals(name, "Expect") && out.expect.empty()) {
      out.expect = decoded();
    }
  }
  return out;
}

// The body's size: the one decimal Content-Length, within `limit` for `route`; none is 0.
std::variant<std::size_t, transport_refusal> body_size_of(const body_headers& h, std::size_t limit,
                                                          const std::string& route) {
  if (h.transfer_encoding)
    return transport_refusal{transport_reason::length_required,
                             "Transfer-Encoding is not accepted (no chunked bodies): send the "
                             "body with a Content-Length"};
  if (h.lengths == 0 && limit > 0)
    return transport_refusal{transport_reason::length_required,
                             route + " takes a body: send it with a Content-Length"};
  if (h.lengths > 1) return bad_request(std::to_string(h.lengths) + " Content-Length headers");
  if (h.lengths == 0) return std::size_t{0};
  const std::string_view length = h.length;
  if (length.empty() ||
      !std::all_of(length.begin(), length.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return bad_request("Content-Length '" + excerpt(length) + "' is not a decimal number");
  // Up to 19 significant digits fit 64 bits; more is over any limit.
  const auto digits = length.substr(std::min(length.find_first_not_of('0'), length.size()));
  std::uint64_t size = 0;
  const bool over =
      digits.size() > 19 ||
      (std::from_chars(digits.data(), digits.data() + digits.size(), size), size > limit);
  if (over)
    return transport_refusal{transport_reason::too_large,
                             "body of " + excerpt(length) + " bytes, limit " +
                                 std::to_string(limit) + " for " + route +
                                 (limit == 0 ? " (it takes no body)" : "")};
  return static_cast<std::size_t>(size);
}

// No Content-Encoding but identity, no multipart Content-Type.
std::optional<transport_refusal> check_content_headers(const body_headers& h) {
  for (const auto& e : h.encodings)
    if (!iequals(trim_whitespace(e), "identity"))
      return transport_refusal{
          transport_reason::unsupported_encoding,
          "Content-Encoding '" + excerpt(e) + "' is not accepted: send the body as it is"};
  for (const auto& t : h.types)
    if (istarts_with(trim_whitespace(t), "multipart/"))
      return transport_refusal{transport_reason::unsupported_media_type,
                               "Content-Type '" + excerpt(t) +
                                   "': multipart bodies are not accepted, send the bundle itself "
                                   "as the body (any other Content-Type)"};
  return std::nullopt;
}

}  // namespace

std::string_view to_string(transport_reason reason) noexcept {
  return word_of(reason).name;
}

int http_status(transport_reason reason) noexcept {
  return word_of(reason).status;
}

std::string refusal_text(const transport_refusal& r) {
  const transport_word& word = word_of(r.reason);
  const std::string body = json{{"error", word.name}, {"detail", r.detail}}.dump(
                               -1, ' ', false, json::error_handler_t::replace) +
                           "\n";
  std::string out = "HTTP/1.1 " + std::to_string(word.status) + " " + std::string(word.phrase) +
                    "\r\nContent-Type: application/json\r\nConnection: close\r\n";
  if (r.reason == transport_reason::busy) out += "Retry-After: 1\r\n";
  return out + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::variant<request_framing, transport_refusal> decide_framing(
    std::string_view head, std::size_t max_header_count, const body_limit_function& body_limit) {
  if (auto r = check_line_ends(head)) return std::move(*r);
  const std::vector<std::string_view> lines = head_lines(head);
  if (lines.size() - 1 > max_header_count)
    return transport_refusal{transport_reason::headers_too_large,
                             std::to_string(lines.size() - 1) + " header lines, limit " +
                                 std::to_string(max_header_count)};
  auto parsed_line = parse_request_line(lines.front());
  if (auto* r = std::get_if<transport_refusal>(&parsed_line)) return std::move(*r);
  const auto& line = std::get<request_line>(parsed_line);
  auto parsed_headers = read_headers(std::span(lines).subspan(1));
  if (auto* r = std::get_if<transport_refusal>(&parsed_headers)) return std::move(*r);
  const auto& headers = std::get<body_headers>(parsed_headers);

  const std::size_t limit = body_limit(line.method, line.path);
  const std::string route = std::string(line.method) + " " + excerpt(line.path);
  auto body_size = body_size_of(headers, limit, route);
  if (auto* r = std::get_if<transport_refusal>(&body_size)) return std::move(*r);
  if (auto r = check_content_headers(headers)) return std::move(*r);
  request_framing framing;
  framing.body_size = std::get<std::size_t>(body_size);
  framing.head_size = head.size();
  framing.expect_continue =
      line.version == "HTTP/1.1" && iequals(trim_whitespace(headers.expect), "100-continue");
  return framing;
}

}  // namespace cubridge::http_internal
