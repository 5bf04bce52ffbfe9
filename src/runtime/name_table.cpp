#include "runtime/name_table.h"

#include <algorithm>

namespace taiji {

Result<uint64_t> NameTable::reserve(const std::string& name, uint64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = names_[name];
  uint64_t v = version != 0 ? version : e.last_posted + 1;
  if (e.in_flight.count(v) != 0) {
    return Status{Code::Duplicate, "op '" + name + "' version " + std::to_string(v) +
                                       " is already in flight"};
  }
  if (v <= e.ended_max) {
    return Status{Code::StaleVersion,
                  "op '" + name + "' version " + std::to_string(v) +
                      " is not above the highest ended version " + std::to_string(e.ended_max)};
  }
  e.in_flight.insert(v);
  e.last_posted = std::max(e.last_posted, v);
  return v;
}

void NameTable::release(const std::string& name, uint64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = names_[name];
  e.in_flight.erase(version);
  e.ended_max = std::max(e.ended_max, version);
}

void NameTable::unreserve(const std::string& name, uint64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = names_[name];
  e.in_flight.erase(version);
  // Every version posted is in flight or at most ended_max: the highest of the others.
  e.last_posted = std::max(e.ended_max, e.in_flight.empty() ? 0 : *e.in_flight.rbegin());
}

bool NameTable::is_past(const std::string& name, uint64_t version) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = names_.find(name);
  if (it == names_.end()) return false;
  return version <= it->second.ended_max && it->second.in_flight.count(version) == 0;
}

bool NameTable::posted(const std::string& name, uint64_t version) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = names_.find(name);
  if (it == names_.end()) return false;
  return version <= it->second.ended_max || it->second.in_flight.count(version) != 0;
}

}  // namespace taiji
