// Tests of cubridge/update/update_gate.hpp without a transport: the decisions the endpoint and
// the fleet agent share, over the CLI tests' memory sink (no GPU). The HTTP answers built on
// them are test_update_endpoint's.
#include <cubridge/bundle/rollback_request.hpp>
#include <cubridge/core/process_health.hpp>
#include <cubridge/update/state_location.hpp>
#include <cubridge/update/update_gate.hpp>
#include <cubridge/update/update_state.hpp>

#include "bundle/source_bundles.hpp"
#include "scoped_env.hpp"
#include "temp_dir.hpp"
#include "tools/memory_sink.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

using cubridge::gate_decision;
using cubridge::gate_outcome;
using cubridge::module_note;
using cubridge::testing::source_bundle;

class UpdateGateTest : public ::testing::Test {
 protected:
  cubridge::keypair keys = cubridge::generate_keypair();
  cubridge::keypair stranger = cubridge::generate_keypair();
  std::shared_ptr<cubridge::testing::memory_sink> sink =
      std::make_shared<cubridge::testing::memory_sink>();

  cubridge::update_gate_options options() const {
    cubridge::update_gate_options o;
    o.keys.add(keys.public_key);
    o.max_bundle_bytes = 64 << 10;
    o.persist_state = false;  // a fresh state per test; the persisted one is named where tested
    return o;
  }
  std::vector<std::byte> bundle(std::uint64_t version) const {
    return source_bundle("filters", version, keys.secret_key);
  }
};

// `reason` as spelled on the wire: the name table is checked with it.
void expect_refused(const gate_decision& d, std::string_view reason,
                    gate_outcome outcome = gate_outcome::refused) {
  EXPECT_EQ(d.outcome, outcome) << to_string(d.reason) << ": " << d.detail;
  EXPECT_EQ(to_string(d.reason), reason) << d.detail;
  EXPECT_EQ(cubridge::parse_gate_reason(reason), d.reason) << reason;
  EXPECT_FALSE(d.detail.empty());
  EXPECT_LE(d.detail.size(), 4096u);
}

TEST_F(UpdateGateTest, AppliesANewerVersionAndRefusesTheSameOrAnOlderOne) {
  cubridge::update_gate gate(sink, options());
  gate.start();
  const auto v3 = gate.push(bundle(3));
  ASSERT_EQ(v3.outcome, gate_outcome::applied) << to_string(v3.reason) << ": " << v3.detail;
  EXPECT_EQ(v3.module, "filters");
  EXPECT_EQ(v3.version, 3u);
  EXPECT_EQ(v3.previous_version, 0u);
  EXPECT_EQ(v3.serving_version, 3u);
  ASSERT_TRUE(v3.manifest);
  EXPECT_EQ(v3.manifest->target, "sm_90");
  EXPECT_EQ(v3.reason, cubridge::gate_reason::none);

  const auto again = gate.push(bundle(3));
  expect_refused(again, "replayed_version", gate_outcome::duplicate);
  EXPECT_EQ(again.serving_version, 3u);
  EXPECT_EQ(again.note, module_note::always);
  const auto older = gate.push(bundle(2));
  expect_refused(older, "older_version");
  EXPECT_EQ(older.highest_version, 3u);
  EXPECT_EQ(sink->current_version("filters"), 3u);
  EXPECT_EQ(gate.highest_version("filters"), 3u);
}

TEST_F(UpdateGateTest, UnverifiedBundlesAreRefusedWithTheirReasonAndNoteNothing) {
  cubridge::update_gate gate(sink, options());
  gate.start();
  auto tampered = bundle(3);  // the payload, just before the 64-byte signature
  tampered[tampered.size() - 70] ^= std::byte{1};
  auto forged = bundle(3);  // the signed manifest says v7
  const std::string text(reinterpret_cast<const char*>(forged.data()), forged.size());
  forged[text.find("\"version\":3") + 10] = std::byte{'7'};
  auto unsigned_bundle = bundle(3);
  std::fill(unsigned_bundle.end() - 64, unsigned_bundle.end(), std::byte{0});
  const auto oversized = source_bundle("filters", 3, keys.secret_key, "sm_90", 70 << 10);

  for (const auto& [body, reason] : std::vector<std::pair<std::vector<std::byte>, std::string>>{
           {tampered, "payload_mismatch"},
           {forged, "bad_signature"},
           {unsigned_bundle, "unsigned_bundle"},
           {source_bundle("filters", 3, stranger.secret_key), "unknown_key"},
           {oversized, "too_large"},
           {std::vector<std::byte>(10, std::byte{'x'}), "bad_magic"}}) {
    const auto d = gate.push(body);
    expect_refused(d, reason);
    EXPECT_EQ(d.note, module_note::none) << reason;
    EXPECT_TRUE(d.module.empty()) << reason;
  }
  EXPECT_EQ(sink->current_version("filters"), 0u);
  EXPECT_EQ(gate.highest_version("filters"), 0u);
  EXPECT_EQ(gate.push(bundle(3)).outcome, gate_outcome::applied);
}

TEST_F(UpdateGateTest, RefusesAnotherDeviceOrAnotherName) {
  cubridge::update_gate gate(sink, options());
  gate.start();
  expect_refused(gate.push(source_bundle("filters", 3, keys.secret_key, "sm_80")), "wrong_device");
  const auto named = gate.push(bundle(3), "other");
  expect_refused(named, "name_mismatch");
  EXPECT_EQ(named.note, module_note::if_present);
  EXPECT_EQ(sink->current_version("filters"), 0u);
  EXPECT_EQ(gate.push(bundle(3), "filters").outcome, gate_outcome::applied);
}

TEST_F(UpdateGateTest, TheReplayFloorSurvivesARestartWithAStateFile) {
  cubridge::testing::temp_dir dir;
  auto o = options();
  o.state_file = dir.path / "state.json";
  {
    cubridge::update_gate gate(sink, o);
    gate.start();
    ASSERT_EQ(gate.push(bundle(4)).outcome, gate_outcome::applied);
  }
  auto fresh = std::make_shared<cubridge::testing::memory_sink>();  // the service restarted empty
  cubridge::update_gate gate(fresh, o);
  gate.start();
  // v4 does not serve here, so it is no duplicate: a refused replay.
  expect_refused(gate.push(bundle(4)), "replayed_version");
  EXPECT_EQ(fresh->current_version("filters"), 0u);
  EXPECT_EQ(gate.push(bundle(5)).outcome, gate_outcome::applied);
}

// The state a gate leaves when its process is killed after recording `version` and before the
// sink answered: pending in the state file.
void crash_while_applying(const std::filesystem::path& file, std::uint64_t version) {
  cubridge::update_state state(file);
  state.load();
  state.record_pending("filters", version);
}

TEST_F(UpdateGateTest, AnApplyInterruptedByACrashIsResumedOnceAfterTheRestart) {
  cubridge::testing::temp_dir dir;
  auto o = options();
  o.state_file = dir.path / "state.json";
  {
    cubridge::update_gate gate(sink, o);
    gate.start();
    ASSERT_EQ(gate.push(bundle(3)).outcome, gate_outcome::applied);
  }
  crash_while_applying(o.state_file, 4);
  // Restarted over the same file, the sink still at v3: the redelivered v4 is applied.
  {
    cubridge::update_gate gate(sink, o);
    gate.start();
    EXPECT_EQ(gate.highest_version("filters"), 4u);
    const auto d = gate.push(bundle(4));
    ASSERT_EQ(d.outcome, gate_outcome::applied) << to_string(d.reason) << ": " << d.detail;
    EXPECT_EQ(d.reason, cubridge::gate_reason::none);
    EXPECT_NE(d.detail.find("resumes"), std::string::npos) << d.detail;
    EXPECT_EQ(d.previous_version, 3u);
    EXPECT_EQ(d.serving_version, 4u);
    EXPECT_EQ(sink->current_version("filters"), 4u);
    // Settled: the same bundle again is a duplicate, the sink not called.
    expect_refused(gate.push(bundle(4)), "replayed_version", gate_outcome::duplicate);
  }
  // Settled in the file too: after another restart, served below it, v4 is a replay.
  auto fresh = std::make_shared<cubridge::testing::memory_sink>();
  cubridge::update_gate gate(fresh, o);
  gate.start();
  expect_refused(gate.push(bundle(4)), "replayed_version");
  EXPECT_EQ(fresh->current_version("filters"), 0u);
}

TEST_F(UpdateGateTest, APendingVersionThatServesIsADuplicateAndSettled) {
  cubridge::testing::temp_dir dir;
  auto o = options();
  o.state_file = dir.path / "state.json";
  {
    cubridge::update_gate gate(sink, o);
    gate.start();
    ASSERT_EQ(gate.push(bundle(4)).outcome, gate_outcome::applied);
  }
  crash_while_applying(o.state_file, 4);  // killed after the promote, before the settle
  {
    cubridge::update_gate gate(sink, o);
    gate.start();
    expect_refused(gate.push(bundle(4)), "replayed_version", gate_outcome::duplicate);
  }
  auto fresh = std::make_shared<cubridge::testing::memory_sink>();  // known applied: not resumed on
                                                                    // an empty service
  cubridge::update_gate gate(fresh, o);
  gate.start();
  expect_refused(gate.push(bundle(4)), "replayed_version");
}

TEST_F(UpdateGateTest, ASignedRollbackSettlesAPendingVersion) {
  cubridge::testing::temp_dir dir;
  auto o = options();
  o.state_file = dir.path / "state.json";
  {
    cubridge::update_gate gate(sink, o);
    gate.start();
    ASSERT_EQ(gate.push(bundle(2)).outcome, gate_outcome::applied);
    ASSERT_EQ(gate.push(bundle(3)).outcome, gate_outcome::applied);
  }
  crash_while_applying(o.state_file, 4);
  cubridge::update_gate gate(sink, o);
  gate.start();
  const auto back = gate.rollback(cubridge::sign_rollback_request("filters", 3, keys.secret_key));
  ASSERT_EQ(back.outcome, gate_outcome::rolled_back)
      << to_string(back.reason) << ": " << back.detail;
  EXPECT_EQ(sink->current_version("filters"), 2u);
  // The operator went back: neither the rolled-back v3 nor the unsettled v4 comes again.
  expect_refused(gate.push(bundle(3)), "older_version");
  expect_refused(gate.push(bundle(4)), "replayed_version");
  EXPECT_EQ(sink->current_version("filters"), 2u);
}

TEST_F(UpdateGateTest, AVersionFloorAtAPendingVersionRefusesIt) {
  cubridge::testing::temp_dir dir;
  auto o = options();
  o.state_file = dir.path / "state.json";
  crash_while_applying(o.state_file, 4);
  o.version_floor = {{"filters", 4}};
  cubridge::update_gate gate(sink, o);
  gate.start();
  expect_refused(gate.push(bundle(4)), "replayed_version");
  EXPECT_EQ(sink->current_version("filters"), 0u);
}

TEST_F(UpdateGateTest, ASignedRollbackIsHonouredOnce) {
  cubridge::update_gate gate(sink, options());
  gate.start();
  ASSERT_EQ(gate.push(bundle(2)).outcome, gate_outcome::applied);
  ASSERT_EQ(gate.push(bundle(3)).outcome, gate_outcome::applied);
  expect_refused(gate.rollback(cubridge::sign_rollback_request("filters", 2, keys.secret_key)),
                 "version_mismatch");
  expect_refused(gate.rollback(cubridge::sign_rollback_request("filters", 3, stranger.secret_key)),
                 "unknown_key");
  const auto request = cubridge::sign_rollback_request("filters", 3, keys.secret_key);
  const auto d = gate.rollback(request, "filters");
  ASSERT_EQ(d.outcome, gate_outcome::rolled_back) << to_string(d.reason) << ": " << d.detail;
  EXPECT_EQ(d.version, 2u);
  EXPECT_EQ(d.previous_version, 3u);
  EXPECT_EQ(sink->current_version("filters"), 2u);
  expect_refused(gate.rollback(request), "replayed_request");
  // v3 served: it stays the floor after the rollback.
  expect_refused(gate.push(bundle(3)), "replayed_version");
  EXPECT_EQ(sink->current_version("filters"), 2u);
}

TEST_F(UpdateGateTest, ARollbackOfAnUnknownModuleIsRefusedWithoutANote) {
  cubridge::update_gate gate(sink, options());
  gate.start();
  const auto d = gate.rollback(cubridge::sign_rollback_request("nothing", 1, keys.secret_key));
  expect_refused(d, "unknown_module");
  EXPECT_EQ(d.note, module_note::none);
}

// --- payloads recorded as bad -----------------------------------------------------------------

// A bundle of "filters" at `version` whose payload is the one source_bundle gives `payload_of`:
// the same code signed again under another version.
std::vector<std::byte> resigned(std::uint64_t version, std::uint64_t payload_of,
                                const cubridge::secret_key& key) {
  const std::string source =
      "extern \"C\" __global__ void k" + std::to_string(payload_of) + "() {}\n// \n";
  cubridge::bundle_manifest_input in;
  in.name = "filters";
  in.version = version;
  in.target = "sm_90";
  in.kind = cubridge::payload_kind::cuda_source;
  return cubridge::sign_bundle(in, std::as_bytes(std::span(source.data(), source.size())), key);
}

std::string payload_digest(std::span<const std::byte> bundle, const cubridge::public_key& key) {
  return cubridge::verify_bundle(bundle, cubridge::trusted_keys{key}, {}).manifest.payload_sha256;
}

TEST_F(UpdateGateTest, APayloadThatFaultedInProbationIsNeverStagedAgainEvenAfterARestart) {
  cubridge::testing::temp_dir dir;
  auto o = options();
  o.state_file = dir.path / "state.json";
  const auto digest = payload_digest(bundle(3), keys.public_key);
  ASSERT_EQ(payload_digest(resigned(4, 3, keys.secret_key), keys.public_key), digest);
  {
    cubridge::update_gate gate(sink, o);
    gate.start();
    ASSERT_EQ(gate.push(bundle(2)).outcome, gate_outcome::applied);
    sink->fail_version = 3;
    sink->fail_reason = cubridge::gate_reason::faulted_in_probation;
    const auto faulted = gate.push(bundle(3));
    expect_refused(faulted, "faulted_in_probation", gate_outcome::failed);
    EXPECT_EQ(faulted.serving_version, 2u);
    const auto recorded = gate.bad_versions();
    ASSERT_EQ(recorded.size(), 1u);
    EXPECT_EQ(recorded[0].module, "filters");
    EXPECT_EQ(recorded[0].digest, digest);
    EXPECT_EQ(recorded[0].version, 3u);
    EXPECT_EQ(recorded[0].reason, cubridge::gate_reason::faulted_in_probation);
    EXPECT_EQ(sink->applies.load(), 2);
    // Refused before the sink sees it: the same bundle, and its payload signed as v4.
    sink->fail_version = 0;
    for (const auto& body : {bundle(3), resigned(4, 3, keys.secret_key)}) {
      const auto d = gate.push(body);
      expect_refused(d, "known_bad", gate_outcome::failed);
      EXPECT_NE(d.detail.find(digest), std::string::npos) << d.detail;
      EXPECT_NE(d.detail.find("faulted_in_probation"), std::string::npos) << d.detail;
      EXPECT_EQ(d.serving_version, 2u);
    }
    EXPECT_EQ(sink->applies.load(), 2);
  }
  // Restarted over the same file with a fresh service: still refused unstaged, also with an
  // operator's word for exactly that version.
  auto fresh = std::make_shared<cubridge::testing::memory_sink>();
  cubridge::update_gate gate(fresh, o);
  gate.start();
  EXPECT_EQ(gate.bad_versions().size(), 1u);
  const cubridge::push_authority word{4, true, "the test's desired state"};
  expect_refused(gate.push(resigned(4, 3, keys.secret_key), {}, &word), "known_bad",
                 gate_outcome::failed);
  expect_refused(gate.push(bundle(3)), "known_bad", gate_outcome::failed);
  EXPECT_EQ(fresh->applies.load(), 0);
  EXPECT_EQ(gate.push(bundle(5)).outcome, gate_outcome::applied);  // other code: staged
}

TEST_F(UpdateGateTest, AProbationWithTooLittleEvidenceFailsButRecordsNothing) {
  cubridge::update_gate gate(sink, options());
  gate.start();
  ASSERT_EQ(gate.push(bundle(1)).outcome, gate_outcome::applied);
  sink->fail_version = 2;
  sink->fail_reason = cubridge::gate_reason::probation_incomplete;
  expect_refused(gate.push(bundle(2)), "probation_incomplete", gate_outcome::failed);
  EXPECT_TRUE(gate.bad_versions().empty());
  sink->fail_version = 0;
  EXPECT_EQ(gate.push(bundle(2)).outcome, gate_outcome::applied);  // tried again, with traffic
}

TEST_F(UpdateGateTest, EveryProbationRefusalRecordsThePayloadWithItsReason) {
  cubridge::update_gate gate(sink, options());
  gate.start();
  ASSERT_EQ(gate.push(bundle(1)).outcome, gate_outcome::applied);
  std::uint64_t version = 2;
  for (const auto reason : {cubridge::gate_reason::faulted_in_probation,
                            cubridge::gate_reason::mismatch_in_probation}) {
    sink->fail_version = version;
    sink->fail_reason = reason;
    expect_refused(gate.push(bundle(version)), to_string(reason), gate_outcome::failed);
    const auto recorded = gate.bad_versions();
    ASSERT_EQ(recorded.size(), version - 1);
    EXPECT_EQ(recorded.back().reason, reason);
    EXPECT_EQ(recorded.back().version, version);
    EXPECT_EQ(recorded.back().digest, payload_digest(bundle(version), keys.public_key));
    ++version;
  }
  // A smoke test that failed otherwise marks nothing: a fixed bundle of the same code may come.
  sink->fail_version = version;
  sink->fail_reason = cubridge::gate_reason::apply_failed;
  expect_refused(gate.push(bundle(version)), "apply_failed", gate_outcome::failed);
  EXPECT_EQ(gate.bad_versions().size(), 2u);
  EXPECT_EQ(sink->current_version("filters"), 1u);
}

TEST_F(UpdateGateTest, RecordBadIsCheckedAndTheFirstRecordStands) {
  cubridge::update_gate gate(sink, options());
  const std::string digest(64, 'a');
  EXPECT_THROW(gate.record_bad("filters", digest, 3, cubridge::gate_reason::known_bad),
               cubridge::error)
      << "before start()";
  EXPECT_TRUE(gate.bad_versions().empty());
  gate.start();
  for (const auto& [module, text, version, reason] :
       std::vector<std::tuple<std::string, std::string, std::uint64_t, cubridge::gate_reason>>{
           {"filters", std::string(64, 'A'), 3, cubridge::gate_reason::sticky_error},
           {"filters", std::string(63, 'a'), 3, cubridge::gate_reason::sticky_error},
           {"../x", digest, 3, cubridge::gate_reason::sticky_error},
           {"filters", digest, 0, cubridge::gate_reason::sticky_error},
           {"filters", digest, 3, cubridge::gate_reason::none}}) {
    try {
      gate.record_bad(module, text, version, reason);
      ADD_FAILURE() << module << " " << text << " v" << version << " was recorded";
    } catch (const cubridge::error& e) {
      EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();
    }
  }
  EXPECT_TRUE(gate.bad_versions().empty());
  gate.record_bad("filters", digest, 3, cubridge::gate_reason::mismatch_in_probation);
  gate.record_bad("filters", digest, 4, cubridge::gate_reason::sticky_error);
  const auto recorded = gate.bad_versions();
  ASSERT_EQ(recorded.size(), 1u);
  EXPECT_EQ(recorded[0].version, 3u);
  EXPECT_EQ(recorded[0].reason, cubridge::gate_reason::mismatch_in_probation);
}

// A simulated sticky error (nothing reaches a driver): the process's poison record is forgotten
// after each test, since it is the process's for good otherwise.
class UpdateGatePoisonTest : public UpdateGateTest {
 protected:
  void TearDown() override { cubridge::detail::reset_process_health_for_tests(); }
};

TEST_F(UpdateGatePoisonTest, APoisonedProcessRecordsTheServingPayloadAtOnce) {
  cubridge::testing::temp_dir dir;
  auto o = options();
  o.state_file = dir.path / "state.json";
  const auto good = bundle(2), suspect = bundle(3);
  {
    cubridge::update_gate gate(sink, o);
    gate.start();
    ASSERT_EQ(gate.push(good).outcome, gate_outcome::applied);
    ASSERT_EQ(gate.push(suspect).outcome, gate_outcome::applied);
    cubridge::note_cuda_result(CUDA_ERROR_ILLEGAL_ADDRESS, "test");
    ASSERT_TRUE(cubridge::process_poisoned());
    const auto recorded = gate.bad_versions();
    ASSERT_EQ(recorded.size(), 1u) << "the serving version only, not the one before it";
    EXPECT_EQ(recorded[0].module, "filters");
    EXPECT_EQ(recorded[0].version, 3u);
    EXPECT_EQ(recorded[0].digest, payload_digest(suspect, keys.public_key));
    EXPECT_EQ(recorded[0].reason, cubridge::gate_reason::sticky_error);
    // In the file before the process would end (update_state reads it without the gate's lock).
    cubridge::update_state written(o.state_file);
    written.load();
    EXPECT_EQ(written.bad_versions(), recorded);
  }
  // The gate is gone, the process still poisoned: a gate started now is told at once, and has
  // applied nothing to record.
  {
    cubridge::update_gate gate(sink, o);
    gate.start();
    EXPECT_EQ(gate.bad_versions().size(), 1u);
  }
  cubridge::detail::reset_process_health_for_tests();
  // After the restart: the version that poisoned it is refused unstaged, the last good one serves.
  auto fresh = std::make_shared<cubridge::testing::memory_sink>();
  cubridge::update_gate gate(fresh, o);
  gate.start();
  const auto refused = gate.push(suspect);
  expect_refused(refused, "known_bad", gate_outcome::failed);
  EXPECT_NE(refused.detail.find("sticky_error"), std::string::npos) << refused.detail;
  const cubridge::push_authority word{2, true, "the fleet's stable version"};
  EXPECT_EQ(gate.push(good, {}, &word).outcome, gate_outcome::applied);
  EXPECT_EQ(fresh->current_version("filters"), 2u);
  EXPECT_EQ(fresh->applies.load(), 1);
}

// A sink whose apply of `fault_on` poisons the process, as an in-process stage or smoke test
// that faults would, or traffic on the serving version meanwhile.
class faulting_sink final : public cubridge::module_sink {
 public:
  std::optional<cubridge::compute_capability> device_capability() const override {
    return cubridge::compute_capability{9, 0};
  }
  std::uint64_t current_version(std::string_view) const override { return serving; }
  cubridge::sink_result apply(const cubridge::verified_bundle& b, cubridge::apply_rule) override {
    if (b.version() == fault_on) {
      cubridge::note_cuda_result(CUDA_ERROR_ILLEGAL_ADDRESS, "smoke test");
      return {cubridge::gate_reason::apply_failed, serving, "CUDA_ERROR_ILLEGAL_ADDRESS"};
    }
    serving = b.version();
    return {cubridge::gate_reason::none, serving, {}};
  }
  cubridge::sink_result rollback(std::string_view) override {
    return {cubridge::gate_reason::no_previous_version, serving, "none"};
  }
  std::vector<cubridge::module_report> status() const override { return {}; }
  std::uint64_t serving = 0;
  std::uint64_t fault_on = 0;
};

TEST_F(UpdateGatePoisonTest, AnErrorWhileApplyingANewerVersionBlamesIt) {
  const auto faulting = std::make_shared<faulting_sink>();
  faulting->fault_on = 3;
  cubridge::update_gate gate(faulting, options());
  gate.start();
  ASSERT_EQ(gate.push(bundle(2)).outcome, gate_outcome::applied);
  // The listener runs inside the sink's apply, under the module's lock: it must not wait for it.
  expect_refused(gate.push(bundle(3)), "apply_failed", gate_outcome::failed);
  const auto recorded = gate.bad_versions();
  ASSERT_EQ(recorded.size(), 1u);
  EXPECT_EQ(recorded[0].version, 3u);
  EXPECT_EQ(recorded[0].reason, cubridge::gate_reason::sticky_error);
}

TEST_F(UpdateGatePoisonTest, AnErrorWhileGoingBackBlamesWhatServes) {
  const auto faulting = std::make_shared<faulting_sink>();
  cubridge::update_gate gate(faulting, options());
  gate.start();
  const auto v2 = bundle(2);
  ASSERT_EQ(gate.push(v2).outcome, gate_outcome::applied);
  ASSERT_EQ(gate.push(bundle(3)).outcome, gate_outcome::applied);
  faulting->fault_on = 2;  // the halt's way back to v2 meets an error of v3's traffic
  const cubridge::push_authority halt{2, true, "the halted rollout's stable version"};
  expect_refused(gate.push(v2, {}, &halt), "apply_failed", gate_outcome::failed);
  const auto recorded = gate.bad_versions();
  ASSERT_EQ(recorded.size(), 1u);
  EXPECT_EQ(recorded[0].version, 3u) << "v2 served before: it is not the suspect";
}

// --- the persisted state by default, its lock, start() -----------------------------------------

// `gate.start()` refused because another gate holds the state file: update_state_error locked.
void expect_locked(cubridge::update_gate& gate, const std::filesystem::path& file) {
  try {
    gate.start();
    ADD_FAILURE() << "a second gate started on " << file;
  } catch (const cubridge::update_state_error& e) {
    EXPECT_EQ(e.reason(), cubridge::update_state_reason::locked) << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find("'" + file.string() + "' is in use by another process"), std::string::npos)
        << what;
    EXPECT_NE(what.find("CUBRIDGE_STATE_DIR"), std::string::npos) << what;
  }
  EXPECT_FALSE(gate.started());
}

TEST_F(UpdateGateTest, WithoutAStateFileTheStateIsPersistedInTheDefaultDirectory) {
  cubridge::testing::temp_dir dir;
  const auto state_dir = dir.path / "state" / "cubridge";  // missing: made at start()
  cubridge::testing::scoped_env env("CUBRIDGE_STATE_DIR", state_dir.c_str());
  auto o = options();
  o.persist_state = true;  // the default
  {
    const auto gate = cubridge::update_gate::create(sink, o);
    EXPECT_TRUE(gate->state_file().empty()) << "nothing chosen before start()";
    gate->start();
    EXPECT_EQ(gate->state_file(), state_dir / "update-state.json");
    ASSERT_EQ(gate->push(bundle(4)).outcome, gate_outcome::applied);
  }
  EXPECT_TRUE(std::filesystem::is_regular_file(state_dir / "update-state.json"));
  struct ::stat status {};
  ASSERT_EQ(::stat(state_dir.c_str(), &status), 0);
  EXPECT_EQ(status.st_mode & 0777, 0700u);

  auto fresh = std::make_shared<cubridge::testing::memory_sink>();  // restarted, serving nothing:
                                                                    // v4 is still a replay
  const auto gate = cubridge::update_gate::create(fresh, o);
  gate->start();
  expect_refused(gate->push(bundle(4)), "replayed_version");
  expect_refused(gate->push(bundle(3)), "older_version");
  EXPECT_EQ(fresh->current_version("filters"), 0u);
  EXPECT_EQ(gate->push(bundle(5)).outcome, gate_outcome::applied);
}

TEST_F(UpdateGateTest, PersistingWithoutAnyStateDirectoryStopsTheStart) {
  cubridge::testing::scoped_env dir("CUBRIDGE_STATE_DIR", nullptr);
  cubridge::testing::scoped_env xdg("XDG_STATE_HOME", nullptr);
  cubridge::testing::scoped_env home("HOME", nullptr);
  auto o = options();
  o.persist_state = true;
  cubridge::update_gate gate(sink, o);
  try {
    gate.start();
    ADD_FAILURE() << "persisting with nowhere to persist started";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();
  }
  EXPECT_FALSE(gate.started());
  cubridge::update_gate memory_only(sink, options());  // the explicit opt-out needs no directory
  memory_only.start();
  EXPECT_TRUE(memory_only.state_file().empty());
}

TEST_F(UpdateGateTest, NothingIsDecidedBeforeStart) {
  cubridge::update_gate gate(sink, options());
  const auto d = gate.push(bundle(3));
  expect_refused(d, "not_started", gate_outcome::failed);
  expect_refused(gate.rollback(cubridge::sign_rollback_request("filters", 3, keys.secret_key)),
                 "not_started", gate_outcome::failed);
  EXPECT_EQ(sink->applies.load(), 0);
  gate.start();
  EXPECT_EQ(gate.push(bundle(3)).outcome, gate_outcome::applied);
}

TEST_F(UpdateGateTest, OneGatePerStateFileInThisProcess) {
  cubridge::testing::temp_dir dir;
  auto o = options();
  o.state_file = dir.path / "state.json";
  auto first = std::make_unique<cubridge::update_gate>(sink, o);
  first->start();
  EXPECT_TRUE(std::filesystem::exists(dir.path / "state.json.lock"));
  cubridge::update_gate second(sink, o);
  expect_locked(second, o.state_file);
  expect_refused(second.push(bundle(3)), "not_started", gate_outcome::failed);
  first.reset();   // releases the lock
  second.start();  // a start that threw may be retried
  EXPECT_TRUE(second.started());
  EXPECT_EQ(second.push(bundle(3)).outcome, gate_outcome::applied);
  cubridge::update_gate third(sink, o);
  expect_locked(third, o.state_file);
}

TEST_F(UpdateGateTest, OneGatePerStateFileAcrossProcesses) {
  cubridge::testing::temp_dir dir;
  auto o = options();
  o.state_file = dir.path / "state.json";
  cubridge::update_gate gate(sink, o);
  gate.start();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // another service on the same file
    int code = 1;
    try {
      auto other = std::make_shared<cubridge::testing::memory_sink>();
      cubridge::update_gate theirs(other, o);
      theirs.start();
    } catch (const cubridge::update_state_error& e) {
      code = e.reason() == cubridge::update_state_reason::locked ? 0 : 2;
    } catch (...) {
      code = 3;
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: started, 2: another reason, 3: another exception";
}

TEST_F(UpdateGateTest, StartIsIdempotentAndThreadSafe) {
  cubridge::testing::temp_dir dir;
  auto o = options();
  o.state_file = dir.path / "state.json";
  o.version_floor = {{"filters", 2}};
  const auto gate = cubridge::update_gate::create(sink, o);
  // Every door starts the gate; a second real start would find the file locked and throw.
  std::vector<std::thread> doors;
  std::atomic<int> failed{0};
  for (int i = 0; i < 4; ++i)
    doors.emplace_back([&] {
      try {
        gate->start();
      } catch (const std::exception&) {
        ++failed;
      }
    });
  for (auto& t : doors) t.join();
  EXPECT_EQ(failed.load(), 0);
  ASSERT_EQ(gate->push(bundle(3)).outcome, gate_outcome::applied);
  gate->start();  // later calls change nothing: the state is not loaded again over it
  EXPECT_EQ(gate->highest_version("filters"), 3u);
  expect_refused(gate->push(bundle(2)), "older_version");
}

// The gate holds its sink: the service's pointer may go first, and the gate still applies
// into it; a gate over no sink is refused when it is made, not when a push arrives.
TEST_F(UpdateGateTest, HoldsItsSinkAndRefusesNone) {
  const std::weak_ptr<cubridge::module_sink> watched = sink;
  const auto gate = cubridge::update_gate::create(std::exchange(sink, nullptr), options());
  gate->start();
  ASSERT_FALSE(watched.expired());
  EXPECT_EQ(gate->push(bundle(3)).outcome, gate_outcome::applied);
  EXPECT_EQ(gate->sink().current_version("filters"), 3u);
  EXPECT_THROW((void)cubridge::update_gate::create(nullptr, options()), cubridge::error);
}

TEST(UpdateStateReason, LockedHasItsName) {
  EXPECT_EQ(cubridge::to_string(cubridge::update_state_reason::locked), "locked");
}

// One vocabulary: every reason has its wire spelling, read back to itself; a bundle's reason
// is the gate's under the same name, but for expired (expired_bundle, beside expired_request).
TEST(GateReason, EveryReasonHasOneWireSpellingReadBackToItself) {
  using cubridge::gate_reason;
  std::set<std::string_view> names;
  for (int i = 1; i <= static_cast<int>(gate_reason::sticky_error); ++i) {
    const auto reason = static_cast<gate_reason>(i);
    const auto name = to_string(reason);
    EXPECT_FALSE(name.empty()) << i;
    EXPECT_NE(name, "unknown") << i;
    EXPECT_TRUE(names.insert(name).second) << name << " twice";
    EXPECT_EQ(cubridge::parse_gate_reason(name), reason) << name;
  }
  EXPECT_EQ(to_string(gate_reason::none), "");
  EXPECT_EQ(cubridge::parse_gate_reason(""), std::nullopt);
  EXPECT_EQ(cubridge::parse_gate_reason("none"), std::nullopt);
  EXPECT_EQ(cubridge::parse_gate_reason("Replayed_version"), std::nullopt);
  for (int i = 0; i <= static_cast<int>(cubridge::bundle_reason::bad_key); ++i) {
    const auto r = static_cast<cubridge::bundle_reason>(i);
    const auto g = cubridge::gate_reason_of(r);
    if (r == cubridge::bundle_reason::expired)
      EXPECT_EQ(g, gate_reason::expired_bundle);
    else
      EXPECT_EQ(to_string(g), to_string(r));
  }
  EXPECT_TRUE(cubridge::transient(gate_reason::state_failed));
  EXPECT_TRUE(cubridge::transient(gate_reason::busy));
  EXPECT_FALSE(cubridge::transient(gate_reason::bad_signature));
  // What a node records as bad: the probation's refusals and a poisoned process's serving version.
  for (int i = 0; i <= static_cast<int>(gate_reason::sticky_error); ++i) {
    const auto reason = static_cast<gate_reason>(i);
    const bool bad = reason == gate_reason::faulted_in_probation ||
                     reason == gate_reason::mismatch_in_probation ||
                     reason == gate_reason::sticky_error;
    EXPECT_EQ(cubridge::marks_bad(reason), bad) << to_string(reason);
    EXPECT_FALSE(cubridge::transient(reason) && bad) << to_string(reason);
  }
}

}  // namespace
