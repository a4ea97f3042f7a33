// Tests of cubridge/update_endpoint.hpp: the endpoint over real HTTP on loopback, with a fake
// module_sink (no GPU). Each refusal: the right status and reason, no change in the sink, and a
// valid push right after still succeeds.
#include <cubridge/rollback_request.hpp>
#include <cubridge/update_endpoint.hpp>

#include "gpu_test.hpp"  // only for the test image paths
#include "temp_dir.hpp"

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace {

using namespace std::chrono_literals;
using cubridge::module_report;
using cubridge::sink_outcome;
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

// A module_sink that keeps versions in memory, like hot_module does (current and one rollback
// target), and records every call so tests can see what was applied and when.
class fake_sink final : public cubridge::module_sink {
 public:
  int sm = 90;
  bool creates_modules = true;
  // Runs inside apply (e.g. to refuse a version or to be slow); nullopt: apply normally.
  std::function<std::optional<sink_result>(const cubridge::verified_bundle&)> hook;

  int device_sm() const override { return sm; }
  std::uint64_t current_version(std::string_view name) const override {
    std::lock_guard lock(mutex_);
    const auto it = modules_.find(std::string(name));
    return it == modules_.end() ? 0 : it->second.current;
  }
  sink_result apply(const cubridge::verified_bundle& bundle) override {
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
      return {sink_outcome::unknown_module, 0, "no module '" + name + "'"};
    auto& m = modules_[name];
    if (early) {
      m.last_error = early->detail;
      return *early;
    }
    m.previous = m.current;
    m.current = bundle.version();
    m.applied.push_back(bundle.version());
    return {sink_outcome::done, m.current, {}};
  }
  sink_result rollback(std::string_view name) override {
    std::lock_guard lock(mutex_);
    const auto it = modules_.find(std::string(name));
    if (it == modules_.end()) return {sink_outcome::unknown_module, 0, "no such module"};
    auto& m = it->second;
    if (m.previous == 0) return {sink_outcome::no_previous_version, m.current, "only one version"};
    std::swap(m.current, m.previous);
    ++rollbacks_;
    return {sink_outcome::done, m.current, {}};
  }
  std::vector<module_report> status() const override {
    std::lock_guard lock(mutex_);
    std::vector<module_report> out;
    for (const auto& [name, m] : modules_) {
      module_report r{name, m.current, {}, 3, m.last_error};
      if (m.previous) r.versions_held.push_back(m.previous);
      if (m.current) r.versions_held.push_back(m.current);
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
      s.current[name] = m.current;
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
  struct module {
    std::uint64_t current = 0;
    std::uint64_t previous = 0;
    std::vector<std::uint64_t> applied;
    std::string last_error;
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
  const std::string request = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
                              "Connection: close\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body;
  EXPECT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  auto response = read_until_closed(fd, 10s);
  ::close(fd);
  return response;
}

// --- the fixture ------------------------------------------------------------------------------

struct reply {
  int status = 0;  // 0: no response (connection failed)
  json body;
};

class UpdateEndpointTest : public ::testing::Test {
 protected:
  cubridge::keypair keys = cubridge::generate_keypair();
  cubridge::keypair stranger = cubridge::generate_keypair();
  fake_sink sink;
  bytes cubin = read_file(cubridge::testing::test_cubin_path());  // sm_90
  std::unique_ptr<cubridge::update_endpoint> endpoint;
  std::uint64_t next_valid = 100;  // versions for "still serving" pushes

  void start(cubridge::update_endpoint_options options = {}) {
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
    httplib::Result r = method == "PUT"    ? client.Put(path.c_str(), body, "application/octet-stream")
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
    EXPECT_EQ(sink.state(), before) << "a refused request changed the sink";
    expect_still_serving();
  }
  void expect_still_serving() {
    const auto v = ++next_valid;
    const auto ok = push("canary", bundle("canary", v));
    EXPECT_EQ(ok.status, 200) << "a valid push after the refusal failed: " << ok.body.dump();
    EXPECT_EQ(sink.current_version("canary"), v);
  }
};

// --- pushes -----------------------------------------------------------------------------------

TEST_F(UpdateEndpointTest, NothingListensUntilStarted) {
  cubridge::update_endpoint idle(sink, {});
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
  cubridge::update_endpoint_options taken;
  taken.port = port();
  cubridge::update_endpoint second(sink, taken);
  try {
    second.start();
    FAIL() << "binding a port in use succeeded";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::io));
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port())),
              std::string::npos)
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
  EXPECT_EQ(sink.applied("filters"), std::vector<std::uint64_t>{3});
  EXPECT_EQ(endpoint->stats().applied, 1u);
}

TEST_F(UpdateEndpointTest, UnsignedBundleIs401) {
  start();
  auto b = bundle("filters", 3);
  std::fill(b.end() - 64, b.end(), std::byte{0});
  const auto before = sink.state();
  expect_refused(push("filters", b), 401, "unsigned_bundle", before);
}

TEST_F(UpdateEndpointTest, UnknownKeyIs403) {
  start();
  const auto before = sink.state();
  expect_refused(push("filters", bundle("filters", 3, &stranger.secret_key)), 403, "unknown_key",
                 before);
}

TEST_F(UpdateEndpointTest, TamperedPayloadIs403) {
  start();
  auto b = bundle("filters", 3);
  b[b.size() - 64 - 100] ^= std::byte{0x01};  // a byte of the payload's end
  const auto before = sink.state();
  expect_refused(push("filters", b), 403, "payload_mismatch", before);
}

TEST_F(UpdateEndpointTest, TamperedManifestIs403) {
  start();
  auto b = bundle("filters", 3);
  const auto text = as_text(b);
  const auto at = text.find("\"version\":3");
  ASSERT_NE(at, std::string::npos);
  b[at + 10] = std::byte{'9'};  // version 3 -> 9, same length, old signature
  const auto before = sink.state();
  expect_refused(push("filters", b), 403, "bad_signature", before);
}

TEST_F(UpdateEndpointTest, ReplayedAndOlderVersionsAre409) {
  start();
  ASSERT_EQ(push("filters", bundle("filters", 3)).status, 200);
  const auto before = sink.state();
  const auto replay = push("filters", bundle("filters", 3));
  expect_refused(replay, 409, "replayed_version", before);
  EXPECT_EQ(replay.body["current_version"], 3);
  expect_refused(push("filters", bundle("filters", 2)), 409, "older_version", sink.state());
  EXPECT_EQ(sink.applied("filters"), std::vector<std::uint64_t>{3});
}

TEST_F(UpdateEndpointTest, AVersionSeenBeforeStaysRefusedAfterARollback) {
  start();
  ASSERT_EQ(push("filters", bundle("filters", 3)).status, 200);
  const auto v4 = bundle("filters", 4);
  ASSERT_EQ(push("filters", v4).status, 200);
  const auto r = send("POST", "/v1/modules/filters/rollback",
                      cubridge::sign_rollback_request("filters", 4, keys.secret_key));
  ASSERT_EQ(r.status, 200) << r.body.dump();
  ASSERT_EQ(sink.current_version("filters"), 3u);
  // A captured v4 must not come back on its own: only a newer version moves forward.
  expect_refused(push("filters", v4), 409, "replayed_version", sink.state());
  EXPECT_EQ(push("filters", bundle("filters", 5)).status, 200);
}

TEST_F(UpdateEndpointTest, OversizedBodyIs413) {
  cubridge::update_endpoint_options options;
  options.max_body_bytes = 8 << 10;  // below the test cubin's size
  start(options);
  const auto before = sink.state();
  const auto r = push("filters", bundle("filters", 3));
  EXPECT_EQ(r.status, 413) << r.body.dump();
  EXPECT_EQ(r.body.value("error", ""), "too_large");
  EXPECT_EQ(sink.state(), before);
  // A much larger body is cut off by the same limit, and the service keeps serving.
  const auto huge = raw_request(port(), "PUT", "/v1/modules/filters", std::string(1 << 20, 'x'));
  EXPECT_EQ(status_of(huge), 413) << huge.substr(0, 200);
  EXPECT_EQ(sink.state(), before);
  const auto small = bytes(64, std::byte{'x'});
  cubridge::bundle_manifest_input in{"canary", 1, "sm_90", cubridge::payload_kind::cuda_source};
  const auto ok = push("canary", cubridge::sign_bundle(in, small, keys.secret_key));
  EXPECT_EQ(ok.status, 200) << ok.body.dump();
}

TEST_F(UpdateEndpointTest, MalformedBundlesAre400) {
  start();
  const auto before = sink.state();
  expect_refused(send("PUT", "/v1/modules/filters", "not a bundle"), 400, "bad_magic", before);
  auto truncated = bundle("filters", 3);
  truncated.resize(truncated.size() - 10);
  expect_refused(push("filters", truncated), 400, "malformed", before);
  expect_refused(
      push("filters", cubridge::detail::sign_bundle_unchecked("{\"name\":", cubin, keys.secret_key)),
      400, "malformed_manifest", before);
  cubridge::bundle_manifest_input in{"filters", 3, "sm_90"};
  auto manifest = cubridge::detail::manifest_json(in, cubin, keys.public_key);
  manifest.insert(1, "\"extra\":1,");
  expect_refused(push("filters", cubridge::detail::sign_bundle_unchecked(manifest, cubin,
                                                                         keys.secret_key)),
                 400, "invalid_manifest", before);
}

TEST_F(UpdateEndpointTest, NamesThatAreNotNamesAre400BeforeAnything) {
  start();
  const auto before = sink.state();
  const auto body = as_text(bundle("filters", 3));
  for (const std::string& target : std::vector<std::string>{"/v1/modules/a/b", "/v1/modules/..", "/v1/modules/%2e%2e", "/v1/modules/a%2Fb",
        "/v1/modules/..%2Fetc%2Fpasswd", "/v1/modules/a%5Cb", "/v1/modules/a%00b",
        "/v1/modules/a%0Ab", "/v1/modules/", "/v1/modules/.", "/v1/modules/" + std::string(129, 'n')}) {
    const auto response = raw_request(port(), "PUT", target, body);
    EXPECT_EQ(status_of(response), 400) << target << ": " << response.substr(0, 300);
    EXPECT_EQ(body_of(response).value("error", ""), "bad_name") << target;
    const auto rollback = raw_request(port(), "POST", target + "/rollback", "x");
    EXPECT_EQ(status_of(rollback), 400) << target << "/rollback: " << rollback.substr(0, 300);
  }
  EXPECT_EQ(sink.state(), before);
  expect_still_serving();
}

TEST_F(UpdateEndpointTest, UrlNameMustBeTheSignedName) {
  start();
  const auto before = sink.state();
  expect_refused(push("other", bundle("filters", 3)), 400, "name_mismatch", before);
}

TEST_F(UpdateEndpointTest, PayloadForAnotherGpuIs422) {
  sink.sm = 80;  // an sm_90 cubin cannot run here
  start();
  const auto before = sink.state();
  const auto r = push("filters", bundle("filters", 3));
  EXPECT_EQ(r.status, 422) << r.body.dump();
  EXPECT_EQ(r.body.value("error", ""), "wrong_device");
  EXPECT_EQ(r.body.value("gpu", ""), "sm_80");
  EXPECT_EQ(sink.state(), before);
  const auto other = read_file(cubridge::testing::test_cubin_other_path());  // sm_80
  cubridge::bundle_manifest_input in{"filters", 3, "sm_80"};
  const auto ok = push("filters", cubridge::sign_bundle(in, other, keys.secret_key));
  EXPECT_EQ(ok.status, 200) << ok.body.dump();
}

TEST_F(UpdateEndpointTest, StageRefusalIs422AndReported) {
  start();
  sink.hook = [](const cubridge::verified_bundle& b) -> std::optional<sink_result> {
    if (b.version() == 4) return sink_result{sink_outcome::rejected, 3, "kernel 'blur' missing"};
    return std::nullopt;
  };
  ASSERT_EQ(push("filters", bundle("filters", 3)).status, 200);
  const auto r = push("filters", bundle("filters", 4));
  EXPECT_EQ(r.status, 422) << r.body.dump();
  EXPECT_EQ(r.body.value("error", ""), "stage_refused");
  EXPECT_EQ(r.body.value("detail", ""), "kernel 'blur' missing");
  EXPECT_EQ(sink.current_version("filters"), 3u);
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
  sink.hook = nullptr;
  EXPECT_EQ(push("filters", bundle("filters", 4)).status, 200);
}

TEST_F(UpdateEndpointTest, UnknownModuleIs404WhenTheSinkCreatesNone) {
  sink.creates_modules = false;
  start();
  const auto r = push("filters", bundle("filters", 3));
  EXPECT_EQ(r.status, 404) << r.body.dump();
  EXPECT_EQ(r.body.value("error", ""), "unknown_module");
}

TEST_F(UpdateEndpointTest, SinkExceptionIs500AndChangesNothing) {
  start();
  ASSERT_EQ(push("filters", bundle("filters", 3)).status, 200);
  sink.hook = [](const cubridge::verified_bundle&) -> std::optional<sink_result> {
    throw std::runtime_error("out of device memory");
  };
  const auto r = push("filters", bundle("filters", 4));
  EXPECT_EQ(r.status, 500) << r.body.dump();
  EXPECT_EQ(r.body.value("error", ""), "apply_failed");
  EXPECT_NE(r.body.value("detail", "").find("out of device memory"), std::string::npos);
  EXPECT_EQ(sink.current_version("filters"), 3u);
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
  EXPECT_EQ(sink.current_version("filters"), 4u);
  expect_refused(rollback("filters", request), 409, "replayed_request", sink.state());
  // A fresh request from a version that no longer serves.
  expect_refused(rollback("filters", cubridge::sign_rollback_request("filters", 5, keys.secret_key)),
                 409, "version_mismatch", sink.state());
}

TEST_F(RollbackTest, RefusedRequests) {
  const auto before = sink.state();
  auto request = cubridge::sign_rollback_request("filters", 5, keys.secret_key);
  auto unsigned_request = request.substr(0, request.find('\n') + 1) + std::string(128, '0');
  expect_refused(rollback("filters", unsigned_request), 401, "unsigned_bundle", before);
  expect_refused(rollback("filters", cubridge::sign_rollback_request("filters", 5,
                                                                     stranger.secret_key)),
                 403, "unknown_key", before);
  auto tampered = request;
  tampered.replace(tampered.find("\"from_version\":5"), 16, "\"from_version\":4");
  expect_refused(rollback("filters", tampered), 403, "bad_signature", before);
  expect_refused(rollback("filters", cubridge::sign_rollback_request(
                                         "filters", 5, keys.secret_key,
                                         std::chrono::system_clock::now() - 1h)),
                 403, "expired_request", before);
  expect_refused(rollback("filters", "roll it back please"), 400, "malformed", before);
  expect_refused(rollback("filters", cubridge::detail::sign_rollback_line_unchecked(
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
  const auto before = sink.state();
  expect_refused(rollback("solo", cubridge::sign_rollback_request("solo", 1, keys.secret_key)), 409,
                 "no_previous_version", before);
}

// --- connections ------------------------------------------------------------------------------

TEST_F(UpdateEndpointTest, TooManyConnectionsAre503AndTheServiceRecovers) {
  cubridge::update_endpoint_options options;
  options.threads = 2;
  options.max_queued_connections = 1;
  options.request_timeout = 3s;
  start(options);
  const auto before = sink.state();
  // Three connections that never finish their request: two hold the workers, one waits.
  std::vector<int> holders;
  for (int i = 0; i < 3; ++i) {
    holders.push_back(connect_loopback(port()));
    const std::string partial = "PUT /v1/modules/filters HTTP/1.1\r\nHost: x\r\n";
    ::send(holders.back(), partial.data(), partial.size(), MSG_NOSIGNAL);
  }
  // Once the three are accepted and handed to workers, the next connection is refused. On a
  // loaded machine that can take longer than one wait: try again a few times.
  std::string response;
  bool closed = false;
  for (int attempt = 0; attempt < 10; ++attempt) {
    std::this_thread::sleep_for(200ms);
    const int extra = connect_loopback(port());
    closed = false;
    response = read_until_closed(extra, 2s, &closed);
    ::close(extra);
    if (status_of(response) == 503) break;
  }
  EXPECT_EQ(status_of(response), 503) << response;
  EXPECT_EQ(body_of(response).value("error", ""), "busy");
  EXPECT_TRUE(closed) << "a refused connection is closed at once";
  EXPECT_GE(endpoint->stats().connections_refused, 1u);
  for (int fd : holders) ::close(fd);
  EXPECT_EQ(sink.state(), before);
  expect_still_serving();
}

TEST_F(UpdateEndpointTest, ASlowClientIsCutOffAtTheRequestDeadline) {
  cubridge::update_endpoint_options options;
  options.threads = 2;
  options.request_timeout = 1s;
  options.read_timeout = 500ms;
  start(options);
  const auto before = sink.state();
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
  EXPECT_EQ(sink.state(), before) << "the cut-off request changed the sink";
  expect_still_serving();
}

TEST_F(UpdateEndpointTest, AClientThatSendsNothingIsCutOff) {
  cubridge::update_endpoint_options options;
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

// A self-signed certificate for 127.0.0.1, written as PEM files.
void write_self_signed(const std::filesystem::path& cert, const std::filesystem::path& key) {
  EVP_PKEY* pkey = EVP_EC_gen("P-256");
  ASSERT_NE(pkey, nullptr);
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
  X509_gmtime_adj(X509_getm_notBefore(x), -60);
  X509_gmtime_adj(X509_getm_notAfter(x), 3600);
  X509_set_pubkey(x, pkey);
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("127.0.0.1"), -1, -1, 0);
  X509_set_issuer_name(x, name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, x, x, nullptr, nullptr, 0);
  X509_EXTENSION* san = X509V3_EXT_conf_nid(nullptr, &ctx, NID_subject_alt_name, "IP:127.0.0.1");
  X509_add_ext(x, san, -1);
  X509_EXTENSION_free(san);
  ASSERT_GT(X509_sign(x, pkey, EVP_sha256()), 0);
  FILE* f = std::fopen(cert.c_str(), "w");
  PEM_write_X509(f, x);
  std::fclose(f);
  f = std::fopen(key.c_str(), "w");
  PEM_write_PrivateKey(f, pkey, nullptr, nullptr, 0, nullptr, nullptr);
  std::fclose(f);
  X509_free(x);
  EVP_PKEY_free(pkey);
}

TEST_F(UpdateEndpointTest, ServesHttpsWithACertificate) {
  cubridge::testing::temp_dir dir;
  const auto cert = dir.path / "cert.pem", key = dir.path / "key.pem";
  write_self_signed(cert, key);
  cubridge::update_endpoint_options options;
  options.tls_certificate = cert;
  options.tls_private_key = key;
  start(options);
  EXPECT_EQ(endpoint->url(), "https://127.0.0.1:" + std::to_string(port()));
  httplib::SSLClient client("127.0.0.1", port());
  client.set_ca_cert_path(cert.c_str());
  client.enable_server_certificate_verification(true);
  const auto b = bundle("filters", 3);
  const auto r = client.Put("/v1/modules/filters", as_text(b), "application/octet-stream");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(sink.current_version("filters"), 3u);
  // Plain HTTP to the TLS port gets no answer from the service.
  const auto plain = raw_request(port(), "GET", "/v1/modules");
  EXPECT_NE(status_of(plain), 200);
}

TEST_F(UpdateEndpointTest, UnusableTlsFilesAreNamed) {
  cubridge::testing::temp_dir dir;
  cubridge::testing::write_text(dir.path / "cert.pem", "not a certificate");
  cubridge::update_endpoint_options options;
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
  cubridge::update_endpoint_options options;
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
      const auto status = json::parse(r->body);  // named: a range-for over a temporary's
      for (const auto& m : status.at("modules"))   // member would outlive the temporary
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
  EXPECT_EQ(sink.applied("hot"), expected) << "versions lost, repeated or out of order";
  EXPECT_EQ(pushes_ok, static_cast<int>(versions));
  EXPECT_EQ(pushes_replayed, static_cast<int>(versions));
  EXPECT_EQ(other_answers, 0);
  EXPECT_EQ(sink.overlapping_calls(), 0) << "apply ran twice at once for one module";
  EXPECT_GT(queries, 0);
  EXPECT_EQ(bad_queries, 0);
  EXPECT_EQ(went_back, 0) << "a status query saw the current version go back";
  EXPECT_GT(refused_ok, 0);
  EXPECT_EQ(refused_wrong, 0);
  EXPECT_EQ(sink.current_version("hot"), versions);
  std::printf("load: %llu versions x 2 pushers, %d status queries, %d refused pushes in %.1f s\n",
              static_cast<unsigned long long>(versions), queries.load(), refused_ok.load(),
              took.count());
}

}  // namespace
