#include "in_process_node.hpp"

namespace cubridge::bench {

std::uint64_t memory_sink::current_version(std::string_view name) const {
  std::lock_guard lock(mutex_);
  return name == module_ ? current_ : 0;
}

sink_result memory_sink::apply(const verified_bundle& bundle, apply_rule rule) {
  if (bundle.manifest.name != module_)
    return {gate_reason::unknown_module, 0, "this node serves " + module_};
  std::lock_guard lock(mutex_);
  if (rule == apply_rule::above_serving && bundle.version() <= current_)
    return not_newer_result(module_, bundle.version(), current_);
  previous_ = current_;
  current_ = bundle.version();
  return {gate_reason::none, current_, {}};
}

sink_result memory_sink::rollback(std::string_view name) {
  std::lock_guard lock(mutex_);
  if (name != module_) return {gate_reason::unknown_module, 0, "no such module"};
  if (previous_ == 0) return {gate_reason::no_previous_version, current_, "none"};
  std::swap(current_, previous_);
  return {gate_reason::none, current_, {}};
}

std::vector<module_report> memory_sink::status() const {
  std::lock_guard lock(mutex_);
  return {{module_, current_, {previous_, current_}, 0, {}}};
}

in_process_node::in_process_node(std::string id, const std::filesystem::path& dir,
                                 const std::string& module,
                                 const cubridge::public_key& operator_key,
                                 const std::string& servers,
                                 const std::filesystem::path& credentials,
                                 const std::filesystem::path& ca_file)
    : id_(std::move(id)), module_(module), sink_(std::make_shared<memory_sink>(module)) {
  const auto keys = generate_keypair();
  public_key_ = keys.public_key;
  const auto key_file = dir / (id_ + ".key");
  write_key_file(key_file, keys.secret_key);

  update_gate_options policy;
  policy.keys.add(operator_key);
  policy.state_file = dir / (id_ + ".state");
  policy.max_bundle_bytes = std::size_t{16} << 20;  // as the node process's default
  gate_ = update_gate::create(sink_, std::move(policy));

  fleet_agent_options options;  // the defaults: heartbeat 5 s, resync 2 s, retries 100 ms to 2 s
  options.bus.servers = servers;
  options.bus.credentials = credentials;
  options.bus.ca_file = ca_file;
  options.node = id_;
  options.node_key_file = key_file;
  options.modules = {module};
  agent_ = std::make_unique<fleet_agent>(gate_, std::move(options));
}

in_process_node::~in_process_node() {
  stop();
}

void in_process_node::start() {
  agent_->start();
}

void in_process_node::stop() noexcept {
  if (agent_) agent_->stop();
}

std::uint64_t in_process_node::serving() const {
  return sink_->current_version(module_);
}

fleet_agent_stats in_process_node::stats() const noexcept {
  return agent_->stats();
}

std::string in_process_node::last_problem() const {
  return agent_->last_problem();
}

}  // namespace cubridge::bench
