// The built-in strategies, some of them host-aware. A host map gives host_of[r], the host
// of rank r; labels are any non-negative ints and are renumbered 0..H-1 by first appearance,
// so host h is the h-th distinct host in rank order. An empty map puts every rank on its own
// host. The leader of a host is its lowest rank, so leaders in rank order are hosts 0..H-1.
//
// Costs below are per chunk of the buffer (B bytes per chunk, n ranks, H hosts); chunks are
// pipelined, so a strategy with P pairs keeps up to P graphs busy at once.
#pragma once

#include <string_view>
#include <vector>

#include "common/status.h"
#include "topology/graph.h"

namespace taiji {

// Empty, or n labels that are all >= 0.
Status validate_host_map(int n, const std::vector<int>& host_of);

// The builders assume n >= 1 (they return no pairs otherwise) and a host map that
// validate_host_map accepts (any other map is treated as empty).
//
// clique: n pairs, pair k a star rooted at k both ways. Every peer sends each root its own
//   share directly: 2(n-1)/n of the buffer per peer, like ring, in 2 hops instead of 2(n-1),
//   but with n-1 connections busy per peer. Wins for medium buffers on a full-bisection
//   network with few ranks.
Strategy make_clique(int n);
// binary_tree: one pair, the binary heap tree over all ranks rooted at 0 (parent (r-1)/2),
//   hosts ignored. 2*floor(log2(n)) hops; an inner rank sends B up and 2B down. Wins
//   for small buffers where latency dominates.
Strategy make_binary_tree(int n);
// binary_tree_star: one pair. Per host a star to the leader, then the leaders in a binary
//   heap tree (in leader order) rooted at the first leader. Only leaders cross hosts, each
//   sending at most B up and 2B down across hosts, in about 2*log2(H) + 2 hops. Wins for
//   small and medium buffers on multi-rank hosts with fast local links.
Strategy make_binary_tree_star(int n, const std::vector<int>& host_of);
// tree: the default small-message shape, named "tree": the same graphs as binary_tree_star,
//   which with no ranks sharing a host is exactly make_tree(n), the plain binary tree.
Strategy make_tree(int n, const std::vector<int>& host_of);
// multi_binary_tree_star: H pairs; pair h is binary_tree_star with the leader order rotated
//   so that leader h is the tree's root. Spreading the roots spreads the inner-rank load:
//   about 2B across hosts per leader on average instead of up to 3B at the inner leaders.
//   Wins over binary_tree_star for medium buffers with several hosts.
Strategy make_multi_binary_tree_star(int n, const std::vector<int>& host_of);
// hierarchical: H pairs. Per host a star to the leader (local reduce, local broadcast);
//   across hosts the leaders run a ring: pair k reduces along the leader chain ending at
//   leader k and broadcasts along the chain starting there. Each leader sends 2(H-1)/H of
//   the buffer across hosts; local links carry B per non-leader each way. Wins for large
//   buffers when local bandwidth is well above the inter-host bandwidth. One host gives a
//   star; every rank on its own host gives exactly ring.
Strategy make_hierarchical(int n, const std::vector<int>& host_of);

// The built-in names in a fixed order: star, ring, clique, tree, binary_tree,
// binary_tree_star, multi_binary_tree_star, hierarchical. Index + 1 is the strategy's id on
// the wire, so names are only ever appended, never reordered.
const std::vector<std::string_view>& strategy_names();

// By name (exact, case-sensitive). InvalidArgument for n < 1, an invalid host map, or an
// unknown name (the message names it and lists the known ones).
Result<Strategy> make_strategy(std::string_view name, int n, const std::vector<int>& host_of);

}  // namespace taiji
