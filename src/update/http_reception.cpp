// The update endpoint's HTTP transport: the TLS context, binding, and the connection service
// that receives and hands over requests; see http_reception.hpp.
#include "http_reception.hpp"

#include "http_connection.hpp"
#include "http_connection_service.hpp"

#include <cubridge/core/error.hpp>

#include <openssl/err.h>

#include <algorithm>
#include <ctime>

#include <sys/socket.h>

namespace cubridge::http_internal {
namespace {

std::string openssl_errors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char text[256];
    ERR_error_string_n(e, text, sizeof text);
    out += out.empty() ? "" : "; ";
    out += text;
  }
  return out.empty() ? "no OpenSSL error recorded" : out;
}

ssl_ctx_ptr make_tls_context(const std::filesystem::path& certificate,
                             const std::filesystem::path& key) {
  constexpr const char* call = "update_endpoint::start (TLS)";
  ERR_clear_error();
  ssl_ctx_ptr ctx(SSL_CTX_new(TLS_server_method()));
  if (!ctx) detail::throw_errc(errc::io, call, "SSL_CTX_new: " + openssl_errors());
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // No renegotiation: the reception thread's non-blocking reads and writes never have to wait
  // for the other direction mid-request.
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_RENEGOTIATION);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), certificate.c_str()) != 1)
    detail::throw_errc(errc::io, call,
                       "certificate '" + certificate.string() + "': " + openssl_errors());
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), key.c_str(), SSL_FILETYPE_PEM) != 1)
    detail::throw_errc(errc::io, call, "private key '" + key.string() + "': " + openssl_errors());
  if (SSL_CTX_check_private_key(ctx.get()) != 1)
    detail::throw_errc(errc::io, call,
                       "private key '" + key.string() + "' does not match certificate '" +
                           certificate.string() + "'");
  return ctx;
}

// httplib's settings for the transport: binding and what it announces in Keep-Alive headers.
void configure_transport(guarded_server& s, const reception_options& options) {
  // httplib's default sets SO_REUSEPORT, which would let another process bind the same port
  // and take part of the connections; SO_REUSEADDR alone only allows a quick restart.
  s.set_socket_options([](socket_t sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  // The reception thread enforces them.
  s.set_keep_alive_max_count(options.keep_alive_max_requests);
  s.set_keep_alive_timeout(std::max<time_t>(
      1, std::chrono::ceil<std::chrono::seconds>(options.keep_alive_timeout).count()));
}

// Binds `s` to the options' address and port (0: any free one); the bound port.
std::uint16_t bind_server(guarded_server& s, const reception_options& options) {
  const std::string where = options.bind_address + ":" + std::to_string(options.port);
  int port = options.port;
  if (port == 0) {
    port = s.bind_to_any_port(options.bind_address);
    if (port <= 0) port = 0;
  } else if (!s.bind_to_port(options.bind_address, port)) {
    port = 0;
  }
  if (port == 0)
    detail::throw_errc(errc::io, "update_endpoint::start",
                       "cannot bind " + where + " (address in use, not local, or not permitted)");
  return static_cast<std::uint16_t>(port);
}

}  // namespace

http_reception::http_reception(reception_options options,
                               const std::function<void(httplib::Server&)>& set_up,
                               reception_counters counters)
    : options_(std::move(options)) {
  if (!options_.tls_certificate.empty() || !options_.tls_private_key.empty())
    tls_ = make_tls_context(options_.tls_certificate, options_.tls_private_key);
  server_ = std::make_unique<guarded_server>();
  configure_transport(*server_, options_);
  set_up(*server_);
  port_ = bind_server(*server_, options_);
  server_->set_backlog(options_.listen_backlog);
  service_ = std::make_unique<connection_service>(*server_, server_->release_listener(), options_,
                                                  tls_.get(), std::move(counters));
}

http_reception::~http_reception() = default;

}  // namespace cubridge::http_internal
