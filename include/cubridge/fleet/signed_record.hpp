#pragma once
// Every control message of the fleet is signed (docs/fleet.md, "Who may write what"): desired
// state and the node registry by the operator, results and heartbeats by the node's own key.
// The broker's permissions decide who may publish where; the signatures decide what a reader
// believes, so a message that slipped past a misconfigured server still changes nothing.
//
// A signed record is one JSON object, its body carried as text so that what was signed is
// exactly what is read:
//   {"cubridge_fleet":1,"kind":"result","signer":"<16 hex: key id>",
//    "body":"<the record's JSON text>","signature":"<128 hex: Ed25519>"}
// The signature covers "cubridge fleet v1 <kind>\n" followed by the body, so a heartbeat never
// passes as a result nor a result as desired state.

#include <cubridge/bundle/bundle.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace cubridge::fleet {

/// Largest signed record read, in bytes (a desired state, a registry of 10,000 nodes).
inline constexpr std::size_t max_signed_record_bytes = std::size_t{4} << 20;

/// What a signed record is.
enum class record_kind { desired_state, registry, result, heartbeat };

/// "desired_state", "registry", "result", "heartbeat".
[[nodiscard]] std::string_view to_string(record_kind kind) noexcept;

/// The signed record of `body` (a JSON object's text). Throws std::bad_alloc only.
[[nodiscard]] std::string sign_record(record_kind kind, std::string_view body,
                                      const secret_key& key);

/// A record that verified: its body and who signed it.
struct opened_record {
  std::string body{};
  key_id signer{};
};

/// Why a record was refused, in words naming the check ("signature does not verify with key
/// 0123abcd...").
struct record_refusal {
  std::string why{};
};

/// Verifies `text` as a signed record of `kind` by one of `keys`; the body when it verifies,
/// else nullopt with the reason in `refusal` (when given): over max_signed_record_bytes, not
/// the format above, another kind, an unknown signer, a bad signature, a body that is not
/// valid UTF-8 without NUL bytes. Never throws but std::bad_alloc.
[[nodiscard]] std::optional<opened_record> open_record(std::string_view text, record_kind kind,
                                                       const trusted_keys& keys,
                                                       record_refusal* refusal = nullptr);

}  // namespace cubridge::fleet
