// The fleet's NATS plumbing (src/fleet/nats.hpp) against a real nats-server
// (tests/nats_server.hpp): streams and bucket made idempotently, a stream configured otherwise
// refused, the payload limit, an unreachable server, and a server stopped and started again.
#include "eventually.hpp"
#include "nats_server.hpp"
#include "fleet/nats.hpp"

#include <cubridge/fleet/subjects.hpp>

#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>

#include <thread>
#include <vector>

namespace {

using namespace cubridge::fleet;
using cubridge::fleet_errc;
using cubridge::testing::nats_server;

detail::connection_ptr connect_to(const nats_server& server) {
  return detail::connect({server.url(), "test", false, false});
}

template <class F>
cubridge::error expect_fleet_error(F&& f, fleet_errc code) {
  try {
    f();
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(code)) << e.what();
    return e;
  }
  ADD_FAILURE() << "no cubridge::error thrown";
  return cubridge::error(cubridge::fleet_error_domain, 0, "", "", "", {});
}

using cubridge::testing::eventually;

std::vector<std::byte> bytes_of(std::string_view text) {
  const auto* data = reinterpret_cast<const std::byte*>(text.data());
  return {data, data + text.size()};
}

TEST(FleetNats, ServerTakesBundlesUpTo16MiB) {
  nats_server server;
  const auto connection = connect_to(server);
  EXPECT_EQ(natsConnection_GetMaxPayload(connection.get()), 16 << 20);
}

TEST(FleetNats, EnsureIsIdempotent) {
  nats_server server;
  for (int round = 0; round < 2; ++round) {  // a second connection finds them made
    const auto connection = connect_to(server);
    const auto js = detail::jetstream(connection.get());
    for (int again = 0; again < 2; ++again) {
      detail::ensure_bundle_stream(js.get(), "filters");
      detail::ensure_result_stream(js.get());
      detail::ensure_heartbeat_stream(js.get());
      EXPECT_NE(detail::ensure_desired_bucket(js.get()), nullptr);
    }
  }
  const auto connection = connect_to(server);
  const auto js = detail::jetstream(connection.get());
  // Last per subject: a second bundle replaces the first.
  detail::publish(js.get(), connection.get(), bundle_subject_all("filters"), bytes_of("v1"), "b");
  detail::publish(js.get(), connection.get(), bundle_subject_all("filters"), bytes_of("v2"), "b");
  detail::publish(js.get(), connection.get(), rollback_subject("filters"), bytes_of("r"), "r");
  jsStreamInfo* raw = nullptr;
  ASSERT_EQ(js_GetStreamInfo(&raw, js.get(), bundle_stream("filters").c_str(), nullptr, nullptr),
            NATS_OK);
  const detail::stream_info_ptr info(raw);
  EXPECT_EQ(info->State.Msgs, 2u);
  const auto last =
      detail::last_message(js.get(), bundle_stream("filters"), bundle_subject_all("filters"));
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(detail::message_text(last.get()), "v2");
  EXPECT_EQ(detail::last_message(js.get(), bundle_stream("filters"),
                                 bundle_subject_node("filters", "n1")),
            nullptr);
}

TEST(FleetNats, StreamConfiguredOtherwiseIsRefused) {
  nats_server server;
  const auto connection = connect_to(server);
  const auto js = detail::jetstream(connection.get());
  const char* subjects[] = {"cubridge.result.>"};
  jsStreamConfig config;
  jsStreamConfig_Init(&config);
  config.Name = "CUBRIDGE_RESULTS";
  config.Subjects = subjects;
  config.SubjectsLen = 1;
  config.MaxMsgsPerSubject = 1;
  config.Storage = js_MemoryStorage;
  ASSERT_EQ(js_AddStream(nullptr, js.get(), &config, nullptr, nullptr), NATS_OK);
  const auto e = expect_fleet_error([&] { detail::ensure_result_stream(js.get()); },
                                    fleet_errc::config_mismatch);
  EXPECT_NE(std::string(e.what()).find("max_msgs_per_subject 1, wanted 64"), std::string::npos)
      << e.what();
  EXPECT_NE(std::string(e.what()).find("storage memory, wanted file"), std::string::npos);
  EXPECT_NE(std::string(e.what()).find("CUBRIDGE_RESULTS"), std::string::npos);
}

TEST(FleetNats, OversizedMessageIsRefused) {
  nats_server server;
  const auto connection = connect_to(server);
  const auto js = detail::jetstream(connection.get());
  detail::ensure_bundle_stream(js.get(), "big");
  // Above JetStream's default 1 MiB: the configuration raised it.
  const std::vector<std::byte> two_mib(2 << 20, std::byte{7});
  detail::publish(js.get(), connection.get(), bundle_subject_all("big"), two_mib, "bundle");
  const std::vector<std::byte> over((16 << 20) + 1, std::byte{7});
  const auto e = expect_fleet_error(
      [&] {
        detail::publish(js.get(), connection.get(), bundle_subject_all("big"), over, "bundle");
      },
      fleet_errc::oversized);
  EXPECT_NE(std::string(e.what()).find("bundle of 16777217 bytes is over the server's largest "
                                       "message, 16777216 bytes"),
            std::string::npos)
      << e.what();

  // The server itself refuses it too (a client that does not check first).
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(server.port()));
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  const std::string publish = "CONNECT {\"verbose\":false}\r\nPUB x 16777217\r\n";
  ASSERT_EQ(::send(fd, publish.data(), publish.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(publish.size()));
  std::string answer;
  char buffer[4096];
  while (answer.find("-ERR") == std::string::npos ||
         answer.find("\r\n", answer.find("-ERR")) == std::string::npos) {
    const auto got = ::recv(fd, buffer, sizeof buffer, 0);
    if (got <= 0) break;
    answer.append(buffer, static_cast<std::size_t>(got));
  }
  ::close(fd);
  EXPECT_NE(answer.find("-ERR 'Maximum Payload Violation'"), std::string::npos) << answer;
}

TEST(FleetNats, UnreachableServerFailsAtOnce) {
  std::string url;
  {
    nats_server server;
    url = server.url();
  }  // gone: nothing listens there now
  const auto e = expect_fleet_error(
      [&] {
        (void)detail::connect({url, "test", false, false});
      },
      fleet_errc::unreachable);
  EXPECT_NE(std::string(e.what()).find("natsConnection_Connect"), std::string::npos);
  EXPECT_NE(std::string(e.what()).find(url), std::string::npos) << e.what();
}

TEST(FleetNats, StoreSurvivesARestartOnTheSamePort) {
  nats_server server;
  {
    const auto connection = connect_to(server);
    const auto js = detail::jetstream(connection.get());
    detail::ensure_bundle_stream(js.get(), "filters");
    detail::publish(js.get(), connection.get(), bundle_subject_all("filters"), bytes_of("v3"),
                    "bundle");
  }
  server.stop();
  EXPECT_FALSE(server.running());
  expect_fleet_error([&] { (void)connect_to(server); }, fleet_errc::unreachable);
  server.start();
  const auto connection = connect_to(server);
  const auto js = detail::jetstream(connection.get());
  detail::ensure_bundle_stream(js.get(), "filters");
  const auto last =
      detail::last_message(js.get(), bundle_stream("filters"), bundle_subject_all("filters"));
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(detail::message_text(last.get()), "v3");
}

TEST(FleetNats, RetryingConnectionConnectsOnceTheServerStarts) {
  nats_server server;
  server.kill();
  // An agent starts while the server is down: connect returns, the library keeps trying.
  const auto connection = detail::connect({server.url(), "agent", true, true});
  ASSERT_NE(connection, nullptr);
  EXPECT_NE(natsConnection_Status(connection.get()), NATS_CONN_STATUS_CONNECTED);
  server.start();
  EXPECT_TRUE(eventually(
      [&] { return natsConnection_Status(connection.get()) == NATS_CONN_STATUS_CONNECTED; }));
  // A lost connection comes back too.
  server.kill();
  server.start();
  EXPECT_TRUE(eventually([&] {
    return natsConnection_Status(connection.get()) == NATS_CONN_STATUS_CONNECTED &&
           natsConnection_FlushTimeout(connection.get(), 1000) == NATS_OK;
  }));
}

TEST(FleetNats, ReconnectDelayGrowsFrom250msTo2s) {
  for (int attempt = 1; attempt <= 20; ++attempt) {
    const auto delay = detail::reconnect_delay(attempt).count();
    EXPECT_GE(delay, attempt == 1 ? 250 : 500);
    EXPECT_LE(delay, attempt == 1 ? 312 : 2000);
  }
  EXPECT_GE(detail::reconnect_delay(10).count(), 2000);
}

}  // namespace
