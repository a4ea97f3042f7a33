#pragma once
// The nodes the control side trusts (docs/fleet.md, "Enrolment"): an operator-signed registry in
// the bucket `cubridge_fleet` under `registry`, each node's id, its Ed25519 public key (its
// results and heartbeats are signed with the matching secret key) and its labels. A result or a
// heartbeat from a node not in the registry, or not signed by its key, is refused and counted.

#include <cubridge/bundle/bundle.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace cubridge::fleet {

/// Most nodes a registry holds, and most labels per node.
inline constexpr std::size_t max_registry_nodes = 100000;
inline constexpr std::size_t max_node_labels = 16;

/// One enrolled node.
struct enrolled_node {
  public_key key{};
  /// Labels: "cohort" chooses canaries by cohort (`publish --cohort`); names and values are
  /// fleet names (check_fleet_name).
  std::map<std::string, std::string, std::less<>> labels{};
};

/// The registry.
struct node_registry {
  /// One more for each write (compare-and-set as the desired state).
  std::uint64_t revision = 0;
  std::map<std::string, enrolled_node, std::less<>> nodes{};

  /// The node's entry, or nullptr.
  [[nodiscard]] const enrolled_node* find(std::string_view node) const;
};

/// The registry's JSON body (signed, kind registry).
[[nodiscard]] std::string to_json(const node_registry& registry);
/// The registry in `body`; nullopt (the reason in `why`) for anything else. Never throws but
/// std::bad_alloc.
[[nodiscard]] std::optional<node_registry> parse_registry(std::string_view body,
                                                          std::string* why = nullptr);

}  // namespace cubridge::fleet
