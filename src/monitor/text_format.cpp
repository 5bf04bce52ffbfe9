#include "monitor/text_format.h"

#include <cmath>
#include <cstdio>

namespace taiji {

namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 if it is not one. Valid as
// RFC 3629 has it: no overlong forms (C0, C1, E0 80..9F, F0 80..8F), no surrogates
// (ED A0..BF), nothing above U+10FFFF (F4 90.., F5..FF), which strict parsers reject.
size_t utf8_length(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  const auto second = static_cast<unsigned char>(s[i + 1]);
  const unsigned char lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;
  const unsigned char hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
  if (second < lo || second > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return 0;
  }
  return n;
}

void append_double(std::string& out, double v) {
  char buf[32];
  int n = std::snprintf(buf, sizeof buf, "%.9g", v);
  out.append(buf, static_cast<size_t>(n));
}

}  // namespace

void append_json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = utf8_length(s, i);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c >= 0x20 && n > 0) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    }
    ++i;
  }
  out.push_back('"');
}

void append_json_number(std::string& out, double v) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  append_double(out, v);
}

void append_json_number(std::string& out, uint64_t v) { out += std::to_string(v); }

void append_label_value(std::string& out, std::string_view s) {
  out.push_back('"');
  for (size_t i = 0; i < s.size();) {
    const char c = s[i];
    const size_t n = utf8_length(s, i);
    if (c == '\\' || c == '"') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (n == 0) {
      // Label values must be UTF-8 (a scrape fails on one bad byte) and allow no other
      // escapes: a byte that is not UTF-8 becomes U+FFFD.
      out += "\xef\xbf\xbd";
    } else {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    ++i;
  }
  out.push_back('"');
}

void append_sample_value(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
  } else if (std::isinf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
  } else {
    append_double(out, v);
  }
}

void append_sample_value(std::string& out, uint64_t v) { out += std::to_string(v); }

bool valid_metric_name(std::string_view s, bool colon) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

}  // namespace taiji
