#include "record_costs.hpp"

#include "bundle/source_bundles.hpp"
#include "in_process_node.hpp"

#include <cubridge/bundle/detail/signing.hpp>
#include <cubridge/fleet/desired_state.hpp>
#include <cubridge/fleet/records.hpp>
#include <cubridge/fleet/registry.hpp>
#include <cubridge/fleet/signed_record.hpp>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

namespace cubridge::bench {
namespace {

using steady = std::chrono::steady_clock;
using fleet::record_kind;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty()      ? 0
         : v.size() % 2 ? v[v.size() / 2]
                        : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// What the loops produce goes here, so that the compiler keeps them.
volatile std::size_t kept = 0;

// Microseconds per call of `op`: loops of about 20 ms each, the median of `repeats`.
template <class F>
double per_call_us(int repeats, F&& op) {
  const auto once = steady::now();
  op();
  const double first = std::chrono::duration<double, std::micro>(steady::now() - once).count();
  const int iterations = std::clamp(static_cast<int>(20000.0 / std::max(first, 0.05)), 3, 20000);
  std::vector<double> per_call;
  for (int r = 0; r < repeats; ++r) {
    const auto start = steady::now();
    for (int i = 0; i < iterations; ++i) op();
    per_call.push_back(std::chrono::duration<double, std::micro>(steady::now() - start).count() /
                       iterations);
  }
  return median(per_call);
}

std::string digest_of(int i) {
  const std::string text = "bundle " + std::to_string(i);
  return cubridge::detail::sha256_hex(std::as_bytes(std::span(text.data(), text.size())));
}

fleet::result_record sample_result() {
  fleet::result_record r;
  r.node = "i1000_0001";
  r.module = "bench_i1000";
  r.revision = 7;
  r.digest = digest_of(7);
  r.version = 7;
  r.serving_version = 7;
  r.outcome = gate_outcome::applied;
  r.verify_ms = 3.25;
  r.apply_ms = 0.04;
  r.time = std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now());
  return r;
}

// Measures one kind: `body` made by `to_body`, signed with `signer`, opened with `keys`, parsed
// by `parse`.
template <class ToBody, class Parse>
record_cost measure(record_kind kind, ToBody to_body, Parse parse, const secret_key& signer,
                    const trusted_keys& keys, int repeats) {
  record_cost c;
  const auto text = fleet::sign_record(kind, to_body(), signer);
  c.bytes = text.size();
  const auto opened = fleet::open_record(text, kind, keys);
  if (!opened || !parse(opened->body))
    throw std::logic_error("record_costs: a " + std::string(fleet::to_string(kind)) +
                           " record does not open and parse");
  c.sign_us = per_call_us(
      repeats, [&] { kept = kept + fleet::sign_record(kind, to_body(), signer).size(); });
  c.open_us = per_call_us(repeats,
                          [&] { kept = kept + fleet::open_record(text, kind, keys)->body.size(); });
  c.parse_us = per_call_us(repeats, [&] { kept = kept + (parse(opened->body) ? 1 : 0); });
  return c;
}

}  // namespace

record_costs measure_record_costs(std::size_t registry_nodes, int repeats) {
  record_costs out;
  out.registry_nodes = registry_nodes;
  out.repeats = repeats;
  const auto node = generate_keypair();
  const auto op = generate_keypair();
  const trusted_keys node_keys{node.public_key};
  trusted_keys operator_keys;
  operator_keys.add(op.public_key);

  const auto result = sample_result();
  out.result = measure(
      record_kind::result, [&] { return fleet::to_json(result); },
      [](std::string_view body) { return fleet::parse_result_record(body).has_value(); },
      node.secret_key, node_keys, repeats);

  fleet::heartbeat beat;
  beat.node = result.node;
  beat.gpu = "sm_90";
  beat.interval = std::chrono::milliseconds(5000);
  beat.time = result.time;
  beat.versions[result.module] = 7;
  beat.revisions[result.module] = 7;
  beat.last_result = result;
  out.heartbeat = measure(
      record_kind::heartbeat, [&] { return fleet::to_json(beat); },
      [](std::string_view body) { return fleet::parse_heartbeat(body).has_value(); },
      node.secret_key, node_keys, repeats);

  fleet::desired_state desired;
  desired.module = result.module;
  desired.revision = 9;
  desired.stable = fleet::bundle_ref{9, digest_of(9), std::uint64_t{1} << 20, "sm_90"};
  for (int v = 1; v <= static_cast<int>(fleet::max_desired_history); ++v)
    desired.history.push_back({static_cast<std::uint64_t>(v), digest_of(v), 1 << 20, "sm_90"});
  desired.time = "2026-12-01T12:00:00Z";
  out.desired = measure(
      record_kind::desired_state, [&] { return fleet::to_json(desired); },
      [](std::string_view body) { return fleet::parse_desired_state(body).has_value(); },
      op.secret_key, operator_keys, repeats);

  fleet::node_registry registry;
  registry.revision = registry_nodes;
  for (std::size_t i = 0; i < registry_nodes; ++i)
    registry.nodes.emplace("n" + std::to_string(100000 + i),
                           fleet::enrolled_node{generate_keypair().public_key, {}});
  out.registry = measure(
      record_kind::registry, [&] { return fleet::to_json(registry); },
      [](std::string_view body) { return fleet::parse_registry(body).has_value(); }, op.secret_key,
      operator_keys, repeats);
  return out;
}

gate_push_cost measure_gate_push(const std::filesystem::path& dir, int pushes) {
  std::filesystem::create_directories(dir);
  const auto op = generate_keypair();
  const auto sink = std::make_shared<memory_sink>("bench_gate");
  update_gate_options policy;
  policy.keys.add(op.public_key);
  policy.state_file = dir / "gate.state";
  const auto gate = update_gate::create(sink, std::move(policy));
  gate->start();
  std::vector<double> push, verify, apply;
  for (int v = 1; v <= pushes; ++v) {
    const auto bundle = cubridge::testing::source_bundle(
        "bench_gate", static_cast<std::uint64_t>(v), op.secret_key, "sm_90", 1024);
    const auto start = steady::now();
    const auto d = gate->push(bundle, "bench_gate");
    push.push_back(std::chrono::duration<double, std::milli>(steady::now() - start).count());
    if (d.outcome != gate_outcome::applied)
      throw std::runtime_error("gate push of v" + std::to_string(v) + ": " +
                               std::string(to_string(d.reason)) + " " + d.detail);
    verify.push_back(static_cast<double>(d.verify_time.count()) / 1000.0);
    apply.push_back(static_cast<double>(d.apply_time.count()) / 1000.0);
  }
  return {median(push), median(verify), median(apply), pushes};
}

}  // namespace cubridge::bench
