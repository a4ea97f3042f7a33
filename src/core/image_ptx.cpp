// The PTX reader of inspect_image.
//
// PTX: text, ".version M.N" first (after comments), then ".target sm_XY[a|f][, ...]" and
//   ".address_size 32|64"; kernels are ".entry name (.param ...) { ... }".

#include "image_internal.hpp"

#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cubridge::image_internal {
namespace {

bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '$' || c == '%' || c == '.';
}
bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

}  // namespace

std::size_t skip_space_and_comments(std::string_view t, std::size_t pos) {
  while (pos < t.size()) {
    if (is_space(t[pos])) {
      ++pos;
    } else if (t[pos] == '/' && pos + 1 < t.size() && t[pos + 1] == '/') {
      pos = t.find('\n', pos + 2);
      if (pos == std::string_view::npos) return t.size();
    } else if (t[pos] == '/' && pos + 1 < t.size() && t[pos + 1] == '*') {
      pos = t.find("*/", pos + 2);
      if (pos == std::string_view::npos) return std::string_view::npos;
      pos += 2;
    } else {
      break;
    }
  }
  return pos;
}

bool looks_like_ptx(byte_span d) {
  auto t = as_text(d);
  t = t.substr(0, t.find('\0'));
  const auto pos = skip_space_and_comments(t, 0);
  if (pos == std::string_view::npos || !t.substr(pos).starts_with(".version")) return false;
  return pos + 8 == t.size() || !is_word_char(t[pos + 8]);
}

namespace {

struct ptx_token {
  enum kind_t { end, word, punct, string } kind = end;
  std::string_view text;
  std::size_t offset = 0;
  [[nodiscard]] bool is(char c) const { return kind == punct && text.size() == 1 && text[0] == c; }
  [[nodiscard]] bool is(std::string_view w) const { return kind == word && text == w; }
};

class ptx_parser {
 public:
  ptx_parser(const source& s, std::string_view text) : s_(s), t_(text) {}

  parsed_code parse() {
    parsed_code out;
    auto tok = next();
    if (!tok.is(".version")) s_.fail("must begin with .version, found '" + show(tok) + "'");
    out.target.ptx_version = parse_version(next());
    int depth = 0;
    std::size_t outer_open = 0;
    std::optional<image_kernel> pending;  // an .entry whose body has not been seen yet
    std::size_t pending_at = 0;
    bool pending_extern = false;
    bool extern_seen = false;
    bool have_target = false;
    int address_bits = 32;  // the PTX default without .address_size
    for (tok = next(); tok.kind != ptx_token::end; tok = next()) {
      if (depth > 0) {
        if (tok.is('{')) ++depth;
        if (tok.is('}')) --depth;
        continue;
      }
      if (tok.is('{')) {
        if (pending && !pending_extern) kernels_.push_back(std::move(*pending));
        pending.reset();
        extern_seen = false;
        depth = 1;
        outer_open = tok.offset;
      } else if (tok.is('}')) {
        s_.fail("unbalanced '}' at " + s_.at(tok.offset));
      } else if (tok.is(';')) {
        pending.reset();  // a declaration, not a definition
        extern_seen = false;
      } else if (tok.is(".target")) {
        if (have_target) s_.fail("second .target directive at " + s_.at(tok.offset));
        parse_target(out.target);
        have_target = true;
      } else if (tok.is(".address_size")) {
        const auto v = next();
        if (v.is("64")) {
          address_bits = 64;
        } else if (v.is("32")) {
          address_bits = 32;
        } else {
          s_.fail(".address_size must be 32 or 64, found '" + show(v) + "' at " + s_.at(v.offset));
        }
      } else if (tok.is(".pragma")) {
        // ".pragma "...";" may stand between an .entry's parameters and its body.
        for (tok = next(); tok.kind != ptx_token::end && !tok.is(';'); tok = next()) {
        }
      } else if (tok.is(".extern")) {
        extern_seen = true;
      } else if (tok.is(".entry")) {
        if (pending)
          s_.fail(".entry at " + s_.at(tok.offset) + " follows an .entry without a body");
        pending_at = tok.offset;
        pending = parse_entry();
        pending_extern = extern_seen;
        extern_seen = false;
      }
    }
    if (depth > 0) s_.fail("'{' at " + s_.at(outer_open) + " is never closed (truncated PTX?)");
    if (pending)
      s_.fail(".entry '" + pending->name + "' at " + s_.at(pending_at) +
              " has no body (truncated PTX?)");
    if (!have_target) s_.fail("no .target directive");
    out.target.kind = image_kind::ptx;
    out.target.address_bits = address_bits;
    out.target.arch_name = arch_name_of(image_kind::ptx, out.target.capability());
    out.kernels = std::move(kernels_);
    return out;
  }

 private:
  static std::string show(const ptx_token& tok) {
    if (tok.kind == ptx_token::end) return "end of text";
    return std::string(tok.text.substr(0, 40));
  }

  ptx_token next() {
    if (peeked_) {
      peeked_ = false;
      return peek_;
    }
    return lex();
  }
  const ptx_token& peek() {
    if (!peeked_) {
      peek_ = lex();
      peeked_ = true;
    }
    return peek_;
  }

  ptx_token lex() {
    const auto start = pos_;
    pos_ = skip_space_and_comments(t_, pos_);
    if (pos_ == std::string_view::npos)
      s_.fail("unterminated /* comment after " + s_.at(start) + " (truncated PTX?)");
    ptx_token tok;
    tok.offset = pos_;
    if (pos_ >= t_.size()) return tok;
    const char c = t_[pos_];
    if (is_word_char(c)) {
      auto e = pos_;
      while (e < t_.size() && is_word_char(t_[e])) ++e;
      tok.kind = ptx_token::word;
      tok.text = t_.substr(pos_, e - pos_);
      pos_ = e;
    } else if (c == '"') {
      auto e = pos_ + 1;
      while (e < t_.size() && t_[e] != '"') e += t_[e] == '\\' ? 2U : 1U;
      if (e >= t_.size()) s_.fail("unterminated string starting at " + s_.at(pos_));
      tok.kind = ptx_token::string;
      tok.text = t_.substr(pos_, e + 1 - pos_);
      pos_ = e + 1;
    } else if (c > ' ' && c < 0x7f) {
      tok.kind = ptx_token::punct;
      tok.text = t_.substr(pos_, 1);
      ++pos_;
    } else {
      s_.fail("byte " + hex(static_cast<unsigned char>(c)) + " at " + s_.at(pos_) +
              " cannot appear in PTX text");
    }
    return tok;
  }

  ptx_isa_version parse_version(const ptx_token& tok) {
    const auto t = tok.kind == ptx_token::word ? tok.text : std::string_view{};
    const auto dot = t.find('.');
    auto number = [](std::string_view n, int& out) {
      if (n.empty() || n.size() > 4) return false;
      out = 0;
      for (char c : n) {
        if (c < '0' || c > '9') return false;
        out = out * 10 + (c - '0');
      }
      return true;
    };
    ptx_isa_version v;
    if (dot == std::string_view::npos || !number(t.substr(0, dot), v.major) ||
        !number(t.substr(dot + 1), v.minor))
      s_.fail("bad .version '" + show(tok) + "' at " + s_.at(tok.offset));
    return v;
  }

  void parse_target(image_target& target) {
    bool have_sm = false;
    for (;;) {
      const auto tok = next();
      if (tok.kind != ptx_token::word)
        s_.fail("bad .target list: '" + show(tok) + "' at " + s_.at(tok.offset));
      if (tok.text.starts_with("sm_")) {
        if (have_sm) s_.fail("second architecture in .target at " + s_.at(tok.offset));
        have_sm = true;
        const auto capability = parse_compute_capability(tok.text);
        if (!capability)
          s_.fail("bad architecture '" + show(tok) + "' in .target at " + s_.at(tok.offset));
        target.sm = capability->as_int();
        target.variant = capability->variant;
      }
      if (!peek().is(',')) break;
      next();
    }
    if (!have_sm) s_.fail(".target names no sm_ architecture");
  }

  static std::size_t type_size(std::string_view t) {
    static constexpr std::array<std::pair<std::string_view, std::size_t>, 20> types{{
        {".b8", 1},  {".s8", 1},  {".u8", 1},    {".b16", 2},    {".s16", 2},
        {".u16", 2}, {".f16", 2}, {".bf16", 2},  {".b32", 4},    {".s32", 4},
        {".u32", 4}, {".f32", 4}, {".f16x2", 4}, {".bf16x2", 4}, {".tf32", 4},
        {".b64", 8}, {".s64", 8}, {".u64", 8},   {".f64", 8},    {".b128", 16},
    }};
    for (const auto& [name, size] : types)
      if (name == t) return size;
    return 0;
  }

  // After ".entry": the name and the optional parameter list.
  image_kernel parse_entry() {
    const auto name = next();
    if (name.kind != ptx_token::word || name.text.starts_with("."))
      s_.fail(".entry without a name at " + s_.at(name.offset));
    image_kernel k{std::string(name.text), std::vector<std::size_t>{}};
    if (!peek().is('(')) return k;
    const auto open = next();
    bool known = true;
    if (peek().is(')')) {
      next();
      return k;
    }
    for (;;) {
      // One parameter: ".param" then type, ".align N", state spaces, name, "[N]"...
      std::size_t element = 0;
      std::uint64_t count = 1;
      std::size_t index = 0;
      ptx_token tok;
      for (tok = next();; tok = next(), ++index) {
        if (tok.kind == ptx_token::end)
          s_.fail("parameter list of .entry '" + k.name + "' opened at " + s_.at(open.offset) +
                  " is never closed (truncated PTX?)");
        if (tok.is(',') || tok.is(')')) break;
        if (tok.is('{') || tok.is('}') || tok.is(';') || tok.is('('))
          s_.fail("unexpected '" + show(tok) + "' in the parameter list of .entry '" + k.name +
                  "' at " + s_.at(tok.offset));
        if (index == 0) {
          if (!tok.is(".param")) known = false;
        } else if (tok.is(".align")) {
          next();  // the alignment value
        } else if (tok.is(".v2") || tok.is(".v4")) {
          count *= tok.is(".v2") ? 2U : 4U;
        } else if (tok.kind == ptx_token::word && tok.text.starts_with(".")) {
          if (auto size = type_size(tok.text); size != 0) {
            element = size;
          } else if (!(tok.is(".ptr") || tok.is(".global") || tok.is(".const") ||
                       tok.is(".shared") || tok.is(".local"))) {
            known = false;  // .texref, .samplerref, ... : size not known here
          }
        } else if (tok.is('[')) {
          const auto n = next();
          std::uint64_t dim = 0;
          bool ok = n.kind == ptx_token::word && !n.text.empty() && n.text.size() <= 9;
          for (char c : ok ? n.text : std::string_view{}) {
            if (c < '0' || c > '9') ok = false;
            dim = dim * 10 + static_cast<std::uint64_t>(c - '0');
          }
          if (!ok || !next().is(']')) {
            known = false;  // unsized or symbolic dimension
          } else {
            count = sat_mul(count, dim);
          }
        }
      }
      if (element == 0 || count > (std::uint64_t{1} << 32)) known = false;
      if (known) k.parameter_sizes->push_back(element * count);
      if (tok.is(')')) break;
    }
    if (!known) k.parameter_sizes.reset();
    return k;
  }

  const source& s_;
  std::string_view t_;
  std::size_t pos_ = 0;
  bool peeked_ = false;
  ptx_token peek_;
  std::vector<image_kernel> kernels_;
};

}  // namespace

parsed_code parse_ptx(const source& s, work_budget& budget) {
  auto text = as_text(s.data);
  text = text.substr(0, text.find('\0'));  // the driver reads PTX up to its NUL
  budget.spend(text.size(), s);
  return ptx_parser(s, text).parse();
}

}  // namespace cubridge::image_internal
