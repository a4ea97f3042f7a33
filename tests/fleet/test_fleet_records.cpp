// Tests of the fleet's pure parts, without a server: signed records (signed_record.hpp), the
// desired state (desired_state.hpp), the node registry (registry.hpp), results and heartbeats
// (records.hpp), server lists and credentials files (connection.hpp), names and subjects
// (subjects.hpp). Every reader is fed what a hostile or broken writer could put in the bucket or
// on a subject: each field missing, of another type, out of range.
#include <cubridge/bundle/bundle.hpp>
#include <cubridge/core/detail/hex.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/fleet/connection.hpp>
#include <cubridge/fleet/desired_state.hpp>
#include <cubridge/fleet/records.hpp>
#include <cubridge/fleet/registry.hpp>
#include <cubridge/fleet/rollout_words.hpp>
#include <cubridge/fleet/signed_record.hpp>
#include <cubridge/fleet/subjects.hpp>

#include "temp_dir.hpp"

#include <cubridge/version.hpp>

#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
namespace fleet = cubridge::fleet;
using cubridge::errc;
using cubridge::gate_outcome;
using cubridge::testing::temp_dir;
using cubridge::testing::write_text;

// ---------------------------------------------------------------------------------------------
// Helpers: JSON objects written field by field (each value as JSON text), so that a test can
// leave one field out or give it another value, and texts checked for what a terminal must not
// see.

using fields = std::vector<std::pair<std::string, std::string>>;

std::string object(const fields& members) {
  std::string out = "{";
  for (const auto& [name, value] : members) {
    if (out.size() > 1) out += ',';
    out += "\"" + name + "\":" + value;
  }
  return out + "}";
}

fields without(fields members, std::string_view name) {
  std::erase_if(members, [&](const auto& m) { return m.first == name; });
  return members;
}

fields with(fields members, std::string_view name, std::string value) {
  for (auto& m : members)
    if (m.first == name) {
      m.second = std::move(value);
      return members;
    }
  members.emplace_back(std::string(name), std::move(value));
  return members;
}

std::string json_text(std::string_view text) {
  return "\"" + std::string(text) + "\"";
}

// Whether every byte is printable ASCII (what a terminal shows as itself).
bool printable_ascii(std::string_view text) {
  for (const char c : text)
    if (c < 0x20 || c > 0x7e) return false;
  return true;
}

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

const std::string digest_a = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const std::string digest_b = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
const std::chrono::sys_seconds noon =
    std::chrono::sys_days{std::chrono::year{2026} / 11 / 29} + std::chrono::hours{12};
constexpr std::uint64_t uint64_max = std::numeric_limits<std::uint64_t>::max();

// Times at and beyond the edges of [earliest_record_time, latest_record_time].
const std::vector<std::string> times_refused = {
    "\"9999-12-31T23:59:59Z\"",
    "\"1970-01-01T00:00:00Z\"",
    "\"1999-12-31T23:59:59Z\"",
    "\"2200-01-01T00:00:01Z\"",
    "\"2026-11-29T12:00:00\"",
    "\"2026-11-29 12:00:00Z\"",
    "\"2026-02-30T12:00:00Z\"",
    "\"2026-11-29T24:00:00Z\"",
    "\"+2026-11-29T12:00:00Z\"",
    "\"\"",
    "1795003200",
};

// ---------------------------------------------------------------------------------------------
// subjects.hpp

TEST(FleetNames, CheckFleetNameTakesOneSubjectToken) {
  EXPECT_EQ(fleet::check_fleet_name("filters", "module name"), "");
  EXPECT_EQ(fleet::check_fleet_name("Node_1-a", "node id"), "");
  EXPECT_EQ(fleet::check_fleet_name(std::string(64, 'n'), "node id"), "");
  EXPECT_EQ(fleet::check_fleet_name("", "node id"), "node id is empty");
  EXPECT_EQ(fleet::check_fleet_name(std::string(65, 'n'), "node id"), "node id is over 64 bytes");
  for (const std::string_view bad :
       {"a.b", "a b", "a/b", "a*", "a>", "caf\xc3\xa9", "a\x1b[0m", "a\n"})
    EXPECT_EQ(fleet::check_fleet_name(bad, "module name"),
              "module name may hold only A-Z, a-z, 0-9, '_' and '-'")
        << bad;
}

TEST(FleetNames, Subjects) {
  EXPECT_EQ(fleet::bundle_subject("filters", 7, digest_a),
            "cubridge.bundle.filters.7.0123456789abcdef");
  EXPECT_EQ(fleet::bundle_subject("filters", uint64_max, digest_b),
            "cubridge.bundle.filters.18446744073709551615.fedcba9876543210");
  EXPECT_EQ(fleet::bundle_stream("filters"), "CUBRIDGE_BUNDLES_filters");
  EXPECT_EQ(fleet::bundle_subjects("filters"), "cubridge.bundle.filters.>");
  EXPECT_EQ(fleet::desired_key("filters"), "desired.filters");
  EXPECT_EQ(fleet::result_subject("filters", "node-1"), "cubridge.result.filters.node-1");
  EXPECT_EQ(fleet::result_subjects("filters"), "cubridge.result.filters.*");
  EXPECT_EQ(fleet::heartbeat_subject("node-1"), "cubridge.heartbeat.node-1");
}

// ---------------------------------------------------------------------------------------------
// signed_record.hpp

class SignedRecordTest : public ::testing::Test {
 protected:
  cubridge::keypair node_key = cubridge::generate_keypair();
  cubridge::keypair other_key = cubridge::generate_keypair();
  cubridge::trusted_keys trusted{node_key.public_key};
  const std::string body = R"({"value":"payload-text"})";

  std::string signed_result() const {
    return fleet::sign_record(fleet::record_kind::result, body, node_key.secret_key);
  }

  // The refusal of `text` as a result record, or a failure if it opened.
  std::string refusal_of(std::string_view text,
                         fleet::record_kind kind = fleet::record_kind::result) const {
    fleet::record_refusal refusal;
    const auto opened = fleet::open_record(text, kind, trusted, &refusal);
    EXPECT_FALSE(opened) << "opened: " << text.substr(0, 200);
    EXPECT_FALSE(refusal.why.empty());
    return refusal.why;
  }
};

// `text` with `from` (which must occur) replaced once by `to`.
std::string replaced(std::string text, std::string_view from, std::string_view to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from << " not in " << text;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// `text` with the hex digit at `at` changed to another lower-case hex digit.
std::string flipped_hex(std::string text, std::size_t at) {
  text[at] = text[at] == '0' ? '1' : '0';
  return text;
}

TEST_F(SignedRecordTest, KindNames) {
  EXPECT_EQ(fleet::to_string(fleet::record_kind::desired_state), "desired_state");
  EXPECT_EQ(fleet::to_string(fleet::record_kind::registry), "registry");
  EXPECT_EQ(fleet::to_string(fleet::record_kind::result), "result");
  EXPECT_EQ(fleet::to_string(fleet::record_kind::heartbeat), "heartbeat");
}

TEST_F(SignedRecordTest, AGoodRecordOpensWithTheRightKey) {
  const auto text = signed_result();
  EXPECT_TRUE(contains(text, "\"cubridge_fleet\":1")) << text;
  EXPECT_TRUE(contains(text, "\"kind\":\"result\"")) << text;
  EXPECT_TRUE(contains(text, "\"signer\":\"" + cubridge::to_hex(node_key.public_key.id()) + "\""))
      << text;
  fleet::record_refusal refusal;
  const auto opened = fleet::open_record(text, fleet::record_kind::result, trusted, &refusal);
  ASSERT_TRUE(opened) << refusal.why;
  EXPECT_EQ(opened->body, body);
  EXPECT_EQ(opened->signer, node_key.public_key.id());
  // Among several trusted keys, the signer's is found; and without a refusal to fill in.
  const cubridge::trusted_keys both{other_key.public_key, node_key.public_key};
  const auto again = fleet::open_record(text, fleet::record_kind::result, both);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->body, body);
  // Every kind signs and opens as itself.
  for (const auto kind : {fleet::record_kind::desired_state, fleet::record_kind::registry,
                          fleet::record_kind::heartbeat}) {
    const auto record = fleet::sign_record(kind, body, node_key.secret_key);
    const auto opened_kind = fleet::open_record(record, kind, trusted);
    ASSERT_TRUE(opened_kind) << fleet::to_string(kind);
    EXPECT_EQ(opened_kind->body, body);
  }
}

TEST_F(SignedRecordTest, AnotherKindIsRefused) {
  const auto beat = fleet::sign_record(fleet::record_kind::heartbeat, body, node_key.secret_key);
  const auto why = refusal_of(beat, fleet::record_kind::result);
  EXPECT_TRUE(contains(why, "heartbeat") && contains(why, "result")) << why;
  EXPECT_FALSE(fleet::open_record(signed_result(), fleet::record_kind::desired_state, trusted));
  // The kind is signed too: a heartbeat relabelled as a result does not verify.
  const auto relabelled = replaced(beat, "\"kind\":\"heartbeat\"", "\"kind\":\"result\"");
  const auto why_relabelled = refusal_of(relabelled);
  EXPECT_TRUE(contains(why_relabelled, "signature does not verify")) << why_relabelled;
}

TEST_F(SignedRecordTest, AFlippedByteIsRefused) {
  const auto text = signed_result();
  // In the body.
  const auto body_changed = replaced(text, "payload-text", "payload-texu");
  auto why = refusal_of(body_changed);
  EXPECT_TRUE(contains(
      why, "signature does not verify with key " + cubridge::to_hex(node_key.public_key.id())))
      << why;
  // In the signature: first, middle and last digit.
  const auto signature_at = text.find("\"signature\":\"") + 13;
  for (const std::size_t offset : {0u, 64u, 127u}) {
    why = refusal_of(flipped_hex(text, signature_at + offset));
    EXPECT_TRUE(contains(why, "signature does not verify")) << offset << ": " << why;
  }
  // In the signer: an unknown key.
  const auto signer_at = text.find("\"signer\":\"") + 10;
  why = refusal_of(flipped_hex(text, signer_at + 15));
  EXPECT_TRUE(contains(why, "is not a trusted key")) << why;
  // The signer named as another trusted key: its key does not verify the signature.
  const cubridge::trusted_keys both{node_key.public_key, other_key.public_key};
  const auto other_signer = replaced(text, cubridge::to_hex(node_key.public_key.id()),
                                     cubridge::to_hex(other_key.public_key.id()));
  fleet::record_refusal refusal;
  EXPECT_FALSE(fleet::open_record(other_signer, fleet::record_kind::result, both, &refusal));
  EXPECT_TRUE(contains(refusal.why, "signature does not verify with key " +
                                        cubridge::to_hex(other_key.public_key.id())))
      << refusal.why;
}

TEST_F(SignedRecordTest, AnUntrustedSignerIsRefused) {
  const auto text = fleet::sign_record(fleet::record_kind::result, body, other_key.secret_key);
  const auto why = refusal_of(text);
  EXPECT_TRUE(contains(
      why, "signer " + cubridge::to_hex(other_key.public_key.id()) + " is not a trusted key"))
      << why;
  EXPECT_FALSE(
      fleet::open_record(signed_result(), fleet::record_kind::result, cubridge::trusted_keys{}));
}

TEST_F(SignedRecordTest, TheFormatIsChecked) {
  const auto text = signed_result();
  // An extra field.
  auto why = refusal_of(text.substr(0, text.size() - 1) + ",\"extra\":1}");
  EXPECT_TRUE(contains(why, "fields other than the five")) << why;
  // The format missing, of another type or another number.
  for (const std::string_view format : {"\"cubridge_fleet\":2", "\"cubridge_fleet\":\"1\"",
                                        "\"cubridge_fleet\":1.0", "\"cubridge_fleet\":-1"}) {
    why = refusal_of(replaced(text, "\"cubridge_fleet\":1", format));
    EXPECT_TRUE(contains(why, "format 1")) << format << ": " << why;
  }
  why = refusal_of(replaced(text, "\"cubridge_fleet\":1,", ""));
  EXPECT_TRUE(contains(why, "format 1")) << why;
  // A field of another type.
  why = refusal_of(replaced(text, "\"kind\":\"result\"", "\"kind\":3"));
  EXPECT_TRUE(contains(why, "lacks kind, signer, body or signature")) << why;
  // The signer or signature in upper case or of another length.
  const auto signer = cubridge::to_hex(node_key.public_key.id());
  std::string upper = signer;
  for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (upper != signer) {
    why = refusal_of(replaced(text, signer, upper));
    EXPECT_TRUE(contains(why, "signer is not 16 lower-case hex digits")) << why;
  }
  why = refusal_of(replaced(text, signer, signer.substr(1)));
  EXPECT_TRUE(contains(why, "signer is not 16 lower-case hex digits")) << why;
  const auto signature_at = text.find("\"signature\":\"") + 13;
  why = refusal_of(std::string(text).erase(signature_at, 1));
  EXPECT_TRUE(contains(why, "signature is not 128 lower-case hex digits")) << why;
  // Not an object at all.
  for (const std::string_view not_object : {"", "[1,2]", "\"text\"", "{", "null", "garbage"}) {
    why = refusal_of(not_object);
    EXPECT_TRUE(contains(why, "not a JSON object")) << not_object << ": " << why;
  }
}

TEST_F(SignedRecordTest, AMissingFieldIsNamedAsMissing) {
  // The signature or the kind left out: the refusal says which is lacking, not that the record
  // has fields other than the five.
  const auto text = signed_result();
  const auto signature_at = text.find(",\"signature\":\"");
  const auto signature_end = text.find('"', signature_at + 14) + 1;
  const auto no_signature = std::string(text).erase(signature_at, signature_end - signature_at);
  ASSERT_EQ(no_signature.find("signature"), std::string::npos) << no_signature;
  const auto why = refusal_of(no_signature);
  EXPECT_TRUE(contains(why, "lacks") && contains(why, "signature")) << why;
  const auto no_kind = replaced(text, "\"kind\":\"result\",", "");
  const auto why_kind = refusal_of(no_kind);
  EXPECT_TRUE(contains(why_kind, "lacks") && contains(why_kind, "kind")) << why_kind;
}

TEST_F(SignedRecordTest, ARecordOverTheLimitIsRefused) {
  const auto text = signed_result();
  // Padded with whitespace (still one valid JSON object) to the limit: it opens.
  auto at_limit = text + std::string(fleet::max_signed_record_bytes - text.size(), ' ');
  ASSERT_EQ(at_limit.size(), fleet::max_signed_record_bytes);
  fleet::record_refusal refusal;
  EXPECT_TRUE(fleet::open_record(at_limit, fleet::record_kind::result, trusted, &refusal))
      << refusal.why;
  // One byte more: refused before parsing.
  const auto why = refusal_of(at_limit + ' ');
  EXPECT_TRUE(contains(why, "record of 4194305 bytes is over 4194304")) << why;
}

TEST_F(SignedRecordTest, TextThatIsNotUtf8OrHoldsANulIsRefused) {
  const auto text = signed_result();
  const auto at = text.find("payload-text") + 8;
  auto why = refusal_of(replaced(text, "payload-text", "payload-\xfftext"));
  EXPECT_TRUE(contains(why, "invalid UTF-8 at offset " + std::to_string(at))) << why;
  why = refusal_of(replaced(text, "payload-text", "payload-\xc0\xaftext"));  // overlong '/'
  EXPECT_TRUE(contains(why, "invalid UTF-8")) << why;
  why = refusal_of(replaced(text, "payload-text", std::string_view("payload-\0text", 13)));
  EXPECT_TRUE(contains(why, "NUL byte at offset " + std::to_string(at))) << why;
  // After the object too (nlohmann would stop reading at the NUL).
  why = refusal_of(text + std::string("\0{}", 3));
  EXPECT_TRUE(contains(why, "NUL byte at offset " + std::to_string(text.size()))) << why;
}

TEST_F(SignedRecordTest, ABodyHoldingANulIsRefused) {
  // signed_record.hpp: open_record refuses "a body that is not valid UTF-8 without NUL bytes".
  // A NUL written as the JSON escape \u0000 passes the check of the envelope's bytes and comes
  // out in the body, where the parser of the body stops reading (bytes after it are signed but
  // never parsed).
  const std::string nul_body("{\"value\":1}\0{\"value\":2}", 23);
  const auto text = fleet::sign_record(fleet::record_kind::result, nul_body, node_key.secret_key);
  EXPECT_TRUE(contains(text, "\\u0000")) << text;
  const auto why = refusal_of(text);
  EXPECT_TRUE(contains(why, "NUL")) << why;
}

// ---------------------------------------------------------------------------------------------
// desired_state.hpp

std::string ref_text(std::uint64_t version, const std::string& digest = digest_a,
                     std::string size = "4096", std::string target = "\"sm_90\"") {
  return object({{"version", std::to_string(version)},
                 {"digest", json_text(digest)},
                 {"size", std::move(size)},
                 {"target", std::move(target)}});
}

fields desired_fields() {
  return {{"module", "\"filters\""},
          {"revision", "4"},
          {"phase", "\"complete\""},
          {"stable", ref_text(7)},
          {"candidate", "null"},
          {"canaries", "[]"},
          {"reason", "\"\""},
          {"reason_version", "0"},
          {"history", "[" + ref_text(5, digest_b) + "," + ref_text(6) + "]"},
          {"time", "\"2026-11-29T12:00:00Z\""}};
}

fields canary_fields() {
  return with(
      with(with(desired_fields(), "phase", "\"canary\""), "candidate", ref_text(8, digest_b)),
      "canaries", "[\"node-2\",\"node-1\"]");
}

fleet::bundle_ref bundle(std::uint64_t version, const std::string& digest = digest_a) {
  return {.version = version, .digest = digest, .size = 4096, .target = "sm_90"};
}

// The refusal of `body` as a desired state, or a failure if it parsed.
std::string desired_refusal(const std::string& body) {
  std::string why;
  const auto state = fleet::parse_desired_state(body, &why);
  EXPECT_FALSE(state) << "parsed: " << body.substr(0, 300);
  EXPECT_FALSE(why.empty()) << body.substr(0, 300);
  return why;
}

TEST(DesiredState, PhaseNames) {
  for (const auto phase : {fleet::rollout_phase::complete, fleet::rollout_phase::canary,
                           fleet::rollout_phase::halted, fleet::rollout_phase::rolled_back})
    EXPECT_EQ(fleet::parse_rollout_phase(fleet::to_string(phase)), phase);
  EXPECT_EQ(fleet::to_string(fleet::rollout_phase::rolled_back), "rolled_back");
  EXPECT_FALSE(fleet::parse_rollout_phase("Complete"));
  EXPECT_FALSE(fleet::parse_rollout_phase(""));
}

TEST(RolloutWords, KeepTheirSpelling) {
  using fleet::halt_signal;
  for (const auto s : {halt_signal::sticky_error, halt_signal::probe, halt_signal::failure_rate,
                       halt_signal::metric, halt_signal::baseline_unhealthy,
                       halt_signal::canary_lost, halt_signal::canary_restarted,
                       halt_signal::canary_left, halt_signal::result, halt_signal::deadline})
    EXPECT_EQ(fleet::parse_halt_signal(fleet::to_string(s)), s);
  EXPECT_EQ(fleet::to_string(halt_signal::canary_lost), "canary_lost");
  EXPECT_EQ(fleet::to_string(halt_signal::none), "");
  EXPECT_FALSE(fleet::parse_halt_signal(""));
  EXPECT_FALSE(fleet::parse_halt_signal("Canary_lost"));
  EXPECT_EQ(fleet::signal_text(halt_signal::metric, "p99_us"), "metric:p99_us");
  EXPECT_EQ(fleet::signal_text(halt_signal::probe, "ignored"), "probe");
  EXPECT_EQ(fleet::to_string(fleet::rollout_step::started), "started");
  EXPECT_EQ(fleet::to_string(fleet::rollout_step::completed), "completed");
}

// The wave plan's words on the wire are 0.1.0's: durations in whole milliseconds, and "halted"
// written from the phase, the one place that says it.
TEST(DesiredState, AWavePlanKeepsItsWireWords) {
  fleet::desired_state s;
  s.module = "filters";
  s.revision = 3;
  s.phase = fleet::rollout_phase::halted;
  s.stable = fleet::bundle_ref{1, std::string(64, 'a'), 10, "sm_90"};
  fleet::wave_plan plan;
  plan.candidate = fleet::bundle_ref{2, std::string(64, 'b'), 10, "sm_90"};
  plan.sizes = {"1", "100%"};
  plan.nodes = {{"n1"}, {}};
  plan.started = "2026-12-06T04:00:00Z";
  plan.bake = std::chrono::seconds(30);
  plan.deadline = std::chrono::minutes(10);
  s.waves = plan;
  EXPECT_TRUE(s.waves_halted());
  const auto body = fleet::to_json(s);
  EXPECT_NE(body.find("\"bake_ms\":30000"), std::string::npos) << body;
  EXPECT_NE(body.find("\"deadline_ms\":600000"), std::string::npos) << body;
  EXPECT_NE(body.find("\"halted\":true"), std::string::npos) << body;
  const auto back = fleet::parse_desired_state(body);
  ASSERT_TRUE(back);
  ASSERT_TRUE(back->waves);
  EXPECT_EQ(back->waves->bake, std::chrono::milliseconds(30000));
  EXPECT_EQ(back->waves->deadline, std::chrono::minutes(10));
  EXPECT_TRUE(back->waves_halted());
  s.phase = fleet::rollout_phase::canary;
  EXPECT_FALSE(s.waves_halted());
  EXPECT_NE(fleet::to_json(s).find("\"halted\":false"), std::string::npos);
}

TEST(DesiredState, RoundTrip) {
  fleet::desired_state state;
  state.module = "filters";
  state.revision = uint64_max;
  state.phase = fleet::rollout_phase::canary;
  state.stable = bundle(7);
  state.candidate = bundle(uint64_max, digest_b);
  state.candidate->size = uint64_max;
  state.canaries = {"node-1", "node-2"};
  state.reason = "canary node-3 refused it";
  state.reason_version = 6;
  for (std::uint64_t v = 1; v <= fleet::max_desired_history; ++v)
    state.history.push_back(bundle(v));
  state.time = "2026-11-29T12:00:00Z";
  state.software = "cubridge 9.8.7";
  const auto body = fleet::to_json(state);
  std::string why;
  const auto back = fleet::parse_desired_state(body, &why);
  ASSERT_TRUE(back) << why << "\n" << body;
  EXPECT_EQ(back->module, state.module);
  EXPECT_EQ(back->revision, state.revision);
  EXPECT_EQ(back->phase, state.phase);
  EXPECT_EQ(back->stable, state.stable);
  EXPECT_EQ(back->candidate, state.candidate);
  EXPECT_EQ(back->canaries, state.canaries);
  EXPECT_EQ(back->reason, state.reason);
  EXPECT_EQ(back->reason_version, state.reason_version);
  EXPECT_EQ(back->history, state.history);
  EXPECT_EQ(back->time, state.time);
  EXPECT_EQ(back->software, state.software);
  EXPECT_EQ(fleet::to_json(*back), body);

  // No stable version yet, every other phase.
  for (const auto phase : {fleet::rollout_phase::complete, fleet::rollout_phase::halted,
                           fleet::rollout_phase::rolled_back}) {
    fleet::desired_state other;
    other.module = "m";
    other.revision = 1;
    other.phase = phase;
    const auto parsed = fleet::parse_desired_state(fleet::to_json(other), &why);
    ASSERT_TRUE(parsed) << why;
    EXPECT_EQ(parsed->phase, phase);
    EXPECT_FALSE(parsed->stable);
    EXPECT_FALSE(parsed->candidate);
  }
}

TEST(DesiredState, HandWrittenBodiesParse) {
  std::string why;
  const auto state = fleet::parse_desired_state(object(desired_fields()), &why);
  ASSERT_TRUE(state) << why;
  EXPECT_EQ(state->module, "filters");
  EXPECT_EQ(state->revision, 4u);
  ASSERT_TRUE(state->stable);
  EXPECT_EQ(*state->stable, bundle(7));
  ASSERT_EQ(state->history.size(), 2u);
  EXPECT_EQ(state->history[0], bundle(5, digest_b));
  // The canaries come out sorted, whatever order they were written in.
  const auto canary = fleet::parse_desired_state(object(canary_fields()), &why);
  ASSERT_TRUE(canary) << why;
  EXPECT_EQ(canary->canaries, (std::vector<std::string>{"node-1", "node-2"}));
  // What wrote it is optional (a record of a controller that predates the field); a text if given.
  EXPECT_EQ(state->software, "");
  EXPECT_FALSE(fleet::parse_desired_state(object(with(desired_fields(), "software", "7")), &why));
}

TEST(DesiredState, EveryFieldMissingOrOfAnotherTypeIsRefused) {
  // Each field with values of another type; the refusal names the field.
  const std::vector<std::pair<std::string, std::vector<std::string>>> wrong = {
      {"module", {"7", "null", "[\"filters\"]"}},
      {"revision", {"\"4\"", "-1", "1.5", "true", "null"}},
      {"phase", {"1", "null", "[\"complete\"]"}},
      {"stable", {"7", "\"x\"", "[]", "true"}},
      {"candidate", {"7", "\"x\"", "[]"}},
      {"canaries", {"{}", "\"node-1\"", "null", "[7]", "[null]"}},
      {"reason", {"0", "null", "{}"}},
      {"reason_version", {"\"0\"", "-1", "0.5", "null"}},
      {"history", {"{}", "null", "7"}},
      {"time", {"0", "null", "[]"}},
  };
  for (const auto& [name, values] : wrong) {
    auto why = desired_refusal(object(without(desired_fields(), name)));
    EXPECT_TRUE(contains(why, "'" + name + "'")) << name << " missing: " << why;
    for (const auto& value : values) {
      why = desired_refusal(object(with(desired_fields(), name, value)));
      EXPECT_TRUE(contains(why, "'" + name + "'")) << name << " = " << value << ": " << why;
    }
  }
  // Not an object.
  for (const std::string_view body : {"", "[]", "null", "{\"module\":", "\"filters\""})
    EXPECT_TRUE(contains(desired_refusal(std::string(body)), "not a JSON object")) << body;
}

TEST(DesiredState, EveryFieldOfABundleIsChecked) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> wrong = {
      {"version", {"0", "-1", "\"7\"", "1.5", "null"}},
      {"digest", {"7", "null"}},
      {"size", {"0", "-1", "\"4096\"", "null"}},
      {"target", {"90", "null"}},
  };
  const fields good = {
      {"version", "7"}, {"digest", json_text(digest_a)}, {"size", "4096"}, {"target", "\"sm_90\""}};
  for (const auto& place : {"stable", "candidate", "history"}) {
    const auto put = [&](const std::string& ref) {
      if (std::string_view(place) == "history")
        return with(desired_fields(), "history", "[" + ref + "]");
      if (std::string_view(place) == "candidate") return with(canary_fields(), "candidate", ref);
      return with(desired_fields(), "stable", ref);
    };
    for (const auto& [name, values] : wrong) {
      auto why = desired_refusal(object(put(object(without(good, name)))));
      EXPECT_TRUE(contains(why, "'" + name + "'")) << place << "." << name << " missing: " << why;
      for (const auto& value : values) {
        why = desired_refusal(object(put(object(with(good, name, value)))));
        EXPECT_TRUE(contains(why, "'" + name + "'"))
            << place << "." << name << " = " << value << ": " << why;
      }
    }
  }
}

TEST(DesiredState, ADigestIsSixtyFourLowerCaseHexDigits) {
  std::string upper = digest_a;
  for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const auto& digest : {digest_a.substr(1), digest_a + "0", upper, std::string(64, 'g'),
                             digest_a.substr(0, 63) + " ", std::string()}) {
    const auto why = desired_refusal(object(with(desired_fields(), "stable", ref_text(7, digest))));
    EXPECT_TRUE(contains(why, "'stable.digest' is not 64 lower-case hex digits"))
        << digest << ": " << why;
    const auto in_candidate =
        desired_refusal(object(with(canary_fields(), "candidate", ref_text(8, digest))));
    EXPECT_TRUE(contains(in_candidate, "'candidate.digest'")) << digest << ": " << in_candidate;
  }
}

TEST(DesiredState, ValuesOutOfRangeAreRefused) {
  EXPECT_TRUE(contains(desired_refusal(object(with(desired_fields(), "revision", "0"))),
                       "'revision' is 0"));
  EXPECT_TRUE(contains(desired_refusal(object(with(desired_fields(), "stable", ref_text(0)))),
                       "'version' is 0"));
  // Past 2^64 - 1: not a whole number the record can hold.
  EXPECT_TRUE(
      contains(desired_refusal(object(with(desired_fields(), "revision", "18446744073709551616"))),
               "'revision'"));
  EXPECT_FALSE(desired_refusal(object(with(desired_fields(), "revision", "1e400"))).empty());
  std::string why;
  const auto largest = fleet::parse_desired_state(
      object(with(desired_fields(), "revision", "18446744073709551615")), &why);
  ASSERT_TRUE(largest) << why;
  EXPECT_EQ(largest->revision, uint64_max);
  // The phase by its name only.
  EXPECT_TRUE(contains(desired_refusal(object(with(desired_fields(), "phase", "\"finished\""))),
                       "'phase' is not complete, canary, halted or rolled_back"));
  EXPECT_TRUE(
      contains(desired_refusal(object(with(desired_fields(), "phase", "\"CANARY\""))), "'phase'"));
}

TEST(DesiredState, NamesAreFleetNames) {
  for (const auto& module :
       {std::string("a.b"), std::string(65, 'm'), std::string(), std::string("a b"),
        std::string("\\u001b[31m"), std::string("caf\xc3\xa9")}) {
    const auto why = desired_refusal(object(with(desired_fields(), "module", json_text(module))));
    EXPECT_TRUE(contains(why, "module name")) << module << ": " << why;
    EXPECT_TRUE(printable_ascii(why)) << why;
  }
  std::string why;
  ASSERT_TRUE(fleet::parse_desired_state(
      object(with(desired_fields(), "module", json_text(std::string(64, 'm')))), &why))
      << why;
  for (const auto& canary :
       {std::string("n.1"), std::string(65, 'n'), std::string(), std::string("node 1")}) {
    const auto refused = desired_refusal(
        object(with(canary_fields(), "canaries", "[\"node-1\"," + json_text(canary) + "]")));
    EXPECT_TRUE(contains(refused, "'canaries' holds something that is not a node id"))
        << canary << ": " << refused;
  }
}

TEST(DesiredState, AtMostTheMaximumCanariesAndHistory) {
  const auto canaries = [](std::size_t n) {
    std::string list = "[";
    for (std::size_t i = 0; i < n; ++i) list += (i ? ",\"n" : "\"n") + std::to_string(i) + "\"";
    return list + "]";
  };
  std::string why;
  const auto most = fleet::parse_desired_state(
      object(with(canary_fields(), "canaries", canaries(fleet::max_desired_canaries))), &why);
  ASSERT_TRUE(most) << why;
  EXPECT_EQ(most->canaries.size(), fleet::max_desired_canaries);
  EXPECT_TRUE(contains(desired_refusal(object(with(canary_fields(), "canaries",
                                                   canaries(fleet::max_desired_canaries + 1)))),
                       "'canaries' is not a list of at most 10000"));

  const auto history = [](std::size_t n) {
    std::string list = "[";
    for (std::size_t i = 0; i < n; ++i) list += (i ? "," : "") + ref_text(i + 1);
    return list + "]";
  };
  const auto full = fleet::parse_desired_state(
      object(with(desired_fields(), "history", history(fleet::max_desired_history))), &why);
  ASSERT_TRUE(full) << why;
  EXPECT_EQ(full->history.size(), fleet::max_desired_history);
  EXPECT_TRUE(contains(desired_refusal(object(with(desired_fields(), "history",
                                                   history(fleet::max_desired_history + 1)))),
                       "'history' is not a list of at most 8"));
}

TEST(DesiredState, AHistoryEntryThatIsNoBundleIsRefused) {
  for (const auto& entry : {std::string("7"), std::string("\"x\""), std::string("[]"), ref_text(0),
                            ref_text(5, digest_a.substr(1))})
    (void)desired_refusal(
        object(with(desired_fields(), "history", "[" + ref_text(5) + "," + entry + "]")));
}

TEST(DesiredState, AHistoryEntryRefusalNamesTheHistory) {
  // Not "'h' is neither a bundle nor null": 'h' is no field of the record.
  for (const auto& entry : {std::string("7"), ref_text(5, digest_a.substr(1))}) {
    const auto why = desired_refusal(
        object(with(desired_fields(), "history", "[" + ref_text(5) + "," + entry + "]")));
    EXPECT_TRUE(contains(why, "'history")) << entry << ": " << why;
    EXPECT_FALSE(contains(why, "'h'") || contains(why, "'h.")) << entry << ": " << why;
  }
}

TEST(DesiredState, ANullHistoryEntryIsRefused) {
  // desired_state.hpp: history holds "earlier stable bundles"; a null is none, and is neither
  // kept nor to vanish silently (the record would read as another than was signed).
  const auto why =
      desired_refusal(object(with(desired_fields(), "history", "[" + ref_text(5) + ",null]")));
  EXPECT_TRUE(contains(why, "history")) << why;
}

TEST(DesiredState, PhaseCanaryNeedsACandidateAndCanaries) {
  const auto no_candidate = with(canary_fields(), "candidate", "null");
  EXPECT_TRUE(contains(desired_refusal(object(no_candidate)),
                       "phase canary without a candidate and canaries"));
  const auto no_canaries = with(canary_fields(), "canaries", "[]");
  EXPECT_TRUE(contains(desired_refusal(object(no_canaries)),
                       "phase canary without a candidate and canaries"));
  std::string why;
  EXPECT_TRUE(fleet::parse_desired_state(object(canary_fields()), &why)) << why;
}

TEST(DesiredState, ReasonsComeOutPrintable) {
  std::string why;
  const auto state = fleet::parse_desired_state(
      object(with(desired_fields(), "reason", "\"\\u001b[31mred\\u001b[0m\\u0007 caf\\u00e9\"")),
      &why);
  ASSERT_TRUE(state) << why;
  EXPECT_EQ(state->reason, "?[31mred?[0m? caf??");
  // Written printable too, and cut with "...".
  fleet::desired_state written;
  written.module = "filters";
  written.revision = 1;
  written.reason = "\x1b]0;title\x07" + std::string(5000, 'r');
  const auto body = fleet::to_json(written);
  EXPECT_TRUE(printable_ascii(body)) << body.substr(0, 200);
  EXPECT_FALSE(contains(body, "\\u00")) << body.substr(0, 200);
  const auto back = fleet::parse_desired_state(body, &why);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(back->reason.substr(0, 10), "?]0;title?");
  EXPECT_EQ(back->reason.size(), 2048u + 3u);
  EXPECT_EQ(back->reason.substr(back->reason.size() - 4), "r...");
  EXPECT_EQ(fleet::to_json(*back), body);
}

TEST(DesiredState, TargetForGivesTheCandidateOnlyToCanariesInPhaseCanary) {
  fleet::desired_state state;
  state.module = "filters";
  state.revision = 3;
  state.phase = fleet::rollout_phase::canary;
  state.stable = bundle(7);
  state.candidate = bundle(8, digest_b);
  state.canaries = {"node-1", "node-3"};
  ASSERT_NE(state.target_for("node-1"), nullptr);
  EXPECT_EQ(*state.target_for("node-1"), *state.candidate);
  EXPECT_EQ(*state.target_for("node-3"), *state.candidate);
  EXPECT_EQ(*state.target_for("node-2"), *state.stable);
  EXPECT_EQ(*state.target_for("node"), *state.stable);
  EXPECT_EQ(*state.target_for(""), *state.stable);
  // Another phase: everyone gets stable, canaries included.
  for (const auto phase : {fleet::rollout_phase::complete, fleet::rollout_phase::halted,
                           fleet::rollout_phase::rolled_back}) {
    state.phase = phase;
    ASSERT_NE(state.target_for("node-1"), nullptr);
    EXPECT_EQ(state.target_for("node-1"), &*state.stable) << fleet::to_string(phase);
    EXPECT_EQ(state.target_for("node-2"), &*state.stable);
  }
  // No stable version: nothing for a node that is no canary.
  state.phase = fleet::rollout_phase::canary;
  state.stable.reset();
  EXPECT_EQ(state.target_for("node-2"), nullptr);
  EXPECT_EQ(state.target_for("node-1"), &*state.candidate);
  state.phase = fleet::rollout_phase::complete;
  EXPECT_EQ(state.target_for("node-1"), nullptr);
  // A canary phase whose candidate is gone: stable, or nothing.
  state.phase = fleet::rollout_phase::canary;
  state.candidate.reset();
  EXPECT_EQ(state.target_for("node-1"), nullptr);
  state.stable = bundle(7);
  EXPECT_EQ(state.target_for("node-1"), &*state.stable);
}

// ---------------------------------------------------------------------------------------------
// registry.hpp

class RegistryTest : public ::testing::Test {
 protected:
  cubridge::public_key key_1 = cubridge::generate_keypair().public_key;
  cubridge::public_key key_2 = cubridge::generate_keypair().public_key;

  fields node_fields(const cubridge::public_key& key) const {
    return {{"key", json_text(cubridge::detail::to_hex(key.bytes))},
            {"labels", "{\"cohort\":\"canary\"}"}};
  }
  std::string body_with_node(const std::string& id, const std::string& node) const {
    return object({{"revision", "2"}, {"nodes", object({{id, node}})}});
  }
  std::string refusal_of(const std::string& body) const {
    std::string why;
    EXPECT_FALSE(fleet::parse_registry(body, &why)) << "parsed: " << body.substr(0, 300);
    EXPECT_FALSE(why.empty());
    return why;
  }
};

TEST_F(RegistryTest, RoundTripAndFind) {
  fleet::node_registry registry;
  registry.revision = uint64_max;
  registry.nodes["node-1"] = {key_1, {{"cohort", "canary"}, {"rack", "r-12"}}};
  registry.nodes["node-2"] = {key_2, {}};
  const auto body = fleet::to_json(registry);
  std::string why;
  const auto back = fleet::parse_registry(body, &why);
  ASSERT_TRUE(back) << why << "\n" << body;
  EXPECT_EQ(back->revision, uint64_max);
  ASSERT_EQ(back->nodes.size(), 2u);
  const auto* node_1 = back->find("node-1");
  ASSERT_NE(node_1, nullptr);
  EXPECT_EQ(node_1->key, key_1);
  EXPECT_EQ(node_1->labels, registry.nodes["node-1"].labels);
  const auto* node_2 = back->find("node-2");
  ASSERT_NE(node_2, nullptr);
  EXPECT_EQ(node_2->key, key_2);
  EXPECT_TRUE(node_2->labels.empty());
  EXPECT_EQ(back->find("node-3"), nullptr);
  EXPECT_EQ(back->find(""), nullptr);
  EXPECT_EQ(back->find("node-"), nullptr);
  EXPECT_EQ(fleet::to_json(*back), body);
  // An empty registry.
  const auto empty = fleet::parse_registry("{\"revision\":1,\"nodes\":{}}", &why);
  ASSERT_TRUE(empty) << why;
  EXPECT_TRUE(empty->nodes.empty());
}

TEST_F(RegistryTest, TheRevisionAndNodesAreChecked) {
  const auto nodes = object({{"node-1", object(node_fields(key_1))}});
  for (const auto& revision : {"0", "-1", "1.5", "\"2\"", "null", "18446744073709551616"})
    EXPECT_TRUE(contains(refusal_of(object({{"revision", revision}, {"nodes", nodes}})),
                         "registry 'revision' is not a positive whole number"))
        << revision;
  EXPECT_TRUE(contains(refusal_of(object({{"nodes", nodes}})), "'revision'"));
  for (const auto& bad : {"[]", "null", "7", "\"x\""})
    EXPECT_TRUE(contains(refusal_of(object({{"revision", "2"}, {"nodes", bad}})),
                         "registry 'nodes' is not an object of at most 100000 nodes"))
        << bad;
  EXPECT_TRUE(contains(refusal_of(object({{"revision", "2"}})), "'nodes'"));
  for (const std::string_view body : {"", "[]", "{\"revision\":"})
    EXPECT_TRUE(contains(refusal_of(std::string(body)), "registry is not a JSON object")) << body;
}

TEST_F(RegistryTest, NodeIdsAreFleetNames) {
  const auto node = object(node_fields(key_1));
  EXPECT_TRUE(contains(refusal_of(body_with_node("node.1", node)), "node id may hold only"));
  EXPECT_TRUE(
      contains(refusal_of(body_with_node(std::string(65, 'n'), node)), "node id is over 64 bytes"));
  EXPECT_TRUE(contains(refusal_of(body_with_node("", node)), "node id is empty"));
  std::string why;
  EXPECT_TRUE(fleet::parse_registry(body_with_node(std::string(64, 'n'), node), &why)) << why;
}

TEST_F(RegistryTest, EveryFieldOfANodeIsChecked) {
  EXPECT_TRUE(contains(refusal_of(body_with_node("node-1", "7")),
                       "registry entry of 'node-1' is not an object"));
  EXPECT_TRUE(contains(refusal_of(body_with_node("node-1", "[]")), "is not an object"));
  const auto hex = cubridge::detail::to_hex(key_1.bytes);
  std::string upper = hex;
  for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const auto& key : {json_text(hex.substr(1)), json_text(hex + "0"), json_text(upper),
                          json_text(std::string(64, 'g')), std::string("7"), std::string("null")}) {
    EXPECT_TRUE(
        contains(refusal_of(body_with_node("node-1", object(with(node_fields(key_1), "key", key)))),
                 "registry key of 'node-1' is not 64 lower-case hex digits"))
        << key;
  }
  EXPECT_TRUE(
      contains(refusal_of(body_with_node("node-1", object(without(node_fields(key_1), "key")))),
               "registry key of 'node-1'"));
  EXPECT_TRUE(
      contains(refusal_of(body_with_node("node-1", object(without(node_fields(key_1), "labels")))),
               "registry labels of 'node-1' are not an object of at most 16"));
  for (const auto& labels : {"[]", "null", "\"cohort\""})
    EXPECT_TRUE(contains(
        refusal_of(body_with_node("node-1", object(with(node_fields(key_1), "labels", labels)))),
        "registry labels of 'node-1'"))
        << labels;
}

TEST_F(RegistryTest, LabelsAreBoundedFleetNames) {
  const auto labels = [](std::size_t n) {
    fields list;
    for (std::size_t i = 0; i < n; ++i) list.emplace_back("l" + std::to_string(i), "\"v\"");
    return object(list);
  };
  const auto node = [&](const std::string& l) {
    return body_with_node("node-1", object(with(node_fields(key_1), "labels", l)));
  };
  std::string why;
  const auto most = fleet::parse_registry(node(labels(fleet::max_node_labels)), &why);
  ASSERT_TRUE(most) << why;
  EXPECT_EQ(most->find("node-1")->labels.size(), fleet::max_node_labels);
  EXPECT_TRUE(contains(refusal_of(node(labels(fleet::max_node_labels + 1))),
                       "are not an object of at most 16"));
  for (const auto& bad : {"{\"cohort\":\"a.b\"}", "{\"co.hort\":\"a\"}", "{\"cohort\":7}",
                          "{\"cohort\":\"\"}", "{\"cohort\":null}", "{\"\":\"a\"}"})
    EXPECT_TRUE(contains(refusal_of(node(bad)),
                         "registry label of 'node-1' is not name: value of fleet names"))
        << bad;
}

TEST_F(RegistryTest, AtMostTheMaximumNodes) {
  // Checked before any entry is read: the entries need not be valid.
  std::string nodes = "{";
  for (std::size_t i = 0; i <= fleet::max_registry_nodes; ++i)
    nodes += (i ? ",\"n" : "\"n") + std::to_string(i) + "\":0";
  nodes += "}";
  EXPECT_TRUE(
      contains(refusal_of(object({{"revision", "2"}, {"nodes", nodes}})), "at most 100000 nodes"));
}

// ---------------------------------------------------------------------------------------------
// records.hpp

fields result_fields() {
  return {{"node", "\"node-1\""},     {"module", "\"filters\""},
          {"revision", "3"},          {"digest", json_text(digest_a)},
          {"version", "7"},           {"serving_version", "7"},
          {"outcome", "\"applied\""}, {"reason", "\"\""},
          {"detail", "\"\""},         {"verify_ms", "1.5"},
          {"apply_ms", "2.25"},       {"time", "\"2026-11-29T12:00:00Z\""}};
}

fields heartbeat_fields() {
  return {{"node", "\"node-1\""},
          {"cohort", "\"all\""},
          {"gpu", "\"sm_90\""},
          {"interval_ms", "1000"},
          {"time", "\"2026-11-29T12:00:00Z\""},
          {"versions", "{\"filters\":7}"},
          {"revisions", "{\"filters\":3}"},
          {"connected", "true"},
          {"last_result", "null"}};
}

fleet::result_record a_result() {
  fleet::result_record r;
  r.node = "node-1";
  r.module = "filters";
  r.revision = 3;
  r.digest = digest_a;
  r.version = 7;
  r.serving_version = 6;
  r.outcome = gate_outcome::refused;
  r.reason = "bad_signature";
  r.detail = "signature does not verify";
  r.verify_ms = 1.5;
  r.apply_ms = 0.25;
  r.time = noon;
  return r;
}

void expect_same(const fleet::result_record& a, const fleet::result_record& b) {
  EXPECT_EQ(a.node, b.node);
  EXPECT_EQ(a.module, b.module);
  EXPECT_EQ(a.revision, b.revision);
  EXPECT_EQ(a.digest, b.digest);
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.serving_version, b.serving_version);
  EXPECT_EQ(a.outcome, b.outcome);
  EXPECT_EQ(a.reason, b.reason);
  EXPECT_EQ(a.detail, b.detail);
  EXPECT_EQ(a.verify_ms, b.verify_ms);
  EXPECT_EQ(a.apply_ms, b.apply_ms);
  EXPECT_EQ(a.time, b.time);
}

TEST(ResultRecord, RoundTrip) {
  auto record = a_result();
  record.revision = uint64_max;
  record.version = uint64_max;
  record.serving_version = uint64_max;
  const auto text = fleet::to_json(record);
  EXPECT_EQ(text.find('\n'), std::string::npos);
  const auto back = fleet::parse_result_record(text);
  ASSERT_TRUE(back) << text;
  expect_same(*back, record);
  EXPECT_EQ(fleet::to_json(*back), text);
  // Every outcome; an empty digest (a record about no bundle).
  for (const auto outcome : {gate_outcome::applied, gate_outcome::duplicate, gate_outcome::refused,
                             gate_outcome::failed, gate_outcome::rolled_back}) {
    record.outcome = outcome;
    const auto parsed = fleet::parse_result_record(fleet::to_json(record));
    ASSERT_TRUE(parsed) << cubridge::to_string(outcome);
    EXPECT_EQ(parsed->outcome, outcome);
  }
  record.digest.clear();
  const auto no_digest = fleet::parse_result_record(fleet::to_json(record));
  ASSERT_TRUE(no_digest);
  EXPECT_EQ(no_digest->digest, "");
  // Hand-written.
  const auto hand = fleet::parse_result_record(object(result_fields()));
  ASSERT_TRUE(hand);
  EXPECT_EQ(hand->time, noon);
  EXPECT_EQ(hand->verify_ms, 1.5);
  EXPECT_EQ(hand->outcome, gate_outcome::applied);
}

TEST(ResultRecord, EveryFieldMissingOrOfAnotherTypeIsRefused) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> wrong = {
      {"node", {"7", "null", "[\"node-1\"]"}},
      {"module", {"7", "null", "{}"}},
      {"revision", {"\"3\"", "-1", "1.5", "true", "null", "18446744073709551616"}},
      {"digest", {"7", "null", "[]"}},
      {"version", {"\"7\"", "-1", "7.5", "null"}},
      {"serving_version", {"\"7\"", "-7", "false"}},
      {"outcome", {"1", "null", "\"won\"", "\"Applied\"", "\"\""}},
      {"reason", {"0", "null", "[]"}},
      {"detail", {"0", "null", "{}"}},
      {"verify_ms", {"\"1.5\"", "true", "null", "[]"}},
      {"apply_ms", {"\"2\"", "false", "null", "{}"}},
      {"time", {"0", "null", "[]"}},
  };
  ASSERT_TRUE(fleet::parse_result_record(object(result_fields())));
  for (const auto& [name, values] : wrong) {
    EXPECT_FALSE(fleet::parse_result_record(object(without(result_fields(), name))))
        << name << " missing";
    for (const auto& value : values)
      EXPECT_FALSE(fleet::parse_result_record(object(with(result_fields(), name, value))))
          << name << " = " << value;
  }
  for (const std::string_view text : {"", "[]", "null", "7", "{\"node\":", "\"node-1\""})
    EXPECT_FALSE(fleet::parse_result_record(text)) << text;
}

TEST(ResultRecord, NamesAndDigestsAreChecked) {
  for (const auto& name : {std::string("node.1"), std::string(65, 'n'), std::string(""),
                           std::string("node 1"), std::string("\\u001b[2J")}) {
    EXPECT_FALSE(fleet::parse_result_record(object(with(result_fields(), "node", json_text(name)))))
        << name;
    EXPECT_FALSE(
        fleet::parse_result_record(object(with(result_fields(), "module", json_text(name)))))
        << name;
  }
  EXPECT_TRUE(fleet::parse_result_record(
      object(with(result_fields(), "node", json_text(std::string(64, 'n'))))));
  std::string upper = digest_a;
  for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const auto& digest : {digest_a.substr(1), digest_a + "0", upper, std::string(64, 'g')})
    EXPECT_FALSE(
        fleet::parse_result_record(object(with(result_fields(), "digest", json_text(digest)))))
        << digest;
}

TEST(ResultRecord, TimesOutsideTheRangeAreRefused) {
  for (const auto& time : times_refused)
    EXPECT_FALSE(fleet::parse_result_record(object(with(result_fields(), "time", time)))) << time;
  const auto earliest =
      fleet::parse_result_record(object(with(result_fields(), "time", "\"2000-01-01T00:00:00Z\"")));
  ASSERT_TRUE(earliest);
  EXPECT_EQ(earliest->time, fleet::earliest_record_time);
  const auto latest =
      fleet::parse_result_record(object(with(result_fields(), "time", "\"2200-01-01T00:00:00Z\"")));
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->time, fleet::latest_record_time);
  // A record written with a time outside is refused when read back.
  auto record = a_result();
  for (const auto time :
       {std::chrono::sys_seconds{}, fleet::earliest_record_time - 1s,
        fleet::latest_record_time + 1s,
        std::chrono::sys_seconds{std::chrono::sys_days{std::chrono::year{9999} / 12 / 31}}}) {
    record.time = time;
    EXPECT_FALSE(fleet::parse_result_record(fleet::to_json(record))) << fleet::to_json(record);
  }
}

TEST(ResultRecord, MillisecondsAreFiniteAndNotNegative) {
  auto record = a_result();
  record.verify_ms = -5;
  record.apply_ms = std::numeric_limits<double>::quiet_NaN();
  auto back = fleet::parse_result_record(fleet::to_json(record));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->verify_ms, 0);
  EXPECT_EQ(back->apply_ms, 0);
  record.verify_ms = std::numeric_limits<double>::infinity();
  record.apply_ms = 1e300;
  back = fleet::parse_result_record(fleet::to_json(record));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->verify_ms, 0);
  EXPECT_EQ(back->apply_ms, 1e300);
  // Read: a negative or integer number.
  back = fleet::parse_result_record(
      object(with(with(result_fields(), "verify_ms", "-3"), "apply_ms", "12")));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->verify_ms, 0);
  EXPECT_EQ(back->apply_ms, 12);
  // A number past a double's range: refused, or read as a finite number.
  const auto huge = fleet::parse_result_record(object(with(result_fields(), "verify_ms", "1e400")));
  if (huge) {
    EXPECT_TRUE(std::isfinite(huge->verify_ms)) << huge->verify_ms;
  }
}

TEST(ResultRecord, TextsComeOutPrintableAndBounded) {
  auto record = a_result();
  record.detail = "\x1b[31mred\x1b[0m\x07\r\n\t\x7f caf\xc3\xa9 \xff";
  record.reason = "bad\x1b[2Jsig";
  const auto text = fleet::to_json(record);
  EXPECT_TRUE(printable_ascii(text)) << text;
  EXPECT_FALSE(contains(text, "\\u00")) << text;
  auto back = fleet::parse_result_record(text);
  ASSERT_TRUE(back) << text;
  EXPECT_EQ(back->detail, "?[31mred?[0m????? caf?? ?");
  EXPECT_EQ(back->reason, "bad?[2Jsig");
  // Read: escapes in the JSON made printable on the way in.
  back = fleet::parse_result_record(object(
      with(with(result_fields(), "detail", "\"\\u001b]8;;http://x\\u0007link\\u001b]8;;\\u0007\""),
           "reason", "\"\\u009b31m\"")));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->detail, "?]8;;http://x?link?]8;;?");
  EXPECT_TRUE(printable_ascii(back->reason)) << back->reason;
  // Cut with "...", and unchanged when read and written again.
  record.detail = std::string(5000, 'd');
  record.reason = std::string(500, 'r');
  const auto long_text = fleet::to_json(record);
  back = fleet::parse_result_record(long_text);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->detail, std::string(fleet::max_record_detail, 'd') + "...");
  EXPECT_EQ(back->reason, std::string(fleet::max_record_token, 'r') + "...");
  EXPECT_EQ(fleet::to_json(*back), long_text);
}

TEST(ResultRecord, ALongTextReadIsCutToTheLimit) {
  // records.hpp: detail is "at most max_record_detail bytes (and "..." when cut)", whoever
  // wrote it, and comes out as to_json writes it.
  const auto back = fleet::parse_result_record(
      object(with(with(result_fields(), "detail", json_text(std::string(5000, 'x'))), "reason",
                  json_text(std::string(500, 'r')))));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->detail, std::string(fleet::max_record_detail, 'x') + "...");
  EXPECT_EQ(back->reason, std::string(fleet::max_record_token, 'r') + "...");
  // Read and written again, unchanged.
  const auto again = fleet::parse_result_record(fleet::to_json(*back));
  ASSERT_TRUE(again);
  EXPECT_EQ(again->detail, back->detail);
  EXPECT_EQ(again->reason, back->reason);
}

TEST(ResultRecord, OverTheLimitIsRefused) {
  // Padded with whitespace to the limit: read; one byte more: refused.
  const auto text = object(result_fields());
  const auto at_limit = text + std::string(fleet::max_record_bytes - text.size(), ' ');
  EXPECT_TRUE(fleet::parse_result_record(at_limit));
  EXPECT_FALSE(fleet::parse_result_record(at_limit + ' '));
}

fleet::heartbeat a_heartbeat() {
  fleet::heartbeat h;
  h.node = "node-1";
  h.cohort = "canary";
  h.gpu = "sm_90";
  h.interval = 2500ms;
  h.time = noon;
  h.versions = {{"filters", 7}, {"scalers", uint64_max}};
  h.revisions = {{"filters", 3}, {"scalers", 0}};
  h.connected = false;
  h.last_result = a_result();
  h.software = "cubridge 9.8.7";
  return h;
}

void expect_same(const fleet::heartbeat& a, const fleet::heartbeat& b) {
  EXPECT_EQ(a.node, b.node);
  EXPECT_EQ(a.cohort, b.cohort);
  EXPECT_EQ(a.gpu, b.gpu);
  EXPECT_EQ(a.interval, b.interval);
  EXPECT_EQ(a.time, b.time);
  EXPECT_EQ(a.versions, b.versions);
  EXPECT_EQ(a.revisions, b.revisions);
  EXPECT_EQ(a.connected, b.connected);
  EXPECT_EQ(a.software, b.software);
  EXPECT_EQ(a.poisoned, b.poisoned);
  ASSERT_EQ(a.last_result.has_value(), b.last_result.has_value());
  if (a.last_result) expect_same(*a.last_result, *b.last_result);
}

TEST(Heartbeat, RoundTrip) {
  auto beat = a_heartbeat();
  const auto text = fleet::to_json(beat);
  EXPECT_EQ(text.find('\n'), std::string::npos);
  const auto back = fleet::parse_heartbeat(text);
  ASSERT_TRUE(back) << text;
  expect_same(*back, beat);
  EXPECT_EQ(fleet::to_json(*back), text);
  // Without a last result, modules or a GPU.
  beat.last_result.reset();
  beat.versions.clear();
  beat.revisions.clear();
  beat.gpu.clear();
  beat.connected = true;
  const auto bare = fleet::parse_heartbeat(fleet::to_json(beat));
  ASSERT_TRUE(bare);
  expect_same(*bare, beat);
  // Hand-written.
  const auto hand = fleet::parse_heartbeat(object(heartbeat_fields()));
  ASSERT_TRUE(hand);
  EXPECT_EQ(hand->interval, 1000ms);
  EXPECT_EQ(hand->versions.at("filters"), 7u);
  EXPECT_FALSE(hand->last_result);
  // A node that predates the software field sends none: it reads as empty.
  EXPECT_EQ(hand->software, "");
}

TEST(Heartbeat, APoisonedProcessRoundTripsAndIsOptional) {
  auto beat = a_heartbeat();
  beat.poisoned = fleet::poison_report{"CUDA_ERROR_ILLEGAL_ADDRESS", "cuStreamSynchronize", noon};
  const auto text = fleet::to_json(beat);
  EXPECT_TRUE(contains(text,
                       "\"poisoned\":{\"call\":\"cuStreamSynchronize\",\"error\":"
                       "\"CUDA_ERROR_ILLEGAL_ADDRESS\",\"since\":\"2026-11-29T12:00:00Z\"}"))
      << text;
  const auto back = fleet::parse_heartbeat(text);
  ASSERT_TRUE(back) << text;
  expect_same(*back, beat);
  EXPECT_EQ(fleet::to_json(*back), text);
  // Healthy: no field at all, as from a node that predates it.
  beat.poisoned.reset();
  EXPECT_FALSE(contains(fleet::to_json(beat), "poisoned"));
  const auto healthy = fleet::parse_heartbeat(fleet::to_json(beat));
  ASSERT_TRUE(healthy);
  EXPECT_FALSE(healthy->poisoned);
  const auto hand = fleet::parse_heartbeat(object(heartbeat_fields()));
  ASSERT_TRUE(hand);
  EXPECT_FALSE(hand->poisoned);
  // An empty error (a process flagged without a record) reads as poisoned all the same.
  const auto flagged = fleet::parse_heartbeat(
      object(with(heartbeat_fields(), "poisoned",
                  "{\"error\":\"\",\"call\":\"\",\"since\":\"2026-11-29T12:00:00Z\"}")));
  ASSERT_TRUE(flagged);
  ASSERT_TRUE(flagged->poisoned);
  EXPECT_EQ(flagged->poisoned->since, noon);
  // Strict: exactly its three fields, bounded printable texts, a time in range.
  const std::string since = "\"since\":\"2026-11-29T12:00:00Z\"";
  for (const std::string& wrong : std::vector<std::string>{
           std::string("null"), std::string("true"), std::string("[]"), std::string("{}"),
           std::string("\"CUDA_ERROR_ILLEGAL_ADDRESS\""), "{\"error\":\"e\",\"call\":\"c\"}",
           "{\"error\":\"e\"," + since + "}", "{\"call\":\"c\"," + since + "}",
           "{\"error\":7,\"call\":\"c\"," + since + "}",
           "{\"error\":\"e\",\"call\":null," + since + "}",
           "{\"error\":\"e\",\"call\":\"c\",\"since\":\"yesterday\"}",
           "{\"error\":\"e\",\"call\":\"c\",\"since\":\"1970-01-01T00:00:00Z\"}",
           "{\"error\":\"e\",\"call\":\"c\"," + since + ",\"more\":1}"})
    EXPECT_FALSE(fleet::parse_heartbeat(object(with(heartbeat_fields(), "poisoned", wrong))))
        << wrong;
  beat.poisoned = fleet::poison_report{"CUDA_ERROR_\x1b[5m" + std::string(100, 'X'), "call", noon};
  const auto cut = fleet::parse_heartbeat(fleet::to_json(beat));
  ASSERT_TRUE(cut);
  ASSERT_TRUE(cut->poisoned);
  EXPECT_TRUE(printable_ascii(cut->poisoned->error));
  EXPECT_LE(cut->poisoned->error.size(), fleet::max_record_token + 3);
  EXPECT_TRUE(cut->poisoned->error.starts_with("CUDA_ERROR_?[5m")) << cut->poisoned->error;
}

TEST(Heartbeat, TheSoftwareIsOptionalButATextWhenThere) {
  const auto given =
      fleet::parse_heartbeat(object(with(heartbeat_fields(), "software", "\"cubridge 0.1.0\"")));
  ASSERT_TRUE(given);
  EXPECT_EQ(given->software, "cubridge 0.1.0");
  for (const char* wrong : {"1", "null", "[]", "{}"})
    EXPECT_FALSE(fleet::parse_heartbeat(object(with(heartbeat_fields(), "software", wrong))))
        << wrong;
  EXPECT_TRUE(fleet::software_text().starts_with("cubridge " + std::string(cubridge::version())));
}

TEST(Heartbeat, EveryFieldMissingOrOfAnotherTypeIsRefused) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> wrong = {
      {"node", {"7", "null", "\"node.1\"", "\"\""}},
      {"cohort", {"1", "null", "[]"}},
      {"gpu", {"90", "null", "{}"}},
      {"interval_ms", {"\"1000\"", "-1", "1.5", "null", "true"}},
      {"time", {"0", "null", "\"now\""}},
      {"versions",
       {"[]", "null", "7", "{\"a.b\":1}", "{\"filters\":-1}", "{\"filters\":\"7\"}",
        "{\"filters\":1.5}", "{\"\":1}"}},
      {"revisions", {"[]", "null", "\"x\"", "{\"filters\":null}", "{\"f s\":1}"}},
      {"connected", {"1", "\"true\"", "null", "[]"}},
      {"last_result", {"7", "\"x\"", "[]", "{}", "true"}},
  };
  ASSERT_TRUE(fleet::parse_heartbeat(object(heartbeat_fields())));
  for (const auto& [name, values] : wrong) {
    EXPECT_FALSE(fleet::parse_heartbeat(object(without(heartbeat_fields(), name))))
        << name << " missing";
    for (const auto& value : values)
      EXPECT_FALSE(fleet::parse_heartbeat(object(with(heartbeat_fields(), name, value))))
          << name << " = " << value;
  }
  // A last result missing any of its fields.
  for (const auto& [name, value] : result_fields())
    EXPECT_FALSE(fleet::parse_heartbeat(
        object(with(heartbeat_fields(), "last_result", object(without(result_fields(), name))))))
        << "last_result." << name << " missing";
  EXPECT_TRUE(fleet::parse_heartbeat(
      object(with(heartbeat_fields(), "last_result", object(result_fields())))));
  for (const std::string_view text : {"", "[]", "null", "{\"node\":"})
    EXPECT_FALSE(fleet::parse_heartbeat(text)) << text;
}

TEST(Heartbeat, TheIntervalIsOneMillisecondToOneHour) {
  for (const auto& interval :
       {"0", "3600001", "7200000", "18446744073709551615", "18446744073709551616", "1e30"})
    EXPECT_FALSE(fleet::parse_heartbeat(object(with(heartbeat_fields(), "interval_ms", interval))))
        << interval;
  const auto shortest =
      fleet::parse_heartbeat(object(with(heartbeat_fields(), "interval_ms", "1")));
  ASSERT_TRUE(shortest);
  EXPECT_EQ(shortest->interval, 1ms);
  const auto longest =
      fleet::parse_heartbeat(object(with(heartbeat_fields(), "interval_ms", "3600000")));
  ASSERT_TRUE(longest);
  EXPECT_EQ(longest->interval, fleet::max_heartbeat_interval);
  // Written with 0, 2 h or a negative interval: refused when read back.
  auto beat = a_heartbeat();
  for (const auto interval :
       {0ms, std::chrono::milliseconds(2h), -5ms, fleet::max_heartbeat_interval + 1ms}) {
    beat.interval = interval;
    EXPECT_FALSE(fleet::parse_heartbeat(fleet::to_json(beat))) << interval.count();
  }
}

TEST(Heartbeat, TimesOutsideTheRangeAreRefused) {
  for (const auto& time : times_refused)
    EXPECT_FALSE(fleet::parse_heartbeat(object(with(heartbeat_fields(), "time", time)))) << time;
  EXPECT_TRUE(
      fleet::parse_heartbeat(object(with(heartbeat_fields(), "time", "\"2200-01-01T00:00:00Z\""))));
  auto beat = a_heartbeat();
  beat.time = std::chrono::sys_days{std::chrono::year{9999} / 12 / 31};
  EXPECT_FALSE(fleet::parse_heartbeat(fleet::to_json(beat)));
  beat.time = std::chrono::sys_seconds{};
  EXPECT_FALSE(fleet::parse_heartbeat(fleet::to_json(beat)));
  // The last result's time too.
  beat = a_heartbeat();
  beat.last_result->time = std::chrono::sys_days{std::chrono::year{1970} / 1 / 1};
  EXPECT_FALSE(fleet::parse_heartbeat(fleet::to_json(beat)));
}

TEST(Heartbeat, TextsComeOutPrintableAndModulesBounded) {
  auto beat = a_heartbeat();
  beat.cohort = "can\x1b[5mary";
  beat.gpu = "sm_90\x07\xc3\xa9";
  const auto text = fleet::to_json(beat);
  EXPECT_TRUE(printable_ascii(text)) << text;
  auto back = fleet::parse_heartbeat(text);
  ASSERT_TRUE(back) << text;
  EXPECT_EQ(back->cohort, "can?[5mary");
  EXPECT_EQ(back->gpu, "sm_90???");
  back =
      fleet::parse_heartbeat(object(with(heartbeat_fields(), "cohort", "\"\\u001b[0m\\u0000\"")));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->cohort, "?[0m?");
  // At most max_heartbeat_modules modules: written cut to that many, read refused past it.
  beat = a_heartbeat();
  beat.versions.clear();
  beat.revisions.clear();
  fields versions;
  for (std::size_t i = 0; i <= fleet::max_heartbeat_modules; ++i) {
    const auto name = "m" + std::to_string(i);
    beat.versions[name] = i;
    beat.revisions[name] = i;
    versions.emplace_back(name, std::to_string(i));
  }
  back = fleet::parse_heartbeat(fleet::to_json(beat));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->versions.size(), fleet::max_heartbeat_modules);
  EXPECT_EQ(back->revisions.size(), fleet::max_heartbeat_modules);
  EXPECT_FALSE(
      fleet::parse_heartbeat(object(with(heartbeat_fields(), "versions", object(versions)))));
  EXPECT_FALSE(
      fleet::parse_heartbeat(object(with(heartbeat_fields(), "revisions", object(versions)))));
  versions.pop_back();
  EXPECT_TRUE(
      fleet::parse_heartbeat(object(with(heartbeat_fields(), "versions", object(versions)))));
}

TEST(Heartbeat, OverTheLimitIsRefused) {
  const auto text = object(heartbeat_fields());
  const auto at_limit = text + std::string(fleet::max_record_bytes - text.size(), ' ');
  EXPECT_TRUE(fleet::parse_heartbeat(at_limit));
  EXPECT_FALSE(fleet::parse_heartbeat(at_limit + ' '));
}

TEST(Heartbeat, SignedAndOpenedAsAHeartbeatOnly) {
  const auto key = cubridge::generate_keypair();
  const cubridge::trusted_keys trusted{key.public_key};
  const auto body = fleet::to_json(a_heartbeat());
  const auto text = fleet::sign_record(fleet::record_kind::heartbeat, body, key.secret_key);
  const auto opened = fleet::open_record(text, fleet::record_kind::heartbeat, trusted);
  ASSERT_TRUE(opened);
  const auto beat = fleet::parse_heartbeat(opened->body);
  ASSERT_TRUE(beat);
  expect_same(*beat, a_heartbeat());
  fleet::record_refusal refusal;
  EXPECT_FALSE(fleet::open_record(text, fleet::record_kind::result, trusted, &refusal));
  EXPECT_TRUE(contains(refusal.why, "heartbeat") && contains(refusal.why, "wanted a result"))
      << refusal.why;
}

// ---------------------------------------------------------------------------------------------
// connection.hpp: server lists

// The message of the precondition error `servers` raises, or a failure.
std::string server_list_refusal(std::string_view servers) {
  try {
    const auto urls = fleet::parse_server_list(servers);
    ADD_FAILURE() << "'" << servers << "' was taken (" << urls.size() << " URLs)";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(errc::precondition)) << e.what();
    return e.what();
  }
  return {};
}

TEST(ServerList, URLsAreTaken) {
  using list = std::vector<std::string>;
  EXPECT_EQ(fleet::parse_server_list("nats://127.0.0.1:4222"), list{"nats://127.0.0.1:4222"});
  EXPECT_EQ(fleet::parse_server_list(" nats://a.example:4222 , tls://b-2.example:4223,nats://c_3 "),
            (list{"nats://a.example:4222", "tls://b-2.example:4223", "nats://c_3"}));
  EXPECT_EQ(fleet::parse_server_list("tls://[::1]:4222"), list{"tls://[::1]:4222"});
  EXPECT_EQ(fleet::parse_server_list("nats://[::1]"), list{"nats://[::1]"});
  // No port: the default (4222) is the client's; the URL is kept as given.
  EXPECT_EQ(fleet::parse_server_list("nats://localhost"), list{"nats://localhost"});
  EXPECT_EQ(fleet::parse_server_list("nats://h:1,nats://h:65535"),
            (list{"nats://h:1", "nats://h:65535"}));
  // Credentials are kept (to connect with), never printed.
  EXPECT_EQ(fleet::parse_server_list("nats://user:secret@host:4222"),
            list{"nats://user:secret@host:4222"});
  EXPECT_EQ(fleet::parse_server_list("tls://token@host"), list{"tls://token@host"});
  EXPECT_EQ(fleet::bus_options{}.servers, "nats://127.0.0.1:4222");
  EXPECT_EQ(fleet::parse_server_list(fleet::bus_options{}.servers).size(), 1u);
}

TEST(ServerList, MalformedURLsAreRefusedNamingTheEntry) {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"not a url", "'not a url' is not a URL"},
      {"http://x", "is neither nats nor tls"},
      {"NATS://x", "is neither nats nor tls"},
      {"nats://", "'nats://' names no host"},
      {"nats://:4222", "names no host"},
      {"nats://[]:4222", "names no host"},
      {"nats://h:0", "is not 1 to 65535"},
      {"nats://h:70000", "is not 1 to 65535"},
      {"nats://h:65536", "is not 1 to 65535"},
      {"nats://h:99999999999999999999", "is not 1 to 65535"},
      {"nats://h:12ab", "is not 1 to 65535"},
      {"nats://h:-1", "is not 1 to 65535"},
      {"nats://h:", "is not 1 to 65535"},
      {"nats://h:4222/path", "nothing may follow HOST:PORT"},
      {"nats://h:4222?x=1", "nothing may follow HOST:PORT"},
      {"nats://h/path", "'nats://h/path'"},
      {"nats://h#x", "'nats://h#x'"},
      {"nats://[::1", "'[' without ']'"},
      {"nats://[::1]x", "something after the host"},
      {"nats://h\x1b[31m:4222", "the host may hold only"},
  };
  for (const auto& [servers, expected] : refused) {
    const auto message = server_list_refusal(servers);
    EXPECT_TRUE(contains(message, expected)) << servers << ": " << message;
    if (printable_ascii(servers)) {
      EXPECT_TRUE(contains(message, "server '" + servers + "'")) << message;
    }
    EXPECT_TRUE(printable_ascii(message)) << message;
  }
}

TEST(ServerList, EmptyEntriesAndTooManyURLsAreRefused) {
  EXPECT_FALSE(server_list_refusal("a,,b").empty());
  for (const auto& servers :
       {"nats://a:1,,nats://b:2", "nats://a:1,", ",nats://a:1", "", " ", "nats://a:1, ,nats://b"})
    EXPECT_TRUE(contains(server_list_refusal(servers), "has an empty entry")) << servers;
  std::string list;
  for (int i = 0; i < 32; ++i) list += (i ? ",nats://h:" : "nats://h:") + std::to_string(4222 + i);
  EXPECT_EQ(fleet::parse_server_list(list).size(), 32u);
  EXPECT_TRUE(contains(server_list_refusal(list + ",nats://h:5000"), "more than 32 URLs"));
}

TEST(ServerList, APasswordIsNeverInARefusal) {
  for (const auto& servers :
       {"nats://user:secret@host:0", "nats://user:secret@host:70000", "nats://user:secret@",
        "http://user:secret@host:4222", "nats://user:secret@host:4222/path",
        "nats://user:secret@[::1", "user:secret@host:4222",
        "nats://user:secret@host:4222,,nats://b", "nats://user:secret@bad\x01host",
        "nats://ok:1,tls://user:secret@h:0"}) {
    const auto message = server_list_refusal(servers);
    EXPECT_FALSE(contains(message, "secret")) << servers << ": " << message;
    // In a list holding credentials an entry is named by position only (a ',' in a password
    // would split it).
    EXPECT_TRUE(contains(message, "credentials hidden")) << servers << ": " << message;
  }
}

TEST(ServerList, RedactUrl) {
  EXPECT_EQ(fleet::redact_url("nats://user:secret@host:4222"), "nats://***@host:4222");
  EXPECT_EQ(fleet::redact_url("tls://token@host"), "tls://***@host");
  EXPECT_EQ(fleet::redact_url("nats://host:4222"), "nats://host:4222");
  EXPECT_EQ(fleet::redact_url(""), "");
  EXPECT_EQ(fleet::redact_url("user:secret@host"), "***@host");
  EXPECT_EQ(fleet::redact_server_list("nats://a:1,nats://u:p@b:2, tls://c"),
            "nats://a:1,nats://***@b:2, tls://c");
  EXPECT_EQ(fleet::redact_server_list(""), "");
}

TEST(ServerList, APasswordHoldingAnAtSignIsRedactedWhole) {
  // parse_server_list takes the host after the last '@' (connection.cpp check_url), so
  // "p@ss" is one password; redact_url must cut all of it.
  const std::string url = "nats://user:p@ss@host:4222";
  EXPECT_EQ(fleet::parse_server_list(url), std::vector<std::string>{url});
  EXPECT_EQ(fleet::redact_url(url), "nats://***@host:4222");
  const auto message = server_list_refusal("nats://user:p@ss@host:0");
  EXPECT_FALSE(contains(message, "ss@host")) << message;
}

TEST(ServerList, RefusalsQuoteAValueOnce) {
  // connection.cpp quotes detail::printable(...), which quotes by default: "scheme ''http''".
  EXPECT_TRUE(contains(server_list_refusal("http://x"), "scheme 'http' is neither nats nor tls"));
  EXPECT_TRUE(contains(server_list_refusal("nats://h:0"), "port '0' is not 1 to 65535"));
  const temp_dir dir;
  const auto path = dir.path / "c";
  write_text(path, "user a\npassword b\nname x\n");
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  try {
    (void)fleet::read_credentials_file(path);
    ADD_FAILURE() << "did not throw";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(contains(e.what(), "line 3: unknown field 'name' (user, password, api_prefix)"))
        << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// connection.hpp: credentials files

// The cubridge::error that `read` throws, checked to be of `code`; its message.
std::string error_of(const std::function<void()>& read, errc code) {
  try {
    read();
    ADD_FAILURE() << "did not throw";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(code)) << e.what();
    return e.what();
  }
  return {};
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// `text` as a file of mode 0600.
fs::path private_file(const fs::path& path, std::string_view text) {
  write_text(path, text);
  EXPECT_EQ(::chmod(path.c_str(), 0600), 0);
  return path;
}

TEST(CredentialsFile, RoundTrip) {
  const temp_dir dir;
  const auto path = dir.path / "node-1.creds";
  fleet::write_credentials_file(path, {"node-1", "s3cr3t!#x%"}, "node-1 of fleet prod");
  struct ::stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(read_text(path), "# node-1 of fleet prod\nuser node-1\npassword s3cr3t!#x%\n");
  const auto read = fleet::read_credentials_file(path);
  EXPECT_EQ(read.user, "node-1");
  EXPECT_EQ(read.password, "s3cr3t!#x%");
  // Without a comment.
  const auto bare = dir.path / "bare.creds";
  fleet::write_credentials_file(bare, {"op", "pw"});
  EXPECT_EQ(read_text(bare), "user op\npassword pw\n");
  EXPECT_EQ(fleet::read_credentials_file(bare).password, "pw");
}

TEST(CredentialsFile, AnApiPrefixIsKeptAndTakenByTheBusOptions) {
  const temp_dir dir;
  const auto path = dir.path / "node-1.creds";
  fleet::write_credentials_file(path, {"node-1", "pw", "cubridge.api"});
  EXPECT_EQ(read_text(path), "user node-1\npassword pw\napi_prefix cubridge.api\n");
  EXPECT_EQ(fleet::read_credentials_file(path).api_prefix, "cubridge.api");
  fleet::bus_options bus;
  bus.credentials = path;
  EXPECT_EQ(fleet::api_prefix_of(bus), "cubridge.api");
  bus.api_prefix = "other.api";  // given: it wins
  EXPECT_EQ(fleet::api_prefix_of(bus), "other.api");
  bus = {};  // no credentials file: none
  EXPECT_EQ(fleet::api_prefix_of(bus), "");
  // Only subject tokens: no wildcard, no empty token, no space.
  for (const char* bad : {"cubridge.*", "a..b", ".a", "a.", "a.>", "a$b", "x\x01"}) {
    const auto file =
        private_file(dir.path / "bad", std::string("user a\npassword b\napi_prefix ") + bad + "\n");
    const auto message =
        error_of([&] { (void)fleet::read_credentials_file(file); }, errc::precondition);
    EXPECT_TRUE(contains(message, "line 3")) << bad << ": " << message;
  }
}

TEST(CredentialsFile, CommentsBlankLinesAndLineEndings) {
  const temp_dir dir;
  const auto path = private_file(dir.path / "c",
                                 "# a comment\n\n   \n\tpassword  pw-1 \r\n# user nobody\n"
                                 "user  alice\r\n");
  const auto read = fleet::read_credentials_file(path);
  EXPECT_EQ(read.user, "alice");
  EXPECT_EQ(read.password, "pw-1");
  // No final newline.
  const auto last = private_file(dir.path / "d", "user a\npassword b");
  EXPECT_EQ(fleet::read_credentials_file(last).password, "b");
}

TEST(CredentialsFile, AFileOthersMayReadIsRefusedUnlessAllowed) {
  const temp_dir dir;
  const auto path = private_file(dir.path / "c", "user a\npassword b\n");
  for (const mode_t mode : {0644U, 0640U, 0604U, 0660U}) {
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
    const auto message = error_of([&] { (void)fleet::read_credentials_file(path); }, errc::io);
    EXPECT_TRUE(contains(message, "may be read by group or others (chmod 600 it)")) << message;
    EXPECT_FALSE(contains(message, "password b")) << message;
    EXPECT_EQ(fleet::read_credentials_file(path, true).password, "b");
  }
  ASSERT_EQ(::chmod(path.c_str(), 0400), 0);
  EXPECT_EQ(fleet::read_credentials_file(path).user, "a");
}

TEST(CredentialsFile, MalformedFilesAreRefusedNamingTheLine) {
  const temp_dir dir;
  const auto refusal = [&](std::string_view text) {
    const auto path = private_file(dir.path / "c", text);
    return error_of([&] { (void)fleet::read_credentials_file(path); }, errc::precondition);
  };
  for (const auto& text : {"user a\n", "password b\n", "# nothing\n", "", "user a\npassword\n"}) {
    const auto message = refusal(text);
    EXPECT_TRUE(contains(message, "needs a user and a password line") ||
                contains(message, "a value of printable characters"))
        << text << ": " << message;
  }
  EXPECT_TRUE(contains(refusal("user a\n"), "needs a user and a password line"));
  auto message = refusal("user a\npassword b\n\n# c\nname x\n");
  EXPECT_TRUE(contains(message, "line 5: unknown field") && contains(message, "name")) << message;
  message = refusal("user a\npassword se cret\n");
  EXPECT_TRUE(contains(message, "line 2: a value of printable characters, no spaces")) << message;
  EXPECT_FALSE(contains(message, "cret")) << message;
  message = refusal("user a\npassword s\x1b[0m\n");
  EXPECT_TRUE(contains(message, "line 2")) << message;
  EXPECT_TRUE(printable_ascii(message)) << message;
  message = refusal("user\ta\npassword b\n");
  EXPECT_TRUE(contains(message, "line 1")) << message;
  message = refusal("user a\nhunter2\n");
  EXPECT_TRUE(contains(message, "line 2")) << message;
  EXPECT_FALSE(contains(message, "hunter2")) << message;
}

TEST(CredentialsFile, OnlyASmallRegularFileIsRead) {
  const temp_dir dir;
  auto message =
      error_of([&] { (void)fleet::read_credentials_file(dir.path / "missing"); }, errc::io);
  EXPECT_TRUE(contains(message, "cannot open")) << message;
  message = error_of([&] { (void)fleet::read_credentials_file(dir.path); }, errc::io);
  EXPECT_TRUE(contains(message, "is a directory, not a regular file")) << message;
  const auto big = private_file(
      dir.path / "big", "user a\npassword b\n" + std::string(fleet::max_credentials_bytes, '#'));
  message = error_of([&] { (void)fleet::read_credentials_file(big); }, errc::io);
  EXPECT_TRUE(contains(message, "is over 4 KiB")) << message;

  // A FIFO with no writer: refused at once, not waited on. A reader stuck on it is released by
  // opening the other end, so that a regression fails instead of hanging the suite.
  const auto fifo = dir.path / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto result = std::async(std::launch::async, [&]() -> std::string {
    return error_of([&] { (void)fleet::read_credentials_file(fifo); }, errc::io);
  });
  if (result.wait_for(30s) != std::future_status::ready) {
    ADD_FAILURE() << "blocked on the FIFO for 30 s";
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  }
  message = result.get();
  EXPECT_TRUE(contains(message, "is a FIFO, not a regular file")) << message;
}

TEST(CredentialsFile, AnExistingFileIsNotOverwritten) {
  const temp_dir dir;
  const auto path = private_file(dir.path / "c", "user old\npassword old\n");
  const auto message = error_of(
      [&] {
        fleet::write_credentials_file(path, {"new", "new-secret"});
      },
      errc::io);
  EXPECT_TRUE(contains(message, "exists")) << message;
  EXPECT_FALSE(contains(message, "new-secret")) << message;
  EXPECT_EQ(read_text(path), "user old\npassword old\n");
  // Nor a symlink (dangling or not), nor anything left next to it.
  const auto link = dir.path / "link";
  fs::create_symlink(dir.path / "nowhere", link);
  (void)error_of([&] { fleet::write_credentials_file(link, {"new", "new-secret"}); }, errc::io);
  EXPECT_FALSE(fs::exists(dir.path / "nowhere"));
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir.path)) ++entries;
  EXPECT_EQ(entries, 2u);
}

}  // namespace
