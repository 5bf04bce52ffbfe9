#include "json_mini.h"

#include <cstdlib>

namespace taiji_test {

namespace {

struct Parser {
  const std::string& s;
  size_t i = 0;

  [[noreturn]] void fail(const std::string& what) {
    throw std::runtime_error("JSON: " + what + " at offset " + std::to_string(i));
  }
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) ++i;
  }
  void expect(char c) {
    ws();
    if (i >= s.size() || s[i] != c) fail(std::string("expected '") + c + "'");
    ++i;
  }
  bool literal(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (s.compare(i, n, word) != 0) return false;
    i += n;
    return true;
  }
  std::string str() {
    expect('"');
    std::string out;
    while (i < s.size() && s[i] != '"') {
      char c = s[i++];
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= s.size()) fail("cut escape");
      char e = s[i++];
      switch (e) {
        case '"': case '\\': case '/': out += e; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          if (i + 4 > s.size()) fail("cut \\u escape");
          unsigned v = static_cast<unsigned>(std::strtoul(s.substr(i, 4).c_str(), nullptr, 16));
          i += 4;
          if (v < 0x80) {
            out += static_cast<char>(v);
          } else {
            out += '?';  // enough for tests: they check escaping, not decoding
          }
          break;
        }
        default: fail("bad escape");
      }
    }
    if (i >= s.size()) fail("unterminated string");
    ++i;
    return out;
  }
  Json value() {
    ws();
    if (i >= s.size()) fail("unexpected end");
    Json v;
    char c = s[i];
    if (c == '{') {
      ++i;
      v.type = Json::Type::Object;
      ws();
      if (i < s.size() && s[i] == '}') {
        ++i;
        return v;
      }
      for (;;) {
        std::string key = str();
        expect(':');
        if (v.object.count(key)) fail("duplicate key '" + key + "'");
        v.object[key] = value();
        ws();
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      ++i;
      v.type = Json::Type::Array;
      ws();
      if (i < s.size() && s[i] == ']') {
        ++i;
        return v;
      }
      for (;;) {
        v.array.push_back(value());
        ws();
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.type = Json::Type::String;
      v.string = str();
      return v;
    }
    if (literal("true")) {
      v.type = Json::Type::Bool;
      v.boolean = true;
      return v;
    }
    if (literal("false")) {
      v.type = Json::Type::Bool;
      return v;
    }
    if (literal("null")) return v;
    const char* start = s.c_str() + i;
    char* end = nullptr;
    v.number = std::strtod(start, &end);
    if (end == start) fail("bad value");
    i += static_cast<size_t>(end - start);
    v.type = Json::Type::Number;
    return v;
  }
};

}  // namespace

Json parse_json(const std::string& text) {
  Parser p{text};
  Json v = p.value();
  p.ws();
  if (p.i != text.size()) p.fail("trailing text");
  return v;
}

}  // namespace taiji_test
