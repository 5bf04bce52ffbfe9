// Topology graphs. A Graph is a rooted tree over ranks 0..n-1 given by parent links; a
// reduce graph sends data toward its root, a broadcast graph away from it. A Strategy is a
// list of (reduce, broadcast) pairs: chunk i of a buffer runs on pair i mod pairs.size(),
// so several rooted graphs share the load (a ring is n rotated chains).
#pragma once

#include <cstdint>

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace taiji {

class Graph {
 public:
  Graph() = default;
  // parent[r] == -1 marks the root. Not validated: call validate_graph().
  explicit Graph(std::vector<int> parent);

  int size() const { return static_cast<int>(parent_.size()); }
  int root() const { return root_; }
  int parent(int r) const { return parent_[r]; }
  // Children of r in ascending rank order (deterministic reduction order).
  const std::vector<int>& children(int r) const { return children_[r]; }
  const std::vector<int>& parents() const { return parent_; }

  // The same shape with every rank r renamed to (r + shift) mod n.
  Graph rotated(int shift) const;
  // The same undirected edges rooted at new_root: the links on the path from new_root up to
  // the old root are reversed. Unlike rotated() no rank moves, so a host-aware shape keeps
  // its local edges. A copy of *this when new_root is out of range or its walk upward does
  // not end at a root (an invalid graph).
  Graph rerooted(int new_root) const;

 private:
  std::vector<int> parent_;
  std::vector<std::vector<int>> children_;
  int root_ = -1;
};

struct GraphPair {
  Graph reduce;
  Graph broadcast;
};

struct Strategy {
  std::string name;
  std::vector<GraphPair> pairs;
};

// Exactly one root, every parent in range, no cycle, every rank reaches the root.
Status validate_graph(const Graph& g, int n);
// Both graphs valid over n ranks and the broadcast graph rooted where the reduce graph ends.
Status validate_pair(const GraphPair& p, int n);

// Built-in strategies (n >= 1); the full set, host-aware ones included, and make_strategy
// with a host map are in topology/strategies.h.
//   ring:  n pairs; pair k reduces along the chain k+1 -> k+2 -> ... -> k and broadcasts
//          along k -> k+1 -> ... -> k-1. Pipelined over chunks every peer sends 2(n-1)/n
//          of the buffer: bandwidth-optimal for large buffers.
//   tree:  one pair, a binary tree rooted at 0 (children of r are 2r+1, 2r+2), used both
//          ways: about 2*log2(n) hops, latency-optimal for small buffers.
//   star:  one pair, every rank a child of rank 0.
Strategy make_ring(int n);
Strategy make_tree(int n);
Strategy make_star(int n);
// By name, with every rank on its own host; an unknown name is an InvalidArgument error
// that lists the known names.
Result<Strategy> make_strategy(std::string_view name, int n);

// Graphs for an op rooted at `root` (broadcast, reduce). The pairs whose graph is already
// rooted there are used as they are, all of them in pair order; only when none is, every
// pair's graph is rerooted at `root`. Taking the strategy's own graphs keeps host-aware
// shapes intact, and for a ring it gives the chain of n-1 hops starting at the root.
// `limit` keeps only the first graphs of that list (an op with fewer chunks than graphs
// uses no more), so that unused pairs are not rerooted.
std::vector<Graph> broadcast_graphs(const Strategy& s, int root, size_t limit = SIZE_MAX);
std::vector<Graph> reduce_graphs(const Strategy& s, int root, size_t limit = SIZE_MAX);
// How many graphs those give for `root` without a limit, without building any: the pairs
// rooted there, or every pair (a pair's two graphs share their root).
size_t rooted_graph_count(const Strategy& s, int root);

}  // namespace taiji
