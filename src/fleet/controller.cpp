// The control side's connection: publishing, the desired bucket, and reading the last
// heartbeat of every node and the last result of every node (docs/fleet.md). The canary policy
// is in fleet_rollout.cpp.
#include "fleet/controller_impl.hpp"

#include <cubridge/core/detail/printable.hpp>
#include <cubridge/fleet/subjects.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <set>

namespace cubridge::fleet {
namespace {

using json = nlohmann::json;

void require_fleet_name(std::string_view name, std::string_view what) {
  if (const auto problem = check_fleet_name(name, what); !problem.empty())
    cubridge::detail::throw_errc(errc::precondition, "fleet controller",
                                 problem + " (docs/fleet.md: one subject token)");
}

std::optional<std::uint64_t> parse_decimal(std::string_view text) {
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || value == 0) return std::nullopt;
  return value;
}

std::string halted_key(std::string_view module) {
  return desired_key(module, "halted");
}

}  // namespace

void controller::impl::put(const std::string& key, const std::string& value) {
  std::uint64_t revision = 0;
  detail::check(kvStore_PutString(&revision, desired.get(), key.c_str(), value.c_str()),
                "kvStore_PutString", "key " + key + " of bucket " + std::string(desired_bucket));
}

std::optional<std::string> controller::impl::get(const std::string& key) const {
  kvEntry* raw = nullptr;
  const auto status = kvStore_Get(&raw, desired.get(), key.c_str());
  const detail::kv_entry_ptr entry(raw);
  if (status == NATS_NOT_FOUND) return std::nullopt;
  detail::check(status, "kvStore_Get", "key " + key + " of bucket " + std::string(desired_bucket));
  const char* value = kvEntry_ValueString(entry.get());
  return std::string(value ? value : "");
}

void controller::impl::remove(const std::string& key) {
  const auto status = kvStore_Delete(desired.get(), key.c_str());
  if (status == NATS_NOT_FOUND) return;
  detail::check(status, "kvStore_Delete",
                "key " + key + " of bucket " + std::string(desired_bucket));
}

void controller::impl::send(const std::string& subject, std::span<const std::byte> data,
                            std::string_view what) {
  detail::publish(js.get(), connection.get(), subject, data, what);
}

controller::controller(controller_options options) : impl_(std::make_unique<impl>()) {
  impl_->options = std::move(options);
  detail::connect_options connect;
  connect.url = impl_->options.server_url;
  connect.name = impl_->options.client_name;
  connect.reconnect = false;  // a lost server is an error, never a wait
  connect.retry_on_failed_connect = false;
  connect.connect_timeout = impl_->options.connect_timeout;
  impl_->connection = detail::connect(connect);
  impl_->js = detail::jetstream(impl_->connection.get(), impl_->options.request_timeout);
  detail::ensure_result_stream(impl_->js.get());
  detail::ensure_heartbeat_stream(impl_->js.get());
  impl_->desired = detail::ensure_desired_bucket(impl_->js.get());
}

controller::~controller() = default;

std::size_t controller::max_payload() const {
  const auto limit = natsConnection_GetMaxPayload(impl_->connection.get());
  return limit > 0 ? static_cast<std::size_t>(limit) : 0;
}

void controller::publish(std::span<const std::byte> bundle, std::string_view module,
                         std::span<const std::string> nodes) {
  require_fleet_name(module, "module name");
  for (const auto& node : nodes) require_fleet_name(node, "node id");
  // Refused before the stream is touched: nothing of an oversized rollout reaches the server.
  if (bundle.size() > max_payload())
    detail::fail(fleet_errc::oversized,
                 "bundle of " + std::to_string(bundle.size()) +
                     " bytes is over the server's largest message, " +
                     std::to_string(max_payload()) +
                     " bytes (its max_payload; docs/fleet.md, Payload limits)",
                 "publish", "module " + std::string(module) + " at " + impl_->options.server_url);
  detail::ensure_bundle_stream(impl_->js.get(), module);
  if (nodes.empty()) return impl_->send(bundle_subject_all(module), bundle, "bundle");
  for (const auto& node : nodes) impl_->send(bundle_subject_node(module, node), bundle, "bundle");
}

void controller::rollback(std::string_view module, std::string_view signed_request) {
  require_fleet_name(module, "module name");
  detail::ensure_bundle_stream(impl_->js.get(), module);
  impl_->send(rollback_subject(module),
              {reinterpret_cast<const std::byte*>(signed_request.data()), signed_request.size()},
              "rollback request");
}

std::optional<std::uint64_t> controller::desired(std::string_view module,
                                                 std::string_view cohort) const {
  const auto value = impl_->get(desired_key(module, cohort));
  return value ? parse_decimal(*value) : std::nullopt;
}

void controller::set_desired(std::string_view module, std::string_view cohort,
                             std::uint64_t version) {
  require_fleet_name(module, "module name");
  if (version == 0) return impl_->remove(desired_key(module, cohort));
  impl_->put(desired_key(module, cohort), std::to_string(version));
}

void controller::clear_halt(std::string_view module) {
  impl_->remove(halted_key(module));
}

std::vector<module_state> controller::modules() const {
  kvKeysList keys{};
  const auto status = kvStore_Keys(&keys, impl_->desired.get(), nullptr);
  if (status == NATS_NOT_FOUND) return {};  // an empty bucket
  detail::check(status, "kvStore_Keys", "bucket " + std::string(desired_bucket));
  std::set<std::string> names;
  for (int i = 0; i < keys.Count; ++i) {
    const std::string_view key = keys.Keys[i];
    const auto dot = key.rfind('.');
    // Anyone who can write to the account can write keys: only fleet names are modules.
    if (dot != std::string_view::npos && check_fleet_name(key.substr(0, dot), "m").empty())
      names.emplace(key.substr(0, dot));
  }
  kvKeysList_Destroy(&keys);
  std::vector<module_state> out;
  for (const auto& name : names) {
    module_state state{name, desired(name, "all"), desired(name, "canary"), {}, 0};
    if (const auto halt = impl_->get(halted_key(name))) {
      const auto parsed = json::parse(*halt, nullptr, false);
      if (parsed.is_object() && parsed.value("reason", json()).is_string()) {
        state.halted_reason = cubridge::detail::printable(
            parsed["reason"].get<std::string>(),
            {.max_bytes = 2048, .quoted = false, .cut = cubridge::detail::printable_cut::ellipsis});
        state.halted_version = parsed.value("version", std::uint64_t{0});
      }
    }
    out.push_back(std::move(state));
  }
  return out;
}

std::vector<node_state> controller::nodes(std::chrono::system_clock::time_point now) const {
  std::vector<node_state> out;
  const std::string stream(heartbeat_stream);
  for (const auto& subject :
       detail::stream_subjects(impl_->js.get(), stream, heartbeat_subject(">"))) {
    const auto message = detail::last_message(impl_->js.get(), stream, subject);
    if (!message) continue;  // gone meanwhile (max age)
    auto beat = parse_heartbeat(detail::message_text(message.get()));
    // A heartbeat must come from its own subject: a node cannot speak for another.
    if (!beat || heartbeat_subject(beat->node) != subject) continue;
    node_state state;
    const auto age = std::chrono::duration_cast<std::chrono::seconds>(now - beat->time);
    state.age = std::max(age, std::chrono::seconds(0));
    const auto interval =
        beat->interval > std::chrono::milliseconds(0) ? beat->interval : std::chrono::seconds(5);
    state.live = now - beat->time < 3 * interval;
    state.beat = std::move(*beat);
    out.push_back(std::move(state));
  }
  std::sort(out.begin(), out.end(),
            [](const node_state& a, const node_state& b) { return a.beat.node < b.beat.node; });
  return out;
}

std::vector<result_record> controller::last_results(std::string_view module) const {
  std::vector<result_record> out;
  const std::string stream(result_stream);
  for (const auto& subject :
       detail::stream_subjects(impl_->js.get(), stream, result_subject(module, "*"))) {
    const auto message = detail::last_message(impl_->js.get(), stream, subject);
    if (!message) continue;
    auto record = parse_result_record(detail::message_text(message.get()));
    if (!record || result_subject(record->module, record->node) != subject) continue;
    out.push_back(std::move(*record));
  }
  std::sort(out.begin(), out.end(),
            [](const result_record& a, const result_record& b) { return a.node < b.node; });
  return out;
}

}  // namespace cubridge::fleet
