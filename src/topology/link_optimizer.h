// Strategies computed from a measured LinkMatrix, and the cost model that predicts how
// long an allreduce takes on any strategy over that matrix. The choice is made by the
// same model that explains it: every candidate gets a predicted time, and the result says
// which won and by how much. Pure and deterministic: the same matrix and options give the
// same strategy on every rank and every machine (no clock; the ring heuristic's
// perturbations come from a generator with a fixed seed, and its work is counted in
// steps, not time).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "topology/graph.h"
#include "topology/link_matrix.h"

namespace taiji {

// The cost model, for an allreduce of `bytes` over strategy `s` (pair i carries bytes/P of
// the buffer, P = pair count):
//  - every non-root rank of a pair's reduce graph sends its share to its parent, and every
//    non-root rank of its broadcast graph receives its share from its parent; summed over
//    the pairs that is the load of each directed link (u, v), of each rank's egress
//    (everything it sends) and of its ingress (everything it receives);
//  - a rank's egress capacity is its fastest outgoing measured link and its ingress
//    capacity its fastest incoming one (the NIC, which every link of the rank shares);
//  - bandwidth term: the largest of load/bandwidth over links, egress and ingress;
//  - latency term: for each root-to-rank path of a graph, its latency summed over its links
//    plus the time for one chunk (min(bytes/P, chunk_bytes)) to cross the slowest link of
//    the path once per hop (pipeline fill); the longest such path of a reduce graph plus
//    that of its broadcast graph, largest over the pairs.
// The prediction is the sum of the two terms, in seconds (0 for one rank, which sends
// nothing). Unknown links count as fill_unknown_links says. `s` must be valid over m.n
// ranks (validate_strategy) and m well formed: otherwise every time is infinite and the
// bottleneck "invalid strategy".
struct CostBreakdown {
  double seconds = 0;            // bandwidth_seconds + latency_seconds
  double bandwidth_seconds = 0;
  double latency_seconds = 0;
  // The argmax of the bandwidth term, e.g. "link 2->3", "egress of 4", "ingress of 0"
  // (on a tie the link); "none" when nothing is sent.
  std::string bottleneck;
};
CostBreakdown predict_allreduce(const Strategy& s, const LinkMatrix& m, uint64_t bytes,
                                uint64_t chunk_bytes);

// Where unknown entries are handled, for every function of this header: an off-diagonal
// bandwidth that is not a positive finite number becomes the slowest measured bandwidth of
// the matrix, a latency likewise the largest measured latency; with nothing measured every
// link gets bandwidth 1 and latency 0, so that the shapes alone decide. The diagonal
// becomes 0. A matrix that is not n*n is returned as it is.
LinkMatrix fill_unknown_links(const LinkMatrix& m);

struct OptimizeOptions {
  uint64_t bytes = uint64_t{16} << 20;        // the allreduce size to optimise for
  uint64_t chunk_bytes = uint64_t{1} << 20;   // the pipeline chunk of the collectives
  // Up to this many ranks the ring order is exact (a bottleneck travelling-salesman
  // search by dynamic programming over subsets); above, a deterministic heuristic
  // (greedy tours from every start, then improvement moves), bounded in time for n <= 1024.
  // Values above 16 count as 16 (the exact search costs 2^n n^2 steps).
  int exact_ring_max = 13;
  // Ranks whose mutual latency is below this fraction of the median off-diagonal latency
  // are grouped as one host (a latency cluster) for the host-aware candidates; 0: no
  // grouping (every rank its own host).
  double host_latency_fraction = 0.25;
};

struct Candidate {
  std::string name;     // "measured_ring", "slow_leaf_tree", "ring", ...
  CostBreakdown cost;
};

struct OptimizeResult {
  Strategy strategy;                 // the winner, valid over m.n ranks; its name is the winner's
  CostBreakdown cost;                // the winner's prediction
  std::vector<Candidate> candidates; // every candidate evaluated, in evaluation order
  std::vector<int> ring_order;       // the measured ring's order (a cyclic sequence of ranks)
  std::vector<int> host_of;          // the latency clusters (labels 0..H-1 by first appearance)
  // One line, for the logs: the winner, its predicted time and bottleneck, and the next
  // best candidates with their predicted times, e.g.
  // "measured_ring 0.141 s (link 3->0) for 16777216 B; next: slow_leaf_tree 0.162 s, ring 0.400 s"
  // (times to 3 significant digits).
  std::string explanation;
};

// The candidates, all scored by predict_allreduce for options.bytes, the smallest
// predicted time winning (ties: the first in this order):
//   measured_ring      a ring over the order that maximises its slowest link
//                      (bottleneck ATSP on the bandwidth matrix; ring data flows along
//                      order[i] -> order[i+1], see ring_over)
//   slow_leaf_tree     a binary tree (one pair, both ways) over the ranks sorted by
//                      egress capacity, fastest first, so the slowest ranks are leaves
//   slow_leaf_ring     the ranks whose egress capacity is below half the median hang as
//                      leaves off the measured ring over the others (every pair of the
//                      ring gets them, each attached to a different ring rank, round robin);
//                      only when there are such ranks and at least 2 others
//   every built-in of strategy_names(), with the latency clusters as the host map
// InvalidArgument when m.n < 1 or the matrix is not n*n.
Result<OptimizeResult> optimize_topology(const LinkMatrix& m, const OptimizeOptions& options);

// The bottleneck ring order alone: a cyclic order of 0..n-1 starting at rank 0 that
// maximises the smallest bandwidth along order[i] -> order[i+1] (and back to order[0]);
// ties broken by the smallest sum of latency along the tour, then lexicographically
// smallest order. Exact up to exact_max ranks (at most 16); above, the heuristic's best,
// which is deterministic but may miss the optimum. Empty for a matrix that is not n*n with
// n >= 1.
std::vector<int> best_ring_order(const LinkMatrix& m, int exact_max);

// A ring strategy whose data flows along order[i] -> order[(i + 1) % n]: n pairs, pair k
// reducing along the chain order[k+1] -> ... -> order[k] and broadcasting along
// order[k] -> ... -> order[k-1], so with order = 0..n-1 it equals make_ring(n). Named
// "measured_ring"; no pairs (an invalid strategy) when order is not a permutation of 0..n-1.
Strategy ring_over(const std::vector<int>& order);

// Latency clusters: ranks i, j share a label when lat(i,j) and lat(j,i) are both below
// fraction x the median off-diagonal latency (transitively). Labels 0..H-1 by first
// appearance in rank order. fraction <= 0 or all latencies unknown: every rank its own.
std::vector<int> latency_clusters(const LinkMatrix& m, double fraction);

}  // namespace taiji
