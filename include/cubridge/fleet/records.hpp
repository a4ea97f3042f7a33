#pragma once
// What the nodes of a fleet tell the control side (docs/fleet.md): a result record per desired
// revision a node acted on, on cubridge.result.<m>.<node>, and a heartbeat per interval, on
// cubridge.heartbeat.<node>. Each travels as the body of a record signed with the node's own key
// (signed_record.hpp); the structs here are the parsed body. Parsing checks every field, times
// and intervals are range-checked, and every text that comes out is bounded printable ASCII
// (core/detail/printable.hpp: any other byte as '?', so that a record read and written again is
// unchanged).

#include <cubridge/update/update_gate.hpp>  // gate_outcome

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace cubridge::fleet {

/// Largest record or heartbeat parsed, in bytes.
inline constexpr std::size_t max_record_bytes = std::size_t{64} << 10;
/// Longest `detail` kept (printable), and longest reason, cohort or GPU name.
inline constexpr std::size_t max_record_detail = 1024;
inline constexpr std::size_t max_record_token = 64;
/// Most modules a heartbeat lists.
inline constexpr std::size_t max_heartbeat_modules = 256;

/// Earliest and latest time a record may carry (a time outside is refused: no arithmetic on it
/// can overflow), and the longest heartbeat interval.
inline constexpr std::chrono::sys_seconds earliest_record_time{std::chrono::seconds(946684800)};
inline constexpr std::chrono::sys_seconds latest_record_time{std::chrono::seconds(7258118400)};
inline constexpr std::chrono::milliseconds max_heartbeat_interval{std::chrono::hours(1)};

/// What one node did about one revision of a module's desired state.
struct result_record {
  std::string node{};
  std::string module{};
  /// The desired state's revision and the bundle's digest this result answers: a result counts
  /// only for the revision and digest it names.
  std::uint64_t revision = 0;
  std::string digest{};
  /// The desired bundle's version.
  std::uint64_t version = 0;
  /// The version serving on the node after the message.
  std::uint64_t serving_version = 0;
  gate_outcome outcome = gate_outcome::refused;
  /// Empty for applied and rolled_back; else the gate's reason (bad_signature, too_large, ...).
  std::string reason{};
  /// What exactly, printable ASCII, at most max_record_detail bytes (and "..." when cut).
  std::string detail{};
  /// Time verifying, and in the sink (stage, smoke test and promote are one module_sink call).
  double verify_ms = 0;
  double apply_ms = 0;
  /// When the node decided, whole seconds.
  std::chrono::sys_seconds time{};
};

/// Most named values a health report carries per module, and the longest detail.
inline constexpr std::size_t max_health_values = 16;
inline constexpr std::size_t max_health_detail = 256;

/// One module's health on one node, as its heartbeat reports it: the serving version's launch
/// counters (since it was promoted: hot_module::launches()) and the service's own probe
/// (fleet_agent_options::health_probe).
struct module_health {
  /// The version these figures are about: the one serving when the heartbeat was made.
  std::uint64_t version = 0;
  std::uint64_t launches = 0;
  std::uint64_t launch_failures = 0;
  /// The driver's name of a launch failure that poisoned the context ("CUDA_ERROR_ILLEGAL_
  /// ADDRESS"); empty when none did.
  std::string sticky_error{};
  /// The probe's verdict (true when the service registered no probe).
  bool healthy = true;
  /// The probe's named values ("wrong_answers": 3, "p99_us": 420), names as module names.
  std::map<std::string, double, std::less<>> values{};
  /// The probe's words, printable, at most max_health_detail bytes.
  std::string detail{};
  friend bool operator==(const module_health&, const module_health&) = default;
};

/// What poisoned a node's process (core/process_health.hpp), as its heartbeats report it from
/// then on: the first sticky CUDA error a cubridge call saw. The process can no longer use the
/// GPU; its supervisor starts a new one (docs/fleet.md, "A poisoned node").
struct poison_report {
  /// The driver's name of the error ("CUDA_ERROR_ILLEGAL_ADDRESS"), at most max_record_token
  /// bytes; empty when the process could not keep a record of it.
  std::string error{};
  /// The call that saw it ("cuStreamSynchronize"), at most max_record_token bytes.
  std::string call{};
  /// When it was seen (the node's clock), whole seconds.
  std::chrono::sys_seconds since{};
  friend bool operator==(const poison_report&, const poison_report&) = default;
};

/// A node's periodic state.
struct heartbeat {
  std::string node{};
  /// The node's own label ("all" unless configured); the canary cohort is chosen by the
  /// publisher.
  std::string cohort = "all";
  /// The node's GPU ("sm_90"), empty when the sink knows none.
  std::string gpu{};
  /// The interval the node sends heartbeats at, so that a reader can tell a silent node.
  std::chrono::milliseconds interval{0};
  std::chrono::sys_seconds time{};
  /// What the node runs, "cubridge 0.1.0" (software_text()); empty from a node that predates it.
  std::string software{};
  /// Per module, its health (optional: a node that predates it sends none).
  std::map<std::string, module_health, std::less<>> health{};
  /// Per module, the version serving.
  std::map<std::string, std::uint64_t, std::less<>> versions{};
  /// Per module, the desired revision the node last acted on (0: none seen).
  std::map<std::string, std::uint64_t, std::less<>> revisions{};
  bool connected = true;
  std::optional<result_record> last_result{};
  /// Which run of the node sent it: 16 lower-case hex digits drawn at random when the agent
  /// starts, and the heartbeat's number within that run (1, 2, ...), so that a reader refuses a
  /// heartbeat that goes back (an older one written again) and sees a restart. Empty and 0 from
  /// a node that predates them.
  std::string boot{};
  std::uint64_t sequence = 0;
  /// When that run started (the node's clock): of two runs, the later one is the newer.
  std::chrono::sys_seconds started{};
  /// The agent's last problem (a refused desired state, a connection it could not make), in
  /// words; empty when none.
  std::string problem{};
  /// Set once the node's process is poisoned (optional: absent while healthy, and from a node
  /// that predates it). The heartbeat that first carries it goes out at once, not at the next
  /// interval.
  std::optional<poison_report> poisoned{};
};

/// Whether `boot` is what a heartbeat's boot id must be: 16 lower-case hex digits.
[[nodiscard]] bool is_boot_id(std::string_view boot) noexcept;

/// "cubridge <version>": what heartbeats and desired states say wrote them (cubridge::version(),
/// the library linked), so that an operator sees which nodes run which release.
[[nodiscard]] std::string software_text();

/// One line of JSON (no newline): the body a node signs. Texts are made printable and cut as
/// above. Throws std::bad_alloc only.
[[nodiscard]] std::string to_json(const result_record& record);
[[nodiscard]] std::string to_json(const heartbeat& beat);

/// The record or heartbeat in `text` (a verified body); nullopt for anything that is not one:
/// over max_record_bytes, not a JSON object, a field missing or of another type, a node or
/// module name check_fleet_name refuses, an unknown outcome, a digest that is not 64 lower-case
/// hex digits, a time that is not RFC 3339 UTC or outside [earliest_record_time,
/// latest_record_time], an interval of 0 or over max_heartbeat_interval, a `poisoned` that is
/// not an object of exactly "error", "call" and "since". Texts are made
/// printable and cut as above. Throws std::bad_alloc only.
[[nodiscard]] std::optional<result_record> parse_result_record(std::string_view text);
[[nodiscard]] std::optional<heartbeat> parse_heartbeat(std::string_view text);

}  // namespace cubridge::fleet
