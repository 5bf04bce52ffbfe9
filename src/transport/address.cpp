#include "transport/address.h"

#include <utility>

namespace taiji {

namespace {

// The whole string must be decimal digits and the value at most 65535.
bool parse_port_digits(const std::string& s, uint64_t* out) {
  if (s.empty()) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
    if (v > 65535) return false;
  }
  *out = v;
  return true;
}

}  // namespace

std::string split_host_port(const std::string& s, bool allow_zero, std::string* host,
                            uint16_t* port) {
  std::string h;
  std::string p;
  if (!s.empty() && s.front() == '[') {
    const size_t close = s.find(']');
    if (close == std::string::npos) return "missing ']' after the IPv6 address";
    h = s.substr(1, close - 1);
    if (close + 1 >= s.size() || s[close + 1] != ':') return "missing ':port' after ']'";
    p = s.substr(close + 2);
  } else {
    const size_t colon = s.rfind(':');
    if (colon == std::string::npos) return "missing ':port'";
    h = s.substr(0, colon);
    if (h.find(':') != std::string::npos) {
      return "an IPv6 address needs brackets, as in [::1]:port";
    }
    p = s.substr(colon + 1);
  }
  if (h.empty()) return "empty host";
  for (char ch : h) {
    if (ch == '[' || ch == ']' || ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') {
      return "bad character in host";
    }
  }
  uint64_t v = 0;
  if (!parse_port_digits(p, &v) || (v == 0 && !allow_zero)) {
    return "port '" + p + "' is not a number in " + (allow_zero ? "0" : "1") + "..65535";
  }
  *host = std::move(h);
  *port = static_cast<uint16_t>(v);
  return {};
}

Status parse_host_port(const std::string& s, std::string* host, uint16_t* port,
                       bool allow_zero) {
  std::string reason = split_host_port(s, allow_zero, host, port);
  if (reason.empty()) return Status::ok();
  return {Code::InvalidArgument, "'" + s + "' is not host:port: " + reason};
}

}  // namespace taiji
