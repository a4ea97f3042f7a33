// `cubridge fleet publish | status | rollback | watch | enroll`, the real binary run as a child
// against a real nats-server (tests/nats_server.hpp); the test plays the nodes' heartbeats,
// signed with their enrolled keys.
#include "eventually.hpp"
#include "fleet/nats.hpp"
#include "nats_server.hpp"

#include <cubridge/bundle/bundle.hpp>
#include <cubridge/core/detail/child_process.hpp>
#include <cubridge/fleet/controller.hpp>
#include <cubridge/fleet/signed_record.hpp>
#include <cubridge/fleet/subjects.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>
#include <thread>

namespace {

using namespace cubridge::fleet;
using namespace std::chrono_literals;
using cubridge::testing::nats_server;
using cubridge::testing::temp_dir;
using json = nlohmann::json;

struct run_result {
  int exit_code = -1;
  std::string out, err;
};

std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// `cubridge ARGS...` in `dir`, killed after 60 s (a hang is a failure, not a wait).
run_result run_tool(const std::vector<std::string>& args, const temp_dir& dir,
                    const std::vector<std::string>& environment = {}) {
  const auto out_path = dir.path / "out.txt", err_path = dir.path / "err.txt";
  const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  cubridge::detail::child_spec spec;
  spec.program = CUBRIDGE_TOOL_PATH;
  spec.args = args;
  spec.environment = cubridge::detail::environment_with(environment);
  spec.fds = {{1, out}, {2, err}};
  spec.working_directory = dir.path;
  auto child = cubridge::detail::child_process::spawn(spec);
  ::close(out);
  ::close(err);
  run_result result;
  if (const auto ended = child.wait_for(60s); ended && ended->exited())
    result.exit_code = ended->exit_code;
  else
    ADD_FAILURE() << "cubridge did not exit within 60 s";
  result.out = read_text(out_path);
  result.err = read_text(err_path);
  return result;
}

std::chrono::sys_seconds now_seconds() {
  return std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now());
}

struct FleetCli : ::testing::Test {
  nats_server server;
  temp_dir dir;
  cubridge::keypair keys = cubridge::generate_keypair();
  cubridge::keypair node_keys = cubridge::generate_keypair();
  std::unique_ptr<controller> control;
  detail::connection_ptr connection;
  detail::jetstream_ptr js;

  void SetUp() override {
    cubridge::write_key_file(dir.path / "k.key", keys.secret_key);
    cubridge::write_key_file(dir.path / "n1.pub", node_keys.public_key);
    std::filesystem::copy_file(CUBRIDGE_TEST_CUBIN, dir.path / "filters.cubin");
    controller_options o;
    o.bus.servers = server.url();
    o.operator_keys.add(keys.public_key);
    control = std::make_unique<controller>(std::move(o));
    detail::connect_options c;
    c.bus.servers = server.url();
    c.name = "nodes";
    c.reconnect = false;
    connection = detail::connect(c);
    js = detail::jetstream(connection.get());
  }
  // A heartbeat of `node`, signed with `key` (the enrolled one unless a test forges).
  void heartbeat(const std::string& node, std::map<std::string, std::uint64_t, std::less<>> v,
                 const cubridge::secret_key& key, std::chrono::sys_seconds time = now_seconds(),
                 std::string gpu = "sm_90") {
    cubridge::fleet::heartbeat beat;
    beat.node = node;
    beat.gpu = std::move(gpu);
    beat.interval = 5s;
    beat.time = time;
    beat.versions = std::move(v);
    const auto text = sign_record(record_kind::heartbeat, to_json(beat), key);
    detail::publish(js.get(), connection.get(), heartbeat_subject(node),
                    {reinterpret_cast<const std::byte*>(text.data()), text.size()}, "heartbeat");
  }
  std::vector<std::string> tool(std::vector<std::string> args) const {
    args.insert(args.end(), {"--server", server.url()});
    return args;
  }
};

// The fleet's one backoff (reconnects, the agent's retries): doubling to its longest, each
// delay plus up to half again, so that nodes that failed together spread out.
TEST(JitteredBackoff, DoublesToItsLongestPlusUpToHalfAgain) {
  using std::chrono::milliseconds;
  for (int attempt = 1; attempt <= 8; ++attempt) {
    const auto base =
        std::min(milliseconds(100) * (1 << std::min(attempt - 1, 6)), milliseconds(2000));
    std::set<std::int64_t> seen;
    for (int i = 0; i < 200; ++i) {
      const auto d = cubridge::fleet::detail::jittered_backoff(attempt, 100ms, 2000ms);
      EXPECT_GE(d, base) << attempt;
      EXPECT_LE(d, base + base / 2) << attempt;
      seen.insert(d.count());
    }
    EXPECT_GT(seen.size(), 10u) << "attempt " << attempt << " is not spread out";
  }
  EXPECT_LE(cubridge::fleet::detail::reconnect_delay(1), 375ms);
  EXPECT_GE(cubridge::fleet::detail::reconnect_delay(1), 250ms);
}

TEST_F(FleetCli, PublishStoresTheBundleAndMakesItDesired) {
  ASSERT_EQ(run_tool({"sign", "filters.cubin", "--key", "k.key", "--version", "3", "--out",
                      "filters.bundle"},
                     dir)
                .exit_code,
            0);
  const auto r = run_tool(tool({"fleet", "publish", "filters.bundle", "--key", "k.key"}), dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("published 'filters' v3"), std::string::npos) << r.out;
  const auto desired = control->desired("filters");
  ASSERT_TRUE(desired);
  ASSERT_TRUE(desired->state.stable);
  EXPECT_EQ(desired->state.stable->version, 3u);
  const auto& ref = *desired->state.stable;
  const auto message = detail::last_message(js.get(), bundle_stream("filters"),
                                            bundle_subject("filters", 3, ref.digest));
  ASSERT_TRUE(message);
  const auto verified = cubridge::verify_bundle(detail::message_bytes(message.get()),
                                                cubridge::trusted_keys{keys.public_key});
  EXPECT_EQ(verified.version(), 3u);
  // A retry of the same bundle writes nothing new; the same version signed again (another
  // bundle) and a lower version are refused without a rollback.
  const auto again = run_tool(tool({"fleet", "publish", "filters.bundle", "--key", "k.key"}), dir);
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find("(already)"), std::string::npos) << again.out;
  EXPECT_EQ(control->desired("filters")->state.revision, desired->state.revision);
  ASSERT_EQ(run_tool({"sign", "filters.cubin", "--key", "k.key", "--version", "3", "--expires",
                      "7d", "--out", "other.bundle"},
                     dir)
                .exit_code,
            0);  // the same version, another bundle (it carries an expiry)
  const auto resigned = run_tool(tool({"fleet", "publish", "other.bundle", "--key", "k.key"}), dir);
  EXPECT_EQ(resigned.exit_code, 1);
  EXPECT_NE(resigned.err.find("desired already with another bundle"), std::string::npos)
      << resigned.err;
  const auto lower = run_tool(
      tool({"fleet", "publish", "filters.cubin", "--key", "k.key", "--version", "2"}), dir);
  EXPECT_EQ(lower.exit_code, 1);
  EXPECT_NE(lower.err.find("CUBRIDGE_FLEET_OLDER_VERSION"), std::string::npos) << lower.err;
  EXPECT_EQ(control->desired("filters")->state.stable->version, 3u);
}

TEST_F(FleetCli, CudaSourceIsCompiledForTheNodesGpu) {
  control->enroll("n1", node_keys.public_key, {}, keys.secret_key);
  heartbeat("n1", {}, node_keys.secret_key, now_seconds(), "sm_80");  // not the default sm_90
  std::filesystem::copy_file(CUBRIDGE_TEST_HOT_KERNELS, dir.path / "hot.cu");
  const auto r = run_tool(
      tool({"fleet", "publish", "hot.cu", "--key", "k.key", "--version", "2", "--name", "hot"}),
      dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("compiled hot.cu for sm_80"), std::string::npos) << r.out;
  EXPECT_EQ(control->desired("hot")->state.stable->target, "sm_80");
}

TEST_F(FleetCli, EnrollThenStatusShowsVerifiedNodesOnly) {
  const auto e = run_tool(tool({"fleet", "enroll", "n1", "--node-key", "n1.pub", "--key", "k.key",
                                "--label", "cohort=a"}),
                          dir);
  ASSERT_EQ(e.exit_code, 0) << e.err;
  ASSERT_EQ(
      run_tool(tool({"fleet", "publish", "filters.cubin", "--key", "k.key", "--version", "3"}), dir)
          .exit_code,
      0);
  heartbeat("n1", {{"filters", 2}}, node_keys.secret_key);
  const auto stranger = cubridge::generate_keypair();
  heartbeat("ghost", {{"filters", 3}}, stranger.secret_key);  // not enrolled: never shown
  const auto r = run_tool(tool({"fleet", "status", "--json", "--key", "k.key"}), dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto status = json::parse(r.out);
  ASSERT_EQ(status["nodes"].size(), 1u) << status.dump();
  EXPECT_EQ(status["nodes"][0]["node"], "n1");
  EXPECT_EQ(status["nodes"][0]["live"], true);
  EXPECT_EQ(status["nodes"][0]["labels"]["cohort"], "a");
  EXPECT_EQ(status["nodes"][0]["lag"]["filters"], 1);
  EXPECT_EQ(status["modules"][0]["stable"]["version"], 3);
  EXPECT_EQ(status["open_bus"], true);
  // n1's heartbeat forged with another key: refused, counted, n1 not live.
  heartbeat("n1", {{"filters", 3}}, stranger.secret_key);
  const auto forged = run_tool(tool({"fleet", "status", "--key", "k.key"}), dir);
  ASSERT_EQ(forged.exit_code, 0) << forged.err;
  EXPECT_NE(forged.out.find("a laptop demo only"), std::string::npos) << forged.out;
  EXPECT_NE(forged.out.find("refused: 1 x heartbeat not signed by its node"), std::string::npos)
      << forged.out;
  const auto once = run_tool(tool({"fleet", "watch", "--once", "--key", "k.key"}), dir);
  ASSERT_EQ(once.exit_code, 0) << once.err;
  EXPECT_NE(once.out.find("module filters: complete, stable v3"), std::string::npos) << once.out;
}

TEST_F(FleetCli, RollbackMakesTheEarlierVersionDesired) {
  for (const char* v : {"3", "4"})
    ASSERT_EQ(
        run_tool(tool({"fleet", "publish", "filters.cubin", "--key", "k.key", "--version", v}), dir)
            .exit_code,
        0);
  const auto r = run_tool(tool({"fleet", "rollback", "filters", "--key", "k.key"}), dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto desired = control->desired("filters");
  EXPECT_EQ(desired->state.phase, rollout_phase::rolled_back);
  EXPECT_EQ(desired->state.stable->version, 3u);
  EXPECT_NE(desired->state.reason.find("from v4 to v3"), std::string::npos);
  const auto nothing = run_tool(tool({"fleet", "rollback", "filters", "--key", "k.key"}), dir);
  EXPECT_EQ(nothing.exit_code, 1) << nothing.out;
}

TEST_F(FleetCli, CanaryWithoutAnswerHalts) {
  control->enroll("n1", node_keys.public_key, {}, keys.secret_key);
  heartbeat("n1", {{"filters", 0}}, node_keys.secret_key);
  const auto r = run_tool(tool({"fleet", "publish", "filters.cubin", "--key", "k.key", "--version",
                                "5", "--canary", "1", "--window", "0.2"}),
                          dir);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.err.find("halted: 0 of 1 canary results `applied` within 200 ms"), std::string::npos)
      << r.err;
  const auto desired = control->desired("filters");
  EXPECT_EQ(desired->state.phase, rollout_phase::halted);
  EXPECT_FALSE(desired->state.stable);  // never desired for everyone
  const auto status = run_tool(tool({"fleet", "status", "--key", "k.key"}), dir);
  EXPECT_NE(status.out.find("HALTED"), std::string::npos) << status.out;
}

TEST_F(FleetCli, CanaryNeedsNodesThatFollowTheModule) {
  control->enroll("n1", node_keys.public_key, {}, keys.secret_key);
  heartbeat("n1", {{"other", 1}}, node_keys.secret_key);  // live, but follows another module
  const auto r = run_tool(tool({"fleet", "publish", "filters.cubin", "--key", "k.key", "--version",
                                "5", "--canary", "1"}),
                          dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("0 node(s) qualify for 1 canaries"), std::string::npos) << r.err;
  EXPECT_FALSE(control->desired("filters"));
}

TEST_F(FleetCli, UnreachableServerIsOneLineAndExit75) {
  const std::string dead = "nats://127.0.0.1:" + std::to_string(server.port());
  server.kill();
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"fleet", "status", "--server", dead},
           {"fleet", "publish", "filters.cubin", "--server", dead, "--key", "k.key", "--version",
            "3"},
           {"fleet", "rollback", "filters", "--key", "k.key", "--server", dead},
           {"fleet", "watch", "--once", "--server", dead}}) {
    const auto r = run_tool(args, dir);
    EXPECT_EQ(r.exit_code, 75) << args[1] << ": " << r.err;
    EXPECT_NE(r.err.find("CUBRIDGE_FLEET_UNREACHABLE"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

TEST_F(FleetCli, UsageErrorsAreExit64AndCredentialsAreNeverPrinted) {
  const auto no_key = run_tool(tool({"fleet", "publish", "filters.cubin", "--canary", "1"}), dir);
  EXPECT_EQ(no_key.exit_code, 64) << no_key.err;
  for (const char* window : {"nan", "-1", "0", "inf"}) {
    const auto r = run_tool(tool({"fleet", "publish", "filters.cubin", "--key", "k.key",
                                  "--version", "3", "--window", window}),
                            dir);
    EXPECT_EQ(r.exit_code, 64) << window << ": " << r.err;
  }
  for (const char* url :
       {"not a url", "http://127.0.0.1:4222", "nats://127.0.0.1:99999", "nats://a,,nats://b"}) {
    const auto r = run_tool({"fleet", "status", "--server", url}, dir);
    EXPECT_EQ(r.exit_code, 64) << url << ": " << r.err;
  }
  const auto secret =
      run_tool({"fleet", "status", "--server", "nats://operator:hunter2@127.0.0.1:1"}, dir);
  EXPECT_EQ(secret.exit_code, 75) << secret.err;
  EXPECT_EQ(secret.err.find("hunter2"), std::string::npos) << secret.err;
  const auto bad =
      run_tool({"fleet", "status", "--server", "nats://operator:hunter2@127.0.0.1:0"}, dir);
  EXPECT_EQ(bad.exit_code, 64) << bad.err;
  EXPECT_EQ(bad.err.find("hunter2"), std::string::npos) << bad.err;
}

// A hung first server (its port takes the connection and never answers, as a frozen host's
// does) costs the quick first try (400 ms), not the connect timeout (2 s).
TEST_F(FleetCli, AServerListWhoseFirstServerHangsConnectsWithinASecond) {
  const int hung = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(hung, reinterpret_cast<const sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(hung, 16), 0);  // never accepted: the kernel completes the handshake
  socklen_t length = sizeof address;
  ASSERT_EQ(::getsockname(hung, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const auto list =
      "nats://127.0.0.1:" + std::to_string(ntohs(address.sin_port)) + "," + server.url();
  const auto start = std::chrono::steady_clock::now();
  const auto r = run_tool({"fleet", "status", "--server", list}, dir);
  const auto took = std::chrono::steady_clock::now() - start;
  ::close(hung);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::printf("fleet status with a hung first server: %.0f ms\n",
              std::chrono::duration<double, std::milli>(took).count());
  EXPECT_LT(took, 1500ms);  // the whole command, on a loaded machine; 2 s+ before
}

TEST_F(FleetCli, AServerListWithOneHealthyUrlConnects) {
  const std::string dead = "nats://127.0.0.1:1";
  const auto r = run_tool(
      {"fleet", "status", "--server", dead + "," + server.url() + "," + server.url()}, dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// The server, credentials and CA from the environment or a profile (`fleet init` writes one),
// the command line over both.
TEST_F(FleetCli, TheBusComesFromTheEnvironmentOrAProfile) {
  const auto by_env = run_tool({"fleet", "status"}, dir, {"CUBRIDGE_FLEET_SERVER=" + server.url()});
  EXPECT_EQ(by_env.exit_code, 0) << by_env.err;
  {
    std::ofstream profile(dir.path / "fleet.profile");
    profile << "# a test's profile\nserver " << server.url() << "\n";
  }
  const auto by_profile = run_tool({"fleet", "status", "--profile", "fleet.profile"}, dir);
  EXPECT_EQ(by_profile.exit_code, 0) << by_profile.err;
  const auto by_env_profile =
      run_tool({"fleet", "status"}, dir,
               {"CUBRIDGE_FLEET_PROFILE=" + (dir.path / "fleet.profile").string()});
  EXPECT_EQ(by_env_profile.exit_code, 0) << by_env_profile.err;
  // The command line over the profile: a dead server named there is the one tried.
  const auto overridden = run_tool(
      {"fleet", "status", "--profile", "fleet.profile", "--server", "nats://127.0.0.1:1"}, dir);
  EXPECT_EQ(overridden.exit_code, 75) << overridden.err;
  // A profile that does not parse is named with its line.
  { std::ofstream(dir.path / "bad.profile") << "server " << server.url() << "\nport 4222\n"; }
  const auto bad = run_tool({"fleet", "status", "--profile", "bad.profile"}, dir);
  EXPECT_EQ(bad.exit_code, 1) << bad.err;
  EXPECT_NE(bad.err.find("bad.profile' line 2: unknown field 'port'"), std::string::npos)
      << bad.err;
  // A CA file that is not there: one line that says so, before any connection.
  const auto no_ca = run_tool(tool({"fleet", "status", "--ca", "missing.pem"}), dir);
  EXPECT_EQ(no_ca.exit_code, 1) << no_ca.err;
  EXPECT_NE(no_ca.err.find("'missing.pem' cannot be read: No such file"), std::string::npos)
      << no_ca.err;
  EXPECT_EQ(std::count(no_ca.err.begin(), no_ca.err.end(), '\n'), 1) << no_ca.err;
}

// `fleet publish x.cubin --version N` run twice signs twice: the same payload, another bundle.
// The second run writes nothing (no new revision, nothing stored) and says so.
TEST_F(FleetCli, PublishingTheSamePayloadTwiceWritesNothingTheSecondTime) {
  const std::vector<std::string> publish = {
      "fleet", "publish", "filters.cubin", "--key", "k.key", "--version", "4"};
  const auto first = run_tool(tool(publish), dir);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const auto desired = control->desired("filters");
  ASSERT_TRUE(desired);
  std::this_thread::sleep_for(1100ms);  // another signing second: another bundle
  const auto second = run_tool(tool(publish), dir);
  EXPECT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.out.find("(already)"), std::string::npos) << second.out;
  const auto after = control->desired("filters");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->bucket_revision, desired->bucket_revision);
  EXPECT_EQ(after->state.revision, desired->state.revision);
  EXPECT_EQ(detail::stream_subjects(js.get(), bundle_stream("filters"), "cubridge.bundle.>").size(),
            1u);
  // Another payload under the same version is still refused.
  std::filesystem::copy_file(CUBRIDGE_TEST_CUBIN_OTHER, dir.path / "filters.cubin",
                             std::filesystem::copy_options::overwrite_existing);
  const auto other = run_tool(tool(publish), dir);
  EXPECT_EQ(other.exit_code, 1) << other.out;
  EXPECT_NE(other.err.find("desired already with another bundle"), std::string::npos) << other.err;
}

// --- the dashboard and watch as long-running children -----------------------------------------

// A TCP connection to 127.0.0.1:`port` whose reads give up after `timeout`; -1 when refused.
int connect_to(int port, std::chrono::milliseconds timeout = 5s) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Sends a GET of `path` on `fd` and reads until `until` appears, the peer closes, or a read
// times out; what was read.
std::string get(int fd, const std::string& path, const std::string& until = "") {
  const std::string request =
      "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) < 0) return {};
  std::string text;
  char buffer[4096];
  for (;;) {
    const auto n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
    if (!until.empty() && text.find(until) != std::string::npos) break;
  }
  return text;
}

// A `cubridge ARGS...` child left running, its output in files; SIGTERM when it goes.
struct running_tool {
  std::filesystem::path out, err;
  cubridge::detail::child_process child;
  running_tool(const std::vector<std::string>& args, const temp_dir& dir, const std::string& name)
      : out(dir.path / (name + ".out")), err(dir.path / (name + ".err")) {
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cubridge::detail::child_spec spec;
    spec.program = CUBRIDGE_TOOL_PATH;
    spec.args = args;
    spec.environment = cubridge::detail::current_environment();
    spec.fds = {{1, o}, {2, e}};
    spec.working_directory = dir.path;
    child = cubridge::detail::child_process::spawn(spec);
    ::close(o);
    ::close(e);
  }
  ~running_tool() {
    if (child.running()) {
      ::kill(child.pid(), SIGTERM);
      if (!child.wait_for(10s)) (void)child.kill();
    }
  }
  [[nodiscard]] bool says(const std::string& what, std::chrono::milliseconds deadline = 30s) const {
    return cubridge::testing::eventually(
        [&] { return (read_text(out) + read_text(err)).find(what) != std::string::npos; },
        deadline);
  }
};

TEST_F(FleetCli, TheDashboardBoundsItsListenersAndIdleConnectionsAndSaysWhenItsPortIsTaken) {
  const int port = cubridge::testing::free_ports(1).front();
  const auto listen = "127.0.0.1:" + std::to_string(port);
  running_tool dashboard(tool({"fleet", "dashboard", "--listen", listen}), dir, "dashboard");
  ASSERT_TRUE(dashboard.says("dashboard at http://")) << read_text(dashboard.err);
  // A second one on the same port fails with the reason, at once (no SO_REUSEPORT).
  const auto second = run_tool(tool({"fleet", "dashboard", "--listen", listen}), dir);
  EXPECT_EQ(second.exit_code, 1) << second.err;
  EXPECT_NE(second.err.find("the port is in use"), std::string::npos) << second.err;
  // 40 connections that send nothing: /state answers at once all the same.
  std::vector<int> idle;
  for (int i = 0; i < 40; ++i) idle.push_back(connect_to(port));
  const auto asked = std::chrono::steady_clock::now();
  const int fd = connect_to(port);
  const auto state = get(fd, "/state");
  const auto waited = std::chrono::steady_clock::now() - asked;
  ::close(fd);
  EXPECT_NE(state.find("200 OK"), std::string::npos) << state;
  EXPECT_LT(waited, 1500ms) << "/state waited behind idle connections";
  // Idle ones are closed after the read timeout (2 s): a read sees the end.
  char byte = 0;
  EXPECT_EQ(::recv(idle.front(), &byte, 1, 0), 0) << "an idle connection was kept";
  for (const int f : idle) ::close(f);
  // Two pages listening from one address; the third is refused with why.
  std::vector<int> pages;
  for (int i = 0; i < 2; ++i) {
    pages.push_back(connect_to(port));
    EXPECT_NE(get(pages.back(), "/events", "data:").find("200 OK"), std::string::npos);
  }
  const int third = connect_to(port);
  const auto refused = get(third, "/events", "per address");
  EXPECT_NE(refused.find("503"), std::string::npos) << refused;
  ::close(third);
  for (const int f : pages) ::close(f);
}

TEST_F(FleetCli, TheDashboardAndWatchKeepRunningAcrossAServerRestart) {
  const int port = cubridge::testing::free_ports(1).front();
  running_tool dashboard(
      tool({"fleet", "dashboard", "--listen", "127.0.0.1:" + std::to_string(port)}), dir,
      "dashboard");
  running_tool watch(tool({"fleet", "watch"}), dir, "watch");
  ASSERT_TRUE(dashboard.says("dashboard at http://")) << read_text(dashboard.err);
  ASSERT_TRUE(watch.says("NODE")) << read_text(watch.err);
  control.reset();
  connection.reset();
  server.kill();
  EXPECT_TRUE(dashboard.says("lost the server")) << read_text(dashboard.err);
  EXPECT_TRUE(watch.says("lost the server")) << read_text(watch.err);
  EXPECT_TRUE(cubridge::testing::eventually(
      [&] {
        const int fd = connect_to(port);
        const bool said = get(fd, "/state").find("\"disconnected\"") != std::string::npos;
        ::close(fd);
        return said;
      },
      30s))
      << "the page never said the server was lost";
  server.start();
  EXPECT_TRUE(dashboard.says("connected again")) << read_text(dashboard.err);
  EXPECT_TRUE(watch.says("connected again")) << read_text(watch.err);
  EXPECT_FALSE(dashboard.child.try_wait()) << "the dashboard ended";
  EXPECT_FALSE(watch.child.try_wait()) << "watch ended";
}

}  // namespace
