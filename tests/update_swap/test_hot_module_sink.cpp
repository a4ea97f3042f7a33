// Tests of cubridge/update_swap/hot_module_sink.hpp on a GPU: pushed bundles become the serving
// version of a hot module, directly and through the update endpoint over loopback HTTP.
#include <cubridge/bundle/rollback_request.hpp>
#include <cubridge/core/context.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/swap/hot_module_group.hpp>
#include <cubridge/update/update_endpoint.hpp>
#include <cubridge/update_swap/hot_module_sink.hpp>

#include "hot_module_fixture.hpp"

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <utility>

namespace {

using cubridge::testing::hot_image;

class HotModuleSink : public cubridge::testing::hot_module_fixture {
 protected:
  void SetUp() override {
    hot_module_fixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    // Its first image is bundle version 1: recorded in the module's chain, read by the sink.
    hot_.emplace(
        cubridge::hot_module::load(*ctx_, "versions", hot_image("v1"), {.origin = {.label = 1}}));
    cubridge::compile_options compile;
    compile.defines["VERSION"] = "7";
    sink_ = std::make_shared<cubridge::hot_module_sink>(compile);
    sink_->add(*hot_);
  }
  std::string signed_bundle(std::uint64_t version, const std::vector<std::byte>& payload) {
    cubridge::bundle_manifest_input in{"versions", version, "sm_90", cubridge::payload_kind::cubin};
    const auto b = cubridge::sign_bundle(in, payload, keys_.secret_key);
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }
  cubridge::verified_bundle verified(std::uint64_t version, std::vector<std::byte> payload,
                                     cubridge::payload_kind kind = cubridge::payload_kind::cubin) {
    cubridge::bundle_manifest_input in{"versions", version, "sm_90", kind};
    return cubridge::verify_bundle(cubridge::sign_bundle(in, payload, keys_.secret_key),
                                   {keys_.public_key});
  }
  cubridge::keypair keys_ = cubridge::generate_keypair();
  std::shared_ptr<cubridge::hot_module_sink> sink_;
};

constexpr auto above = cubridge::apply_rule::above_serving;

TEST_F(HotModuleSink, AppliesCubinAndSourceRefusesBrokenAndRollsBack) {
  EXPECT_EQ(sink_->device_capability(), cubridge::device::get(0).capability());
  EXPECT_EQ(sink_->current_version("versions"), 1u);
  EXPECT_EQ(run_write_version(), 1u);

  auto r = sink_->apply(verified(2, hot_image("v2")), above);
  ASSERT_EQ(r.reason, cubridge::gate_reason::none) << r.detail;
  EXPECT_EQ(run_write_version(), 2u);

  r = sink_->apply(verified(3, hot_image("missing")), above);  // lacks a kernel of the interface
  EXPECT_EQ(r.reason, cubridge::gate_reason::stage_refused);
  EXPECT_NE(r.detail.find("spin_then_write"), std::string::npos) << r.detail;
  EXPECT_EQ(run_write_version(), 2u);

  const auto source = cubridge::testing::read_bytes(std::string(CUBRIDGE_TEST_SOURCE_DIR) +
                                                    "/kernels/hot_kernels.cu");
  r = sink_->apply(verified(4, source, cubridge::payload_kind::cuda_source), above);
  ASSERT_EQ(r.reason, cubridge::gate_reason::none) << r.detail;
  EXPECT_EQ(run_write_version(), 7u);  // compiled here with VERSION=7

  r = sink_->rollback("versions");
  ASSERT_EQ(r.reason, cubridge::gate_reason::none) << r.detail;
  EXPECT_EQ(r.serving_version, 2u);
  EXPECT_EQ(run_write_version(), 2u);

  const auto status = sink_->status();
  ASSERT_EQ(status.size(), 1u);
  EXPECT_EQ(status[0].current_version, 2u);
  EXPECT_EQ(status[0].versions_held, (std::vector<std::uint64_t>{4, 2}));
  ASSERT_TRUE(status[0].counters.has_value()) << "a hot module reports its counters";
  EXPECT_EQ(status[0].counters->promotions, 3u) << "v2, v4 and the rollback";
  EXPECT_EQ(status[0].counters->rollbacks, 1u);
  EXPECT_EQ(status[0].counters->rejected, 1u) << "the image that lacks a kernel";
  EXPECT_EQ(sink_->apply(verified(5, hot_image("v2")), above).reason, cubridge::gate_reason::none);
  EXPECT_EQ(sink_->rollback("nothing").reason, cubridge::gate_reason::unknown_module);
}

TEST_F(HotModuleSink, PushedOverHttpServesOnTheNextLaunch) {
  cubridge::update_endpoint_options options;
  options.keys.add(keys_.public_key);
  options.persist_state = false;  // each test's modules start fresh
  options.serve_metrics = true;
  cubridge::update_endpoint endpoint(sink_, options);
  endpoint.start();
  httplib::Client client("127.0.0.1", endpoint.port());
  cubridge::bundle_manifest_input in{"versions", 2, "sm_90", cubridge::payload_kind::cubin};
  const auto b = cubridge::sign_bundle(in, hot_image("v2"), keys_.secret_key);
  const auto r = client.Put("/v1/modules/versions",
                            std::string(reinterpret_cast<const char*>(b.data()), b.size()),
                            "application/octet-stream");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(run_write_version(), 2u);
  const auto rollback =
      client.Post("/v1/modules/versions/rollback",
                  cubridge::sign_rollback_request("versions", 2, keys_.secret_key), "text/plain");
  ASSERT_TRUE(rollback);
  EXPECT_EQ(rollback->status, 200) << rollback->body;
  EXPECT_EQ(run_write_version(), 1u);
  const auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  for (const char* line :
       {"cubridge_module_version{module=\"versions\"} 1\n",
        "cubridge_module_promotions_total{module=\"versions\"} 2\n",
        "cubridge_module_rollbacks_total{module=\"versions\"} 1\n",
        "cubridge_module_rejected_total{module=\"versions\"} 0\n",
        "cubridge_update_applied_total 1\n", "cubridge_update_rollbacks_total 1\n"})
    EXPECT_NE(metrics->body.find(line), std::string::npos) << line << " in\n" << metrics->body;
}

// The endpoint holds its gate, the gate its sink, the sink a handle of its module: the
// service's own handles of the module and the sink may go first, and pushes still apply.
TEST_F(HotModuleSink, TheEndpointKeepsItsSinkAndItsModuleAlive) {
  const auto kernel = hot_->get_kernel("write_version");
  cubridge::update_endpoint_options options;
  options.keys.add(keys_.public_key);
  options.persist_state = false;  // each test's modules start fresh
  cubridge::update_endpoint endpoint(std::exchange(sink_, nullptr), options);
  hot_.reset();  // the service's handle of the module, gone before the endpoint
  endpoint.start();
  httplib::Client client("127.0.0.1", endpoint.port());
  cubridge::bundle_manifest_input in{"versions", 2, "sm_90", cubridge::payload_kind::cubin};
  const auto b = cubridge::sign_bundle(in, hot_image("v2"), keys_.secret_key);
  const auto r = client.Put("/v1/modules/versions",
                            std::string(reinterpret_cast<const char*>(b.data()), b.size()),
                            "application/octet-stream");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200) << r->body;
  (void)kernel.launch({.block = {256}, .stream = *stream_}, out_->span());
  EXPECT_EQ(cubridge::driver::api().cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(cubridge::testing::read_back(*out_, 255), 2u) << "the pushed version serves";
}

// Issue 12, the test as the issue states it: promote directly (no endpoint), then push an older
// bundle (refused, 409), then roll back through the endpoint, then read the status: every answer
// comes from the module's version chain, so all of them agree.
TEST_F(HotModuleSink, DirectPromoteThenOlderPushRefusedThenEndpointRollbackThenConsistentStatus) {
  using json = nlohmann::json;
  cubridge::update_endpoint_options options;
  options.keys.add(keys_.public_key);
  options.persist_state = false;  // each test's modules start fresh
  cubridge::update_endpoint endpoint(sink_, options);
  endpoint.start();
  httplib::Client client("127.0.0.1", endpoint.port());
  client.set_read_timeout(30, 0);

  // 1. A direct promote, past the sink and the endpoint: the v2 image as bundle version 7.
  auto staged =
      hot_->stage(hot_image("v2"), {.source_name = "by hand", .label = 7, .signer = "0123abcd"});
  EXPECT_EQ(staged.origin().label, 7u);
  EXPECT_EQ(staged.origin().source, "by hand");
  const auto promoted_id = hot_->promote(std::move(staged));
  EXPECT_EQ(promoted_id, 2u);
  EXPECT_EQ(run_write_version(), 2u);
  EXPECT_EQ(sink_->current_version("versions"), 7u);

  // 2. An older bundle is refused: 409 older_version against the serving v7.
  const auto older = client.Put("/v1/modules/versions", signed_bundle(6, hot_image("v1")),
                                "application/octet-stream");
  ASSERT_TRUE(older) << httplib::to_string(older.error());
  EXPECT_EQ(older->status, 409) << older->body;
  const auto refusal = json::parse(older->body, nullptr, false);
  EXPECT_EQ(refusal.value("error", ""), "older_version") << older->body;
  EXPECT_EQ(refusal.value("current_version", 0u), 7u) << older->body;
  EXPECT_EQ(run_write_version(), 2u) << "the refused push changed what serves";

  // 3. A rollback through the endpoint, from v7 (what the chain says serves), goes back to what
  //    the chain says came before: the loaded v1.
  const auto rollback =
      client.Post("/v1/modules/versions/rollback",
                  cubridge::sign_rollback_request("versions", 7, keys_.secret_key), "text/plain");
  ASSERT_TRUE(rollback) << httplib::to_string(rollback.error());
  ASSERT_EQ(rollback->status, 200) << rollback->body;
  const auto rolled = json::parse(rollback->body, nullptr, false);
  EXPECT_EQ(rolled.value("version", 0u), 1u) << rollback->body;
  EXPECT_EQ(rolled.value("from_version", 0u), 7u) << rollback->body;
  EXPECT_EQ(run_write_version(), 1u);

  // 4. The status, from every side, says the same.
  const auto get = client.Get("/v1/modules");
  ASSERT_TRUE(get) << httplib::to_string(get.error());
  ASSERT_EQ(get->status, 200) << get->body;
  const auto listing = json::parse(get->body, nullptr, false);
  ASSERT_TRUE(listing.contains("modules")) << get->body;
  ASSERT_EQ(listing["modules"].size(), 1u) << get->body;
  const auto& m = listing["modules"][0];
  EXPECT_EQ(m["name"], "versions");
  EXPECT_EQ(m["current_version"], 1) << get->body;
  EXPECT_EQ(m["versions_held"], json::array({7, 1})) << get->body;
  EXPECT_EQ(m["highest_version"], 7) << get->body;

  const auto status = sink_->status();
  ASSERT_EQ(status.size(), 1u);
  EXPECT_EQ(status[0].current_version, 1u);
  EXPECT_EQ(status[0].versions_held, (std::vector<std::uint64_t>{7, 1}));
  EXPECT_EQ(sink_->current_version("versions"), 1u);

  const auto held = hot_->versions();
  EXPECT_EQ(held.serving.id, 1u);
  EXPECT_EQ(held.serving.origin.label, 1u);
  EXPECT_EQ(held.serving.origin.source, "load");
  ASSERT_TRUE(held.rollback_target.has_value());
  EXPECT_EQ(held.rollback_target->id, promoted_id);
  EXPECT_EQ(held.rollback_target->origin.label, 7u);
  EXPECT_EQ(held.rollback_target->origin.signer, "0123abcd");
  EXPECT_EQ(hot_->stats().current_id, 1u);

  // The floor stays at v7 after the rollback below it; a newer push is applied on top.
  const auto again = client.Put("/v1/modules/versions", signed_bundle(6, hot_image("v1")),
                                "application/octet-stream");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 409) << again->body;
  const auto newer = client.Put("/v1/modules/versions", signed_bundle(8, hot_image("v2")),
                                "application/octet-stream");
  ASSERT_TRUE(newer);
  EXPECT_EQ(newer->status, 200) << newer->body;
  EXPECT_EQ(run_write_version(), 2u);
  EXPECT_EQ(sink_->current_version("versions"), 8u);
  const auto after = hot_->versions();
  EXPECT_EQ(after.serving.origin.label, 8u);
  EXPECT_EQ(after.serving.origin.signer, cubridge::to_hex(keys_.public_key.id()));
  EXPECT_EQ(after.rollback_target->origin.label, 1u);
}

// Issue 16: a group (three contexts: on one GPU here; one per device on a node) behind the
// endpoint: a push is staged on every member and promoted on all, a refused one switches none,
// a rollback returns every member.
TEST_F(HotModuleSink, AGroupTakesAPushOnEveryMemberOrOnNone) {
  std::vector<cubridge::context> contexts;
  std::vector<cubridge::context_arg> args;
  for (int i = 0; i < 3; ++i)
    contexts.push_back(cubridge::context::create(cubridge::device::get(0)));
  for (auto& c : contexts) args.emplace_back(c);
  auto group =
      cubridge::hot_module_group::load("grouped", args, hot_image("v1"), {.origin = {.label = 1}});
  auto sink = std::make_shared<cubridge::hot_module_sink>();
  sink->add(group);
  EXPECT_THROW(sink->add(group), cubridge::error);  // a name once
  auto serving_everywhere = [&] {
    std::vector<unsigned> written;
    auto k = group.get_kernel("write_version");
    for (auto& c : contexts) {
      cubridge::scoped_current current(c);
      auto out = cubridge::driver_buffer<unsigned>::allocate(c, 256);
      (void)k.launch({.block = {256}, .stream = cubridge::stream_ref::legacy_default()},
                     out.span());
      EXPECT_EQ(cubridge::driver::api().cuCtxSynchronize(), CUDA_SUCCESS);
      written.push_back(cubridge::testing::read_back(out, 255));
    }
    return written;
  };
  cubridge::update_endpoint_options options;
  options.keys.add(keys_.public_key);
  options.persist_state = false;  // each test's modules start fresh
  options.serve_metrics = true;
  cubridge::update_endpoint endpoint(sink, options);
  endpoint.start();
  httplib::Client client("127.0.0.1", endpoint.port());
  auto push = [&](std::uint64_t version, const char* image) {
    cubridge::bundle_manifest_input in{"grouped", version, "sm_90", cubridge::payload_kind::cubin};
    const auto b = cubridge::sign_bundle(in, hot_image(image), keys_.secret_key);
    return client.Put("/v1/modules/grouped",
                      std::string(reinterpret_cast<const char*>(b.data()), b.size()),
                      "application/octet-stream");
  };
  auto r = push(2, "v2");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(serving_everywhere(), (std::vector<unsigned>{2, 2, 2}));
  r = push(3, "missing");  // lacks a kernel of the interface: refused on every member
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 422) << r->body;
  EXPECT_NE(r->body.find("member"), std::string::npos) << r->body;
  EXPECT_EQ(serving_everywhere(), (std::vector<unsigned>{2, 2, 2}));
  EXPECT_EQ(sink->current_version("grouped"), 2u);
  const auto rollback =
      client.Post("/v1/modules/grouped/rollback",
                  cubridge::sign_rollback_request("grouped", 2, keys_.secret_key), "text/plain");
  ASSERT_TRUE(rollback);
  EXPECT_EQ(rollback->status, 200) << rollback->body;
  EXPECT_EQ(serving_everywhere(), (std::vector<unsigned>{1, 1, 1}));
  const auto status = sink->status();
  ASSERT_EQ(status.size(), 1u);
  EXPECT_EQ(status[0].current_version, 1u);
  EXPECT_EQ(status[0].versions_held, (std::vector<std::uint64_t>{2, 1}));
  ASSERT_TRUE(status[0].counters.has_value());
  EXPECT_EQ(status[0].counters->promotions, 2u);
  EXPECT_EQ(status[0].counters->rollbacks, 1u);
  EXPECT_EQ(status[0].counters->rejected, 1u);
  for (std::size_t i = 0; i < group.size(); ++i)
    EXPECT_EQ(group.member(i).versions().serving.origin.label, 1u) << "member " << i;
}

}  // namespace
