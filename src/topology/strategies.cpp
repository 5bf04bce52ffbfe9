#include "topology/strategies.h"

#include <array>
#include <cstddef>
#include <string>
#include <unordered_map>
#include <utility>

#include "topology/text.h"

namespace taiji {

namespace {

Status invalid(std::string message) { return {Code::InvalidArgument, std::move(message)}; }

// The host map reduced to what the builders need.
struct Hosts {
  std::vector<int> leader_of;  // per rank: the lowest rank on its host
  std::vector<int> leaders;    // ascending, so leaders[h] leads host h
};

Hosts group_hosts(int n, const std::vector<int>& host_of) {
  Hosts h;
  h.leader_of.resize(static_cast<size_t>(n));
  const bool use_map = validate_host_map(n, host_of).is_ok() && !host_of.empty();
  std::unordered_map<int, int> leader_of_label;
  for (int r = 0; r < n; ++r) {
    if (!use_map) {
      h.leader_of[r] = r;
      h.leaders.push_back(r);
      continue;
    }
    auto [it, fresh] = leader_of_label.emplace(host_of[r], r);
    if (fresh) h.leaders.push_back(r);
    h.leader_of[r] = it->second;
  }
  return h;
}

// Non-leaders point at their leader; leaders get -1 for the caller to link up.
std::vector<int> local_stars(const Hosts& h) {
  std::vector<int> parent(h.leader_of.size());
  for (size_t r = 0; r < parent.size(); ++r) {
    parent[r] = h.leader_of[r] == static_cast<int>(r) ? -1 : h.leader_of[r];
  }
  return parent;
}

// Leaders in a binary heap tree over the leader order rotated by `first`.
Graph tree_star(const Hosts& h, size_t first) {
  std::vector<int> parent = local_stars(h);
  const size_t count = h.leaders.size();
  for (size_t i = 1; i < count; ++i) {
    parent[h.leaders[(first + i) % count]] = h.leaders[(first + (i - 1) / 2) % count];
  }
  return Graph(std::move(parent));
}

Strategy single(std::string name, Graph g) {
  Strategy s{std::move(name), {}};
  s.pairs.push_back({g, g});
  return s;
}

using Builder = Strategy (*)(int, const std::vector<int>&);

struct Entry {
  std::string_view name;
  Builder build;
};

// The order is the wire id order: append only.
const std::array<Entry, 8> kBuiltins = {{
    {"star", [](int n, const std::vector<int>&) { return make_star(n); }},
    {"ring", [](int n, const std::vector<int>&) { return make_ring(n); }},
    {"clique", [](int n, const std::vector<int>&) { return make_clique(n); }},
    {"tree", make_tree},
    {"binary_tree", [](int n, const std::vector<int>&) { return make_binary_tree(n); }},
    {"binary_tree_star", make_binary_tree_star},
    {"multi_binary_tree_star", make_multi_binary_tree_star},
    {"hierarchical", make_hierarchical},
}};

}  // namespace

Status validate_host_map(int n, const std::vector<int>& host_of) {
  if (host_of.empty()) return Status::ok();
  if (n < 0 || host_of.size() != static_cast<size_t>(n)) {
    return invalid("host map has " + std::to_string(host_of.size()) + " entries for " +
                   std::to_string(n) + " ranks");
  }
  for (size_t r = 0; r < host_of.size(); ++r) {
    if (host_of[r] < 0) {
      return invalid("host map: rank " + std::to_string(r) + " has negative host " +
                     std::to_string(host_of[r]));
    }
  }
  return Status::ok();
}

Strategy make_ring(int n) {
  Strategy s{"ring", {}};
  for (int k = 0; k < n; ++k) {
    std::vector<int> up(static_cast<size_t>(n));
    std::vector<int> down(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      up[r] = r == k ? -1 : (r + 1) % n;
      down[r] = r == k ? -1 : (r - 1 + n) % n;
    }
    s.pairs.push_back({Graph(std::move(up)), Graph(std::move(down))});
  }
  return s;
}

Strategy make_tree(int n) {
  if (n < 1) return {"tree", {}};
  return single("tree", make_binary_tree(n).pairs[0].reduce);
}

Strategy make_star(int n) {
  if (n < 1) return {"star", {}};
  std::vector<int> parent(static_cast<size_t>(n), 0);
  parent[0] = -1;
  return single("star", Graph(std::move(parent)));
}

Strategy make_clique(int n) {
  Strategy s{"clique", {}};
  for (int k = 0; k < n; ++k) {
    std::vector<int> parent(static_cast<size_t>(n), k);
    parent[k] = -1;
    Graph g(std::move(parent));
    s.pairs.push_back({g, g});
  }
  return s;
}

Strategy make_binary_tree(int n) {
  if (n < 1) return {"binary_tree", {}};
  std::vector<int> parent(static_cast<size_t>(n));
  parent[0] = -1;
  for (int r = 1; r < n; ++r) parent[r] = (r - 1) / 2;
  return single("binary_tree", Graph(std::move(parent)));
}

Strategy make_binary_tree_star(int n, const std::vector<int>& host_of) {
  if (n < 1) return {"binary_tree_star", {}};
  return single("binary_tree_star", tree_star(group_hosts(n, host_of), 0));
}

Strategy make_tree(int n, const std::vector<int>& host_of) {
  if (n < 1) return {"tree", {}};
  return single("tree", tree_star(group_hosts(n, host_of), 0));
}

Strategy make_multi_binary_tree_star(int n, const std::vector<int>& host_of) {
  Strategy s{"multi_binary_tree_star", {}};
  if (n < 1) return s;
  const Hosts h = group_hosts(n, host_of);
  for (size_t first = 0; first < h.leaders.size(); ++first) {
    Graph g = tree_star(h, first);
    s.pairs.push_back({g, g});
  }
  return s;
}

Strategy make_hierarchical(int n, const std::vector<int>& host_of) {
  Strategy s{"hierarchical", {}};
  if (n < 1) return s;
  const Hosts h = group_hosts(n, host_of);
  const std::vector<int> local = local_stars(h);
  const size_t count = h.leaders.size();
  for (size_t k = 0; k < count; ++k) {
    std::vector<int> up = local;
    std::vector<int> down = local;
    for (size_t i = 0; i < count; ++i) {
      if (i == k) continue;
      // As in make_ring, over leader indices: reduce i -> i+1, broadcast i-1 -> i.
      up[h.leaders[i]] = h.leaders[(i + 1) % count];
      down[h.leaders[i]] = h.leaders[(i + count - 1) % count];
    }
    s.pairs.push_back({Graph(std::move(up)), Graph(std::move(down))});
  }
  return s;
}

const std::vector<std::string_view>& strategy_names() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> v;
    for (const Entry& e : kBuiltins) v.push_back(e.name);
    return v;
  }();
  return names;
}

Result<Strategy> make_strategy(std::string_view name, int n, const std::vector<int>& host_of) {
  if (n < 1) {
    return invalid("strategy '" + printable(name) + "' needs at least 1 rank, got " +
                   std::to_string(n));
  }
  if (Status s = validate_host_map(n, host_of); !s.is_ok()) return s;
  for (const Entry& e : kBuiltins) {
    if (e.name == name) return e.build(n, host_of);
  }
  std::string known;
  for (const Entry& e : kBuiltins) known += (known.empty() ? "" : ", ") + std::string(e.name);
  return invalid("unknown strategy '" + printable(name) + "' (known: " + known + ")");
}

Result<Strategy> make_strategy(std::string_view name, int n) {
  return make_strategy(name, n, {});
}

}  // namespace taiji
