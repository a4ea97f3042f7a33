// Tests of cubridge/hot_module_sink.hpp on a GPU: pushed bundles become the serving version of a
// hot module, directly and through the update endpoint over loopback HTTP.
#include <cubridge/context.hpp>
#include <cubridge/device_buffer.hpp>
#include <cubridge/hot_module_sink.hpp>
#include <cubridge/rollback_request.hpp>
#include <cubridge/scoped_current.hpp>
#include <cubridge/update_endpoint.hpp>

#include "hot_module_fixture.hpp"

#include <gtest/gtest.h>
#include <httplib.h>

#include <optional>
#include <string>

namespace {

using cubridge::testing::hot_image;

class HotModuleSink : public cubridge::testing::hot_module_fixture {
 protected:
  void SetUp() override {
    hot_module_fixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    cubridge::compile_options compile;
    compile.defines["VERSION"] = "7";
    sink_.emplace(compile);
    sink_->add(*hot_, 1);
  }
  cubridge::verified_bundle verified(std::uint64_t version, std::vector<std::byte> payload,
                                     cubridge::payload_kind kind = cubridge::payload_kind::cubin) {
    cubridge::bundle_manifest_input in{"versions", version, "sm_90", kind};
    return cubridge::verify_bundle(cubridge::sign_bundle(in, payload, keys_.secret_key),
                                   {keys_.public_key});
  }
  cubridge::keypair keys_ = cubridge::generate_keypair();
  std::optional<cubridge::hot_module_sink> sink_;
};

TEST_F(HotModuleSink, AppliesCubinAndSourceRefusesBrokenAndRollsBack) {
  EXPECT_EQ(sink_->device_sm(), cubridge::device::get(0).capability().as_int());
  EXPECT_EQ(sink_->current_version("versions"), 1u);
  EXPECT_EQ(run_write_version(), 1u);

  auto r = sink_->apply(verified(2, hot_image("v2")));
  ASSERT_EQ(r.outcome, cubridge::sink_outcome::done) << r.detail;
  EXPECT_EQ(run_write_version(), 2u);

  r = sink_->apply(verified(3, hot_image("missing")));  // lacks a kernel of the interface
  EXPECT_EQ(r.outcome, cubridge::sink_outcome::rejected);
  EXPECT_NE(r.detail.find("spin_then_write"), std::string::npos) << r.detail;
  EXPECT_EQ(run_write_version(), 2u);

  const auto source = cubridge::read_file_bytes(std::string(CUBRIDGE_TEST_SOURCE_DIR) +
                                                "/kernels/hot_kernels.cu");
  r = sink_->apply(verified(4, source, cubridge::payload_kind::cuda_source));
  ASSERT_EQ(r.outcome, cubridge::sink_outcome::done) << r.detail;
  EXPECT_EQ(run_write_version(), 7u);  // compiled here with VERSION=7

  r = sink_->rollback("versions");
  ASSERT_EQ(r.outcome, cubridge::sink_outcome::done) << r.detail;
  EXPECT_EQ(r.version, 2u);
  EXPECT_EQ(run_write_version(), 2u);

  const auto status = sink_->status();
  ASSERT_EQ(status.size(), 1u);
  EXPECT_EQ(status[0].current_version, 2u);
  EXPECT_EQ(status[0].versions_held, (std::vector<std::uint64_t>{4, 2}));
  EXPECT_EQ(sink_->apply(verified(5, hot_image("v2"))).outcome, cubridge::sink_outcome::done);
  EXPECT_EQ(sink_->rollback("nothing").outcome, cubridge::sink_outcome::unknown_module);
}

TEST_F(HotModuleSink, PushedOverHttpServesOnTheNextLaunch) {
  cubridge::update_endpoint_options options;
  options.keys.add(keys_.public_key);
  cubridge::update_endpoint endpoint(*sink_, options);
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
  const auto rollback = client.Post("/v1/modules/versions/rollback",
                                    cubridge::sign_rollback_request("versions", 2, keys_.secret_key),
                                    "text/plain");
  ASSERT_TRUE(rollback);
  EXPECT_EQ(rollback->status, 200) << rollback->body;
  EXPECT_EQ(run_write_version(), 1u);
}

}  // namespace
