// The cost model of link_optimizer.h, and where unknown links get their stand-in values.
// It is deliberately coarse (a rank's links share its NIC, every link is full duplex, hops
// pipeline perfectly after the first chunk) so that it can score every candidate the same
// way; the optimiser only needs the order of the predictions to be right, and the log line
// shows the numbers so that a wrong order can be seen.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "topology/link_optimizer.h"
#include "topology/text.h"

namespace taiji {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool well_formed(const LinkMatrix& m) {
  if (m.n < 1) return false;
  const size_t cells = static_cast<size_t>(m.n) * static_cast<size_t>(m.n);
  return m.bandwidth.size() == cells && m.latency.size() == cells;
}

// Negative and non-finite entries are treated like 0: a measurement that went wrong says
// no more about the link than a missing one.
bool measured(double x) { return std::isfinite(x) && x > 0; }

// The slowest root-to-rank path of g: its latency summed over the links, plus one chunk
// crossing the slowest link of the path once per hop. `to_root`: data flows child -> parent.
double deepest_path_seconds(const Graph& g, const LinkMatrix& m, bool to_root, double chunk) {
  struct Reach {
    double latency = 0;
    double slowest = kInf;
    int hops = 0;
  };
  std::vector<Reach> at(static_cast<size_t>(g.size()));
  std::vector<int> stack{g.root()};
  double worst = 0;
  while (!stack.empty()) {
    const int u = stack.back();
    stack.pop_back();
    const Reach from = at[static_cast<size_t>(u)];
    for (int c : g.children(u)) {
      const int src = to_root ? c : u;
      const int dst = to_root ? u : c;
      Reach& r = at[static_cast<size_t>(c)];
      r.latency = from.latency + m.lat(src, dst);
      r.slowest = std::min(from.slowest, m.bw(src, dst));
      r.hops = from.hops + 1;
      worst = std::max(worst, r.latency + r.hops * chunk / r.slowest);
      stack.push_back(c);
    }
  }
  return worst;
}

}  // namespace

LinkMatrix fill_unknown_links(const LinkMatrix& m) {
  if (!well_formed(m)) return m;
  const int n = m.n;
  double slowest = kInf;
  double longest = 0;
  for (int u = 0; u < n; ++u) {
    for (int v = 0; v < n; ++v) {
      if (u == v) continue;
      if (measured(m.bw(u, v))) slowest = std::min(slowest, m.bw(u, v));
      if (measured(m.lat(u, v))) longest = std::max(longest, m.lat(u, v));
    }
  }
  // Nothing measured: every link alike, so the choice rests on the shapes alone.
  if (slowest == kInf) slowest = 1;
  LinkMatrix f = m;
  for (int u = 0; u < n; ++u) {
    for (int v = 0; v < n; ++v) {
      const size_t i = m.index(u, v);
      if (u == v) {
        f.bandwidth[i] = 0;
        f.latency[i] = 0;
        continue;
      }
      if (!measured(f.bandwidth[i])) f.bandwidth[i] = slowest;
      if (!measured(f.latency[i])) f.latency[i] = longest;
    }
  }
  return f;
}

CostBreakdown predict_allreduce(const Strategy& s, const LinkMatrix& measured_links, uint64_t bytes,
                                uint64_t chunk_bytes) {
  CostBreakdown cost;
  if (!well_formed(measured_links) || !validate_strategy(s, measured_links.n).is_ok()) {
    cost.seconds = cost.bandwidth_seconds = cost.latency_seconds = kInf;
    cost.bottleneck = "invalid strategy";
    return cost;
  }
  const LinkMatrix m = fill_unknown_links(measured_links);
  const int n = m.n;
  const double share = static_cast<double>(bytes) / static_cast<double>(s.pairs.size());
  const double chunk = std::min(share, static_cast<double>(chunk_bytes));

  std::vector<double> link(m.bandwidth.size(), 0.0);
  std::vector<double> egress(static_cast<size_t>(n), 0.0);
  std::vector<double> ingress(static_cast<size_t>(n), 0.0);
  const auto carry = [&](int src, int dst) {
    link[m.index(src, dst)] += share;
    egress[static_cast<size_t>(src)] += share;
    ingress[static_cast<size_t>(dst)] += share;
  };
  for (const GraphPair& p : s.pairs) {
    for (int r = 0; r < n; ++r) {
      if (p.reduce.parent(r) >= 0) carry(r, p.reduce.parent(r));
      if (p.broadcast.parent(r) >= 0) carry(p.broadcast.parent(r), r);
    }
    cost.latency_seconds =
        std::max(cost.latency_seconds, deepest_path_seconds(p.reduce, m, true, chunk) +
                                           deepest_path_seconds(p.broadcast, m, false, chunk));
  }

  // Links first, then each rank's egress and ingress: on a tie the link, the most specific
  // name, is kept. The name is written once, for the winner.
  enum class Kind { None, Link, Egress, Ingress };
  Kind kind = Kind::None;
  int first = 0;
  int second = 0;
  const auto consider = [&](double load, double capacity, Kind k, int a, int b) {
    if (load <= 0 || load / capacity <= cost.bandwidth_seconds) return;
    cost.bandwidth_seconds = load / capacity;
    kind = k;
    first = a;
    second = b;
  };
  for (int u = 0; u < n; ++u) {
    for (int v = 0; v < n; ++v) consider(link[m.index(u, v)], m.bw(u, v), Kind::Link, u, v);
  }
  for (int r = 0; r < n; ++r) {
    double out = 0;
    double in = 0;
    for (int o = 0; o < n; ++o) {
      out = std::max(out, m.bw(r, o));
      in = std::max(in, m.bw(o, r));
    }
    consider(egress[static_cast<size_t>(r)], out, Kind::Egress, r, 0);
    consider(ingress[static_cast<size_t>(r)], in, Kind::Ingress, r, 0);
  }
  switch (kind) {
    case Kind::None:
      cost.bottleneck = "none";
      break;
    case Kind::Link:
      cost.bottleneck = "link " + std::to_string(first) + "->" + std::to_string(second);
      break;
    case Kind::Egress:
      cost.bottleneck = "egress of " + std::to_string(first);
      break;
    case Kind::Ingress:
      cost.bottleneck = "ingress of " + std::to_string(first);
      break;
  }
  cost.seconds = cost.bandwidth_seconds + cost.latency_seconds;
  return cost;
}

}  // namespace taiji
