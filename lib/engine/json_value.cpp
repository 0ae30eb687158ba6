// SPDX-License-Identifier: MIT
// The strict JSON parser of json_value.hpp: recursive descent over the bytes, bounded depth.
#include "engine/json_value.hpp"

#include <set>

#include "engine/error.hpp"

namespace cxlpool::engine {

bool JsonValue::as_u64(uint64_t* out) const {
  if (kind_ != Kind::kNumber || string_.empty() || string_.size() > 20) return false;
  uint64_t v = 0;
  for (char c : string_) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = uint64_t(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

const JsonValue* JsonValue::find(std::string_view key) const {
  for (const auto& [k, v] : members_)
    if (k == key) return &v;
  return nullptr;
}

const char* JsonValue::kind_name(Kind k) {
  switch (k) {
    case Kind::kNull:
      return "null";
    case Kind::kBool:
      return "a boolean";
    case Kind::kNumber:
      return "a number";
    case Kind::kString:
      return "a string";
    case Kind::kArray:
      return "an array";
    case Kind::kObject:
      return "an object";
  }
  return "?";
}

class JsonParser {
 public:
  JsonParser(std::string_view text, const std::string& what) : s_(text), what_(what) {}

  JsonValue document() {
    JsonValue v = value(0);
    skip_space();
    if (pos_ != s_.size()) error("unexpected text after the value");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 64;

  [[noreturn]] void error(const std::string& problem) const {
    fail(what_ + ": JSON: " + problem + " at byte " + std::to_string(pos_));
  }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return s_[pos_]; }
  void expect(char c) {
    if (at_end() || peek() != c) error(std::string("expected '") + c + "'");
    ++pos_;
  }

  JsonValue value(int depth) {
    if (depth > kMaxDepth) error("nested deeper than 64");
    skip_space();
    if (at_end()) error("unexpected end of text");
    JsonValue v;
    switch (peek()) {
      case '{':
        v.kind_ = JsonValue::Kind::kObject;
        object(v, depth);
        break;
      case '[':
        v.kind_ = JsonValue::Kind::kArray;
        array(v, depth);
        break;
      case '"':
        v.kind_ = JsonValue::Kind::kString;
        v.string_ = string();
        break;
      case 't':
        literal("true");
        v.kind_ = JsonValue::Kind::kBool;
        v.bool_ = true;
        break;
      case 'f':
        literal("false");
        v.kind_ = JsonValue::Kind::kBool;
        break;
      case 'n':
        literal("null");
        break;
      default:
        v.kind_ = JsonValue::Kind::kNumber;
        v.string_ = number();
    }
    return v;
  }

  void literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) error("invalid literal");
    pos_ += word.size();
  }

  void object(JsonValue& v, int depth) {
    ++pos_;
    skip_space();
    if (!at_end() && peek() == '}') {
      ++pos_;
      return;
    }
    std::set<std::string, std::less<>> seen;
    for (;;) {
      skip_space();
      if (at_end() || peek() != '"') error("expected a string key");
      const size_t key_at = pos_;
      std::string key = string();
      if (!seen.insert(key).second) {
        pos_ = key_at;
        error("duplicate key \"" + key + "\"");
      }
      skip_space();
      expect(':');
      v.members_.emplace_back(std::move(key), value(depth + 1));
      skip_space();
      if (at_end()) error("unexpected end of text in an object");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}');
      return;
    }
  }

  void array(JsonValue& v, int depth) {
    ++pos_;
    skip_space();
    if (!at_end() && peek() == ']') {
      ++pos_;
      return;
    }
    for (;;) {
      v.array_.push_back(value(depth + 1));
      skip_space();
      if (at_end()) error("unexpected end of text in an array");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']');
      return;
    }
  }

  unsigned hex4() {
    if (s_.size() - pos_ < 4) error("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= unsigned(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= unsigned(c - 'A' + 10);
      else
        error("invalid \\u escape");
    }
    return v;
  }

  static void put_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xc0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += char(0xe0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    } else {
      out += char(0xf0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3f));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    }
  }

  // One UTF-8 sequence starting at pos_, validated (no overlongs, no surrogates, <= U+10FFFF).
  void utf8_char(std::string& out) {
    const auto b0 = static_cast<unsigned char>(s_[pos_]);
    size_t len = 0;
    unsigned cp = 0, min = 0;
    if (b0 >= 0xc2 && b0 <= 0xdf) {
      len = 2, cp = b0 & 0x1fu, min = 0x80;
    } else if (b0 >= 0xe0 && b0 <= 0xef) {
      len = 3, cp = b0 & 0x0fu, min = 0x800;
    } else if (b0 >= 0xf0 && b0 <= 0xf4) {
      len = 4, cp = b0 & 0x07u, min = 0x10000;
    } else {
      error("invalid UTF-8");
    }
    if (s_.size() - pos_ < len) error("truncated UTF-8");
    for (size_t i = 1; i < len; ++i) {
      const auto b = static_cast<unsigned char>(s_[pos_ + i]);
      if ((b & 0xc0u) != 0x80u) error("invalid UTF-8");
      cp = (cp << 6) | (b & 0x3fu);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) error("invalid UTF-8");
    out.append(s_.substr(pos_, len));
    pos_ += len;
  }

  std::string string() {
    ++pos_;  // the opening quote
    std::string out;
    for (;;) {
      if (at_end()) error("unterminated string");
      const auto c = static_cast<unsigned char>(peek());
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) error("control character in a string");
      if (c >= 0x80) {
        utf8_char(out);
        continue;
      }
      if (c != '\\') {
        out += char(c);
        ++pos_;
        continue;
      }
      ++pos_;
      if (at_end()) error("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xdc00 && cp <= 0xdfff) error("lone low surrogate");
          if (cp >= 0xd800 && cp <= 0xdbff) {
            if (s_.substr(pos_, 2) != "\\u") error("lone high surrogate");
            pos_ += 2;
            const unsigned lo = hex4();
            if (lo < 0xdc00 || lo > 0xdfff) error("lone high surrogate");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          }
          put_utf8(out, cp);
          break;
        }
        default:
          --pos_;
          error("invalid escape");
      }
    }
  }

  std::string number() {
    const size_t start = pos_;
    auto digit = [&] { return !at_end() && peek() >= '0' && peek() <= '9'; };
    if (!at_end() && peek() == '-') ++pos_;
    if (!digit()) error("invalid value");
    if (peek() == '0') {
      ++pos_;
      if (digit()) error("leading zero in a number");
    } else {
      while (digit()) ++pos_;
    }
    if (!at_end() && peek() == '.') {
      ++pos_;
      if (!digit()) error("digits expected after '.'");
      while (digit()) ++pos_;
    }
    if (!at_end() && (peek() == 'e' || peek() == 'E')) {
      ++pos_;
      if (!at_end() && (peek() == '+' || peek() == '-')) ++pos_;
      if (!digit()) error("digits expected in the exponent");
      while (digit()) ++pos_;
    }
    if (pos_ - start > 64) {
      pos_ = start;
      error("number longer than 64 characters");
    }
    return std::string(s_.substr(start, pos_ - start));
  }

  std::string_view s_;
  const std::string& what_;
  size_t pos_ = 0;
};

JsonValue parse_json(std::string_view text, const std::string& what) { return JsonParser(text, what).document(); }

}  // namespace cxlpool::engine
