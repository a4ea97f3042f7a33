// Tests of cubridge/update/update_endpoint.hpp: the endpoint over real HTTP on loopback, with a
// fake module_sink (no GPU). Each refusal: the right status and reason, no change in the sink, and
// a valid push right after still succeeds.
#include <cubridge/bundle/rollback_request.hpp>
#include <cubridge/core/process_health.hpp>
#include <cubridge/swap/version_chain.hpp>
#include <cubridge/update/update_endpoint.hpp>
#include "self_signed_certificate.hpp"

#include "gpu_test.hpp"  // only for the test image paths
#include "temp_dir.hpp"

#include <gtest/gtest.h>
#include <httplib.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <regex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

using namespace std::chrono_literals;
using cubridge::gate_reason;
using cubridge::module_report;
using cubridge::sink_result;
using json = nlohmann::json;
using bytes = std::vector<std::byte>;

bytes read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  bytes out(chars.size());
  std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

std::string as_text(const bytes& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

// A module_sink whose versions live where hot_module keeps them: in a version_chain per module
// (each version with its origin), read back for current_version(), rollback and status(), with
// no copy of its own. promote_directly() is a second promoter the endpoint does not see (a
// hot_reloader, a direct hot_module::promote). It records every call so tests can see what was
// applied and when.
class fake_sink final : public cubridge::module_sink {
 public:
  std::optional<cubridge::compute_capability> device = cubridge::compute_capability{9, 0};
  bool creates_modules = true;
  // Runs inside apply (e.g. to refuse a version or to be slow); nullopt: apply normally.
  std::function<std::optional<sink_result>(const cubridge::verified_bundle&)> hook;

  // probe_health() calls, and whether it finds a sticky error, as the driver's answer to a
  // stream query of a context that faulted would.
  mutable std::atomic<int> probes{0};
  std::atomic<bool> probe_finds_fault{false};

  std::optional<cubridge::compute_capability> device_capability() const override { return device; }
  bool probe_health() const noexcept override {
    ++probes;
    if (probe_finds_fault) cubridge::note_cuda_result(CUDA_ERROR_ILLEGAL_ADDRESS, "health probe");
    return module_sink::probe_health();
  }
  std::uint64_t current_version(std::string_view name) const override {
    std::lock_guard lock(mutex_);
    const auto it = modules_.find(std::string(name));
    return it == modules_.end() ? 0 : it->second.current();
  }
  // Promotes a version staged with `bundle_version` (0: not from a bundle) past the endpoint.
  void promote_directly(const std::string& name, std::uint64_t bundle_version) {
    std::lock_guard lock(mutex_);
    modules_[name].promote(bundle_version, "promoted directly");
  }
  // Rolls back past the endpoint; false when there is nothing to go back to.
  bool rollback_directly(const std::string& name) {
    std::lock_guard lock(mutex_);
    auto& m = modules_[name];
    if (!m.chain->held().rollback_target) return false;
    (void)m.chain->rollback();
    return true;
  }
  sink_result apply(const cubridge::verified_bundle& bundle, cubridge::apply_rule rule) override {
    const auto& name = bundle.manifest.name;
    {
      std::lock_guard lock(mutex_);
      if (!in_apply_.insert(name).second) overlapping_calls_++;
    }
    std::optional<sink_result> early;
    if (hook) early = hook(bundle);
    std::lock_guard lock(mutex_);
    in_apply_.erase(name);
    ++apply_calls_;
    if (name == "canary") ++canary_calls_;
    if (!modules_.contains(name) && !creates_modules)
      return {gate_reason::unknown_module, 0, "no module '" + name + "'"};
    auto& m = modules_[name];
    if (early) {
      m.last_error = early->detail;
      return *early;
    }
    if (rule == cubridge::apply_rule::above_serving && bundle.version() <= m.current())
      return cubridge::not_newer_result(name, bundle.version(), m.current());
    m.promote(bundle.version(), "pushed");
    m.applied.push_back(bundle.version());
    return {gate_reason::none, m.current(), {}};
  }
  sink_result rollback(std::string_view name) override {
    std::lock_guard lock(mutex_);
    const auto it = modules_.find(std::string(name));
    if (it == modules_.end()) return {gate_reason::unknown_module, 0, "no such module"};
    auto& m = it->second;
    // A module created by its first push has nothing before it (the chain's first version is
    // the empty one, bundle version 0).
    const auto held = m.chain->held();
    if (!held.rollback_target || held.rollback_target->id == 1)
      return {gate_reason::no_previous_version, m.current(), "only one version"};
    (void)m.chain->rollback();
    ++rollbacks_;
    return {gate_reason::none, m.current(), {}};
  }
  std::vector<module_report> status() const override {
    std::lock_guard lock(mutex_);
    std::vector<module_report> out;
    for (const auto& [name, m] : modules_) {
      const auto held = m.chain->held();
      module_report r{name, held.serving.origin.label, {}, 3, m.last_error};
      if (held.rollback_target && held.rollback_target->origin.label)
        r.versions_held.push_back(held.rollback_target->origin.label);
      if (held.serving.origin.label) r.versions_held.push_back(held.serving.origin.label);
      out.push_back(std::move(r));
    }
    return out;
  }

  // What a test compares before and after a refused request; the module "canary" (the fixture's
  // proof that the service still serves) is left out.
  struct snapshot {
    std::map<std::string, std::vector<std::uint64_t>> applied;
    std::map<std::string, std::uint64_t> current;
    int apply_calls = 0;
    int rollbacks = 0;
    friend bool operator==(const snapshot&, const snapshot&) = default;
  };
  snapshot state() const {
    std::lock_guard lock(mutex_);
    snapshot s;
    for (const auto& [name, m] : modules_) {
      if (name == "canary") continue;
      s.applied[name] = m.applied;
      s.current[name] = m.current();
    }
    s.apply_calls = apply_calls_ - canary_calls_;
    s.rollbacks = rollbacks_;
    return s;
  }
  std::vector<std::uint64_t> applied(const std::string& name) const {
    std::lock_guard lock(mutex_);
    const auto it = modules_.find(name);
    return it == modules_.end() ? std::vector<std::uint64_t>{} : it->second.applied;
  }
  int overlapping_calls() const {
    std::lock_guard lock(mutex_);
    return overlapping_calls_;
  }

 private:
  using version_store =
      cubridge::version_chain<std::uint64_t, int, int>;  // payload: bundle version
  struct module {
    // Version 1 is "nothing yet" (bundle version 0), as before the first push.
    std::unique_ptr<version_store> chain = std::make_unique<version_store>(0);
    std::vector<std::uint64_t> applied;  // a log of apply() calls, not a version record
    std::string last_error;
    std::uint64_t current() const { return chain->held().serving.origin.label; }
    void promote(std::uint64_t bundle_version, std::string source) {
      (void)chain->promote(bundle_version,
                           cubridge::version_origin{bundle_version, {}, std::move(source), {}});
      (void)chain->reclaim([](int) { return true; });  // nothing runs on a fake GPU
    }
  };
  mutable std::mutex mutex_;
  std::map<std::string, module> modules_;
  std::set<std::string> in_apply_;
  int overlapping_calls_ = 0;
  int apply_calls_ = 0;
  int canary_calls_ = 0;
  int rollbacks_ = 0;
};

// --- raw sockets, for what an HTTP client library would not send ------------------------------

int connect_loopback(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << std::strerror(errno);
  return fd;
}

// Reads until the server closes or `timeout` passes; returns what arrived.
std::string read_until_closed(int fd, std::chrono::milliseconds timeout, bool* closed = nullptr) {
  std::string out;
  const auto until = std::chrono::steady_clock::now() + timeout;
  if (closed) *closed = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return out;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return out;
    char buffer[4096];
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) {
      if (closed) *closed = true;
      return out;
    }
    out.append(buffer, static_cast<std::size_t>(n));
  }
}

int status_of(const std::string& response) {
  if (response.size() < 12 || !response.starts_with("HTTP/1.1 ")) return 0;
  return std::stoi(response.substr(9, 3));
}

json body_of(const std::string& response) {
  const auto at = response.find("\r\n\r\n");
  if (at == std::string::npos) return json::object();
  auto body = json::parse(response.substr(at + 4), nullptr, false);
  return body.is_object() ? body : json::object();
}

// Sends one request with Connection: close and returns the whole response.
std::string raw_request(std::uint16_t port, const std::string& method, const std::string& target,
                        const std::string& body = {}) {
  const int fd = connect_loopback(port);
  const std::string request =
      method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
      "Connection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  EXPECT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  auto response = read_until_closed(fd, 10s);
  ::close(fd);
  return response;
}

// --- the fixture ------------------------------------------------------------------------------

// Options whose replay state stays in memory: each test starts from a fresh state (the tests of
// the persisted state name a state_file or set CUBRIDGE_STATE_DIR).
cubridge::update_endpoint_options memory_only() {
  cubridge::update_endpoint_options options;
  options.persist_state = false;
  return options;
}

struct reply {
  int status = 0;  // 0: no response (connection failed)
  json body;
};

class UpdateEndpointTest : public ::testing::Test {
 protected:
  cubridge::keypair keys = cubridge::generate_keypair();
  cubridge::keypair stranger = cubridge::generate_keypair();
  std::shared_ptr<fake_sink> sink = std::make_shared<fake_sink>();
  bytes cubin = read_file(cubridge::testing::test_cubin_path());  // sm_90
  std::unique_ptr<cubridge::update_endpoint> endpoint;
  std::uint64_t next_valid = 100;  // versions for "still serving" pushes

  // Starts the endpoint with a fresh self-signed certificate for 127.0.0.1 written into `dir`;
  // returns the certificate's path (for the client to trust).
  std::filesystem::path start_with_tls(const cubridge::testing::temp_dir& dir) {
    const auto cert = dir.path / "cert.pem", key = dir.path / "key.pem";
    cubridge::test::write_self_signed(cert, key);
    auto options = memory_only();
    options.tls_certificate = cert;
    options.tls_private_key = key;
    start(options);
    return cert;
  }

  void start(cubridge::update_endpoint_options options = memory_only()) {
    options.keys.add(keys.public_key);
    endpoint = std::make_unique<cubridge::update_endpoint>(sink, std::move(options));
    endpoint->start();
    ASSERT_TRUE(endpoint->running());
    ASSERT_NE(endpoint->port(), 0);
  }
  std::uint16_t port() const { return endpoint->port(); }

  bytes bundle(std::string name, std::uint64_t version, const cubridge::secret_key* key = nullptr,
               const bytes* payload = nullptr) const {
    cubridge::bundle_manifest_input in;
    in.name = std::move(name);
    in.version = version;
    in.target = "sm_90";
    in.kind = cubridge::payload_kind::cubin;
    return cubridge::sign_bundle(in, payload ? *payload : cubin, key ? *key : keys.secret_key);
  }

  reply send(const std::string& method, const std::string& path, const std::string& body = {}) {
    httplib::Client client("127.0.0.1", port());
    client.set_read_timeout(10, 0);
    client.set_tcp_nodelay(true);
    httplib::Result r = method == "PUT" ? client.Put(path.c_str(), body, "application/octet-stream")
                        : method == "POST" ? client.Post(path.c_str(), body, "text/plain")
                                           : client.Get(path.c_str());
    if (!r) return {0, json(httplib::to_string(r.error()))};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  reply push(const std::string& name, const bytes& b) {
    return send("PUT", "/v1/modules/" + name, as_text(b));
  }

  // The refusal, that nothing in the sink changed, and that a valid push works right after.
  void expect_refused(const reply& r, int status, const std::string& error,
                      const fake_sink::snapshot& before) {
    EXPECT_EQ(r.status, status) << r.body.dump();
    EXPECT_EQ(r.body.value("error", ""), error) << r.body.dump();
    EXPECT_FALSE(r.body.value("detail", "").empty()) << "a refusal says why: " << r.body.dump();
    EXPECT_EQ(sink->state(), before) << "a refused request changed the sink";
    expect_still_serving();
  }
  void expect_still_serving() {
    const auto v = ++next_valid;
    const auto ok = push("canary", bundle("canary", v));
    EXPECT_EQ(ok.status, 200) << "a valid push after the refusal failed: " << ok.body.dump();
    EXPECT_EQ(sink->current_version("canary"), v);
  }
};

// --- pushes -----------------------------------------------------------------------------------

TEST_F(UpdateEndpointTest, NothingListensUntilStarted) {
  cubridge::update_endpoint idle(sink, memory_only());
  EXPECT_FALSE(idle.running());
  EXPECT_EQ(idle.port(), 0);
  EXPECT_EQ(idle.url(), "");
}

TEST_F(UpdateEndpointTest, BindsLoopbackOnAnEphemeralPortAndStops) {
  start();
  EXPECT_EQ(endpoint->url(), "http://127.0.0.1:" + std::to_string(port()));
  const auto p = port();
  endpoint->stop();
  EXPECT_FALSE(endpoint->running());
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(p);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_NE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << "still listening";
  ::close(fd);
}

TEST_F(UpdateEndpointTest, BindFailureNamesTheAddress) {
  start();
  auto taken = memory_only();
  taken.port = port();
  cubridge::update_endpoint second(sink, taken);
  try {
    second.start();
    FAIL() << "binding a port in use succeeded";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::io));
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port())), std::string::npos)
        << e.what();
  }
}

TEST_F(UpdateEndpointTest, ValidPushPromotes) {
  start();
  const auto r = push("filters", bundle("filters", 3));
  ASSERT_EQ(r.status, 200) << r.body.dump();
  EXPECT_EQ(r.body["promoted"], true);
  EXPECT_EQ(r.body["module"], "filters");
  EXPECT_EQ(r.body["version"], 3);
  EXPECT_EQ(r.body["previous_version"], 0);
  EXPECT_EQ(sink->applied("filters"), std::vector<std::uint64_t>{3});
  EXPECT_EQ(endpoint->stats().applied, 1u);
}

TEST_F(UpdateEndpointTest, UnsignedBundleIs401) {
  start();
  auto b = bundle("filters", 3);
  std::fill(b.end() - 64, b.end(), std::byte{0});
  const auto before = sink->state();
  expect_refused(push("filters", b), 401, "unsigned_bundle", before);
}

TEST_F(UpdateEndpointTest, UnknownKeyIs403) {
  start();
  const auto before = sink->state();
  expect_refused(push("filters", bundle("filters", 3, &stranger.secret_key)), 403, "unknown_key",
                 before);
}

TEST_F(UpdateEndpointTest, TamperedPayloadIs403) {
  start();
  auto b = bundle("filters", 3);
  b[b.size() - 64 - 100] ^= std::byte{0x01};  // a byte of the payload's end
  const auto before = sink->state();
  expect_refused(push("filters", b), 403, "payload_mismatch", before);
}

TEST_F(UpdateEndpointTest, TamperedManifestIs403) {
  start();
  auto b = bundle("filters", 3);
  const auto text = as_text(b);
  const auto at = text.find("\"version\":3");
  ASSERT_NE(at, std::string::npos);
  b[at + 10] = std::byte{'9'};  // version 3 -> 9, same length, old signature
  const auto before = sink->state();
  expect_refused(push("filters", b), 403, "bad_signature", before);
}

TEST_F(UpdateEndpointTest, ReplayedAndOlderVersionsAre409) {
  start();
  ASSERT_EQ(push("filters", bundle("filters", 3)).status, 200);
  const auto before = sink->state();
  const auto replay = push("filters", bundle("filters", 3));
  expect_refused(replay, 409, "replayed_version", before);
  EXPECT_EQ(replay.body["current_version"], 3);
  expect_refused(push("filters", bundle("filters", 2)), 409, "older_version", sink->state());
  EXPECT_EQ(sink->applied("filters"), std::vector<std::uint64_t>{3});
}

TEST_F(UpdateEndpointTest, AVersionSeenBeforeStaysRefusedAfterARollback) {
  start();
  ASSERT_EQ(push("filters", bundle("filters", 3)).status, 200);
  const auto v4 = bundle("filters", 4);
  ASSERT_EQ(push("filters", v4).status, 200);
  const auto r = send("POST", "/v1/modules/filters/rollback",
                      cubridge::sign_rollback_request("filters", 4, keys.secret_key));
  ASSERT_EQ(r.status, 200) << r.body.dump();
  ASSERT_EQ(sink->current_version("filters"), 3u);
  // A captured v4 must not come back on its own: only a newer version moves forward.
  expect_refused(push("filters", v4), 409, "replayed_version", sink->state());
  EXPECT_EQ(push("filters", bundle("filters", 5)).status, 200);
}

// Issue 12: the module's record of its versions is the one truth, whoever promoted. A version
// promoted past the endpoint (here bundle v7, as a hot_reloader or a direct promote() would) is
// what the replay check, the rollback check and the status see; and once the endpoint has seen
// it serve, it stays the floor after a rollback below it.
TEST_F(UpdateEndpointTest, AVersionPromotedPastTheEndpointIsWhatItChecksAndReports) {
  start();
  ASSERT_EQ(push("filters", bundle("filters", 3)).status, 200);
  sink->promote_directly("filters", 7);  // no endpoint involved
  ASSERT_EQ(sink->current_version("filters"), 7u);

  const auto older = push("filters", bundle("filters", 6));
  expect_refused(older, 409, "older_version", sink->state());
  EXPECT_EQ(older.body["current_version"], 7) << older.body.dump();

  auto status = send("GET", "/v1/modules");
  ASSERT_EQ(status.status, 200);
  json filters;
  for (const auto& m : status.body["modules"])
    if (m["name"] == "filters") filters = m;
  EXPECT_EQ(filters["current_version"], 7) << status.body.dump();
  EXPECT_EQ(filters["versions_held"], json::array({3, 7})) << status.body.dump();
  EXPECT_GE(filters["highest_version"].get<std::uint64_t>(), 7u) << status.body.dump();

  // A rollback request from what the endpoint last pushed (v3) no longer matches: v7 serves.
  const auto stale = send("POST", "/v1/modules/filters/rollback",
                          cubridge::sign_rollback_request("filters", 3, keys.secret_key));
  EXPECT_EQ(stale.status, 409) << stale.body.dump();
  EXPECT_EQ(stale.body.value("error", ""), "version_mismatch");
  // From v7, back to whatever the module holds as the version before it: v3.
  const auto back = send("POST", "/v1/modules/filters/rollback",
                         cubridge::sign_rollback_request("filters", 7, keys.secret_key));
  ASSERT_EQ(back.status, 200) << back.body.dump();
  EXPECT_EQ(back.body["version"], 3);
  EXPECT_EQ(back.body["from_version"], 7);
  EXPECT_EQ(sink->current_version("filters"), 3u);

  // v7 was applied (past the endpoint): v6 and v7 stay refused after the rollback below them.
  expect_refused(push("filters", bundle("filters", 6)), 409, "older_version", sink->state());
  expect_refused(push("filters", bundle("filters", 7)), 409, "replayed_version", sink->state());
  status = send("GET", "/v1/modules");
  for (const auto& m : status.body["modules"])
    if (m["name"] == "filters") filters = m;
  EXPECT_EQ(filters["current_version"], 3) << status.body.dump();
  EXPECT_EQ(filters["highest_version"], 7) << status.body.dump();
  EXPECT_EQ(push("filters", bundle("filters", 8)).status, 200);
  EXPECT_EQ(sink->current_version("filters"), 8u);
}

// The floor survives a restart too: the endpoint writes a served version it did not push to
// its state file when it sees it (at a push refused against it, or a rollback from it).
TEST_F(UpdateEndpointTest, AVersionPromotedPastTheEndpointIsPersistedAsTheFloor) {
  cubridge::testing::temp_dir dir;
  auto options = memory_only();
  options.state_file = dir.path / "state.json";
  start(options);
  ASSERT_EQ(push("filters", bundle("filters", 3)).status, 200);
  sink->promote_directly("filters", 7);
  ASSERT_EQ(send("POST", "/v1/modules/filters/rollback",
                 cubridge::sign_rollback_request("filters", 7, keys.secret_key))
                .status,
            200);
  endpoint->stop();
  endpoint.reset();
  start(options);  // same sink (serving v3), the state file read again
  expect_refused(push("filters", bundle("filters", 5)), 409, "older_version", sink->state());
  EXPECT_EQ(push("filters", bundle("filters", 8)).status, 200);
}

TEST_F(UpdateEndpointTest, OversizedBodyIs413) {
  auto options = memory_only();
  options.max_body_bytes = 8 << 10;  // below the test cubin's size
  start(options);
  const auto before = sink->state();
  const auto r = push("filters", bundle("filters", 3));
  EXPECT_EQ(r.status, 413) << r.body.dump();
  EXPECT_EQ(r.body.value("error", ""), "too_large");
  EXPECT_EQ(sink->state(), before);
  // A much larger body is cut off by the same limit, and the service keeps serving.
  const auto huge = raw_request(port(), "PUT", "/v1/modules/filters", std::string(1 << 20, 'x'));
  EXPECT_EQ(status_of(huge), 413) << huge.substr(0, 200);
  EXPECT_EQ(sink->state(), before);
  const auto small = bytes(64, std::byte{'x'});
  cubridge::bundle_manifest_input in{"canary", 1, "sm_90", cubridge::payload_kind::cuda_source};
  const auto ok = push("canary", cubridge::sign_bundle(in, small, keys.secret_key));
  EXPECT_EQ(ok.status, 200) << ok.body.dump();
}

TEST_F(UpdateEndpointTest, MalformedBundlesAre400) {
  start();
  const auto before = sink->state();
  expect_refused(send("PUT", "/v1/modules/filters", "not a bundle"), 400, "bad_magic", before);
  auto truncated = bundle("filters", 3);
  truncated.resize(truncated.size() - 10);
  expect_refused(push("filters", truncated), 400, "malformed", before);
  expect_refused(push("filters", cubridge::detail::sign_bundle_unchecked("{\"name\":", cubin,
                                                                         keys.secret_key)),
                 400, "malformed_manifest", before);
  cubridge::bundle_manifest_input in{"filters", 3, "sm_90"};
  auto manifest = cubridge::detail::manifest_json(in, cubin, keys.public_key);
  manifest.insert(1, "\"extra\":1,");
  expect_refused(
      push("filters", cubridge::detail::sign_bundle_unchecked(manifest, cubin, keys.secret_key)),
      400, "invalid_manifest", before);
}

TEST_F(UpdateEndpointTest, NamesThatAreNotNamesAre400BeforeAnything) {
  start();
  const auto before = sink->state();
  const auto body = as_text(bundle("filters", 3));
  for (const std::string& target : std::vector<std::string>{
           "/v1/modules/a/b", "/v1/modules/..", "/v1/modules/%2e%2e", "/v1/modules/a%2Fb",
           "/v1/modules/..%2Fetc%2Fpasswd", "/v1/modules/a%5Cb", "/v1/modules/a%00b",
           "/v1/modules/a%0Ab", "/v1/modules/", "/v1/modules/.",
           "/v1/modules/" + std::string(129, 'n')}) {
    const auto response = raw_request(port(), "PUT", target, body);
    EXPECT_EQ(status_of(response), 400) << target << ": " << response.substr(0, 300);
    EXPECT_EQ(body_of(response).value("error", ""), "bad_name") << target;
    const auto rollback = raw_request(port(), "POST", target + "/rollback", "x");
    EXPECT_EQ(status_of(rollback), 400) << target << "/rollback: " << rollback.substr(0, 300);
  }
  EXPECT_EQ(sink->state(), before);
  expect_still_serving();
}

TEST_F(UpdateEndpointTest, UrlNameMustBeTheSignedName) {
  start();
  const auto before = sink->state();
  expect_refused(push("other", bundle("filters", 3)), 400, "name_mismatch", before);
}

TEST_F(UpdateEndpointTest, PayloadForAnotherGpuIs422) {
  sink->device = cubridge::compute_capability{8, 0};  // an sm_90 cubin cannot run here
  start();
  const auto before = sink->state();
  const auto r = push("filters", bundle("filters", 3));
  EXPECT_EQ(r.status, 422) << r.body.dump();
  EXPECT_EQ(r.body.value("error", ""), "wrong_device");
  EXPECT_EQ(r.body.value("gpu", ""), "sm_80");
  EXPECT_EQ(sink->state(), before);
  const auto other = read_file(cubridge::testing::test_cubin_other_path());  // sm_80
  cubridge::bundle_manifest_input in{"filters", 3, "sm_80"};
  const auto ok = push("filters", cubridge::sign_bundle(in, other, keys.secret_key));
  EXPECT_EQ(ok.status, 200) << ok.body.dump();
}

// verify_bundle inspects a pushed cubin once; the endpoint decides the device from that image
// (it does not parse the payload again), and the sink gets it with the bundle.
TEST_F(UpdateEndpointTest, APushedPayloadIsInspectedOnce) {
  start();
  std::mutex seen_mutex;
  std::vector<std::string> kernels_seen;
  sink->hook = [&](const cubridge::verified_bundle& b) -> std::optional<sink_result> {
    std::lock_guard lock(seen_mutex);
    if (b.image)
      for (const auto& k : b.image->kernels) kernels_seen.push_back(k.name);
    return std::nullopt;
  };
  const auto calls = cubridge::detail::inspect_image_calls();
  const auto r = push("filters", bundle("filters", 3));
  ASSERT_EQ(r.status, 200) << r.body.dump();
  EXPECT_EQ(cubridge::detail::inspect_image_calls() - calls, 1u);
  std::vector<std::string> expected;
  for (const auto& k : cubridge::inspect_image(cubin).kernels) expected.push_back(k.name);
  std::lock_guard lock(seen_mutex);
  EXPECT_EQ(kernels_seen, expected);
  EXPECT_FALSE(kernels_seen.empty());
}

TEST_F(UpdateEndpointTest, StageRefusalIs422AndReported) {
  start();
  sink->hook = [](const cubridge::verified_bundle& b) -> std::optional<sink_result> {
    if (b.version() == 4)
      return sink_result{gate_reason::stage_refused, 3, "kernel 'blur' missing"};
    return std::nullopt;
  };
  ASSERT_EQ(push("filters", bundle("filters", 3)).status, 200);
  const auto r = push("filters", bundle("filters", 4));
  EXPECT_EQ(r.status, 422) << r.body.dump();
  EXPECT_EQ(r.body.value("error", ""), "stage_refused");
  EXPECT_EQ(r.body.value("detail", ""), "kernel 'blur' missing");
  EXPECT_EQ(sink->current_version("filters"), 3u);
  const auto status = send("GET", "/v1/modules");
  ASSERT_EQ(status.status, 200);
  bool found = false;
  for (const auto& m : status.body["modules"])
    if (m["name"] == "filters") {
      found = true;
      EXPECT_EQ(m["last_error"], "kernel 'blur' missing");
      EXPECT_NE(m["last_refusal"].get<std::string>().find("422 stage_refused"), std::string::npos);
    }
  EXPECT_TRUE(found) << status.body.dump();
  // A fixed version 4 may still come: a refused version was never applied.
  sink->hook = nullptr;
  EXPECT_EQ(push("filters", bundle("filters", 4)).status, 200);
}

TEST_F(UpdateEndpointTest, UnknownModuleIs404WhenTheSinkCreatesNone) {
  sink->creates_modules = false;
  start();
  const auto r = push("filters", bundle("filters", 3));
  EXPECT_EQ(r.status, 404) << r.body.dump();
  EXPECT_EQ(r.body.value("error", ""), "unknown_module");
}

TEST_F(UpdateEndpointTest, SinkExceptionIs500AndChangesNothing) {
  start();
  ASSERT_EQ(push("filters", bundle("filters", 3)).status, 200);
  sink->hook = [](const cubridge::verified_bundle&) -> std::optional<sink_result> {
    throw std::runtime_error("out of device memory");
  };
  const auto r = push("filters", bundle("filters", 4));
  EXPECT_EQ(r.status, 500) << r.body.dump();
  EXPECT_EQ(r.body.value("error", ""), "apply_failed");
  EXPECT_NE(r.body.value("detail", "").find("out of device memory"), std::string::npos);
  EXPECT_EQ(sink->current_version("filters"), 3u);
}

TEST_F(UpdateEndpointTest, StatusListsEveryModule) {
  start();
  ASSERT_EQ(push("filters", bundle("filters", 3)).status, 200);
  ASSERT_EQ(push("filters", bundle("filters", 5)).status, 200);
  ASSERT_EQ(push("blur", bundle("blur", 1)).status, 200);
  ASSERT_EQ(push("filters", bundle("filters", 4)).status, 409);
  const auto r = send("GET", "/v1/modules");
  ASSERT_EQ(r.status, 200) << r.body.dump();
  EXPECT_EQ(r.body["gpu"], "sm_90");
  ASSERT_EQ(r.body["modules"].size(), 2u) << r.body.dump();
  const auto& filters = r.body["modules"][1];
  EXPECT_EQ(filters["name"], "filters");
  EXPECT_EQ(filters["current_version"], 5);
  EXPECT_EQ(filters["versions_held"], json::array({3, 5}));
  EXPECT_EQ(filters["in_flight"], 3);
  EXPECT_EQ(filters["last_error"], nullptr);
  EXPECT_NE(filters["last_refusal"].get<std::string>().find("409 older_version"),
            std::string::npos);
  EXPECT_EQ(r.body["endpoint"]["applied"], 3);
  EXPECT_EQ(r.body["endpoint"]["refused"], 1);
}

TEST_F(UpdateEndpointTest, UnknownRoutesAre404InJson) {
  start();
  const auto r = send("GET", "/v2/everything");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body.value("error", ""), "not_found");
}

// --- metrics ----------------------------------------------------------------------------------

TEST_F(UpdateEndpointTest, MetricsAreOffByDefault) {
  start();
  const auto r = send("GET", "/metrics");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body.value("error", ""), "not_found");
}

// GET /metrics: the sink's modules and the endpoint's counters, refusals by reason (the
// handlers' and the transport's), each line of the text format; nothing but a bodiless GET.
TEST_F(UpdateEndpointTest, MetricsServeModulesAndCountersAsPrometheusText) {
  auto options = memory_only();
  options.serve_metrics = true;
  start(options);
  ASSERT_EQ(push("filters", bundle("filters", 4)).status, 200);
  EXPECT_EQ(push("filters", bundle("filters", 4)).status, 409);
  EXPECT_EQ(push("filters", bundle("filters", 5, &stranger.secret_key)).status, 403);
  // A body on the bodiless route: refused by the transport from the Content-Length.
  const auto with_body = raw_request(port(), "GET", "/metrics", "x");
  EXPECT_NE(with_body.find(" 413 "), std::string::npos) << with_body;
  const auto post = raw_request(port(), "POST", "/metrics");
  EXPECT_NE(post.find(" 404 "), std::string::npos) << post;

  const auto response = raw_request(port(), "GET", "/metrics");
  ASSERT_NE(response.find("HTTP/1.1 200 OK\r\n"), std::string::npos) << response;
  EXPECT_NE(response.find("Content-Type: text/plain; version=0.0.4\r\n"), std::string::npos)
      << response;
  const auto text = response.substr(response.find("\r\n\r\n") + 4);
  for (const char* line : {
           "# TYPE cubridge_module_version gauge\n",
           "cubridge_module_version{module=\"filters\"} 4\n",
           "cubridge_module_versions_held{module=\"filters\"} 1\n",
           "cubridge_module_retired_waiting{module=\"filters\"} 3\n",
           "# TYPE cubridge_update_applied_total counter\n",
           "cubridge_update_applied_total 1\n",
           "cubridge_update_rollbacks_total 0\n",
           "cubridge_update_refused_total{reason=\"replayed_version\"} 1\n",
           "cubridge_update_refused_total{reason=\"unknown_key\"} 1\n",
           "cubridge_update_refused_total{reason=\"too_large\"} 1\n",
           "cubridge_update_connections_refused_total 0\n",
           "# TYPE cubridge_update_open_connections gauge\n",
       })
    EXPECT_NE(text.find(line), std::string::npos) << line << "in:\n" << text;
  EXPECT_EQ(text.find("not_found"), std::string::npos) << "no such route is no refusal";
  EXPECT_EQ(text.find("cubridge_module_promotions_total"), std::string::npos)
      << "the fake sink reports no counters";
  const std::regex line_grammar(
      R"((# (HELP|TYPE) [a-z_]+ .*)|([a-z_]+(\{[a-z_]+="[^"\\]*"\})? [0-9]+))");
  std::size_t lines = 0;
  for (std::size_t at = 0, end; (end = text.find('\n', at)) != std::string::npos; at = end + 1) {
    EXPECT_TRUE(std::regex_match(text.substr(at, end - at), line_grammar))
        << text.substr(at, end - at);
    ++lines;
  }
  EXPECT_GT(lines, 20u);
  EXPECT_EQ(text.back(), '\n');
}

// --- liveness and readiness -------------------------------------------------------------------

// A simulated sticky error (note_cuda_result with no GPU involved): the record is forgotten
// before and after each test, which the driver would not do for a real one.
class ReadinessTest : public UpdateEndpointTest {
 protected:
  void SetUp() override { cubridge::detail::reset_process_health_for_tests(); }
  void TearDown() override { cubridge::detail::reset_process_health_for_tests(); }

  // The sticky errors are named alike with and without a driver (driver_error_name).
  static bool names_illegal_address(const json& error) {
    return error == "CUDA_ERROR_ILLEGAL_ADDRESS";
  }
};

TEST_F(ReadinessTest, AHealthyProcessIsLiveAndReadyWithoutAKeyOrMetrics) {
  start();
  const auto live = send("GET", "/healthz");
  EXPECT_EQ(live.status, 200);
  EXPECT_EQ(live.body, json({{"status", "live"}}));
  const auto ready = send("GET", "/readyz");
  EXPECT_EQ(ready.status, 200);
  EXPECT_EQ(ready.body, json({{"status", "ready"}}));
  EXPECT_GE(sink->probes.load(), 1) << "readiness asks the sink, which asks the driver";
  // Bodiless GETs, as every route outside /v1/modules/: a body is refused from the
  // Content-Length, another method finds no route.
  EXPECT_NE(raw_request(port(), "GET", "/readyz", "x").find(" 413 "), std::string::npos);
  EXPECT_NE(raw_request(port(), "POST", "/healthz").find(" 404 "), std::string::npos);
}

TEST_F(ReadinessTest, TheFirstProbeAfterAStickyErrorIs503NamingItAndLivenessStays200) {
  auto options = memory_only();
  options.serve_metrics = true;
  start(options);
  ASSERT_EQ(push("filters", bundle("filters", 4)).status, 200);
  const auto before = send("GET", "/readyz");
  ASSERT_EQ(before.status, 200) << before.body.dump();
  const auto healthy_metrics = raw_request(port(), "GET", "/metrics");
  EXPECT_NE(healthy_metrics.find("\ncubridge_process_poisoned 0\n"), std::string::npos)
      << healthy_metrics;
  EXPECT_EQ(healthy_metrics.find("cubridge_process_poisoned_since_seconds"), std::string::npos);

  const auto at = std::chrono::system_clock::now();
  cubridge::note_cuda_result(CUDA_ERROR_ILLEGAL_ADDRESS, "test");
  const auto ready = send("GET", "/readyz");  // the very next request
  EXPECT_EQ(ready.status, 503) << ready.body.dump();
  EXPECT_EQ(ready.body.value("status", ""), "poisoned") << ready.body.dump();
  EXPECT_TRUE(names_illegal_address(ready.body["error"])) << ready.body.dump();
  EXPECT_EQ(ready.body.value("call", ""), "test");
  const auto since = cubridge::detail::parse_time(ready.body.value("since", ""));
  ASSERT_TRUE(since.has_value()) << ready.body.dump();
  EXPECT_LE(std::chrono::abs(*since - std::chrono::floor<std::chrono::seconds>(at)), 2s);
  EXPECT_TRUE(ready.body["running"].is_array()) << "no hot modules here: an empty list";

  const auto live = send("GET", "/healthz");
  EXPECT_EQ(live.status, 200) << "a poisoned process is still live";
  EXPECT_EQ(live.body, json({{"status", "live"}}));

  const auto metrics = raw_request(port(), "GET", "/metrics");
  EXPECT_NE(metrics.find("\ncubridge_process_poisoned 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\ncubridge_process_poisoned_since_seconds "), std::string::npos)
      << metrics;
  EXPECT_EQ(endpoint->stats().refused, 0u) << "a 503 of readiness is no refusal";
}

TEST_F(ReadinessTest, AStickyErrorOnlyTheSinksProbeSeesMakesTheSameProbe503) {
  start();
  ASSERT_EQ(send("GET", "/readyz").status, 200);
  // A context faulted while no call was made: only the driver's answer to the probe says so.
  sink->probe_finds_fault = true;
  const auto ready = send("GET", "/readyz");
  EXPECT_EQ(ready.status, 503) << ready.body.dump();
  EXPECT_EQ(ready.body.value("call", ""), "health probe") << ready.body.dump();
}

TEST_F(ReadinessTest, ANonStickyErrorLeavesTheProcessReady) {
  start();
  cubridge::note_cuda_result(CUDA_ERROR_INVALID_VALUE, "test");
  cubridge::note_cuda_result(CUDA_ERROR_OUT_OF_MEMORY, "test");
  EXPECT_EQ(send("GET", "/readyz").status, 200);
}

// --- rollback ---------------------------------------------------------------------------------

class RollbackTest : public UpdateEndpointTest {
 protected:
  void SetUp() override {
    start();
    ASSERT_EQ(push("filters", bundle("filters", 4)).status, 200);
    ASSERT_EQ(push("filters", bundle("filters", 5)).status, 200);
  }
  reply rollback(const std::string& name, const std::string& body) {
    return send("POST", "/v1/modules/" + name + "/rollback", body);
  }
};

TEST_F(RollbackTest, SignedRollbackGoesBackOnceOnly) {
  const auto request = cubridge::sign_rollback_request("filters", 5, keys.secret_key);
  const auto r = rollback("filters", request);
  ASSERT_EQ(r.status, 200) << r.body.dump();
  EXPECT_EQ(r.body["rolled_back"], true);
  EXPECT_EQ(r.body["version"], 4);
  EXPECT_EQ(r.body["from_version"], 5);
  EXPECT_EQ(sink->current_version("filters"), 4u);
  expect_refused(rollback("filters", request), 409, "replayed_request", sink->state());
  // A fresh request from a version that no longer serves.
  expect_refused(
      rollback("filters", cubridge::sign_rollback_request("filters", 5, keys.secret_key)), 409,
      "version_mismatch", sink->state());
}

TEST_F(RollbackTest, RefusedRequests) {
  const auto before = sink->state();
  auto request = cubridge::sign_rollback_request("filters", 5, keys.secret_key);
  auto unsigned_request = request.substr(0, request.find('\n') + 1) + std::string(128, '0');
  expect_refused(rollback("filters", unsigned_request), 401, "unsigned_bundle", before);
  expect_refused(
      rollback("filters", cubridge::sign_rollback_request("filters", 5, stranger.secret_key)), 403,
      "unknown_key", before);
  auto tampered = request;
  tampered.replace(tampered.find("\"from_version\":5"), 16, "\"from_version\":4");
  expect_refused(rollback("filters", tampered), 403, "bad_signature", before);
  expect_refused(
      rollback("filters", cubridge::sign_rollback_request("filters", 5, keys.secret_key,
                                                          std::chrono::system_clock::now() - 1h)),
      403, "expired_request", before);
  expect_refused(rollback("filters", "roll it back please"), 400, "malformed", before);
  expect_refused(
      rollback("filters", cubridge::detail::sign_rollback_line_unchecked(
                              "{\"action\":\"rollback\",\"action\":1}", keys.secret_key)),
      400, "malformed_manifest", before);
  expect_refused(rollback("other", request), 400, "name_mismatch", before);
  expect_refused(rollback("ghost", cubridge::sign_rollback_request("ghost", 1, keys.secret_key)),
                 404, "unknown_module", before);
  // The refusals above used no nonce up: the original request still works.
  EXPECT_EQ(rollback("filters", request).status, 200);
}

TEST_F(RollbackTest, NothingToRollBackTo) {
  ASSERT_EQ(push("solo", bundle("solo", 1)).status, 200);
  const auto before = sink->state();
  expect_refused(rollback("solo", cubridge::sign_rollback_request("solo", 1, keys.secret_key)), 409,
                 "no_previous_version", before);
}

// --- connections ------------------------------------------------------------------------------

// Reads until `text` has arrived, the server closes, or `timeout` passes; returns what arrived.
std::string read_until(int fd, std::string_view text, std::chrono::milliseconds timeout) {
  std::string out;
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (out.find(text) == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    char buffer[4096];
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    out.append(buffer, static_cast<std::size_t>(n));
  }
  return out;
}

// What the endpoint answers to `head` (a request line and headers, no body) without being sent
// anything more, and whether it then closed the connection.
struct raw_answer {
  std::string text;
  bool closed = false;
};
raw_answer answer_to(std::uint16_t port, const std::string& head,
                     std::chrono::milliseconds timeout = 3s) {
  const int fd = connect_loopback(port);
  ::send(fd, head.data(), head.size(), MSG_NOSIGNAL);
  raw_answer a;
  a.text = read_until_closed(fd, timeout, &a.closed);
  ::close(fd);
  return a;
}

// Sends `request_line` with `headers`, Connection: close and `body`; returns the whole response.
std::string raw_request_with(std::uint16_t port, const std::string& request_line,
                             const std::string& headers, const std::string& body) {
  const int fd = connect_loopback(port);
  const std::string request = request_line +
                              " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + headers +
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  auto response = read_until_closed(fd, 10s);
  ::close(fd);
  return response;
}

// Waits (boundedly) until the endpoint holds `n` connections.
bool holds_connections(const cubridge::update_endpoint& endpoint, std::uint64_t n) {
  for (int i = 0; i < 500; ++i) {
    if (endpoint.stats().open_connections == n) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

std::size_t count_of(std::string_view text, std::string_view what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string_view::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Framing is decided from the headers alone, before any body byte is buffered: every case below
// is answered at once (the test sends no body), where before the endpoint waited for (and
// buffered) a chunked, unbounded or compressed body, or one over the route's limit.
TEST_F(UpdateEndpointTest, FramingIsDecidedFromTheHeadersBeforeAnyBodyIsBuffered) {
  auto options = memory_only();
  options.max_body_bytes = 1 << 20;
  start(options);
  const auto before = sink->state();
  const auto refused_before = endpoint->stats().refused;
  const std::string put = "PUT /v1/modules/filters HTTP/1.1\r\nHost: x\r\n";
  const std::string rollback = "POST /v1/modules/filters/rollback HTTP/1.1\r\nHost: x\r\n";
  const std::string other = "POST /v2/nothing HTTP/1.1\r\nHost: x\r\n";
  const std::string del = "DELETE /v1/modules/filters HTTP/1.1\r\nHost: x\r\n";
  const std::string get = "GET /v1/modules HTTP/1.1\r\nHost: x\r\n";
  std::string many_headers, large_headers;
  for (int i = 0; i < 150; ++i) many_headers += "X-" + std::to_string(i) + ": 1\r\n";
  for (int i = 0; i < 200; ++i)
    large_headers += "X-" + std::to_string(i) + ": " + std::string(100, 'a') + "\r\n";
  struct framing_case {
    std::string head;
    int status;
    std::string error;
  };
  const std::vector<framing_case> cases{
      {put + "Transfer-Encoding: chunked\r\n\r\n", 411, "length_required"},
      {put + "Content-Length: 10\r\nTransfer-Encoding: chunked\r\n\r\n", 411, "length_required"},
      {put + "Transfer-Encoding: gzip, chunked\r\n\r\n", 411, "length_required"},
      {put + "\r\n", 411, "length_required"},
      {put + "Content-Length: 1048577\r\n\r\n", 413, "too_large"},
      {put + "Content-Length: 99999999999999999999999999\r\n\r\n", 413, "too_large"},
      {put + "Content-Length: 10\r\nContent-Length: 10\r\n\r\n", 400, "bad_request"},
      {put + "Content-Length: 10, 10\r\n\r\n", 400, "bad_request"},
      {put + "Content-Length: 1e3\r\n\r\n", 400, "bad_request"},
      {put + "Content-Length: -1\r\n\r\n", 400, "bad_request"},
      {put + "Content-Length: %31%30\r\n\r\n", 400, "bad_request"},
      {put + "Content-Length : 10\r\n\r\n", 400, "bad_request"},
      {put + "Content-Length: 10\n\r\n", 400, "bad_request"},
      {put + " Content-Length: 10\r\n\r\n", 400, "bad_request"},
      {put + "Content-Length: 100\r\nContent-Encoding: gzip\r\n\r\n", 415, "unsupported_encoding"},
      {put + "Content-Length: 100\r\nContent-Encoding: deflate\r\n\r\n", 415,
       "unsupported_encoding"},
      {put + "Content-Length: 100\r\nContent-Encoding: br\r\n\r\n", 415, "unsupported_encoding"},
      {put + "Content-Length: 100\r\nContent-Type: multipart/form-data; boundary=x\r\n\r\n", 415,
       "unsupported_media_type"},
      {put + "Content-Length: 100\r\nContent-Type: Multipart/mixed; boundary=x\r\n\r\n", 415,
       "unsupported_media_type"},
      {rollback + "Content-Length: 4097\r\n\r\n", 413, "too_large"},
      {rollback + "Transfer-Encoding: chunked\r\n\r\n", 411, "length_required"},
      {rollback + "\r\n", 411, "length_required"},
      {rollback + "Content-Length: 100\r\nContent-Encoding: gzip\r\n\r\n", 415,
       "unsupported_encoding"},
      {other + "Content-Length: 100\r\n\r\n", 413, "too_large"},
      {other + "Transfer-Encoding: chunked\r\n\r\n", 411, "length_required"},
      {del + "Content-Length: 100\r\n\r\n", 413, "too_large"},
      {del + "Transfer-Encoding: chunked\r\n\r\n", 411, "length_required"},
      {get + "Content-Length: 10\r\n\r\n", 413, "too_large"},
      {get + many_headers + "\r\n", 431, "headers_too_large"},
      {get + large_headers + "\r\n", 431, "headers_too_large"},
  };
  for (const auto& c : cases) {
    const auto a = answer_to(port(), c.head);
    const auto shown = c.head.substr(0, 120);
    EXPECT_EQ(status_of(a.text), c.status) << shown << "\n-> " << a.text.substr(0, 300);
    EXPECT_EQ(body_of(a.text).value("error", ""), c.error) << shown;
    EXPECT_FALSE(body_of(a.text).value("detail", "").empty()) << shown;
    EXPECT_TRUE(a.closed) << "the connection stays open after a framing refusal: " << shown;
  }
  EXPECT_EQ(endpoint->stats().refused, refused_before + cases.size());
  EXPECT_EQ(sink->state(), before);
  expect_still_serving();
}

// A body is read to its Content-Length and no further: what follows is the next request, and a
// connection serves keep_alive_max_requests requests at most.
TEST_F(UpdateEndpointTest, PipelinedRequestsAreServedInOrderUpToTheRequestLimit) {
  auto options = memory_only();
  options.keep_alive_max_requests = 2;
  start(options);
  const auto b = as_text(bundle("filters", 3));
  const std::string get = "GET /v1/modules HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string requests =
      "PUT /v1/modules/filters HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(b.size()) +
      "\r\n\r\n" + b + get + get;
  const int fd = connect_loopback(port());
  ASSERT_EQ(::send(fd, requests.data(), requests.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(requests.size()));
  bool closed = false;
  const auto answers = read_until_closed(fd, 10s, &closed);
  ::close(fd);
  EXPECT_TRUE(closed) << "the connection outlived keep_alive_max_requests";
  EXPECT_EQ(count_of(answers, "HTTP/1.1 200 OK\r\n"), 2u) << answers;
  EXPECT_NE(answers.find("\"promoted\":true"), std::string::npos) << answers;
  EXPECT_EQ(count_of(answers, "Connection: close\r\n"), 1u) << answers;
  EXPECT_EQ(sink->applied("filters"), std::vector<std::uint64_t>{3});
}

// A body httplib did not read (refused before it, here for the name) is never taken for the next
// request: the connection closes after the answer.
TEST_F(UpdateEndpointTest, AnUnreadBodyIsNeverTakenForTheNextRequest) {
  start();
  const std::string inner = "GET /v1/modules HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string request = "PUT /v1/modules/a%2Fb HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                              std::to_string(inner.size()) + "\r\n\r\n" + inner;
  const int fd = connect_loopback(port());
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  bool closed = false;
  const auto answers = read_until_closed(fd, 10s, &closed);
  ::close(fd);
  EXPECT_EQ(status_of(answers), 400) << answers;
  EXPECT_EQ(count_of(answers, "HTTP/1.1 "), 1u) << "the body was served as a request: " << answers;
  EXPECT_TRUE(closed);
}

// curl sends `Expect: 100-continue` for bodies over 1 MiB and waits for it: the endpoint answers
// 100 once the headers pass the checks, exactly once, and never before a refusal.
TEST_F(UpdateEndpointTest, ExpectContinueIsAnsweredOnceAndOnlyWhenTheHeadersPass) {
  auto options = memory_only();
  options.max_body_bytes = 1 << 20;
  start(options);
  const auto over = answer_to(port(),
                              "PUT /v1/modules/filters HTTP/1.1\r\nHost: x\r\nExpect: 100-continue"
                              "\r\nContent-Length: 2000000\r\n\r\n");
  EXPECT_EQ(status_of(over.text), 413) << "a refusal, not 100 Continue: " << over.text;

  const auto b = as_text(bundle("filters", 3));
  const std::string head =
      "PUT /v1/modules/filters HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
      "Expect: 100-continue\r\nContent-Length: " +
      std::to_string(b.size()) + "\r\n\r\n";
  const int fd = connect_loopback(port());
  ::send(fd, head.data(), head.size(), MSG_NOSIGNAL);
  const auto interim = read_until(fd, "\r\n\r\n", 5s);
  EXPECT_EQ(interim, "HTTP/1.1 100 Continue\r\n\r\n");
  ::send(fd, b.data(), b.size(), MSG_NOSIGNAL);
  const auto final_answer = read_until_closed(fd, 10s);
  ::close(fd);
  EXPECT_EQ(status_of(final_answer), 200) << final_answer;
  EXPECT_EQ(count_of(final_answer, "100 Continue"), 0u)
      << "a second 100 Continue: " << final_answer;
  EXPECT_EQ(sink->applied("filters"), std::vector<std::uint64_t>{3});
}

// The README's command line, as written: curl sends the bundle as
// application/x-www-form-urlencoded (which httplib refused over 8 KiB with a false 413) and with
// Expect: 100-continue over 1 MiB.
TEST_F(UpdateEndpointTest, TheDocumentedCurlCommandPushesABundle) {
  if (std::system("curl --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "curl is not installed";
  start();
  cubridge::testing::temp_dir dir;
  const auto small = bundle("filters", 7);  // the test cubin: 13 KB
  ASSERT_GT(small.size(), 8u << 10);
  const bytes source(2u << 20, std::byte{'/'});
  cubridge::bundle_manifest_input in{"big", 1, "sm_90", cubridge::payload_kind::cuda_source};
  const auto big = cubridge::sign_bundle(in, source, keys.secret_key);
  for (const auto& [name, b] :
       std::vector<std::pair<std::string, bytes>>{{"filters", small}, {"big", big}}) {
    const auto file = dir.path / (name + ".bundle");
    cubridge::testing::write_text(file, as_text(b));
    const auto out = dir.path / (name + ".out");
    const std::string command = "curl --fail-with-body -X PUT --data-binary @" + file.string() +
                                " " + endpoint->url() + "/v1/modules/" + name + " > " +
                                out.string() + " 2> " + (dir.path / (name + ".err")).string();
    const int rc = std::system(command.c_str());
    std::ifstream answer_file(out);
    const std::string answer((std::istreambuf_iterator<char>(answer_file)),
                             std::istreambuf_iterator<char>());
    EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << command << " -> " << rc << ": " << answer;
    EXPECT_EQ(json::parse(answer, nullptr, false).value("promoted", false), true) << answer;
  }
  EXPECT_EQ(sink->applied("filters"), std::vector<std::uint64_t>{7});
  EXPECT_EQ(sink->applied("big"), std::vector<std::uint64_t>{1});
  // multipart is the one Content-Type refused: httplib would parse it as a form.
  const auto b = as_text(small);
  const auto multipart = raw_request_with(port(), "PUT /v1/modules/filters",
                                          "Content-Type: multipart/form-data; boundary=x\r\n", b);
  EXPECT_EQ(status_of(multipart), 415) << multipart.substr(0, 300);
  EXPECT_NE(body_of(multipart).value("detail", "").find("multipart"), std::string::npos);
}

// Slow clients cost a connection slot and a bounded buffer, never a worker: 40 of them trickle
// headers or bodies while a client pushes and queries, each answered at once; stop() returns at
// once with all of them connected.
TEST_F(UpdateEndpointTest, SlowClientsNeverDelayOtherRequestsNorStop) {
  start();  // 4 workers, request_timeout 30 s
  std::vector<int> slow;
  for (int i = 0; i < 40; ++i) {
    slow.push_back(connect_loopback(port()));
    const std::string head =
        i % 2 ? "PUT /v1/modules/slow HTTP/1.1\r\nHost: x\r\nX-Slow: "
              : "PUT /v1/modules/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n";
    ::send(slow.back(), head.data(), head.size(), MSG_NOSIGNAL);
  }
  std::atomic<bool> trickling{true};
  std::thread trickle([&] {
    while (trickling) {
      for (int fd : slow) ::send(fd, "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      std::this_thread::sleep_for(100ms);
    }
  });
  std::this_thread::sleep_for(300ms);  // every slow client connected and trickling
  auto slowest = std::chrono::steady_clock::duration::zero();
  for (int i = 0; i < 20; ++i) {
    const auto began = std::chrono::steady_clock::now();
    const auto r =
        i % 2 ? send("GET", "/v1/modules") : push("canary", bundle("canary", ++next_valid));
    slowest = std::max(slowest, std::chrono::steady_clock::now() - began);
    EXPECT_EQ(r.status, 200) << "request " << i << ": " << r.body.dump();
  }
  EXPECT_LT(slowest, 2s) << "a request waited behind slow clients";
  const auto stopping = std::chrono::steady_clock::now();
  endpoint->stop();
  const auto stop_took = std::chrono::steady_clock::now() - stopping;
  EXPECT_LT(stop_took, 1s) << "stop() waited for slow clients";
  trickling = false;
  trickle.join();
  for (int fd : slow) {
    bool closed = false;
    read_until_closed(fd, 2s, &closed);
    EXPECT_TRUE(closed) << "stop() left a connection open";
    ::close(fd);
  }
}

// request_timeout counts from accept, not from when a worker takes the connection: with one
// worker, three trickling clients are each cut about request_timeout after they connected.
TEST_F(UpdateEndpointTest, ATricklingClientIsCutAtRequestTimeoutCountedFromAccept) {
  auto options = memory_only();
  options.threads = 1;
  options.request_timeout = 1s;
  options.read_timeout = 10s;  // the request deadline, not the read timeout, bounds it
  start(options);
  struct trickler {
    int fd;
    std::chrono::steady_clock::time_point connected, cut{};
    std::string answer;
  };
  std::vector<trickler> clients;
  for (int i = 0; i < 3; ++i)
    clients.push_back({connect_loopback(port()), std::chrono::steady_clock::now()});
  const std::string request = "PUT /v1/modules/filters HTTP/1.1\r\nHost: x\r\nX-Padding: ";
  const auto until = std::chrono::steady_clock::now() + 5s;
  for (std::size_t sent = 0; std::chrono::steady_clock::now() < until; ++sent) {
    bool all_cut = true;
    for (auto& c : clients) {
      if (c.cut != std::chrono::steady_clock::time_point{}) continue;
      all_cut = false;
      const char byte = sent < request.size() ? request[sent] : 'a';
      ::send(c.fd, &byte, 1, MSG_NOSIGNAL);
      pollfd p{c.fd, POLLIN, 0};
      if (::poll(&p, 1, 0) > 0) {
        c.cut = std::chrono::steady_clock::now();
        c.answer = read_until_closed(c.fd, 2s);
      }
    }
    if (all_cut) break;
    std::this_thread::sleep_for(50ms);
  }
  for (const auto& c : clients) {
    ASSERT_NE(c.cut, std::chrono::steady_clock::time_point{}) << "a trickling client was never cut";
    const auto held = c.cut - c.connected;
    EXPECT_GE(held, 900ms);
    EXPECT_LT(held, 2500ms) << "cut after " << std::chrono::duration<double>(held).count()
                            << " s: the deadline started later than accept";
    EXPECT_EQ(status_of(c.answer), 408) << c.answer;
    EXPECT_EQ(body_of(c.answer).value("error", ""), "timeout") << c.answer;
    ::close(c.fd);
  }
  expect_still_serving();
}

// max_connections idle connections fill the endpoint; the next one is answered 503 at once and
// closed; when they go, the service serves again.
TEST_F(UpdateEndpointTest, TooManyConnectionsAre503AndTheServiceRecovers) {
  auto options = memory_only();
  options.max_connections = 3;
  start(options);
  const auto before = sink->state();
  std::vector<int> holders;
  for (int i = 0; i < 3; ++i) holders.push_back(connect_loopback(port()));
  ASSERT_TRUE(holds_connections(*endpoint, 3));
  const int extra = connect_loopback(port());
  bool closed = false;
  const auto response = read_until_closed(extra, 5s, &closed);
  ::close(extra);
  EXPECT_EQ(status_of(response), 503) << response;
  EXPECT_EQ(body_of(response).value("error", ""), "busy");
  EXPECT_TRUE(closed) << "a refused connection is closed at once";
  EXPECT_EQ(endpoint->stats().connections_refused, 1u);
  for (int fd : holders) ::close(fd);
  ASSERT_TRUE(holds_connections(*endpoint, 0));
  EXPECT_EQ(sink->state(), before);
  expect_still_serving();
  EXPECT_EQ(endpoint->stats().connections_refused, 1u);
}

// Bodies are buffered within max_buffered_body_bytes, all connections together: a body that does
// not fit is answered 503 busy from its headers, and the room comes back when the other goes.
TEST_F(UpdateEndpointTest, BufferedBodiesAreBoundedAcrossConnections) {
  auto options = memory_only();
  options.max_body_bytes = 64 << 10;
  options.max_buffered_body_bytes = 64 << 10;
  start(options);
  // Declares the whole budget and sends nothing more; the 100 Continue shows it was reserved.
  const int hog = connect_loopback(port());
  const std::string head =
      "PUT /v1/modules/filters HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
      "Content-Length: 65536\r\n\r\n";
  ::send(hog, head.data(), head.size(), MSG_NOSIGNAL);
  ASSERT_EQ(read_until(hog, "\r\n\r\n", 5s), "HTTP/1.1 100 Continue\r\n\r\n");
  const auto refused = push("canary", bundle("canary", ++next_valid));
  EXPECT_EQ(refused.status, 503) << refused.body.dump();
  EXPECT_EQ(refused.body.value("error", ""), "busy");
  EXPECT_EQ(send("GET", "/v1/modules").status, 200) << "a request without a body still fits";
  ::close(hog);
  ASSERT_TRUE(holds_connections(*endpoint, 0));  // its reservation went with it
  const auto ok = push("canary", bundle("canary", ++next_valid));
  EXPECT_EQ(ok.status, 200) << ok.body.dump();
}

TEST_F(UpdateEndpointTest, ASlowClientIsCutOffAtTheRequestDeadline) {
  auto options = memory_only();
  options.threads = 2;
  options.request_timeout = 1s;
  options.read_timeout = 500ms;
  start(options);
  const auto before = sink->state();
  // Slowloris: one byte every 100 ms, never waiting long enough for a read timeout.
  const int slow = connect_loopback(port());
  const auto began = std::chrono::steady_clock::now();
  std::atomic<bool> cut{false};
  std::thread dribble([&] {
    const std::string request =
        "PUT /v1/modules/filters HTTP/1.1\r\nHost: x\r\nX-Padding: " + std::string(100, 'a');
    for (char c : request) {
      if (::send(slow, &c, 1, MSG_NOSIGNAL) != 1) break;
      pollfd p{slow, POLLIN, 0};
      if (::poll(&p, 1, 100) > 0) {  // the server answered or closed
        cut = true;
        break;
      }
    }
  });
  // The other worker keeps serving meanwhile.
  expect_still_serving();
  dribble.join();
  const auto held = std::chrono::steady_clock::now() - began;
  bool closed = false;
  read_until_closed(slow, 3s, &closed);
  ::close(slow);
  EXPECT_TRUE(cut) << "the server never closed the slow connection";
  EXPECT_TRUE(closed);
  EXPECT_LT(held, 3s) << "the slow client held its worker past the request deadline";
  EXPECT_GE(held, 900ms);
  EXPECT_EQ(sink->state(), before) << "the cut-off request changed the sink";
  expect_still_serving();
}

TEST_F(UpdateEndpointTest, AClientThatSendsNothingIsCutOff) {
  auto options = memory_only();
  options.threads = 1;
  options.request_timeout = 1s;
  options.read_timeout = 10s;  // the request deadline, not the read timeout, bounds it
  start(options);
  const int idle = connect_loopback(port());
  const auto began = std::chrono::steady_clock::now();
  bool closed = false;
  read_until_closed(idle, 5s, &closed);
  ::close(idle);
  EXPECT_TRUE(closed);
  EXPECT_LT(std::chrono::steady_clock::now() - began, 3s);
  expect_still_serving();
}

// --- TLS --------------------------------------------------------------------------------------

TEST_F(UpdateEndpointTest, ServesHttpsWithACertificate) {
  cubridge::testing::temp_dir dir;
  const auto cert = start_with_tls(dir);
  EXPECT_EQ(endpoint->url(), "https://127.0.0.1:" + std::to_string(port()));
  httplib::SSLClient client("127.0.0.1", port());
  client.set_ca_cert_path(cert.c_str());
  client.enable_server_certificate_verification(true);
  const auto b = bundle("filters", 3);
  const auto r = client.Put("/v1/modules/filters", as_text(b), "application/octet-stream");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(sink->current_version("filters"), 3u);
  // Plain HTTP to the TLS port gets no answer from the service.
  const auto plain = raw_request(port(), "GET", "/v1/modules");
  EXPECT_NE(status_of(plain), 200);
}

// Over TLS the reception thread reads with non-blocking SSL: a 2 MiB push (several reads per
// poll round), then more requests on the same connection.
TEST_F(UpdateEndpointTest, HttpsTakesLargeBodiesAndKeepsTheConnection) {
  cubridge::testing::temp_dir dir;
  const auto cert = start_with_tls(dir);
  httplib::SSLClient client("127.0.0.1", port());
  client.set_ca_cert_path(cert.c_str());
  client.enable_server_certificate_verification(true);
  client.set_keep_alive(true);
  const bytes source(2u << 20, std::byte{'/'});
  cubridge::bundle_manifest_input in{"big", 1, "sm_90", cubridge::payload_kind::cuda_source};
  const auto big = as_text(cubridge::sign_bundle(in, source, keys.secret_key));
  const auto r = client.Put("/v1/modules/big", big, "application/octet-stream");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200) << r->body;
  for (int i = 0; i < 3; ++i) {
    const auto status = client.Get("/v1/modules");
    ASSERT_TRUE(status) << httplib::to_string(status.error());
    EXPECT_EQ(status->status, 200);
  }
  EXPECT_EQ(sink->applied("big"), std::vector<std::uint64_t>{1});
  EXPECT_EQ(endpoint->stats().open_connections, 1u) << "one connection served all four";
}

TEST_F(UpdateEndpointTest, UnusableTlsFilesAreNamed) {
  cubridge::testing::temp_dir dir;
  cubridge::testing::write_text(dir.path / "cert.pem", "not a certificate");
  auto options = memory_only();
  options.tls_certificate = dir.path / "cert.pem";
  options.tls_private_key = dir.path / "key.pem";
  cubridge::update_endpoint e(sink, options);
  try {
    e.start();
    FAIL() << "started with a bad certificate";
  } catch (const cubridge::error& x) {
    EXPECT_TRUE(x.is(cubridge::errc::io));
    EXPECT_NE(std::string(x.what()).find("cert.pem"), std::string::npos) << x.what();
  }
  EXPECT_FALSE(e.running());
}

// --- load -------------------------------------------------------------------------------------

// 1,000 versions, each pushed by two clients at once (so each is applied by one and refused as
// a replay to the other), while status queries and refused pushes run alongside. Nothing lost,
// nothing applied twice, versions strictly increasing.
TEST_F(UpdateEndpointTest, LoadThousandPushesWithConcurrentQueriesAndRefusals) {
  auto options = memory_only();
  options.threads = 8;
  start(options);
  constexpr std::uint64_t versions = 1000;
  std::vector<std::string> bundles;
  for (std::uint64_t v = 1; v <= versions; ++v) bundles.push_back(as_text(bundle("hot", v)));

  std::atomic<bool> done{false};
  std::atomic<int> pushes_ok{0}, pushes_replayed{0}, other_answers{0};
  auto pusher = [&] {
    httplib::Client client("127.0.0.1", port());
    client.set_keep_alive(true);
    client.set_tcp_nodelay(true);  // else each request waits for a delayed ACK (40 ms)
    for (const auto& b : bundles) {
      const auto r = client.Put("/v1/modules/hot", b, "application/octet-stream");
      if (!r) {
        ++other_answers;
        continue;
      }
      if (r->status == 200)
        ++pushes_ok;
      else if (r->status == 409)
        ++pushes_replayed;
      else
        ++other_answers;
    }
  };
  std::atomic<int> queries{0}, bad_queries{0}, went_back{0};
  auto querier = [&] {
    httplib::Client client("127.0.0.1", port());
    client.set_keep_alive(true);
    client.set_tcp_nodelay(true);  // else each request waits for a delayed ACK (40 ms)
    std::uint64_t last = 0;
    while (!done) {
      const auto r = client.Get("/v1/modules");
      if (!r || r->status != 200) {
        ++bad_queries;
        continue;
      }
      ++queries;
      const auto status = json::parse(r->body);   // named: a range-for over a temporary's
      for (const auto& m : status.at("modules"))  // member would outlive the temporary
        if (m["name"] == "hot") {
          const auto now = m["current_version"].get<std::uint64_t>();
          if (now < last) ++went_back;
          last = now;
        }
      std::this_thread::sleep_for(2ms);
    }
  };
  std::atomic<int> refused_ok{0}, refused_wrong{0};
  auto refuser = [&] {
    httplib::Client client("127.0.0.1", port());
    client.set_keep_alive(true);
    client.set_tcp_nodelay(true);  // else each request waits for a delayed ACK (40 ms)
    std::uint64_t i = 0;
    while (!done) {
      ++i;
      // A far-future version signed by a stranger, and a tampered one: both must be refused,
      // or they would break the sequence the pushers make.
      const auto forged = as_text(bundle("hot", 1'000'000 + i, &stranger.secret_key));
      auto tampered = bundles[i % versions];
      tampered[tampered.size() - 100] ^= 1;
      for (const std::string* b : std::vector<const std::string*>{&forged, &tampered}) {
        const auto r = client.Put("/v1/modules/hot", *b, "application/octet-stream");
        if (r && r->status == 403)
          ++refused_ok;
        else
          ++refused_wrong;
      }
      std::this_thread::sleep_for(2ms);
    }
  };
  const auto began = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  threads.emplace_back(querier);
  threads.emplace_back(querier);
  threads.emplace_back(refuser);
  std::thread a(pusher), b(pusher);
  a.join();
  b.join();
  done = true;
  for (auto& t : threads) t.join();
  const auto took = std::chrono::duration<double>(std::chrono::steady_clock::now() - began);

  std::vector<std::uint64_t> expected(versions);
  std::iota(expected.begin(), expected.end(), 1);
  EXPECT_EQ(sink->applied("hot"), expected) << "versions lost, repeated or out of order";
  EXPECT_EQ(pushes_ok, static_cast<int>(versions));
  EXPECT_EQ(pushes_replayed, static_cast<int>(versions));
  EXPECT_EQ(other_answers, 0);
  EXPECT_EQ(sink->overlapping_calls(), 0) << "apply ran twice at once for one module";
  EXPECT_GT(queries, 0);
  EXPECT_EQ(bad_queries, 0);
  EXPECT_EQ(went_back, 0) << "a status query saw the current version go back";
  EXPECT_GT(refused_ok, 0);
  EXPECT_EQ(refused_wrong, 0);
  EXPECT_EQ(sink->current_version("hot"), versions);
  std::printf("load: %llu versions x 2 pushers, %d status queries, %d refused pushes in %.1f s\n",
              static_cast<unsigned long long>(versions), queries.load(), refused_ok.load(),
              took.count());
}

}  // namespace

// --- replay state, expiry and status text (issue 11 items 4 and 5) -------------------------------
// Appended as its own block; it reopens the anonymous namespace above.

#include <cubridge/update/update_state.hpp>

namespace {

// Every byte a client or the status shows must be printable or JSON-escaped: no raw control
// characters (but the final newline) in the HTTP body.
bool has_raw_control_bytes(const std::string& response) {
  const auto at = response.find("\r\n\r\n");
  const auto body = at == std::string::npos ? response : response.substr(at + 4);
  for (std::size_t i = 0; i < body.size(); ++i) {
    const auto c = static_cast<unsigned char>(body[i]);
    if ((c < 0x20 || c == 0x7F) && !(c == '\n' && i + 1 == body.size())) return true;
  }
  return false;
}

json module_status(std::uint16_t port, const std::string& name) {
  const auto response = raw_request(port, "GET", "/v1/modules");
  EXPECT_EQ(status_of(response), 200) << response.substr(0, 300);
  EXPECT_FALSE(has_raw_control_bytes(response));
  const auto status = body_of(response);
  for (const auto& m : status["modules"])
    if (m["name"] == name) return m;
  ADD_FAILURE() << "no module '" << name << "' in " << response.substr(0, 500);
  return json::object();
}

// Text an attacker would like to see in an operator's terminal or browser.
std::string hostile_text(std::size_t size) {
  std::string text = "<html><script>alert(1)</script>\x1b[2J\x1b]0;owned\x07\r\n\xc3\xa9";
  while (text.size() < size) text += "<b>AAAA</b>\x1b[31m";
  return text;
}

TEST_F(UpdateEndpointTest, UnverifiedRequestsWriteNothingIntoTheStatus) {
  start();
  ASSERT_EQ(push("filters", bundle("filters", 3)).status, 200);
  const auto evil = hostile_text(8000);
  // An unknown field named by ~8 KB of hostile text: refused by the schema, before any key or
  // signature is looked at.
  const auto manifest = "{\"" + evil + "\":1}";
  const auto unsigned_bundle =
      as_text(cubridge::detail::sign_bundle_unchecked(manifest, cubin, stranger.secret_key));
  const auto bad_syntax = as_text(
      cubridge::detail::sign_bundle_unchecked("{\"name\":\"" + evil, cubin, stranger.secret_key));
  const auto bad_rollback = "{\"" + hostile_text(3000) + "\":1}\n" + std::string(128, 'a');
  for (const auto& [method, target, body] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"PUT", "/v1/modules/filters", unsigned_bundle},
           {"PUT", "/v1/modules/filters", bad_syntax},
           {"PUT", "/v1/modules/filters", evil},
           {"POST", "/v1/modules/filters/rollback", bad_rollback}}) {
    const auto response = raw_request(port(), method, target, body);
    EXPECT_EQ(status_of(response), 400) << response.substr(0, 300);
    EXPECT_FALSE(has_raw_control_bytes(response)) << response.substr(0, 300);
    const auto detail = body_of(response).value("detail", "");
    EXPECT_FALSE(detail.empty());
    EXPECT_LE(detail.size(), 4096u) << "a detail is bounded";
    const auto filters = module_status(port(), "filters");
    EXPECT_EQ(filters["last_refusal"], nullptr)
        << "an unverified request wrote into the status: " << filters.dump().substr(0, 300);
  }
  EXPECT_EQ(sink->current_version("filters"), 3u);
}

TEST_F(UpdateEndpointTest, VerifiedRefusalsAreKeptEscapedAndBounded) {
  start();
  const auto log = "\x1b[31mred\x1b[0m \xc3\xa9 back\\slash " + std::string(10000, 'x');
  sink->hook = [&](const cubridge::verified_bundle& b) -> std::optional<sink_result> {
    if (b.version() == 4) return sink_result{gate_reason::stage_refused, 3, log};
    return std::nullopt;
  };
  ASSERT_EQ(push("filters", bundle("filters", 3)).status, 200);
  const auto response =
      raw_request(port(), "PUT", "/v1/modules/filters", as_text(bundle("filters", 4)));
  EXPECT_EQ(status_of(response), 422);
  const auto detail = body_of(response).value("detail", "");
  EXPECT_LE(detail.size(), 4096u);
  EXPECT_TRUE(detail.starts_with("\x1b[31mred")) << "JSON escapes the client's copy";
  EXPECT_NE(detail.find("more bytes)"), std::string::npos) << "the cut is said";
  const auto summary = module_status(port(), "filters")["last_refusal"].get<std::string>();
  EXPECT_LE(summary.size(), 256u);
  EXPECT_TRUE(
      summary.starts_with("422 stage_refused: \\x1b[31mred\\x1b[0m \\xc3\\xa9 "
                          "back\\\\slash xxx"))
      << summary;
  EXPECT_TRUE(summary.ends_with("...")) << summary;
  for (const char c : summary)
    EXPECT_TRUE(c >= 0x20 && c < 0x7F) << "byte " << static_cast<int>(c) << " in " << summary;
}

// A fresh endpoint over a fresh sink for each "life" of a service, with the same state file.
class ReplayStateTest : public UpdateEndpointTest {
 protected:
  cubridge::testing::temp_dir dir;
  std::filesystem::path state_file = dir.path / "replay.json";
  std::vector<std::shared_ptr<fake_sink>> lives;
  std::chrono::sys_seconds clock_time =
      std::chrono::sys_days{std::chrono::year{2026} / 11 / 29} + std::chrono::hours{12};

  cubridge::update_endpoint_options with_state() const {
    auto options = memory_only();
    options.state_file = state_file;
    options.clock = [t = clock_time] { return std::chrono::system_clock::time_point(t); };
    return options;
  }
  // Stops the running endpoint (the service exits) and starts a new one over a new sink.
  void restart(cubridge::update_endpoint_options options) {
    endpoint.reset();
    lives.push_back(std::make_shared<fake_sink>());
    options.keys.add(keys.public_key);
    endpoint = std::make_unique<cubridge::update_endpoint>(lives.back(), std::move(options));
    endpoint->start();
    ASSERT_TRUE(endpoint->running());
  }
  fake_sink& service() { return *lives.back(); }
  // What a service does at start outside the endpoint: load the versions it had.
  void load_directly(const std::string& name, std::uint64_t version) {
    cubridge::trusted_keys trusted{keys.public_key};
    ASSERT_EQ(service()
                  .apply(cubridge::verify_bundle(bundle(name, version), trusted),
                         cubridge::apply_rule::above_serving)
                  .reason,
              gate_reason::none);
  }
  bytes bundle_at(std::string name, std::uint64_t version, std::chrono::sys_seconds created,
                  std::optional<std::chrono::sys_seconds> expires) const {
    cubridge::bundle_manifest_input in{std::move(name), version, "sm_90"};
    in.created = created;
    if (expires) in.expires = *expires;
    return cubridge::sign_bundle(in, cubin, keys.secret_key);
  }
};

TEST_F(ReplayStateTest, ACapturedBundleStaysRefusedAfterARestart) {
  restart(with_state());
  ASSERT_EQ(push("filters", bundle("filters", 3)).status, 200);
  const auto v4 = bundle("filters", 4);
  ASSERT_EQ(push("filters", v4).status, 200);

  restart(with_state());  // a new process: the sink serves nothing yet
  auto r = push("filters", v4);
  EXPECT_EQ(r.status, 409) << r.body.dump();
  EXPECT_EQ(r.body.value("error", ""), "replayed_version");
  EXPECT_EQ(r.body["highest_version"], 4);
  r = push("filters", bundle("filters", 3));
  EXPECT_EQ(r.body.value("error", ""), "older_version") << r.body.dump();
  EXPECT_TRUE(service().applied("filters").empty());
  EXPECT_EQ(push("filters", bundle("filters", 5)).status, 200);
  EXPECT_EQ(module_status(port(), "filters")["highest_version"], 5);

  // Without a state file the memory is gone with the process: the old bundle is taken again.
  auto in_memory = memory_only();
  restart(in_memory);
  EXPECT_EQ(push("filters", v4).status, 200) << "documented: RAM only is replayable";
}

TEST_F(ReplayStateTest, TheNewVersionIsWrittenBeforeTheSinkApplies) {
  restart(with_state());
  int checked = 0;
  service().hook = [&](const cubridge::verified_bundle& b) -> std::optional<sink_result> {
    cubridge::update_state on_disk(state_file);
    on_disk.load();
    EXPECT_EQ(on_disk.highest_version("filters"), b.version())
        << "a crash now must not let v" << b.version() << " in again";
    ++checked;
    return std::nullopt;
  };
  ASSERT_EQ(push("filters", bundle("filters", 7)).status, 200);
  EXPECT_EQ(checked, 1);
}

TEST_F(ReplayStateTest, ARefusedVersionMayComeAgainAfterARestart) {
  restart(with_state());
  ASSERT_EQ(push("filters", bundle("filters", 3)).status, 200);
  service().hook = [](const cubridge::verified_bundle& b) -> std::optional<sink_result> {
    if (b.version() == 4)
      return sink_result{gate_reason::stage_refused, 3, "kernel 'blur' missing"};
    return std::nullopt;
  };
  EXPECT_EQ(push("filters", bundle("filters", 4)).status, 422);
  cubridge::update_state on_disk(state_file);
  on_disk.load();
  EXPECT_EQ(on_disk.highest_version("filters"), 3u) << "the record of v4 was undone";
  restart(with_state());
  EXPECT_EQ(push("filters", bundle("filters", 4)).status, 200);
}

TEST_F(ReplayStateTest, ARollbackRequestIsHonouredOnceAcrossRestarts) {
  const auto request = cubridge::sign_rollback_request("filters", 5, keys.secret_key, clock_time);
  restart(with_state());
  load_directly("filters", 4);
  load_directly("filters", 5);
  auto r = send("POST", "/v1/modules/filters/rollback", request);
  ASSERT_EQ(r.status, 200) << r.body.dump();

  restart(with_state());  // the service comes back serving v5 again
  load_directly("filters", 4);
  load_directly("filters", 5);
  r = send("POST", "/v1/modules/filters/rollback", request);
  EXPECT_EQ(r.status, 409) << r.body.dump();
  EXPECT_EQ(r.body.value("error", ""), "replayed_request");
  EXPECT_EQ(service().current_version("filters"), 5u);

  auto in_memory = memory_only();
  in_memory.clock = with_state().clock;
  restart(in_memory);
  load_directly("filters", 4);
  load_directly("filters", 5);
  EXPECT_EQ(send("POST", "/v1/modules/filters/rollback", request).status, 200)
      << "documented: RAM only is replayable";
}

TEST_F(ReplayStateTest, VersionFloorRefusesVersionsAtOrBelowIt) {
  auto options = with_state();
  options.version_floor = {{"filters", 7}};
  restart(options);
  auto r = push("filters", bundle("filters", 7));
  EXPECT_EQ(r.status, 409) << r.body.dump();
  EXPECT_EQ(r.body.value("error", ""), "replayed_version");
  EXPECT_EQ(push("filters", bundle("filters", 6)).body.value("error", ""), "older_version");
  EXPECT_EQ(push("blur", bundle("blur", 1)).status, 200) << "other modules have no floor";
  EXPECT_EQ(push("filters", bundle("filters", 8)).status, 200);

  auto bad = memory_only();
  bad.version_floor = {{"../etc", 1}};
  bad.keys.add(keys.public_key);
  cubridge::update_endpoint refused(sink, bad);
  try {
    refused.start();
    ADD_FAILURE() << "a floor for no module name was accepted";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();
  }
  EXPECT_FALSE(refused.running());
}

TEST_F(ReplayStateTest, ACorruptStateFileStopsTheStart) {
  cubridge::testing::write_text(state_file, "{\"cubridge_update_state\":1,\"highest_vers");
  cubridge::update_endpoint_options options = with_state();
  options.keys.add(keys.public_key);
  cubridge::update_endpoint corrupt(sink, options);
  try {
    corrupt.start();
    ADD_FAILURE() << "started over a corrupt state file";
  } catch (const cubridge::update_state_error& e) {
    EXPECT_EQ(e.reason(), cubridge::update_state_reason::corrupt);
    EXPECT_NE(std::string(e.what()).find(state_file.string()), std::string::npos) << e.what();
  }
  EXPECT_FALSE(corrupt.running());
  EXPECT_EQ(corrupt.port(), 0);
}

TEST_F(ReplayStateTest, AStateThatCannotBeWrittenRefusesThePush) {
  const auto directory = dir.path / "state";
  std::filesystem::create_directory(directory);
  auto options = with_state();
  options.state_file = directory / "replay.json";
  restart(options);
  ASSERT_EQ(push("filters", bundle("filters", 1)).status, 200);
  std::filesystem::remove_all(directory);
  const auto r = push("filters", bundle("filters", 2));
  EXPECT_EQ(r.status, 500) << r.body.dump();
  EXPECT_EQ(r.body.value("error", ""), "state_failed");
  EXPECT_EQ(service().applied("filters"), std::vector<std::uint64_t>{1}) << "nothing applied";
  std::filesystem::create_directory(directory);
  EXPECT_EQ(push("filters", bundle("filters", 2)).status, 200);
}

TEST_F(ReplayStateTest, ExpiredBundlesAre403) {
  const auto t = clock_time;
  auto options = with_state();
  restart(options);
  auto r = push("filters",
                bundle_at("filters", 1, t - std::chrono::hours{2}, t - std::chrono::hours{1}));
  EXPECT_EQ(r.status, 403) << r.body.dump();
  EXPECT_EQ(r.body.value("error", ""), "expired_bundle");
  EXPECT_NE(r.body.value("detail", "").find("expired at"), std::string::npos) << r.body.dump();
  EXPECT_EQ(push("filters", bundle_at("filters", 1, t - std::chrono::hours{2}, t)).status, 403)
      << "valid strictly before its expiry";
  EXPECT_EQ(push("filters",
                 bundle_at("filters", 1, t - std::chrono::hours{2}, t + std::chrono::seconds{1}))
                .status,
            200);
  EXPECT_EQ(
      push("filters", bundle_at("filters", 2, t - std::chrono::hours{24 * 3650}, std::nullopt))
          .status,
      200)
      << "a bundle without expires never expires by default";

  options.require_expiry = true;
  options.max_bundle_age = std::chrono::hours{1};
  restart(options);
  r = push("filters", bundle_at("filters", 3, t, std::nullopt));
  EXPECT_EQ(r.body.value("error", ""), "expired_bundle") << r.body.dump();
  r = push("filters",
           bundle_at("filters", 3, t - std::chrono::hours{2}, t + std::chrono::hours{1}));
  EXPECT_EQ(r.body.value("error", ""), "expired_bundle") << r.body.dump();
  EXPECT_EQ(push("filters",
                 bundle_at("filters", 3, t - std::chrono::minutes{30}, t + std::chrono::hours{1}))
                .status,
            200);
}

// --- one gate, two doors ----------------------------------------------------------------------

// The endpoint over a shared gate, and direct gate->push calls standing in for the fleet agent
// (fleet_agent takes the same shared gate): one lock per module, one replay record.
class SharedGateTest : public UpdateEndpointTest {
 protected:
  std::shared_ptr<cubridge::update_gate> gate;

  cubridge::update_gate_options policy() const {
    cubridge::update_gate_options o;
    o.keys.add(keys.public_key);
    o.persist_state = false;  // one life of the service; the persisted state is tested apart
    return o;
  }
  void start_shared(cubridge::update_endpoint_options options = memory_only()) {
    gate = cubridge::update_gate::create(sink, policy());
    endpoint = std::make_unique<cubridge::update_endpoint>(gate, std::move(options));
    endpoint->start();
    ASSERT_TRUE(endpoint->running());
  }
};

TEST_F(SharedGateTest, TheEndpointUsesTheSharedGatesPolicyAndStartsIt) {
  start_shared();
  EXPECT_TRUE(gate->started());
  ASSERT_EQ(push("filters", bundle("filters", 3)).status, 200) << "keys are the gate's";
  EXPECT_EQ(gate->highest_version("filters"), 3u) << "one replay record";
  const auto d = gate->push(bundle("filters", 3), "filters");
  EXPECT_EQ(d.outcome, cubridge::gate_outcome::duplicate)
      << to_string(d.reason) << ": " << d.detail;
  // A gate the other door started already: the endpoint's start() leaves it as it is.
  endpoint->stop();
  endpoint = std::make_unique<cubridge::update_endpoint>(gate, memory_only());
  endpoint->start();
  EXPECT_EQ(push("filters", bundle("filters", 3)).status, 409);
  EXPECT_EQ(sink->applied("filters"), std::vector<std::uint64_t>{3});
}

TEST_F(SharedGateTest, PolicyOptionsTheSharedGateWouldIgnoreAreRefused) {
  gate = cubridge::update_gate::create(sink, policy());
  cubridge::testing::temp_dir dir;
  auto with_keys = memory_only();
  with_keys.keys.add(keys.public_key);
  auto with_file = memory_only();
  with_file.state_file = dir.path / "state.json";
  auto with_floor = memory_only();
  with_floor.version_floor = {{"filters", 2}};
  for (const auto& [options, field] :
       std::vector<std::pair<cubridge::update_endpoint_options, std::string>>{
           {with_keys, "keys"}, {with_file, "state_file"}, {with_floor, "version_floor"}}) {
    cubridge::update_endpoint e(gate, options);
    try {
      e.start();
      ADD_FAILURE() << field << " over a shared gate was accepted";
    } catch (const cubridge::error& x) {
      EXPECT_TRUE(x.is(cubridge::errc::precondition)) << x.what();
      EXPECT_NE(std::string(x.what()).find(field), std::string::npos) << x.what();
    }
    EXPECT_FALSE(e.running());
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path / "state.json.lock")) << "refused before";
  try {
    cubridge::update_endpoint e(std::shared_ptr<cubridge::update_gate>{}, memory_only());
    ADD_FAILURE() << "an endpoint over no gate";
  } catch (const cubridge::error& x) {
    EXPECT_TRUE(x.is(cubridge::errc::precondition)) << x.what();
  }
}

TEST_F(SharedGateTest, TwoEndpointsWithGatesOfTheirOwnOnOneStateFileAreRefused) {
  cubridge::testing::temp_dir dir;
  auto options = memory_only();
  options.state_file = dir.path / "state.json";
  start(options);
  auto second_options = options;
  second_options.keys.add(keys.public_key);
  cubridge::update_endpoint second(sink, second_options);
  try {
    second.start();
    ADD_FAILURE() << "two gates on one state file";
  } catch (const cubridge::update_state_error& e) {
    EXPECT_EQ(e.reason(), cubridge::update_state_reason::locked) << e.what();
  }
  EXPECT_FALSE(second.running());
}

// v5 and v6 of one module, one through each door at the same moment, 1,000 times (a fresh
// module per trial; which door gets the older version alternates): the module lock and the
// replay record are one, so the serving version never goes down and ends at v6, and what one
// door refused the other refuses too.
TEST_F(SharedGateTest, TwoDoorsRacingNeverTakeTheServingVersionDown) {
  start_shared();
  constexpr std::size_t trials = 1000;
  const auto name = [](std::size_t i) { return "race" + std::to_string(i); };
  std::vector<std::string> v5(trials), v6(trials);  // as sent over HTTP
  for (std::size_t i = 0; i < trials; ++i) {
    v5[i] = as_text(bundle(name(i), 5));
    v6[i] = as_text(bundle(name(i), 6));
  }
  const auto as_bytes = [](const std::string& text) {
    return std::as_bytes(std::span(text.data(), text.size()));
  };
  // Even trials: v5 over HTTP, v6 through the gate directly; odd trials the other way round.
  const auto http_gets_v5 = [](std::size_t i) { return i % 2 == 0; };
  std::vector<int> http_status(trials, 0);
  std::vector<cubridge::gate_decision> direct(trials);
  std::barrier both_ready(2);
  std::thread http_door([&] {
    httplib::Client client("127.0.0.1", port());
    client.set_keep_alive(true);
    client.set_read_timeout(10, 0);
    client.set_tcp_nodelay(true);
    for (std::size_t i = 0; i < trials; ++i) {  // every trial runs: the barrier needs both threads
      const auto path = "/v1/modules/" + name(i);
      const auto& body = http_gets_v5(i) ? v5[i] : v6[i];
      both_ready.arrive_and_wait();
      const auto r = client.Put(path.c_str(), body, "application/octet-stream");
      http_status[i] = r ? r->status : 0;
    }
  });
  for (std::size_t i = 0; i < trials; ++i) {
    const auto& body = http_gets_v5(i) ? v6[i] : v5[i];
    both_ready.arrive_and_wait();
    direct[i] = gate->push(as_bytes(body), name(i));
  }
  http_door.join();

  std::size_t v5_first = 0, v5_refused = 0;
  std::vector<std::string> problems;
  const auto problem = [&](std::size_t i, const std::string& what) {
    if (problems.size() < 10) problems.push_back(name(i) + ": " + what);
  };
  for (std::size_t i = 0; i < trials; ++i) {
    const auto& d = direct[i];
    const bool direct_applied = d.outcome == cubridge::gate_outcome::applied;
    const bool v6_applied = http_gets_v5(i) ? direct_applied : http_status[i] == 200;
    const bool v5_applied = http_gets_v5(i) ? http_status[i] == 200 : direct_applied;
    const bool v5_refused_older = http_gets_v5(i)
                                      ? http_status[i] == 409
                                      : d.outcome == cubridge::gate_outcome::refused &&
                                            d.reason == cubridge::gate_reason::older_version;
    const auto applied = sink->applied(name(i));
    if (sink->current_version(name(i)) != 6)
      problem(i, "serves v" + std::to_string(sink->current_version(name(i))));
    if (!v6_applied) problem(i, "v6 was not applied");
    if (v5_applied) {
      ++v5_first;
      if (applied != std::vector<std::uint64_t>{5, 6}) problem(i, "v5 applied after v6");
    } else if (v5_refused_older) {
      ++v5_refused;
      if (applied != std::vector<std::uint64_t>{6}) problem(i, "v5 refused, yet applied");
    } else {
      problem(i, "v5: HTTP " + std::to_string(http_status[i]) + ", gate " +
                     std::string(to_string(d.reason)));
    }
  }
  EXPECT_TRUE(problems.empty()) << ::testing::PrintToString(problems);
  EXPECT_EQ(v5_first + v5_refused, trials);
  EXPECT_EQ(sink->overlapping_calls(), 0) << "one lock per module for both doors";

  // Each version again through the door that did not send it: refused there too.
  problems.clear();
  for (std::size_t i = 0; i < trials; ++i) {
    const auto& older = v5[i];
    const auto& newest = v6[i];
    if (http_gets_v5(i)) {  // v5 came over HTTP, v6 through the gate
      const auto d = gate->push(as_bytes(older), name(i));
      if (d.reason != cubridge::gate_reason::older_version)
        problem(i, "v5 through the gate: " + std::string(to_string(d.reason)));
      const auto r = push(name(i), bundle(name(i), 6));
      if (r.status != 409 || r.body.value("error", "") != "replayed_version")
        problem(i, "v6 over HTTP: " + r.body.dump());
    } else {  // v5 through the gate, v6 over HTTP
      const auto r = send("PUT", "/v1/modules/" + name(i), older);
      if (r.status != 409 || r.body.value("error", "") != "older_version")
        problem(i, "v5 over HTTP: " + r.body.dump());
      const auto d = gate->push(as_bytes(newest), name(i));
      if (d.outcome != cubridge::gate_outcome::duplicate)
        problem(i, "v6 through the gate: " + std::string(to_string(d.reason)));
    }
    if (sink->current_version(name(i)) != 6) problem(i, "no longer serves v6");
  }
  EXPECT_TRUE(problems.empty()) << ::testing::PrintToString(problems);
}

}  // namespace
