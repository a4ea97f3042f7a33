// The node registry's JSON body (registry.hpp).
#include <cubridge/core/detail/hex.hpp>
#include <cubridge/fleet/registry.hpp>
#include <cubridge/fleet/subjects.hpp>

#include <nlohmann/json.hpp>

namespace cubridge::fleet {
namespace {

using json = nlohmann::json;

std::optional<node_registry> refuse(std::string* why, std::string what) {
  if (why) *why = std::move(what);
  return std::nullopt;
}

}  // namespace

const enrolled_node* node_registry::find(std::string_view node) const {
  const auto it = nodes.find(node);
  return it == nodes.end() ? nullptr : &it->second;
}

std::string to_json(const node_registry& registry) {
  json nodes = json::object();
  for (const auto& [id, node] : registry.nodes)
    nodes[id] = {{"key", cubridge::detail::to_hex(node.key.bytes)}, {"labels", node.labels}};
  const json j{{"revision", registry.revision}, {"nodes", std::move(nodes)}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::optional<node_registry> parse_registry(std::string_view body, std::string* why) {
  const auto j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return refuse(why, "registry is not a JSON object");
  const auto revision = j.find("revision");
  const auto nodes = j.find("nodes");
  if (revision == j.end() || !revision->is_number_unsigned() || revision->get<std::uint64_t>() == 0)
    return refuse(why, "registry 'revision' is not a positive whole number");
  if (nodes == j.end() || !nodes->is_object() || nodes->size() > max_registry_nodes)
    return refuse(why, "registry 'nodes' is not an object of at most " +
                           std::to_string(max_registry_nodes) + " nodes");
  node_registry out;
  out.revision = revision->get<std::uint64_t>();
  for (const auto& [id, node] : nodes->items()) {
    if (const auto p = check_fleet_name(id, "node id"); !p.empty()) return refuse(why, p);
    if (!node.is_object()) return refuse(why, "registry entry of '" + id + "' is not an object");
    const auto key = node.find("key");
    const auto labels = node.find("labels");
    enrolled_node entry;
    if (key == node.end() || !key->is_string() ||
        !cubridge::detail::parse_lower_hex(key->get_ref<const std::string&>(), entry.key.bytes))
      return refuse(why, "registry key of '" + id + "' is not 64 lower-case hex digits");
    if (labels == node.end() || !labels->is_object() || labels->size() > max_node_labels)
      return refuse(why, "registry labels of '" + id + "' are not an object of at most " +
                             std::to_string(max_node_labels));
    for (const auto& [name, value] : labels->items()) {
      if (!value.is_string() || !check_fleet_name(name, "l").empty() ||
          !check_fleet_name(value.get_ref<const std::string&>(), "l").empty())
        return refuse(why, "registry label of '" + id + "' is not name: value of fleet names");
      entry.labels[name] = value.get<std::string>();
    }
    out.nodes.emplace(id, std::move(entry));
  }
  return out;
}

}  // namespace cubridge::fleet
