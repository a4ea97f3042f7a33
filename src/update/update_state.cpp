// The persisted replay state of the update endpoint; see update_state.hpp and
// docs/update-endpoint.md ("Replay state").
#include <cubridge/bundle/bundle.hpp>
#include <cubridge/bundle/detail/signing.hpp>
#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/detail/printable.hpp>
#include <cubridge/update/update_state.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace cubridge {
namespace {

using json = nlohmann::json;
constexpr std::string_view format_key = "cubridge_update_state";
constexpr std::uint64_t format_version = 1;

[[noreturn]] void fail(update_state_reason reason, std::string call, std::string involved,
                       std::source_location where = std::source_location::current()) {
  throw update_state_error(reason, std::move(call), std::move(involved), where);
}

std::string quoted(const std::filesystem::path& path) {
  return "'" + path.string() + "'";
}

// The file's bytes; nullopt when it does not exist. Read through the core's one reader of
// regular files (a FIFO or a directory at the path is refused, never waited on), its refusals
// reported as this file's.
std::optional<std::string> read_state_file(const std::filesystem::path& path) {
  constexpr const char* call = "update_state::load";
  std::error_code missing;
  if (std::filesystem::status(path, missing).type() == std::filesystem::file_type::not_found)
    return std::nullopt;
  std::vector<std::byte> bytes;
  try {
    // No limit here: a file over it is too_large, not unreadable (checked from its size, then
    // while reading, since it may grow meanwhile).
    detail::regular_file file(path, UINT64_MAX, "state file");
    if (static_cast<std::uint64_t>(file.status().st_size) > max_update_state_bytes)
      fail(update_state_reason::too_large, call,
           quoted(path) + " is " + std::to_string(file.status().st_size) + " bytes, over the " +
               std::to_string(max_update_state_bytes) + " a state file may hold");
    while (file.read_some(bytes, max_update_state_bytes + 1 - bytes.size()) > 0)
      if (bytes.size() > max_update_state_bytes)
        fail(update_state_reason::too_large, call,
             quoted(path) + " is over the " + std::to_string(max_update_state_bytes) +
                 " bytes a state file may hold");
  } catch (const update_state_error&) {
    throw;
  } catch (const error& e) {
    fail(update_state_reason::unreadable, call, e.involved());
  }
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

struct parsed_state {
  std::map<std::string, std::uint64_t, std::less<>> highest;
  std::set<std::string, std::less<>> pending;
  std::map<std::string, std::vector<bad_version>, std::less<>> bad;
  std::unordered_map<std::string, std::chrono::sys_seconds> nonces;
};

[[noreturn]] void corrupt_file(const std::filesystem::path& path, const std::string& why) {
  fail(update_state_reason::corrupt, "update_state::load", quoted(path) + " is corrupt: " + why);
}

// A module's bad versions past max_bad_versions_per_module lose their oldest.
void keep_newest(std::vector<bad_version>& list) {
  if (list.size() <= max_bad_versions_per_module) return;
  list.erase(list.begin(),
             list.begin() + static_cast<std::ptrdiff_t>(list.size() - max_bad_versions_per_module));
}

// One entry of "bad_versions": exactly its four fields, each as record_bad takes it.
bad_version bad_entry_of(const json& entry, const std::string& module,
                         const std::filesystem::path& path) {
  const auto wrong = [&](const std::string& why) {
    corrupt_file(path, "bad version of module " + detail::printable(module) + ": " + why);
  };
  if (!entry.is_object()) wrong("not an object");
  for (const auto& [key, value] : entry.items())
    if (key != "digest" && key != "version" && key != "reason" && key != "time")
      wrong("unknown field " + detail::printable(key));
  bad_version out;
  out.module = module;
  const auto digest = entry.find("digest");
  if (digest == entry.end() || !digest->is_string() ||
      !detail::is_lower_hex(digest->get_ref<const std::string&>(), 64))
    wrong("digest is not 64 lower-case hex digits");
  out.digest = digest->get<std::string>();
  const auto version = entry.find("version");
  if (version == entry.end() || !version->is_number_unsigned() ||
      version->get<std::uint64_t>() == 0)
    wrong("version is not an unsigned integer > 0");
  out.version = version->get<std::uint64_t>();
  const auto reason = entry.find("reason");
  const auto parsed_reason = reason != entry.end() && reason->is_string()
                                 ? parse_gate_reason(reason->get_ref<const std::string&>())
                                 : std::nullopt;
  if (!parsed_reason) wrong("reason is not a gate reason");
  out.reason = *parsed_reason;
  const auto time = entry.find("time");
  const auto parsed_time = time != entry.end() && time->is_string()
                               ? detail::parse_time(time->get<std::string>())
                               : std::nullopt;
  if (!parsed_time) wrong("time is not YYYY-MM-DDTHH:MM:SSZ");
  out.time = *parsed_time;
  return out;
}

// The optional "bad_versions" (files written before it existed have none): per module its
// records, oldest first, each digest once; past the bound, the newest are kept.
void parse_bad_versions(const json& document, const std::filesystem::path& path,
                        parsed_state& out) {
  const auto bad = document.find("bad_versions");
  if (bad == document.end()) return;
  if (!bad->is_object()) corrupt_file(path, "\"bad_versions\" is not an object");
  for (const auto& [name, entries] : bad->items()) {
    if (auto problem = check_module_name(name); !problem.empty())
      corrupt_file(path, "bad versions of module " + detail::printable(name) + ": " + problem);
    if (!entries.is_array())
      corrupt_file(path, "bad versions of module " + detail::printable(name) + ": not a list");
    auto& list = out.bad[name];
    for (const auto& entry : entries) {
      auto parsed = bad_entry_of(entry, name, path);
      if (std::any_of(list.begin(), list.end(),
                      [&](const bad_version& b) { return b.digest == parsed.digest; }))
        corrupt_file(path, "bad versions of module " + detail::printable(name) + ": digest " +
                               parsed.digest + " is listed twice");
      list.push_back(std::move(parsed));
    }
    keep_newest(list);
  }
}

parsed_state parse_state(const std::string& text, const std::filesystem::path& path) {
  auto corrupt = [&](const std::string& why) { corrupt_file(path, why); };
  // nlohmann stops at a NUL byte: what follows one would never be checked.
  if (auto problem = detail::check_signed_text(text); !problem.empty()) corrupt(problem);
  json document;
  try {
    document = json::parse(text);
  } catch (const json::exception& e) {
    corrupt(e.what());
  }
  if (!document.is_object()) corrupt("not a JSON object");
  for (const auto& [key, value] : document.items())
    if (key != format_key && key != "highest_versions" && key != "pending_versions" &&
        key != "bad_versions" && key != "rollback_nonces")
      corrupt("unknown field " + detail::printable(key));
  const auto version = document.find(format_key);
  if (version == document.end() || !version->is_number_unsigned())
    corrupt("no \"cubridge_update_state\" format version");
  if (version->get<std::uint64_t>() != format_version)
    corrupt("format version " + std::to_string(version->get<std::uint64_t>()) +
            ", this library reads version 1");

  parsed_state out;
  const auto modules = document.find("highest_versions");
  if (modules == document.end() || !modules->is_object())
    corrupt("\"highest_versions\" is missing or not an object");
  for (const auto& [name, value] : modules->items()) {
    if (auto problem = check_module_name(name); !problem.empty())
      corrupt("module " + detail::printable(name) + ": " + problem);
    if (!value.is_number_unsigned() || value.get<std::uint64_t>() == 0)
      corrupt("module " + detail::printable(name) + ": version is not an unsigned integer > 0");
    out.highest.emplace(name, value.get<std::uint64_t>());
  }
  // Optional (files written before it existed have none): absent, every version is settled.
  if (const auto pending = document.find("pending_versions"); pending != document.end()) {
    if (!pending->is_object()) corrupt("\"pending_versions\" is not an object");
    for (const auto& [name, value] : pending->items()) {
      const auto highest = out.highest.find(name);
      if (highest == out.highest.end() || !value.is_number_unsigned() ||
          value.get<std::uint64_t>() != highest->second)
        corrupt("pending module " + detail::printable(name) +
                ": version is not its highest version");
      out.pending.insert(name);
    }
  }
  parse_bad_versions(document, path, out);
  const auto nonces = document.find("rollback_nonces");
  if (nonces == document.end() || !nonces->is_object())
    corrupt("\"rollback_nonces\" is missing or not an object");
  for (const auto& [nonce, value] : nonces->items()) {
    std::array<std::byte, 16> bytes{};
    if (!detail::parse_lower_hex(nonce, bytes))
      corrupt("nonce " + detail::printable(nonce) + " is not 32 lower-case hex digits");
    const auto created =
        value.is_string() ? detail::parse_time(value.get<std::string>()) : std::nullopt;
    if (!created) corrupt("nonce " + nonce + ": time is not YYYY-MM-DDTHH:MM:SSZ");
    out.nonces.emplace(nonce, created.value());
  }
  return out;
}

// Replaces `path` by a file holding `text` (mode 0600) through detail::write_file_atomically:
// a temporary file beside it, flushed, renamed over `path`, the directory flushed after, so a
// crash leaves the old state or the new one, never a mix.
void write_atomically(const std::filesystem::path& path, std::string_view text) {
  try {
    detail::write_file_atomically(path, std::as_bytes(std::span(text.data(), text.size())), 0600,
                                  true, "replay state");
  } catch (const error& e) {
    fail(update_state_reason::write_failed, "update_state (write)", e.involved());
  }
}

}  // namespace

std::string_view to_string(update_state_reason reason) noexcept {
  static constexpr std::array<detail::enum_name<update_state_reason>, 5> names{{
      {update_state_reason::unreadable, "unreadable"},
      {update_state_reason::too_large, "too_large"},
      {update_state_reason::corrupt, "corrupt"},
      {update_state_reason::write_failed, "write_failed"},
      {update_state_reason::locked, "locked"},
  }};
  static_assert(detail::lists_values_in_order(names));
  return detail::name_of(names, reason, "unknown");
}

update_state_error::update_state_error(update_state_reason reason, std::string call,
                                       std::string involved, std::source_location where)
    : error(core_error_domain, static_cast<int>(errc::io),
            "replay state " + std::string(to_string(reason)), std::move(call), std::move(involved),
            where),
      reason_(reason) {}

update_state::update_state(std::filesystem::path file) : file_(std::move(file)) {}

void update_state::load() {
  if (file_.empty()) return;
  const auto text = read_state_file(file_);
  if (!text) return;
  auto parsed = parse_state(*text, file_);
  std::lock_guard lock(mutex_);
  for (const auto& [name, version] : parsed.highest) {
    auto& slot = highest_[name];
    const bool file_pending = parsed.pending.contains(name);
    if (version > slot) {
      slot = version;
      if (file_pending)
        pending_.insert(name);
      else
        pending_.erase(name);
    } else if (version == slot && !file_pending) {
      pending_.erase(name);  // settled on either side: settled
    }
  }
  for (auto& [name, file_list] : parsed.bad) {
    auto& list = bad_[name];
    for (auto& entry : file_list)
      if (std::none_of(list.begin(), list.end(),
                       [&](const bad_version& b) { return b.digest == entry.digest; }))
        list.push_back(std::move(entry));
    keep_newest(list);
  }
  nonces_.merge(parsed.nonces);
}

std::uint64_t update_state::highest_version(std::string_view module) const {
  std::lock_guard lock(mutex_);
  const auto it = highest_.find(module);
  return it == highest_.end() ? 0 : it->second;
}

std::map<std::string, std::uint64_t, std::less<>> update_state::highest_versions() const {
  std::lock_guard lock(mutex_);
  return highest_;
}

void update_state::raise_highest_version(std::string_view module, std::uint64_t version) {
  if (version == 0) return;
  std::lock_guard lock(mutex_);
  auto it = highest_.find(module);
  if (it == highest_.end()) it = highest_.emplace(std::string(module), 0).first;
  if (version >= it->second) pending_.erase(it->first);  // the floor refuses it: settled
  it->second = std::max(it->second, version);
}

void update_state::record_locked(const std::string& module, std::uint64_t version, bool pending) {
  const auto it = highest_.find(module);
  const std::uint64_t before = it == highest_.end() ? 0 : it->second;  // 0: none recorded
  const bool was_pending = pending_.contains(module);
  auto record = [&](std::uint64_t v, bool p) {
    if (v == 0)
      highest_.erase(module);
    else
      highest_[module] = v;
    if (p && v != 0)
      pending_.insert(module);
    else
      pending_.erase(module);
  };
  record(version, pending);
  try {
    save_locked();
  } catch (...) {
    record(before, was_pending);
    throw;
  }
}

void update_state::store_highest_version(std::string_view module, std::uint64_t version) {
  std::lock_guard lock(mutex_);
  record_locked(std::string(module), version, false);
}

void update_state::record_pending(std::string_view module, std::uint64_t version) {
  std::lock_guard lock(mutex_);
  record_locked(std::string(module), version, true);
}

bool update_state::pending(std::string_view module) const {
  std::lock_guard lock(mutex_);
  return pending_.contains(module);
}

void update_state::settle(std::string_view module) {
  std::lock_guard lock(mutex_);
  const auto it = pending_.find(module);
  if (it == pending_.end()) return;
  pending_.erase(it);
  save_locked();
}

nonce_outcome update_state::remember_nonce(std::string_view nonce, std::chrono::sys_seconds created,
                                           std::chrono::sys_seconds forget_before,
                                           std::size_t max_nonces) {
  std::lock_guard lock(mutex_);
  std::erase_if(nonces_, [&](const auto& n) { return n.second < forget_before; });
  if (nonces_.contains(std::string(nonce))) return nonce_outcome::replayed;
  if (nonces_.size() >= max_nonces) return nonce_outcome::full;
  nonces_.emplace(std::string(nonce), created);
  save_locked();
  return nonce_outcome::fresh;
}

std::size_t update_state::nonce_count() const {
  std::lock_guard lock(mutex_);
  return nonces_.size();
}

bool update_state::record_bad(const bad_version& entry) {
  CUBRIDGE_EXPECTS(
      check_module_name(entry.module).empty() && detail::check_signed_text(entry.module).empty(),
      "recording a bad version: " + detail::printable(entry.module) + " is no module name");
  CUBRIDGE_EXPECTS(detail::is_lower_hex(entry.digest, 64),
                   "recording a bad version of module '" + entry.module + "': digest " +
                       detail::printable(entry.digest) + " is not 64 lower-case hex digits");
  // A time the file could not read back would make the next start() fail (corrupt).
  CUBRIDGE_EXPECTS(entry.reason != gate_reason::none && entry.version != 0 &&
                       detail::parse_time(detail::format_time(entry.time)) == entry.time,
                   "recording a bad version of module '" + entry.module + "' (payload " +
                       entry.digest + "): a version above 0, a reason and a time are needed");
  std::lock_guard lock(mutex_);
  auto& list = bad_[entry.module];
  if (std::any_of(list.begin(), list.end(),
                  [&](const bad_version& b) { return b.digest == entry.digest; }))
    return false;
  list.push_back(entry);
  keep_newest(list);
  save_locked();  // on failure the record stays in memory: the safe side
  return true;
}

std::optional<bad_version> update_state::find_bad(std::string_view module,
                                                  std::string_view digest) const {
  std::lock_guard lock(mutex_);
  const auto it = bad_.find(module);
  if (it == bad_.end()) return std::nullopt;
  for (const auto& b : it->second)
    if (b.digest == digest) return b;
  return std::nullopt;
}

std::vector<bad_version> update_state::bad_versions() const {
  std::lock_guard lock(mutex_);
  std::vector<bad_version> out;
  for (const auto& [name, list] : bad_) out.insert(out.end(), list.begin(), list.end());
  return out;
}

void update_state::save_locked() const {
  if (file_.empty()) return;
  json document = json::object();
  document[std::string(format_key)] = format_version;
  json modules = json::object();
  for (const auto& [name, version] : highest_) modules[name] = version;
  document["highest_versions"] = std::move(modules);
  if (!pending_.empty()) {  // absent when every version is settled: the older format exactly
    json pending = json::object();
    for (const auto& name : pending_) pending[name] = highest_.at(name);
    document["pending_versions"] = std::move(pending);
  }
  json bad = json::object();
  for (const auto& [name, list] : bad_) {
    if (list.empty()) continue;
    json entries = json::array();
    for (const auto& b : list)
      entries.push_back({{"digest", b.digest},
                         {"version", b.version},
                         {"reason", std::string(to_string(b.reason))},
                         {"time", detail::format_time(b.time)}});
    bad[name] = std::move(entries);
  }
  if (!bad.empty()) document["bad_versions"] = std::move(bad);  // absent: the older format
  json nonces = json::object();
  for (const auto& [nonce, created] : nonces_) nonces[nonce] = detail::format_time(created);
  document["rollback_nonces"] = std::move(nonces);
  std::string text;
  try {
    text = document.dump() + "\n";  // keys sorted: the same state writes the same bytes
  } catch (const json::exception& e) {
    fail(update_state_reason::write_failed, "update_state (write)",
         "cannot serialise the state of " + quoted(file_) + ": " + e.what());
  }
  if (text.size() > max_update_state_bytes)
    fail(update_state_reason::write_failed, "update_state (write)",
         "the state of " + quoted(file_) + " would be " + std::to_string(text.size()) +
             " bytes, over the " + std::to_string(max_update_state_bytes) + " a load accepts");
  write_atomically(file_, text);
}

}  // namespace cubridge
