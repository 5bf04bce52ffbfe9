// Measuring the links between every pair of ranks, on request: a collective that every
// rank calls at the same point of its op stream. Probes run in rounds of disjoint pairs
// (the circle method of a round-robin tournament), so no rank takes part in two probes at
// once and no link carries two; each pair probes one direction, then the other. The
// sender times each probe (latency: the fastest round trip of a small message, halved;
// bandwidth: a large message and its small answer, less that round trip), so each rank
// measures its own row of the matrix; an internal allgather then gives every rank the
// same whole matrix, from which every rank computes the same strategy.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "common/status.h"
#include "topology/link_matrix.h"

namespace taiji {

class Peer;

struct LinkMeasureOptions {
  uint64_t probe_bytes = uint64_t{4} << 20;  // each bandwidth probe's message
  int latency_rounds = 5;                    // small round trips per direction
  int bandwidth_rounds = 2;                  // large messages per direction (the best counts)
  int64_t timeout_ms = 0;                    // the whole measurement; 0: the op timeout
  // No probes: gather the rows of the background probes (runtime/link_prober.h) instead.
  bool background = false;
};

// Bounds on the options, checked by measure_links.
constexpr uint64_t kMaxProbeBytes = uint64_t{1} << 30;
constexpr int kMaxProbeRounds = 100;

// Rounds of disjoint pairs (a, b), a < b, in which every pair of 0..n-1 meets exactly once:
// n-1 rounds for even n, n for odd n (one rank sits out each round). Deterministic.
std::vector<std::vector<std::pair<int, int>>> probe_schedule(int n);

// The collective. InvalidArgument for options out of bounds or a call from the I/O
// thread; a failed probe fails the measurement with the probe's status (Timeout, PeerLost,
// ...) naming the pair. On success the peer keeps the matrix (Peer::links) and this rank's
// row goes into the metrics.
Result<LinkMatrix> measure_links(Peer& peer, const LinkMeasureOptions& options);

}  // namespace taiji
