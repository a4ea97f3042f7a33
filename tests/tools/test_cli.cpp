// The cubridge command under attack and misuse (issue 11): the real binary, run as a child, with
// planted files and links, FIFOs, loose key modes, hostile or untrusted endpoints (stand-ins in
// this process), odd module names and malformed arguments; and the argument and server-text
// helpers of tools/update/ themselves.
//
// CUBRIDGE_TEST_TOOL in the environment runs another cubridge binary (an older build, to see
// these tests fail there).
#include "self_signed_certificate.hpp"
#include "temp_dir.hpp"
#include "tools/memory_sink.hpp"
#include "update/arguments.hpp"
#include "update/server_text.hpp"

#include <cubridge/bundle/bundle.hpp>
#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/image.hpp>
#include <cubridge/update/update_endpoint.hpp>

#include <gtest/gtest.h>
#include <httplib.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using cubridge::testing::temp_dir;
using json = nlohmann::json;

std::string tool() {
  const char* other = std::getenv("CUBRIDGE_TEST_TOOL");
  return other && *other ? other : CUBRIDGE_TOOL_PATH;
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::byte> read_bytes(const fs::path& file) {
  const auto text = read_text(file);
  const auto bytes = std::as_bytes(std::span(text));
  return {bytes.begin(), bytes.end()};
}

void write_bytes(const fs::path& file, std::span<const std::byte> bytes) {
  std::ofstream(file, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

// --- running the command ----------------------------------------------------------------------

struct run_result {
  int exit_code = -1;  ///< -1: ended by a signal or by the timeout
  bool timed_out = false;
  std::string out, err;
  std::uint64_t peak_rss_bytes = 0;
  [[nodiscard]] std::string all() const { return out + err; }
};

struct run_options {
  fs::path cwd = ".";
  std::vector<std::string> env;  ///< "NAME=value", over the test's own environment
  std::chrono::seconds timeout = 120s;
};

// Runs argv[0] with `argv` as a child and waits for it (killed after options.timeout).
run_result run(const std::vector<std::string>& argv, const run_options& options = {}) {
  temp_dir outputs;
  const auto out_path = outputs.path / "stdout", err_path = outputs.path / "stderr";
  // Everything the child needs is built before fork: after it only exec-safe calls.
  std::vector<std::string> env = options.env;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    const auto name = entry.substr(0, entry.find('=') + 1);
    if (std::none_of(options.env.begin(), options.env.end(),
                     [&](const std::string& o) { return o.starts_with(name); }))
      env.push_back(entry);
  }
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const int out_fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const std::string cwd = options.cwd.string();
  run_result result;
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::chdir(cwd.c_str()) != 0) ::_exit(126);
    ::dup2(out_fd, 1);
    ::dup2(err_fd, 2);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  ::close(out_fd);
  ::close(err_fd);
  if (pid < 0) {
    ADD_FAILURE() << "fork failed";
    return result;
  }
  int status = 0;
  ::rusage usage{};
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  while (::wait4(pid, &status, WNOHANG, &usage) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      result.timed_out = true;
      ::kill(pid, SIGKILL);
      ::wait4(pid, &status, 0, &usage);
      break;
    }
    std::this_thread::sleep_for(10ms);
  }
  if (!result.timed_out && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  result.peak_rss_bytes = static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;
  result.out = read_text(out_path);
  result.err = read_text(err_path);
  return result;
}

// `cubridge ARGS...` in `cwd`.
run_result run_tool(std::vector<std::string> args, const fs::path& cwd = ".",
                    std::chrono::seconds timeout = 120s) {
  args.insert(args.begin(), tool());
  return run(args, {cwd, {}, timeout});
}

// --- stand-in endpoints -----------------------------------------------------------------------

// An HTTP server on a free loopback port that answers every request with `answer`, and keeps
// what it was sent.
class fake_endpoint {
 public:
  struct request {
    std::string method, path, body;
  };
  using handler = std::function<void(const httplib::Request&, httplib::Response&)>;

  explicit fake_endpoint(handler answer) : answer_(std::move(answer)) {
    auto serve = [this](const httplib::Request& req, httplib::Response& res) {
      {
        std::lock_guard lock(mutex_);
        requests_.push_back({req.method, req.path, req.body});
      }
      answer_(req, res);
    };
    server_.Get(".*", serve);
    server_.Put(".*", serve);
    server_.Post(".*", serve);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(1ms);
  }
  ~fake_endpoint() {
    server_.stop();
    thread_.join();
  }
  [[nodiscard]] std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  [[nodiscard]] std::vector<request> requests() const {
    std::lock_guard lock(mutex_);
    return requests_;
  }

 private:
  handler answer_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::vector<request> requests_;
};

void answer_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

// The library's update endpoint over a module sink in memory, trusting `key`.
struct real_endpoint {
  std::shared_ptr<cubridge::testing::memory_sink> sink =
      std::make_shared<cubridge::testing::memory_sink>();
  cubridge::update_endpoint endpoint;
  explicit real_endpoint(const cubridge::public_key& key,
                         cubridge::update_endpoint_options options = {})
      : endpoint(sink, with_key(std::move(options), key)) {
    endpoint.start();
  }
  // Trusting `key`, the replay state in memory: each test's service starts fresh.
  static cubridge::update_endpoint_options with_key(cubridge::update_endpoint_options o,
                                                    const cubridge::public_key& key) {
    o.keys.add(key);
    o.persist_state = false;
    return o;
  }
};

using cubridge::test::write_self_signed;

// --- the fixture ------------------------------------------------------------------------------

// A fresh directory holding a key pair (k.key mode 0600, k.pub) and the sm_90 test cubin.
class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    cubridge::write_key_file(dir.path / "k.pub", keys.public_key);
    cubridge::write_key_file(dir.path / "k.key", keys.secret_key);
    fs::copy_file(CUBRIDGE_TEST_CUBIN, dir.path / "filters.cubin");
  }
  fs::path path(const std::string& name) const { return dir.path / name; }
  // A bundle of the test cubin as module `name` v`version`, written to dir/`file`.
  std::string write_bundle(const std::string& file, const std::string& name,
                           std::uint64_t version) {
    cubridge::bundle_manifest_input in;
    in.name = name;
    in.version = version;
    in.target = "sm_90";
    write_bytes(path(file),
                cubridge::sign_bundle(in, read_bytes(CUBRIDGE_TEST_CUBIN), keys.secret_key));
    return path(file).string();
  }
  cubridge::verified_bundle verify(std::span<const std::byte> bundle) const {
    return cubridge::verify_bundle(bundle, {keys.public_key});
  }

  temp_dir dir;
  cubridge::keypair keys = cubridge::generate_keypair();
};

}  // namespace

// --- the helpers of tools/update/ -------------------------------------------------------------

TEST(CliArguments, VersionsAreStrictDecimalFromOneToTwoToTheSixtyFourMinusOne) {
  using cubridge::tool::parse_version;
  EXPECT_EQ(parse_version("1"), 1u);
  EXPECT_EQ(parse_version("18446744073709551615"), UINT64_MAX);
  for (const char* bad : {"18446744073709551616", "99999999999999999999999", "0", "00", "-1", "+5",
                          " 5", "5 ", "0x10", "010", "1e3", "5.0", "", "abc", "٣"})
    EXPECT_FALSE(parse_version(bad)) << "'" << bad << "'";
  std::string text = "18446744073709551616";
  EXPECT_TRUE(contains(cubridge::tool::version_validator()(text), "over 18446744073709551615"));
}

TEST(CliArguments, ExpiresTakesADurationOrAFutureRfc3339Time) {
  using cubridge::tool::parse_expires;
  const std::chrono::system_clock::time_point now =
      std::chrono::sys_days{std::chrono::year{2026} / 6 / 1};
  EXPECT_EQ(parse_expires("90s", now), now + 90s);
  EXPECT_EQ(parse_expires("30m", now), now + 30min);
  EXPECT_EQ(parse_expires("12h", now), now + 12h);
  EXPECT_EQ(parse_expires("7d", now), now + std::chrono::days{7});
  EXPECT_EQ(parse_expires("2027-01-31T00:00:00Z", now),
            std::chrono::sys_days{std::chrono::year{2027} / 1 / 31});
  // CLI11's unit parsing decides what a duration is: it reads a fraction, a sign, spaces, and a
  // unit alone as one of it.
  EXPECT_EQ(parse_expires("1.5h", now), now + 90min);
  EXPECT_EQ(parse_expires(" 5 m", now), now + 5min);
  EXPECT_EQ(parse_expires("h", now), now + 1h);
  for (const char* bad : {"", "0m", "5", "5y", "5M", "-5m", "0.5s", "2026-05-31T00:00:00Z",
                          "2026-06-01T00:00:00Z", "2027-01-31", "99999999d"})
    EXPECT_THROW((void)parse_expires(bad, now), cubridge::tool::usage_error) << "'" << bad << "'";
}

TEST(CliArguments, DurationsAreANumberAndAUnitThroughCli11) {
  using cubridge::tool::parse_duration;
  EXPECT_EQ(parse_duration("500ms", false).seconds, 0.5);
  EXPECT_EQ(parse_duration("90s", false).seconds, 90);
  EXPECT_EQ(parse_duration("30m", false).seconds, 1800);
  EXPECT_EQ(parse_duration("12h", false).seconds, 43200);
  EXPECT_EQ(parse_duration("7d", false).seconds, 604800);
  EXPECT_EQ(parse_duration("45", false).seconds, 45);  // a bare number is seconds
  EXPECT_TRUE(contains(parse_duration("45", true).error, "unit"));
  EXPECT_TRUE(contains(parse_duration("5w", false).error, "w unit not recognized"));
  EXPECT_FALSE(parse_duration("fast", false).error.empty());
  // As an option's transform, the value reaches the variable in seconds.
  CLI::App app;
  double window = 0;
  app.add_option("--window", window)->transform(cubridge::tool::duration_transform());
  const char* argv[] = {"app", "--window", "2m"};
  app.parse(3, argv);
  EXPECT_EQ(window, 120);
}

TEST(CliArguments, EndpointUrlsAreHttpOrHttpsWithAHostAndAPortOfOneToSixtyFiveThousand) {
  using cubridge::tool::parse_endpoint_url;
  EXPECT_EQ(parse_endpoint_url("http://127.0.0.1:7070").text(), "http://127.0.0.1:7070");
  EXPECT_EQ(parse_endpoint_url("http://127.0.0.1:7070//").text(), "http://127.0.0.1:7070");
  EXPECT_EQ(parse_endpoint_url("HTTPS://gpu-box.example").text(), "https://gpu-box.example:443");
  EXPECT_EQ(parse_endpoint_url("http://[::1]:8080").host, "::1");
  EXPECT_EQ(parse_endpoint_url("http://[::1]:8080").text(), "http://[::1]:8080");
  const std::pair<const char*, const char*> bad[] = {
      {"127.0.0.1:7070", "has no scheme"},      {"ftp://127.0.0.1:7070", "scheme 'ftp'"},
      {"http://127.0.0.1:0", "port '0'"},       {"http://127.0.0.1:65536", "port '65536'"},
      {"http://127.0.0.1:99999999999", "port"}, {"http://127.0.0.1:abc", "port 'abc'"},
      {"http://127.0.0.1:", "port ''"},         {"http://127.0.0.1:+80", "port '+80'"},
      {"http://:7070", "has no host"},          {"http://127.0.0.1:7070/v1", "path"},
      {"http://127.0.0.1:7070?x", "query"},     {"http://user@127.0.0.1:7070", "user info"},
      {"http://[::1:7070", "without its ']'"},  {"http://ho st:7070", "malformed host"},
  };
  for (const auto& [url, why] : bad) {
    try {
      (void)parse_endpoint_url(url);
      ADD_FAILURE() << url << " accepted";
    } catch (const cubridge::tool::usage_error& e) {
      EXPECT_TRUE(contains(e.what(), why)) << url << ": " << e.what();
    }
  }
}

TEST(ServerText, PrintableEscapesControlsBackslashAndNonAsciiAndBoundsTheLength) {
  using cubridge::tool::printable;
  EXPECT_EQ(printable("module 'filters' v3"), "module 'filters' v3");
  EXPECT_EQ(printable("\x1b[2K\rok\x07\\\x7f\n"), "\\x1B[2K\\x0Dok\\x07\\x5C\\x7F\\x0A");
  EXPECT_EQ(printable("\xc2\x9b"
                      "31m"),
            "\\xC2\\x9B31m");  // C1 CSI in UTF-8
  EXPECT_EQ(printable(std::string("a\0b", 3)), "a\\x00b");
  const auto long_text = printable(std::string(10000, 'A'));
  EXPECT_EQ(long_text, std::string(300, 'A') + "... (9700 more bytes)");
}

TEST(ServerText, PercentEncodeKeepsOnlyUnreservedCharacters) {
  using cubridge::tool::percent_encode;
  EXPECT_EQ(percent_encode("filters-v2_a.b~"), "filters-v2_a.b~");
  EXPECT_EQ(percent_encode("a b%c?d#e/f+g&h=i"), "a%20b%25c%3Fd%23e%2Ff%2Bg%26h%3Di");
  EXPECT_EQ(percent_encode("\xc3\xa9"), "%C3%A9");
}

// --- 6: versions and expiry ---------------------------------------------------------------------

TEST_F(Cli, SignRefusesEveryVersionOutsideTheStrictFormAsAUsageError) {
  for (const char* bad : {"18446744073709551616", "99999999999999999999", "0", "-1", "+5", " 5",
                          "0x10", "010", "abc"}) {
    const auto r = run_tool(
        {"sign", "--key", "k.key", "--version", bad, "filters.cubin", "-o", "x.bundle"}, dir.path);
    EXPECT_EQ(r.exit_code, 64) << bad << ": " << r.all();
    EXPECT_TRUE(contains(r.err, "--version")) << r.all();
    EXPECT_FALSE(fs::exists(path("x.bundle"))) << bad << " was signed";
    // push signs with the same check, before it talks to anything.
    const auto p = run_tool(
        {"push", "http://127.0.0.1:1", "filters.cubin", "--key", "k.key", "--version", bad},
        dir.path);
    EXPECT_EQ(p.exit_code, 64) << bad << ": " << p.all();
  }
  const auto max = run_tool({"sign", "--key", "k.key", "--version", "18446744073709551615",
                             "filters.cubin", "-o", "max.bundle"},
                            dir.path);
  ASSERT_EQ(max.exit_code, 0) << max.all();
  EXPECT_EQ(verify(read_bytes(path("max.bundle"))).manifest.version, UINT64_MAX);
}

TEST_F(Cli, ExpiresIsSignedIntoTheBundleBySignAndByPush) {
  const auto before = std::chrono::system_clock::now();
  const auto r = run_tool({"sign", "--key", "k.key", "--version", "3", "--expires", "7d",
                           "filters.cubin", "-o", "f3.bundle"},
                          dir.path);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const auto m = verify(read_bytes(path("f3.bundle"))).manifest;
  ASSERT_TRUE(m.expires_time.has_value()) << r.all();
  EXPECT_GE(*m.expires_time,
            std::chrono::floor<std::chrono::seconds>(before + std::chrono::days{7}));
  EXPECT_LE(*m.expires_time, std::chrono::system_clock::now() + std::chrono::days{7});
  EXPECT_TRUE(contains(r.out, ", expires " + m.expires)) << r.out;

  fake_endpoint endpoint([](const httplib::Request&, httplib::Response& res) {
    answer_json(res, 200, {{"promoted", true}, {"module", "filters"}, {"version", 4}});
  });
  const auto p = run_tool({"push", endpoint.url(), "filters.cubin", "--key", "k.key", "--name",
                           "filters", "--version", "4", "--expires", "2099-01-31T00:00:00Z"},
                          dir.path);
  ASSERT_EQ(p.exit_code, 0) << p.all();
  ASSERT_EQ(endpoint.requests().size(), 1u);
  const auto body = endpoint.requests().front().body;
  EXPECT_EQ(verify(std::as_bytes(std::span(body))).manifest.expires, "2099-01-31T00:00:00Z");

  for (const auto& args : std::vector<std::vector<std::string>>{
           {"sign", "--key", "k.key", "--version", "5", "--expires", "2020-01-01T00:00:00Z",
            "filters.cubin", "-o", "x.bundle"},
           {"sign", "--key", "k.key", "--version", "5", "--expires", "soon", "filters.cubin", "-o",
            "x.bundle"},
           {"push", endpoint.url(), "f3.bundle", "--expires", "1h"}}) {
    const auto bad = run_tool(args, dir.path);
    EXPECT_EQ(bad.exit_code, 64) << bad.all();
    EXPECT_TRUE(contains(bad.err, "--expires")) << bad.all();
  }
  EXPECT_FALSE(fs::exists(path("x.bundle")));
  EXPECT_EQ(endpoint.requests().size(), 1u) << "a .bundle with --expires was sent";
}

// --- 7: push FILE.cu --------------------------------------------------------------------------

// Another local user plants cubridge-push-<pid>.cubin in the shared temporary directory, linked
// to a cubin of theirs. push must sign what it compiled, and touch nothing there.
TEST_F(Cli, PushSignsTheCodeItCompiledFromMemoryNeverAFileInTmp) {
  fake_endpoint endpoint([](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "GET")
      answer_json(res, 200, {{"gpu", "sm_90"}, {"modules", json::array()}});
    else
      answer_json(res, 200, {{"promoted", true}, {"module", "hot_kernels"}, {"version", 7}});
  });
  temp_dir shared_tmp;
  const auto trap = shared_tmp.path / "trap.cubin";
  fs::copy_file(CUBRIDGE_TEST_CUBIN, trap);  // a valid sm_90 cubin: the attacker's code
  const auto trap_bytes = read_bytes(trap);
  // `exec` keeps the shell's pid, so the link has the name push used to write and read back.
  const auto r =
      run({"/bin/sh", "-c",
           "ln -s \"$TRAP\" \"$TMPDIR/cubridge-push-$$.cubin\" && exec \"$TOOL\" push "
           "\"$URL\" \"$SOURCE\" --key k.key --version 7"},
          {dir.path,
           {"TMPDIR=" + shared_tmp.path.string(), "TRAP=" + trap.string(), "TOOL=" + tool(),
            "URL=" + endpoint.url(), "SOURCE=" CUBRIDGE_TEST_HOT_KERNELS}});
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_TRUE(contains(r.out, "hot_kernels.cu for sm_90")) << r.out;
  EXPECT_TRUE(contains(r.out, "promoted 'hot_kernels' v7")) << r.out;

  const auto requests = endpoint.requests();
  ASSERT_EQ(requests.size(), 2u);  // GET the GPU, PUT the bundle
  EXPECT_EQ(requests[1].path, "/v1/modules/hot_kernels");
  const auto bundle = verify(std::as_bytes(std::span(requests[1].body)));
  EXPECT_EQ(bundle.manifest.kind, cubridge::payload_kind::cubin);
  EXPECT_TRUE(bundle.payload != trap_bytes) << "the planted cubin was signed and sent";
  const auto info = cubridge::inspect_image(bundle.payload);
  std::vector<std::string> kernels;
  for (const auto& k : info.kernels) kernels.push_back(k.name);
  EXPECT_NE(std::find(kernels.begin(), kernels.end(), "write_version"), kernels.end());
  EXPECT_NE(std::find(kernels.begin(), kernels.end(), "count_served"), kernels.end());

  EXPECT_TRUE(read_bytes(trap) == trap_bytes) << "written through the planted link";
  const auto left = entries(shared_tmp.path);
  ASSERT_EQ(left.size(), 2u) << "push created or removed files in TMPDIR";
  EXPECT_TRUE(left[0].starts_with("cubridge-push-") && fs::is_symlink(shared_tmp.path / left[0]));
  EXPECT_EQ(left[1], "trap.cubin");
}

// --- 8: key files and other files -------------------------------------------------------------

TEST_F(Cli, ASecretKeyThatOthersMayReadIsRefusedUnlessAllowed) {
  ASSERT_EQ(::chmod(path("k.key").c_str(), 0644), 0);
  const auto r = run_tool(
      {"sign", "--key", "k.key", "--version", "3", "filters.cubin", "-o", "f.bundle"}, dir.path);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_TRUE(contains(r.err, "'k.key' may be read or written by group or others (mode 0644)"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "--allow-readable-key")) << r.err;
  EXPECT_FALSE(fs::exists(path("f.bundle")));
  const auto p =
      run_tool({"push", "http://127.0.0.1:1", "--rollback", "filters", "--key", "k.key"}, dir.path);
  EXPECT_EQ(p.exit_code, 1) << p.all();
  EXPECT_TRUE(contains(p.err, "mode 0644")) << p.err;

  const auto allowed = run_tool({"sign", "--key", "k.key", "--version", "3", "filters.cubin", "-o",
                                 "f.bundle", "--allow-readable-key"},
                                dir.path);
  EXPECT_EQ(allowed.exit_code, 0) << allowed.all();
  EXPECT_TRUE(contains(allowed.err, "warning")) << allowed.err;
  ASSERT_EQ(::chmod(path("k.key").c_str(), 0600), 0);
  const auto tight = run_tool(
      {"sign", "--key", "k.key", "--version", "3", "filters.cubin", "-o", "f.bundle"}, dir.path);
  EXPECT_EQ(tight.exit_code, 0) << tight.all();
  EXPECT_EQ(tight.err, "");
}

TEST_F(Cli, FifosAreRefusedAsKeysPayloadsImagesBundlesAndCertificatesNotWaitedOn) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  ASSERT_EQ(::mkfifo(path("fifo.bundle").c_str(), 0600), 0);
  const std::vector<std::vector<std::string>> commands = {
      {"sign", "--key", "fifo", "--version", "3", "filters.cubin", "-o", "x.bundle"},
      {"sign", "--key", "k.key", "--version", "3", "fifo", "-o", "x.bundle"},
      {"inspect", "fifo"},
      {"push", "http://127.0.0.1:1", "fifo.bundle"},
      {"push", "http://127.0.0.1:1", "fifo", "--key", "k.key", "--version", "3"},
      {"push", "https://127.0.0.1:1", "--rollback", "filters", "--key", "k.key", "--ca-cert",
       "fifo"},
  };
  for (const auto& args : commands) {
    const auto r = run_tool(args, dir.path, 30s);
    EXPECT_FALSE(r.timed_out) << args[0] << " " << args[1] << " waited on a FIFO";
    EXPECT_EQ(r.exit_code, 1) << r.all();
    EXPECT_TRUE(contains(r.err, "is a FIFO, not a regular file")) << r.all();
  }
}

TEST_F(Cli, InspectSaysAHugeFileIsNoImageWithoutReadingItWhole) {
  const auto baseline = run_tool({"inspect", "filters.cubin"}, dir.path);
  ASSERT_EQ(baseline.exit_code, 0) << baseline.all();
  { std::ofstream(path("zeros.bin")); }
  ASSERT_EQ(::truncate(path("zeros.bin").c_str(), (off_t{2} << 30) - 4096), 0);  // sparse
  const auto r = run_tool({"inspect", "zeros.bin"}, dir.path);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_TRUE(contains(r.err, "not a cubin, fatbin or PTX image (2147479552 bytes")) << r.err;
  EXPECT_LT(r.peak_rss_bytes, baseline.peak_rss_bytes + (std::uint64_t{256} << 20))
      << "2 GiB read into memory to say it is no image";
}

TEST_F(Cli, KeygenNeverWritesThroughASymlinkAtItsOutput) {
  cubridge::testing::write_text(path("victim"), "precious");
  fs::create_symlink(path("victim"), path("new.key"));
  fs::create_symlink(path("nowhere"), path("new.pub"));  // dangling
  const auto refused = run_tool({"keygen", "--out", "new"}, dir.path);
  EXPECT_EQ(refused.exit_code, 1) << refused.all();
  EXPECT_TRUE(contains(refused.err, "exists; --force replaces it")) << refused.err;
  EXPECT_FALSE(fs::exists(path("nowhere"))) << "written through the dangling link";

  const auto forced = run_tool({"keygen", "--out", "new", "--force"}, dir.path);
  ASSERT_EQ(forced.exit_code, 0) << forced.all();
  EXPECT_EQ(read_text(path("victim")), "precious") << "the secret key went through the link";
  EXPECT_FALSE(fs::exists(path("nowhere")));
  for (const char* name : {"new.key", "new.pub"}) EXPECT_FALSE(fs::is_symlink(path(name))) << name;
  struct ::stat st {};
  ASSERT_EQ(::stat(path("new.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  const auto pair = cubridge::read_secret_key_file(path("new.key"));
  EXPECT_EQ(cubridge::read_public_key_file(path("new.pub")), pair.public_key());
}

TEST_F(Cli, SignNeverOverwritesItsKeyOrItsPayloadByAnyName) {
  const auto key_text = read_text(path("k.key"));
  const auto cubin_bytes = read_bytes(path("filters.cubin"));
  fs::create_symlink(path("k.key"), path("via-symlink.bundle"));
  fs::create_hard_link(path("k.key"), path("via-hard-link.bundle"));
  fs::create_symlink(path("filters.cubin"), path("payload-link.bundle"));
  for (const char* out : {"k.key", "via-symlink.bundle", "via-hard-link.bundle"}) {
    const auto r = run_tool(
        {"sign", "--key", "k.key", "--version", "3", "filters.cubin", "-o", out}, dir.path);
    EXPECT_EQ(r.exit_code, 64) << out << ": " << r.all();
    EXPECT_TRUE(contains(r.err, "is the secret key file 'k.key'")) << r.err;
  }
  for (const char* out : {"filters.cubin", "payload-link.bundle"}) {
    const auto r = run_tool(
        {"sign", "--key", "k.key", "--version", "3", "filters.cubin", "-o", out}, dir.path);
    EXPECT_EQ(r.exit_code, 64) << out << ": " << r.all();
    EXPECT_TRUE(contains(r.err, "is the payload 'filters.cubin'")) << r.err;
  }
  EXPECT_TRUE(read_text(path("k.key")) == key_text) << "the key was overwritten";
  EXPECT_TRUE(read_bytes(path("filters.cubin")) == cubin_bytes) << "the payload was overwritten";
  EXPECT_TRUE(fs::is_symlink(path("via-symlink.bundle")));
}

// --- 9: what push sends and prints --------------------------------------------------------------

TEST_F(Cli, EndpointTextIsPrintedEscapedAndBounded) {
  const auto bundle = write_bundle("f3.bundle", "filters", 3);
  std::string fake_line = "\r\x1b[1A\x1b[2K\x1b[32mpromoted 'filters' v3 (was v2)\x1b[0m\n";
  std::mutex mutex;
  json answer;
  int status = 0;
  std::string raw;  // non-JSON body, when not empty
  fake_endpoint endpoint([&](const httplib::Request&, httplib::Response& res) {
    std::lock_guard lock(mutex);
    if (!raw.empty()) {
      res.status = status;
      res.set_content(raw, "text/plain");
    } else {
      answer_json(res, status, answer);
    }
  });
  auto expect_clean = [](const run_result& r) {
    const auto all = r.all();
    const auto bad = std::find_if(all.begin(), all.end(), [](char c) {
      return c != '\n' && (static_cast<unsigned char>(c) < 0x20 || c == 0x7f);
    });
    EXPECT_TRUE(bad == all.end()) << "control character " << int(*bad) << " printed at "
                                  << (bad - all.begin()) << ":\n"
                                  << all.substr(0, 2000);
  };
  {
    std::lock_guard lock(mutex);
    status = 409;
    answer = {{"error", "replayed_version\x1b[2K"},
              {"detail", fake_line + std::string(100000, 'A')}};
  }
  auto r = run_tool({"push", endpoint.url(), bundle}, dir.path);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  expect_clean(r);
  EXPECT_TRUE(contains(r.err, "refused: 409 replayed_version\\x1B[2K: \\x0D\\x1B[1A")) << r.err;
  EXPECT_TRUE(contains(r.err, "more bytes)")) << r.err;
  EXPECT_LT(r.all().size(), 1000u);

  {
    std::lock_guard lock(mutex);
    status = 200;
    answer = {{"promoted", true},
              {"module", "filters\x1b]0;pwned\x07"},
              {"version", "v9\r"},
              {"previous_version", -1}};
  }
  r = run_tool({"push", endpoint.url(), bundle}, dir.path);
  EXPECT_EQ(r.exit_code, 0) << r.all();
  expect_clean(r);
  EXPECT_TRUE(contains(r.out, "promoted 'filters\\x1B]0;pwned\\x07' v3 (was v0)")) << r.out;

  {
    std::lock_guard lock(mutex);
    status = 500;
    raw = "\x1b[31mboom\x1b[0m";
  }
  r = run_tool({"push", endpoint.url(), bundle}, dir.path);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  expect_clean(r);
  EXPECT_TRUE(contains(r.err, "refused: 500 not_json: \\x1B[31mboom")) << r.err;

  // The GPU an endpoint reports becomes a compile target only in the form sm_NN[a|f].
  {
    std::lock_guard lock(mutex);
    status = 200;
    raw.clear();
    answer = {{"gpu", "sm_90\x1b[2J"}, {"modules", json::array()}};
  }
  r = run_tool(
      {"push", endpoint.url(), CUBRIDGE_TEST_HOT_KERNELS, "--key", "k.key", "--version", "4"},
      dir.path);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  expect_clean(r);
  EXPECT_TRUE(contains(r.err, "does not say its GPU")) << r.err;
}

// An endpoint cannot make the pusher hold its answer whole: over 1 MiB, or a small gzip body
// that would grow when decompressed, the push stops reading and says so.
TEST_F(Cli, AnAnswerOverTheLimitIsNotReadWhole) {
  const auto bundle = write_bundle("f5.bundle", "filters", 5);
  std::atomic<bool> gzip{false};
  fake_endpoint endpoint([&](const httplib::Request&, httplib::Response& res) {
    res.status = 200;
    if (gzip) {
      // 64 bytes that a decompressing client would inflate (the bytes are not valid gzip, so a
      // client that tries fails differently; one that does not decompress just sees 64 bytes).
      res.set_header("Content-Encoding", "gzip");
      res.set_content(std::string(64, 'x'), "application/json");
    } else {
      res.set_content("{\"detail\":\"" + std::string(std::size_t{3} << 20, 'A') + "\"}",
                      "application/json");
    }
  });
  auto r = run_tool({"push", endpoint.url(), bundle}, dir.path);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_TRUE(contains(r.err, "answer is over 1048576 bytes")) << r.err;
  EXPECT_LT(r.all().size(), 1000u);
  gzip = true;
  r = run_tool({"push", endpoint.url(), bundle}, dir.path);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_TRUE(contains(r.err, "not_json")) << r.err;  // read as sent, not inflated
}

TEST_F(Cli, ModuleNamesAreSentPercentEncodedAndArriveIntact) {
  real_endpoint service(keys.public_key);
  const std::vector<std::string> names = {"a b", "100%",        "what?",
                                          "x#y", "caf\xc3\xa9", "a b%c?d#\xc3\xa9+&=;"};
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto bundle = write_bundle("n" + std::to_string(i) + ".bundle", names[i], 1);
    const auto r = run_tool({"push", service.endpoint.url(), bundle}, dir.path);
    EXPECT_EQ(r.exit_code, 0) << names[i] << ": " << r.all();
    EXPECT_TRUE(contains(r.out, "promoted '" + cubridge::tool::printable(names[i]) + "' v1"))
        << r.out;
    EXPECT_EQ(service.sink->current_version(names[i]), 1u) << names[i];
  }
  // Signed on the fly and rolled back, by the same name.
  const auto& name = names.back();
  auto r = run_tool({"push", service.endpoint.url(), "filters.cubin", "--key", "k.key", "--name",
                     name, "--version", "2"},
                    dir.path);
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_EQ(service.sink->current_version(name), 2u);
  r = run_tool({"push", service.endpoint.url(), "--rollback", name, "--key", "k.key"}, dir.path);
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_TRUE(contains(r.out, "rolled back '" + cubridge::tool::printable(name) + "' v2 -> v1"))
      << r.out;
  EXPECT_EQ(service.sink->current_version(name), 1u);
}

TEST_F(Cli, MalformedEndpointUrlsAreUsageErrorsThatSayWhatIsWrong) {
  const auto bundle = write_bundle("f3.bundle", "filters", 3);
  const std::pair<const char*, const char*> cases[] = {
      {"127.0.0.1:7070", "has no scheme"},
      {"ftp://127.0.0.1:7070", "has the scheme 'ftp'"},
      {"http://127.0.0.1:99999", "port '99999'"},
      {"http://127.0.0.1:0", "port '0'"},
      {"http://127.0.0.1:x", "port 'x'"},
      {"http://127.0.0.1:7070/v1/modules", "has a path"},
  };
  for (const auto& [url, why] : cases) {
    const auto r = run_tool({"push", url, bundle}, dir.path);
    EXPECT_EQ(r.exit_code, 64) << url << ": " << r.all();
    EXPECT_TRUE(contains(r.err, why)) << url << ": " << r.err;
  }
  cubridge::testing::write_text(path("ca.pem"), "");
  const auto http_with_ca =
      run_tool({"push", "http://127.0.0.1:1", bundle, "--ca-cert", "ca.pem"}, dir.path);
  EXPECT_EQ(http_with_ca.exit_code, 64) << http_with_ca.all();
  EXPECT_TRUE(contains(http_with_ca.err, "--ca-cert is for an https endpoint")) << http_with_ca.err;
  // Nothing listening stays "cannot reach" (75).
  const auto dead = run_tool({"push", "http://127.0.0.1:1", bundle}, dir.path);
  EXPECT_EQ(dead.exit_code, 75) << dead.all();
}

TEST_F(Cli, AnUntrustedTlsCertificateIsARefusalThatSaysWhy) {
  write_self_signed(path("cert.pem"), path("cert.key"));
  write_self_signed(path("other.pem"), path("other.key"));
  cubridge::update_endpoint_options options;
  options.tls_certificate = path("cert.pem");
  options.tls_private_key = path("cert.key");
  real_endpoint service(keys.public_key, options);
  const auto url = service.endpoint.url();
  ASSERT_TRUE(url.starts_with("https://")) << url;
  const auto bundle = write_bundle("f3.bundle", "filters", 3);

  auto r = run_tool({"push", url, bundle}, dir.path);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_TRUE(contains(r.err, "TLS certificate is not trusted (self-signed certificate)")) << r.err;
  EXPECT_TRUE(contains(r.err, "give --ca-cert")) << r.err;

  r = run_tool({"push", url, bundle, "--ca-cert", "other.pem"}, dir.path);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_TRUE(contains(r.err,
                       "not trusted (self-signed certificate) by the CA certificates in "
                       "--ca-cert 'other.pem'"))
      << r.err;

  r = run_tool({"push", url, bundle, "--ca-cert", "missing.pem"}, dir.path);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_TRUE(contains(r.err, "cannot open 'missing.pem'")) << r.err;

  cubridge::testing::write_text(path("garbage.pem"), "not a certificate\n");
  r = run_tool({"push", url, bundle, "--ca-cert", "garbage.pem"}, dir.path);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_TRUE(contains(r.err, "cannot use --ca-cert 'garbage.pem'")) << r.err;
  EXPECT_EQ(service.sink->current_version("filters"), 0u);

  // Trusted, but reached by a name it was not issued for.
  const auto port = url.substr(url.rfind(':'));
  r = run_tool({"push", "https://localhost" + port, bundle, "--ca-cert", "cert.pem"}, dir.path);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_TRUE(contains(r.err, "its TLS certificate does not name localhost")) << r.err;
  EXPECT_EQ(service.sink->current_version("filters"), 0u);

  r = run_tool({"push", url, bundle, "--ca-cert", "cert.pem"}, dir.path);
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_TRUE(contains(r.out, "promoted 'filters' v3 (was v0) at " + url)) << r.out;

  // https to a plain http endpoint: no TLS answer, so it cannot be reached (75).
  fake_endpoint plain(
      [](const httplib::Request&, httplib::Response& res) { answer_json(res, 200, {}); });
  r = run_tool({"push", "https" + plain.url().substr(4), bundle}, dir.path);
  EXPECT_EQ(r.exit_code, 75) << r.all();
  EXPECT_TRUE(contains(r.err, "TLS handshake failed")) << r.err;
}
