#include "topology/graph.h"

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>

namespace taiji {

namespace {

Status invalid(std::string message) { return {Code::InvalidArgument, std::move(message)}; }

int mod(int a, int n) { return ((a % n) + n) % n; }

// A long cycle would make an unreadable message; the first ranks are enough to find it.
constexpr size_t kMaxCycleRanksShown = 16;

std::string describe_cycle(const std::vector<int>& parent, int start) {
  std::vector<int> cycle;
  int x = start;
  do {
    cycle.push_back(x);
    x = parent[x];
  } while (x != start);
  // Start at the smallest rank so the same cycle is always reported the same way.
  std::rotate(cycle.begin(), std::min_element(cycle.begin(), cycle.end()), cycle.end());
  std::string s = "cycle through ranks ";
  const size_t shown = std::min(cycle.size(), kMaxCycleRanksShown);
  for (size_t i = 0; i < shown; ++i) {
    s += std::to_string(cycle[i]) + " -> ";
  }
  if (shown < cycle.size()) {
    s += "... (" + std::to_string(cycle.size()) + " ranks)";
  } else {
    s += std::to_string(cycle[0]);
  }
  return s;
}

}  // namespace

Graph::Graph(std::vector<int> parent) : parent_(std::move(parent)) {
  const int n = size();
  children_.resize(parent_.size());
  // Links that validate_graph() would reject are left out here so that walking children()
  // of an unvalidated graph can neither index out of range nor loop on a self link.
  for (int r = 0; r < n; ++r) {
    const int p = parent_[r];
    if (p == -1) {
      if (root_ == -1) root_ = r;
    } else if (p >= 0 && p < n && p != r) {
      children_[p].push_back(r);
    }
  }
}

Graph Graph::rotated(int shift) const {
  const int n = size();
  if (n == 0) return Graph();
  // Reduced first so that r + shift cannot overflow for any int shift.
  shift = mod(shift, n);
  std::vector<int> q(parent_.size(), -1);
  for (int r = 0; r < n; ++r) {
    const int p = parent_[r];
    // Out-of-range parents stay as they are: renaming them could turn an invalid graph
    // into a valid-looking one.
    q[mod(r + shift, n)] = (p >= 0 && p < n) ? mod(p + shift, n) : p;
  }
  return Graph(std::move(q));
}

Graph Graph::rerooted(int new_root) const {
  const int n = size();
  if (new_root < 0 || new_root >= n || new_root == root_) return *this;
  // At most n steps: in an invalid graph the walk may enter a cycle and never end.
  std::vector<int> path{new_root};
  int x = new_root;
  for (int steps = 0; steps < n && parent_[x] != -1; ++steps) {
    const int p = parent_[x];
    if (p < 0 || p >= n || p == x) return *this;
    path.push_back(p);
    x = p;
  }
  if (parent_[x] != -1) return *this;
  std::vector<int> q = parent_;
  q[new_root] = -1;
  for (size_t i = 1; i < path.size(); ++i) q[path[i]] = path[i - 1];
  return Graph(std::move(q));
}

Status validate_graph(const Graph& g, int n) {
  if (n < 1) return invalid("a graph needs at least 1 rank, got " + std::to_string(n));
  if (g.size() != n) {
    return invalid("graph has " + std::to_string(g.size()) + " ranks, expected " +
                   std::to_string(n));
  }
  const std::vector<int>& parent = g.parents();
  std::vector<int> roots;
  for (int r = 0; r < n; ++r) {
    const int p = parent[r];
    if (p == -1) {
      roots.push_back(r);
    } else if (p < 0 || p >= n) {
      return invalid("rank " + std::to_string(r) + ": parent " + std::to_string(p) +
                     " out of range for " + std::to_string(n) + " ranks");
    } else if (p == r) {
      return invalid("rank " + std::to_string(r) + ": parent is itself");
    }
  }
  if (roots.empty()) return invalid("no root: no rank has parent -1");
  if (roots.size() > 1) {
    std::string s = "more than one root: ranks";
    for (size_t i = 0; i < roots.size(); ++i) s += (i ? ", " : " ") + std::to_string(roots[i]);
    return invalid(s);
  }

  // With one root and every link in range, a walk up from any rank ends at the root unless
  // it enters a cycle, so finding no cycle also proves every rank reaches the root.
  enum : char { kUnseen, kOnPath, kReachesRoot };
  std::vector<char> state(static_cast<size_t>(n), kUnseen);
  std::vector<int> path;
  for (int r = 0; r < n; ++r) {
    path.clear();
    int x = r;
    while (x != -1 && state[x] == kUnseen) {
      state[x] = kOnPath;
      path.push_back(x);
      x = parent[x];
    }
    if (x != -1 && state[x] == kOnPath) return invalid(describe_cycle(parent, x));
    for (int y : path) state[y] = kReachesRoot;
  }
  return Status::ok();
}

Status validate_pair(const GraphPair& p, int n) {
  if (Status s = validate_graph(p.reduce, n); !s.is_ok()) {
    return invalid("reduce graph: " + s.message());
  }
  if (Status s = validate_graph(p.broadcast, n); !s.is_ok()) {
    return invalid("broadcast graph: " + s.message());
  }
  if (p.broadcast.root() != p.reduce.root()) {
    return invalid("broadcast graph rooted at " + std::to_string(p.broadcast.root()) +
                   " but reduce graph ends at " + std::to_string(p.reduce.root()));
  }
  return Status::ok();
}

namespace {

// Shared by both directions: keep the pairs already rooted at `root`, else reroot all;
// the first `limit` of either.
template <typename Pick>
std::vector<Graph> rooted_graphs(const Strategy& s, int root, size_t limit, Pick pick) {
  const bool any_rooted =
      std::any_of(s.pairs.begin(), s.pairs.end(), [&](const GraphPair& p) { return pick(p).root() == root; });
  std::vector<Graph> out;
  for (const GraphPair& p : s.pairs) {
    if (out.size() == limit) break;
    if (!any_rooted) {
      out.push_back(pick(p).rerooted(root));
    } else if (pick(p).root() == root) {
      out.push_back(pick(p));
    }
  }
  return out;
}

}  // namespace

size_t rooted_graph_count(const Strategy& s, int root) {
  const size_t rooted = static_cast<size_t>(
      std::count_if(s.pairs.begin(), s.pairs.end(), [root](const GraphPair& p) { return p.broadcast.root() == root; }));
  return rooted > 0 ? rooted : s.pairs.size();
}

std::vector<Graph> broadcast_graphs(const Strategy& s, int root, size_t limit) {
  return rooted_graphs(s, root, limit, [](const GraphPair& p) -> const Graph& { return p.broadcast; });
}

std::vector<Graph> reduce_graphs(const Strategy& s, int root, size_t limit) {
  return rooted_graphs(s, root, limit, [](const GraphPair& p) -> const Graph& { return p.reduce; });
}

}  // namespace taiji
