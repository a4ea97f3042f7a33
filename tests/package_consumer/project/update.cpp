// cubridge::update alone: an update endpoint (cpp-httplib, OpenSSL inside) starts on a free
// loopback port in front of a sink that holds nothing, and stops; a signed rollback request
// verifies. No GPU.
#include <cubridge/bundle/bundle.hpp>
#include <cubridge/bundle/rollback_request.hpp>
#include <cubridge/update/module_sink.hpp>
#include <cubridge/update/update_endpoint.hpp>

#include <cstdio>
#include <memory>

namespace {

class empty_sink final : public cubridge::module_sink {
 public:
  std::optional<cubridge::compute_capability> device_capability() const override {
    return cubridge::compute_capability{9, 0};
  }
  std::uint64_t current_version(std::string_view) const override { return 0; }
  cubridge::sink_result apply(const cubridge::verified_bundle&, cubridge::apply_rule) override {
    return {cubridge::gate_reason::unknown_module, 0, "holds no module"};
  }
  cubridge::sink_result rollback(std::string_view) override {
    return {cubridge::gate_reason::unknown_module, 0, "holds no module"};
  }
  std::vector<cubridge::module_report> status() const override { return {}; }
};

}  // namespace

int main() {
  const auto keys = cubridge::generate_keypair();
  const cubridge::trusted_keys trusted{keys.public_key};
  const auto request = cubridge::verify_rollback_request(
      cubridge::sign_rollback_request("consumer", 3, keys.secret_key), trusted);
  if (request.module != "consumer" || request.from_version != 3) {
    std::printf("cubridge consumer update: the rollback request changed on the way\n");
    return 1;
  }
  const auto sink = std::make_shared<empty_sink>();
  cubridge::update_endpoint_options options;
  options.keys = trusted;
  options.threads = 1;
  options.persist_state = false;  // a smoke test of the package: nothing to keep
  cubridge::update_endpoint endpoint(sink, options);
  endpoint.start();
  const bool listening = endpoint.running() && endpoint.port() != 0;
  const auto url = endpoint.url();
  endpoint.stop();
  if (!listening) {
    std::printf("cubridge consumer update: the endpoint did not listen\n");
    return 1;
  }
  std::printf("cubridge consumer update: endpoint listened at %s\n", url.c_str());
  return 0;
}
