// The parameters of a built-in policy's spec ("name key=value ..."), shared by the files
// that make policies.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/status.h"

namespace taiji {

// A spec's parameters: each must be known to the policy and used once.
class Params {
 public:
  Params(std::string policy, std::map<std::string, std::string> values)
      : policy_(std::move(policy)), values_(std::move(values)) {}

  Status number(const std::string& key, double lo, double hi, double* out) {
    known_.push_back(key);
    auto it = values_.find(key);
    if (it == values_.end()) return {};
    const std::string& text = it->second;
    double v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v)) {
      return bad(key, "'" + text + "' is not a number");
    }
    if (v < lo || v > hi) {
      std::ostringstream range;
      range << "must be in [" << lo << ", " << hi << "], got " << text;
      return bad(key, range.str());
    }
    *out = v;
    return {};
  }
  Status integer(const std::string& key, uint64_t lo, uint64_t hi, uint64_t* out) {
    double v = static_cast<double>(*out);
    if (Status s = number(key, static_cast<double>(lo), static_cast<double>(hi), &v); !s.is_ok()) return s;
    if (v != std::floor(v)) return bad(key, "must be a whole number");
    *out = static_cast<uint64_t>(v);
    return {};
  }
  Status text(const std::string& key, std::string* out) {
    known_.push_back(key);
    auto it = values_.find(key);
    if (it != values_.end()) *out = it->second;
    return {};
  }
  bool has(const std::string& key) const { return values_.count(key) != 0; }
  // After every parameter was read: refuses those the policy does not know.
  Status finish() const {
    for (const auto& [key, value] : values_) {
      if (std::find(known_.begin(), known_.end(), key) != known_.end()) continue;
      std::string list;
      for (const auto& k : known_) list += (list.empty() ? "" : ", ") + k;
      return {Code::InvalidArgument, policy_ + ": unknown parameter '" + key + "' (known: " + list + ")"};
    }
    return {};
  }
  Status bad(const std::string& key, const std::string& why) const {
    return {Code::InvalidArgument, policy_ + ": " + key + " " + why};
  }

 private:
  std::string policy_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> known_;
};

}  // namespace taiji
