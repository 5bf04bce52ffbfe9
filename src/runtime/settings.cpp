// One parser and one check per setting type; the table itself is in settings_table.cpp.
#include "runtime/settings.h"

#include <algorithm>
#include <limits>
#include <type_traits>
#include <utility>

#include "common/time_limit.h"

namespace taiji {

namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
// How much of a long value an error quotes.
constexpr size_t kQuotedBytes = 80;

// The whole string must be decimal digits and the value at most `max`.
bool parse_digits(std::string_view s, uint64_t max, uint64_t* out) {
  if (s.empty()) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (max - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

Status parse_bytes(std::string_view var, std::string_view value, uint64_t* out) {
  std::string_view s = value;
  uint64_t mult = 1;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K': case 'k': mult = kKiB; break;
      case 'M': case 'm': mult = kMiB; break;
      case 'G': case 'g': mult = 1024 * kMiB; break;
      default: break;
    }
    if (mult != 1) s.remove_suffix(1);
  }
  uint64_t v = 0;
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  if (!parse_digits(s, max, &v)) {
    if (all_digits(s)) return config_error(named(var, value) + " is out of range");
    return config_error(named(var, value) +
                        " is not a byte size (digits with an optional K, M or G suffix)");
  }
  if (v == 0) return config_error(named(var, value) + " is not a positive byte size");
  if (v > max / mult) return config_error(named(var, value) + " is out of range");
  *out = v * mult;
  return Status::ok();
}

std::string join(std::span<const SettingWord> words, std::string_view last_sep) {
  std::string s;
  for (size_t i = 0; i < words.size(); ++i) {
    s += (i == 0 ? "" : i + 1 == words.size() ? std::string(last_sep) : ", ");
    s += words[i].text;
  }
  return s;
}

std::string quoted(const std::string& source) {
  return source.size() > kQuotedBytes ? source.substr(0, kQuotedBytes) + "..." : source;
}

std::string prefixed(const Setting& s, const std::string& source) {
  return s.what.empty() ? source : std::string(s.what) + " " + source;
}

void store_number(const Setting& s, Config* c, uint64_t v) {
  std::visit(
      [&](auto member) {
        using T = std::remove_reference_t<decltype(c->*member)>;
        if constexpr (std::is_integral_v<T>) c->*member = static_cast<T>(v);
      },
      s.member);
}

// Explicit numbers: within the setting's range, or its unset value.
Status check_integer(const Setting& s, const Config& c) {
  bool ok = true;
  bool negative = false;
  std::visit(
      [&](auto member) {
        using T = std::remove_cvref_t<decltype(c.*member)>;
        if constexpr (std::is_signed_v<T>) {
          const int64_t v = c.*member;
          negative = v < 0 && v != s.unset;
          ok = v == s.unset || (v >= 0 && static_cast<uint64_t>(v) >= s.min &&
                                static_cast<uint64_t>(v) <= s.max);
        } else if constexpr (std::is_unsigned_v<T>) {
          const uint64_t v = c.*member;
          ok = v == static_cast<uint64_t>(s.unset) || (v >= s.min && v <= s.max);
        }
      },
      s.member);
  if (ok) return Status::ok();
  if (negative) return config_error(value_source(s, c) + " is negative");
  std::string why = " is not in " + std::to_string(s.min) + ".." + std::to_string(s.max);
  if (!s.bound_why.empty()) why += " (" + std::string(s.bound_why) + ")";
  return config_error(value_source(s, c) + why);
}

Status check_bytes(const Setting& s, uint64_t v, const std::string& source) {
  const bool has_min = s.min > 0;
  const bool has_max = s.max < std::numeric_limits<uint64_t>::max();
  if ((!has_min || v >= s.min) && (!has_max || v <= s.max)) return Status::ok();
  std::string why;
  if (has_min && has_max) {
    why = " is not between " + std::to_string(s.min) + " and " + std::to_string(s.max) + " bytes";
  } else if (has_min) {
    why = " is below the minimum " + std::to_string(s.min) + " bytes";
  } else {
    why = " exceeds " + std::to_string(s.max) + " bytes";
  }
  if (!s.bound_why.empty()) why += " (" + std::string(s.bound_why) + ")";
  return config_error(prefixed(s, source) + why);
}

}  // namespace

Status config_error(std::string message) { return {Code::Config, std::move(message)}; }

std::string named(std::string_view var, std::string_view value) {
  return std::string(var) + "='" + std::string(value) + "'";
}

Status parse_int(std::string_view var, std::string_view value, uint64_t min, uint64_t max,
                 uint64_t* out) {
  uint64_t v = 0;
  const char* what = min == 0 ? "a non-negative integer" : "a positive integer";
  if (!parse_digits(value, std::numeric_limits<uint64_t>::max(), &v)) {
    if (all_digits(value)) {
      return config_error(named(var, value) + " is out of range (at most " +
                          std::to_string(max) + ")");
    }
    return config_error(named(var, value) + " is not " + what);
  }
  if (v < min) return config_error(named(var, value) + " is not " + what);
  if (v > max) {
    return config_error(named(var, value) + " is out of range (at most " +
                        std::to_string(max) + ")");
  }
  *out = v;
  return Status::ok();
}

const Setting* find_setting(std::string_view name) {
  for (const Setting& s : settings()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

bool is_set(const Setting& s, const Config& c) {
  return std::visit(
      [&](auto member) {
        using T = std::remove_cvref_t<decltype(c.*member)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return !(c.*member).empty();
        } else {
          return static_cast<int64_t>(c.*member) != s.unset;
        }
      },
      s.member);
}

std::string value_source(const Setting& s, const Config& c) {
  return std::visit(
      [&](auto member) {
        using T = std::remove_cvref_t<decltype(c.*member)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return "'" + c.*member + "'";
        } else {
          return std::string(s.field) + "=" + std::to_string(c.*member);
        }
      },
      s.member);
}

Status parse_setting(const Setting& s, std::string_view value, Config* c) {
  const std::string source = named(s.name, value);
  uint64_t n = 0;
  switch (s.type) {
    case SettingType::Integer:
      if (Status st = parse_int(s.name, value, s.min, s.max, &n); !st.is_ok()) return st;
      store_number(s, c, n);
      return Status::ok();
    case SettingType::Millis:
      if (Status st = parse_int(s.name, value, 1, s.max, &n); !st.is_ok()) return st;
      store_number(s, c, std::min<uint64_t>(n, kMaxTimeoutMs));
      return Status::ok();
    case SettingType::Bytes:
      // A word (a size that means "none", say) stands for its value, past the bounds.
      for (const SettingWord& w : s.words) {
        if (w.text == value) {
          store_number(s, c, static_cast<uint64_t>(w.value));
          return Status::ok();
        }
      }
      if (Status st = parse_bytes(s.name, value, &n); !st.is_ok()) return st;
      if (Status st = check_bytes(s, n, source); !st.is_ok()) return st;
      store_number(s, c, n);
      return Status::ok();
    case SettingType::Switch:
      for (const SettingWord& w : s.words) {
        if (w.text == value) {
          store_number(s, c, static_cast<uint64_t>(w.value));
          return Status::ok();
        }
      }
      return config_error(source + " must be " + join(s.words, " or "));
    case SettingType::String:
    case SettingType::Enum:
      c->*std::get<std::string Config::*>(s.member) = std::string(value);
      return check_resolved(s, c, source);
  }
  return config_error(source + " has an unknown type");
}

Status check_resolved(const Setting& s, Config* c, const std::string& source) {
  switch (s.type) {
    case SettingType::Integer:
      return check_integer(s, *c);
    case SettingType::Millis: {
      int64_t& ms = c->*std::get<int64_t Config::*>(s.member);
      if (ms < 0) return config_error(value_source(s, *c) + " is not a positive timeout");
      ms = clamp_timeout_ms(ms);
      return Status::ok();
    }
    case SettingType::Bytes:
      return check_bytes(s, c->*std::get<uint64_t Config::*>(s.member), source);
    case SettingType::Switch: {
      const int v = c->*std::get<int Config::*>(s.member);
      if (v == -1 || v == 0 || v == 1) return Status::ok();
      return config_error(value_source(s, *c) + " must be 0, 1 or -1 (" + std::string(s.what) +
                          ")");
    }
    case SettingType::Enum: {
      const std::string& v = c->*std::get<std::string Config::*>(s.member);
      for (const SettingWord& w : s.words) {
        if (v == w.text) return Status::ok();
      }
      return config_error(prefixed(s, source) + " is not one of " + join(s.words, ", "));
    }
    case SettingType::String: {
      if (s.check == nullptr) return Status::ok();
      std::string why = s.check(c->*std::get<std::string Config::*>(s.member));
      if (why.empty()) return Status::ok();
      return config_error(prefixed(s, quoted(source)) + " " + why);
    }
  }
  return Status::ok();
}

}  // namespace taiji
