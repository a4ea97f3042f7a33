// `cubridge push URL FILE` and `cubridge push URL --rollback NAME`: talk to a service's update
// endpoint (docs/update-endpoint.md) and say plainly what it answered. Everything the endpoint
// sends is shown escaped and bounded (server_text.hpp); names go into paths percent-encoded.
#include "exit_codes.hpp"
#include "update/arguments.hpp"
#include "update/server_text.hpp"
#include "update/signing.hpp"
#include "update/update_commands.hpp"

#include <cubridge/bundle/rollback_request.hpp>
#include <cubridge/bundle/unverified_bundle.hpp>
#include <cubridge/compile/machine_code.hpp>
#include <cubridge/core/compute_capability.hpp>
#include <cubridge/core/detail/file_io.hpp>

#include <httplib.h>
#include <openssl/x509.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>

namespace cubridge::tool {
namespace {

using json = nlohmann::json;

// A failure to reach the endpoint, reported with exit_unreachable.
struct unreachable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A string the endpoint sent, escaped for the terminal; `fallback` (ours) when it sent none.
std::string text_field(const json& body, const char* key, std::string_view fallback) {
  const auto it = body.find(key);
  if (it == body.end()) return std::string(fallback);
  return printable(it->is_string() ? it->get<std::string>() : it->dump());
}

// A version the endpoint sent; `fallback` when it sent none or something else.
std::uint64_t number_field(const json& body, const char* key, std::uint64_t fallback) {
  const auto it = body.find(key);
  return it != body.end() && it->is_number_unsigned() ? it->get<std::uint64_t>() : fallback;
}

// Whether the endpoint's answer has `field` = true (a JSON boolean, nothing else).
bool says_true(const json& body, const char* field) {
  const auto it = body.find(field);
  return it != body.end() && it->is_boolean() && it->get<bool>();
}

class endpoint_client {
 public:
  // The largest answer read from an endpoint (a status listing of many modules fits easily).
  static constexpr std::size_t max_answer_bytes = std::size_t{1} << 20;

  endpoint_client(const endpoint_url& url, const std::string& ca_cert)
      : url_(url.text()), host_(url.host), ca_cert_(ca_cert) {
    if (url.scheme == "https") {
      auto tls = std::make_unique<httplib::SSLClient>(url.host, url.port);
      tls_ = tls.get();
      tls->enable_server_certificate_verification(true);
      if (!ca_cert.empty()) {
        // Checked here, before any connection: a FIFO would block OpenSSL, a missing file would
        // only show as a failed handshake.
        (void)detail::read_regular_file(ca_cert, std::uint64_t{1} << 20, "CA certificate");
        tls->set_ca_cert_path(ca_cert.c_str());
      }
      client_ = std::move(tls);
    } else {
      if (!ca_cert.empty())
        throw usage_error("--ca-cert is for an https endpoint; " + url_ + " is plain http");
      client_ = std::make_unique<httplib::ClientImpl>(url.host, url.port);
    }
    client_->set_url_encode(false);  // paths are percent-encoded here, once
    client_->set_connection_timeout(5, 0);
    client_->set_read_timeout(120, 0);  // staging may compile and validate
    client_->set_write_timeout(30, 0);
    client_->set_tcp_nodelay(true);
    client_->set_decompress(false);  // a small compressed answer must not grow in memory
  }

  // The answer's status and JSON body; throws unreachable when there is none, and
  // std::runtime_error (exit_failure) when the endpoint's certificate is not trusted.
  std::pair<int, json> call(const std::string& method, const std::string& path,
                            const std::string& body = {}, const char* type = "") {
    // The answer is read into a bounded buffer: an endpoint (or whatever answers at its address)
    // cannot make the pusher hold more than max_answer_bytes, compressed or not.
    httplib::Request request;
    request.method = method;
    request.path = path;
    request.body = body;
    if (*type) request.set_header("Content-Type", type);
    std::string answer;
    bool too_large = false;
    request.content_receiver = [&](const char* data, std::size_t size, std::uint64_t,
                                   std::uint64_t) {
      if (answer.size() + size > max_answer_bytes) return !(too_large = true);
      answer.append(data, size);
      return true;
    };
    auto r = client_->send(request);
    if (too_large)
      throw std::runtime_error("refused " + url_ + ": its answer is over " +
                               std::to_string(max_answer_bytes) + " bytes");
    if (!r) fail(r.error());
    auto parsed = json::parse(answer, nullptr, false);
    if (parsed.is_discarded() || !parsed.is_object())
      parsed = json{{"error", "not_json"}, {"detail", answer.substr(0, 300)}};
    return {r->status, std::move(parsed)};
  }

  const std::string& url() const { return url_; }

 private:
  [[noreturn]] void fail(httplib::Error error) const {
    switch (error) {
      case httplib::Error::SSLServerVerification: {
        // Reached, but not proven to be the endpoint: not worth retrying, so not exit 75.
        const long result = tls_ ? tls_->get_openssl_verify_result() : X509_V_OK;
        if (result == X509_V_OK)  // the chain verified; httplib's host name check did not
          throw std::runtime_error("refused " + url_ + ": its TLS certificate does not name " +
                                   host_ + "; connect by a name or address it was issued for");
        throw std::runtime_error(
            "refused " + url_ + ": its TLS certificate is not trusted (" +
            X509_verify_cert_error_string(result) + ")" +
            (ca_cert_.empty() ? "; give --ca-cert with the certificate of the CA that signed it"
                              : " by the CA certificates in --ca-cert '" + ca_cert_ + "'"));
      }
      case httplib::Error::SSLLoadingCerts:
        throw std::runtime_error("cannot use --ca-cert '" + ca_cert_ +
                                 "': OpenSSL found no PEM certificate in it");
      case httplib::Error::Connection:
        throw unreachable("cannot reach " + url_ +
                          ": could not connect (nothing listening there?)");
      case httplib::Error::SSLConnection:
        throw unreachable("cannot reach " + url_ +
                          ": the TLS handshake failed (is it a plain http:// endpoint?)");
      default:
        throw unreachable("cannot reach " + url_ + ": " + httplib::to_string(error));
    }
  }

  std::string url_;
  std::string host_;
  std::string ca_cert_;
  std::unique_ptr<httplib::ClientImpl> client_;
  httplib::SSLClient* tls_ = nullptr;  // client_, when https
};

// "refused: 409 replayed_version: module 'filters' v3 is not above v3 (serving)".
int report_refusal(int status, const json& body) {
  std::cerr << "cubridge: refused: " << status << " " << text_field(body, "error", "unknown")
            << ": " << text_field(body, "detail", "(no detail)") << "\n";
  return exit_failure;
}

// The module called `name` in a status answer, or null.
json find_module(const json& status, const std::string& name) {
  const auto modules = status.find("modules");
  if (modules == status.end() || !modules->is_array()) return nullptr;
  for (const auto& m : *modules)
    if (m.is_object() && m.contains("name") && m["name"] == name) return m;
  return nullptr;
}

std::string module_path(const std::string& name) {
  return "/v1/modules/" + percent_encode(name);
}

/// Asks the endpoint to roll `name` back to its previous version: the request names the
/// version that serves now, so it asks which one first.
int push_rollback(endpoint_client& endpoint, const std::string& name, const secret_key& key) {
  const auto [code, status] = endpoint.call("GET", "/v1/modules");
  if (code != 200) return report_refusal(code, status);
  const auto module = find_module(status, name);
  if (module.is_null()) {
    std::cerr << "cubridge: " << endpoint.url() << " has no module '" << printable(name) << "'\n";
    return exit_failure;
  }
  const auto from = number_field(module, "current_version", 0);
  const auto body = sign_rollback_request(name, from, key);
  const auto [rc, answer] =
      endpoint.call("POST", module_path(name) + "/rollback", body, "text/plain");
  // Done only when the endpoint says so: a 200 from something else at that address is not.
  if (rc != 200 || !says_true(answer, "rolled_back")) return report_refusal(rc, answer);
  std::cout << "rolled back '" << printable(name) << "' v"
            << number_field(answer, "from_version", from) << " -> v"
            << number_field(answer, "version", 0) << " at " << endpoint.url() << "\n";
  return exit_ok;
}

/// The GPU the endpoint says it has, into `target`, for a .cu pushed without --target.
int ask_endpoint_gpu(endpoint_client& endpoint, std::string& target) {
  const auto [code, status] = endpoint.call("GET", "/v1/modules");
  if (code != 200) return report_refusal(code, status);
  // "sm_90", "sm_100a": the only GPU names taken from an endpoint as a compile target.
  const auto gpu = status.find("gpu");
  if (gpu == status.end() || !gpu->is_string() ||
      !parse_compute_capability(gpu->get<std::string>())) {
    std::cerr << "cubridge: " << endpoint.url() << " does not say its GPU ("
              << (gpu == status.end() ? "no \"gpu\"" : printable(gpu->dump()))
              << "); give --target\n";
    return exit_failure;
  }
  target = gpu->get<std::string>();
  return exit_ok;
}

/// The CUDA source `file` compiled for `target_name`.
std::vector<std::byte> compile_for_push(const std::filesystem::path& file,
                                        const std::vector<std::byte>& source,
                                        const std::string& target_name) {
  const auto target = parse_compute_capability(target_name);
  if (!target)
    detail::throw_errc(errc::precondition, "push",
                       "--target '" + printable(target_name) +
                           "' is not a GPU architecture sm_NN[a|f] (e.g. sm_90)");
  build_options options;
  options.compile.include_paths.push_back(file.parent_path().empty() ? "." : file.parent_path());
  auto compiled = build_machine_code(source_kind::cuda_source, source, file.filename().string(),
                                     *target, options);
  std::cout << "compiled " << file.string() << " for " << target_name << " (" << compiled.size()
            << " bytes)\n";
  return compiled;
}

/// request.file signed into `bundle` (a .cu compiled first, for the endpoint's GPU unless the
/// request names a target); an exit code, exit_ok once signed.
int sign_for_push(endpoint_client& endpoint, signing_request request,
                  std::vector<std::byte>& bundle, bundle_manifest& m) {
  const auto key = read_signing_key(request.key, request.allow_readable_key);
  const auto input = read_input(request.file, max_input_bytes, "payload");
  if (request.file.extension() != ".cu") {
    bundle = sign_payload(request, input.bytes, false, key.key, &m);
    return exit_ok;
  }
  // Compiled here for the target GPU, so the service loads machine code and a compile error
  // shows here rather than as a refusal.
  if (request.target.empty())
    if (const int rc = ask_endpoint_gpu(endpoint, request.target); rc != exit_ok) return rc;
  const auto compiled = compile_for_push(request.file, input.bytes, request.target);
  // Signed from memory: the machine code never passes through a file another user could plant
  // or swap.
  bundle = sign_payload(request, compiled, false, key.key, &m);
  return exit_ok;
}

/// PUTs the signed bundle as module `name`; done when the endpoint says it promoted it.
int promote(endpoint_client& endpoint, const std::string& name,
            const std::vector<std::byte>& bundle, std::uint64_t version) {
  const auto [code, answer] =
      endpoint.call("PUT", module_path(name),
                    std::string(reinterpret_cast<const char*>(bundle.data()), bundle.size()),
                    "application/octet-stream");
  if (code != 200 || !says_true(answer, "promoted")) return report_refusal(code, answer);
  std::cout << "promoted '" << text_field(answer, "module", printable(name)) << "' v"
            << number_field(answer, "version", version) << " (was v"
            << number_field(answer, "previous_version", 0) << ") at " << endpoint.url() << "\n";
  return exit_ok;
}

}  // namespace

int update_commands::push() const {
  const auto& a = push_args_;
  try {
    endpoint_client endpoint(parse_endpoint_url(a.url), a.ca_cert);
    if (!a.rollback.empty()) {
      if (!a.file.empty() || a.key.empty()) {
        std::cerr << "cubridge: push --rollback NAME takes --key and no file\n";
        return exit_usage;
      }
      const auto key = read_signing_key(a.key, a.allow_readable_key);
      return push_rollback(endpoint, a.rollback, key.key);
    }
    if (a.file.empty()) {
      std::cerr << "cubridge: push needs a FILE (or --rollback NAME)\n";
      return exit_usage;
    }

    const std::filesystem::path file = a.file;
    std::vector<std::byte> bundle;
    bundle_manifest m;
    if (file.extension() == ".bundle") {
      if (!a.expires.empty())
        throw usage_error("--expires is signed into a bundle; " + file.string() +
                          " is signed already (give --expires to `cubridge sign`)");
      bundle = read_input(file, max_input_bytes, "bundle").bytes;
      m = read_bundle_unverified(bundle).manifest;
    } else {
      if (a.key.empty() || a.version == 0) {
        std::cerr << "cubridge: pushing " << file.string()
                  << " signs it first: give --key and --version (or push a .bundle)\n";
        return exit_usage;
      }
      signing_request request{
          file, a.key, a.name, a.version, a.target, std::nullopt, a.allow_readable_key};
      if (!a.expires.empty())
        request.expires = parse_expires(a.expires, std::chrono::system_clock::now());
      if (const int rc = sign_for_push(endpoint, std::move(request), bundle, m); rc != exit_ok)
        return rc;
    }
    return promote(endpoint, a.name.empty() ? m.name : a.name, bundle, m.version);
  } catch (const unreachable& e) {
    std::cerr << "cubridge: " << e.what() << "\n";
    return exit_unreachable;
  }
}

}  // namespace cubridge::tool
