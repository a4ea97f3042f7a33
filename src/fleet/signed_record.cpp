// Signed records (signed_record.hpp): Ed25519 through the bundle layer's signing
// (bundle/detail/signing.hpp), JSON through nlohmann.
#include <cubridge/bundle/detail/signing.hpp>
#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/core/detail/hex.hpp>
#include <cubridge/core/detail/printable.hpp>
#include <cubridge/fleet/signed_record.hpp>

#include <nlohmann/json.hpp>

#include <array>

namespace cubridge::fleet {
namespace {

using json = nlohmann::json;

constexpr std::array<cubridge::detail::enum_name<record_kind>, 4> kind_names{{
    {record_kind::desired_state, "desired_state"},
    {record_kind::registry, "registry"},
    {record_kind::result, "result"},
    {record_kind::heartbeat, "heartbeat"},
}};
static_assert(cubridge::detail::lists_values_in_order(kind_names));

std::string domain_of(record_kind kind) {
  return "cubridge fleet v1 " + std::string(to_string(kind)) + "\n";
}

std::optional<opened_record> refuse(record_refusal* refusal, std::string why) {
  if (refusal) refusal->why = std::move(why);
  return std::nullopt;
}

}  // namespace

std::string_view to_string(record_kind kind) noexcept {
  return cubridge::detail::name_of(kind_names, kind, "unknown");
}

std::string sign_record(record_kind kind, std::string_view body, const secret_key& key) {
  const auto signature = cubridge::detail::sign_detached(domain_of(kind), body, key);
  const json envelope{{"cubridge_fleet", 1},
                      {"kind", std::string(to_string(kind))},
                      {"signer", to_hex(key.public_key().id())},
                      {"body", std::string(body)},
                      {"signature", cubridge::detail::to_hex(signature)}};
  return envelope.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::optional<opened_record> open_record(std::string_view text, record_kind kind,
                                         const trusted_keys& keys, record_refusal* refusal) {
  if (text.size() > max_signed_record_bytes)
    return refuse(refusal, "record of " + std::to_string(text.size()) + " bytes is over " +
                               std::to_string(max_signed_record_bytes));
  if (const auto problem = cubridge::detail::check_signed_text(text); !problem.empty())
    return refuse(refusal, "record is not text: " + problem);
  const auto j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return refuse(refusal, "record is not a JSON object");
  const auto field = [&j](const char* name) -> const std::string* {
    const auto it = j.find(name);
    return it != j.end() && it->is_string() ? &it->get_ref<const std::string&>() : nullptr;
  };
  const auto format = j.find("cubridge_fleet");
  if (format == j.end() || !format->is_number_unsigned() || format->get<std::uint64_t>() != 1)
    return refuse(refusal, "record is not a cubridge fleet record of format 1");
  const auto* kind_text = field("kind");
  const auto* signer_text = field("signer");
  const auto* body = field("body");
  const auto* signature_text = field("signature");
  if (!kind_text || !signer_text || !body || !signature_text)
    return refuse(refusal, "record lacks kind, signer, body or signature (as texts)");
  if (j.size() != 5) return refuse(refusal, "record has fields other than the five it may have");
  if (*kind_text != to_string(kind))
    return refuse(refusal, "record is a " +
                               cubridge::detail::printable(*kind_text, {.quoted = false}) +
                               ", wanted a " + std::string(to_string(kind)));
  key_id signer{};
  if (!cubridge::detail::parse_lower_hex(*signer_text, signer))
    return refuse(refusal, "signer is not 16 lower-case hex digits");
  std::array<std::byte, 64> signature{};
  if (!cubridge::detail::parse_lower_hex(*signature_text, signature))
    return refuse(refusal, "signature is not 128 lower-case hex digits");
  const public_key* key = keys.find(signer);
  if (!key) return refuse(refusal, "signer " + *signer_text + " is not a trusted key");
  if (!cubridge::detail::verify_detached(domain_of(kind), *body, signature, *key))
    return refuse(refusal, "signature does not verify with key " + *signer_text);
  // The body as the envelope carried it (an escaped NUL is valid JSON there): checked again so
  // that no signed byte hides behind a NUL from the body's parser.
  if (const auto problem = cubridge::detail::check_signed_text(*body); !problem.empty())
    return refuse(refusal, "record body is not text: " + problem);
  return opened_record{*body, signer};
}

}  // namespace cubridge::fleet
