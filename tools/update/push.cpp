// `cubridge push URL FILE` and `cubridge push URL --rollback NAME`: talk to a service's update
// endpoint (docs/update-endpoint.md) and say plainly what it answered.
#include "exit_codes.hpp"
#include "update/signing.hpp"
#include "update/update_commands.hpp"

#include <cubridge/compile.hpp>
#include <cubridge/rollback_request.hpp>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <iostream>

namespace cubridge::tool {
namespace {

using json = nlohmann::json;

// A failure to reach the endpoint, reported with exit_unreachable.
struct unreachable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class endpoint_client {
 public:
  endpoint_client(std::string url, const std::string& ca_cert) : url_(std::move(url)) {
    while (url_.ends_with('/')) url_.pop_back();
    client_ = std::make_unique<httplib::Client>(url_);
    if (!client_->is_valid())
      detail::throw_errc(errc::precondition, "push",
                         "'" + url_ + "' is not an endpoint URL (http://HOST:PORT or https://...)");
    client_->set_connection_timeout(5, 0);
    client_->set_read_timeout(120, 0);  // staging may compile and validate
    client_->set_write_timeout(30, 0);
    client_->set_tcp_nodelay(true);
    if (!ca_cert.empty()) client_->set_ca_cert_path(ca_cert.c_str());
  }

  // The answer's status and JSON body; throws unreachable when there is none.
  std::pair<int, json> call(const std::string& method, const std::string& path,
                            const std::string& body = {}, const char* type = "") {
    auto r = method == "GET"   ? client_->Get(path.c_str())
             : method == "PUT" ? client_->Put(path.c_str(), body, type)
                               : client_->Post(path.c_str(), body, type);
    if (!r)
      throw unreachable("cannot reach " + url_ + ": " +
                        (r.error() == httplib::Error::Connection
                             ? std::string("could not connect (nothing listening there?)")
                             : httplib::to_string(r.error())));
    auto parsed = json::parse(r->body, nullptr, false);
    if (parsed.is_discarded()) parsed = json{{"error", "not_json"}, {"detail", r->body.substr(0, 200)}};
    return {r->status, std::move(parsed)};
  }

  const std::string& url() const { return url_; }

 private:
  std::string url_;
  std::unique_ptr<httplib::Client> client_;
};

// "refused: 409 replayed_version: module 'filters' v3 is not above v3 (serving)".
int report_refusal(int status, const json& body) {
  std::cerr << "cubridge: refused: " << status << " " << body.value("error", "unknown") << ": "
            << body.value("detail", "(no detail)") << "\n";
  return exit_failure;
}

json find_module(const json& status, const std::string& name) {
  for (const auto& m : status.value("modules", json::array()))
    if (m.value("name", "") == name) return m;
  return nullptr;
}

}  // namespace

int update_commands::push() const {
  const auto& a = push_args_;
  try {
    endpoint_client endpoint(a.url, a.ca_cert);
    if (!a.rollback.empty()) {
      if (!a.file.empty() || a.key.empty()) {
        std::cerr << "cubridge: push --rollback NAME takes --key and no file\n";
        return exit_usage;
      }
      // The request names the version it rolls back from: ask which one serves.
      const auto [code, status] = endpoint.call("GET", "/v1/modules");
      if (code != 200) return report_refusal(code, status);
      const auto module = find_module(status, a.rollback);
      if (module.is_null()) {
        std::cerr << "cubridge: " << endpoint.url() << " has no module '" << a.rollback << "'\n";
        return exit_failure;
      }
      const auto from = module.value("current_version", std::uint64_t{0});
      const auto body = sign_rollback_request(a.rollback, from, read_secret_key_file(a.key));
      const auto [rc, answer] =
          endpoint.call("POST", "/v1/modules/" + a.rollback + "/rollback", body, "text/plain");
      if (rc != 200) return report_refusal(rc, answer);
      std::cout << "rolled back '" << a.rollback << "' v" << answer.value("from_version", from)
                << " -> v" << answer.value("version", std::uint64_t{0}) << " at "
                << endpoint.url() << "\n";
      return exit_ok;
    }
    if (a.file.empty()) {
      std::cerr << "cubridge: push needs a FILE (or --rollback NAME)\n";
      return exit_usage;
    }

    const std::filesystem::path file = a.file;
    std::vector<std::byte> bundle;
    bundle_manifest m;
    if (file.extension() == ".bundle") {
      bundle = read_bytes(file);
      m = peek_manifest(bundle);
    } else {
      if (a.key.empty() || a.version == 0) {
        std::cerr << "cubridge: pushing " << file.string()
                  << " signs it first: give --key and --version (or push a .bundle)\n";
        return exit_usage;
      }
      signing_request request{file, a.key, a.name, a.version, a.target};
      if (file.extension() == ".cu") {
        // Compiled here for the target GPU, so the service loads machine code and a compile
        // error shows here rather than as a refusal.
        if (request.target.empty()) {
          const auto [code, status] = endpoint.call("GET", "/v1/modules");
          if (code != 200) return report_refusal(code, status);
          if (!status.contains("gpu") || !status["gpu"].is_string()) {
            std::cerr << "cubridge: " << endpoint.url() << " does not say its GPU; give --target\n";
            return exit_failure;
          }
          request.target = status["gpu"].get<std::string>();
        }
        const auto source = read_bytes(file);
        compile_options options;
        options.architecture = request.target;
        options.include_paths.push_back(file.parent_path().empty() ? "." : file.parent_path());
        const auto compiled = nvrtc_compile(
            {file.filename().string(),
             std::string(reinterpret_cast<const char*>(source.data()), source.size())},
            options);
        std::cout << "compiled " << file.string() << " for " << request.target << " ("
                  << compiled.cubin.size() << " bytes)\n";
        const auto cubin = std::filesystem::temp_directory_path() /
                           ("cubridge-push-" + std::to_string(::getpid()) + ".cubin");
        {
          std::ofstream out(cubin, std::ios::binary | std::ios::trunc);
          out.write(reinterpret_cast<const char*>(compiled.cubin.data()),
                    static_cast<std::streamsize>(compiled.cubin.size()));
        }
        if (request.name.empty()) request.name = file.stem().string();
        request.file = cubin;
        try {
          bundle = sign_file(request, &m);
        } catch (...) {
          std::filesystem::remove(cubin);
          throw;
        }
        std::filesystem::remove(cubin);
      } else {
        bundle = sign_file(request, &m);
      }
    }
    const std::string name = a.name.empty() ? m.name : a.name;
    const auto [code, answer] =
        endpoint.call("PUT", "/v1/modules/" + name,
                      std::string(reinterpret_cast<const char*>(bundle.data()), bundle.size()),
                      "application/octet-stream");
    if (code != 200) return report_refusal(code, answer);
    std::cout << "promoted '" << answer.value("module", name) << "' v"
              << answer.value("version", m.version) << " (was v"
              << answer.value("previous_version", std::uint64_t{0}) << ") at " << endpoint.url()
              << "\n";
    return exit_ok;
  } catch (const unreachable& e) {
    std::cerr << "cubridge: " << e.what() << "\n";
    return exit_unreachable;
  }
}

}  // namespace cubridge::tool
