// optimize_topology: build the candidates of link_optimizer.h, score each with
// predict_allreduce, keep the fastest. The candidates are few and each is scored in
// O(pairs * n + n^2), so scoring them all costs less than the measurement it rests on.
#include "topology/link_optimizer.h"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "topology/strategies.h"
#include "topology/text.h"

namespace taiji {

namespace {

Status invalid(std::string message) { return {Code::InvalidArgument, std::move(message)}; }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
}

// A rank's egress capacity: its fastest outgoing link (every link of the rank shares its NIC).
std::vector<double> egress_capacities(const LinkMatrix& m) {
  std::vector<double> cap(static_cast<size_t>(m.n), 0.0);
  for (int u = 0; u < m.n; ++u) {
    double& c = cap[static_cast<size_t>(u)];
    for (int v = 0; v < m.n; ++v) c = std::max(c, m.bw(u, v));
  }
  return cap;
}

// The binary heap tree over the ranks by egress capacity, fastest first (ties: lower rank):
// the inner ranks, which send three shares, are the fastest and the slowest are leaves.
Strategy slow_leaf_tree(const std::vector<double>& egress) {
  std::vector<int> by_speed(egress.size());
  std::iota(by_speed.begin(), by_speed.end(), 0);
  std::stable_sort(by_speed.begin(), by_speed.end(), [&](int a, int b) {
    return egress[static_cast<size_t>(a)] > egress[static_cast<size_t>(b)];
  });
  std::vector<int> parent(egress.size(), -1);
  for (size_t i = 1; i < by_speed.size(); ++i) {
    parent[static_cast<size_t>(by_speed[i])] = by_speed[(i - 1) / 2];
  }
  Graph g(std::move(parent));
  return {"slow_leaf_tree", {{g, g}}};
}

// The measured ring over the ranks that are not slow, each slow rank a leaf of it in every
// pair: a slow rank then sends and receives one buffer in all instead of the ring's
// 2(n-1)/n, and the attachment moves round the ring from pair to pair so that no ring
// rank carries the slow ranks' shares alone. Empty when not offered.
Strategy slow_leaf_ring(const LinkMatrix& m, const std::vector<double>& egress, int exact_max) {
  const double threshold = median(egress) / 2;
  std::vector<int> fast;
  std::vector<int> slow;
  for (int r = 0; r < m.n; ++r) {
    (egress[static_cast<size_t>(r)] < threshold ? slow : fast).push_back(r);
  }
  if (slow.empty() || fast.size() < 2) return {};

  LinkMatrix sub = LinkMatrix::sized(static_cast<int>(fast.size()));
  for (size_t a = 0; a < fast.size(); ++a) {
    for (size_t b = 0; b < fast.size(); ++b) {
      sub.bandwidth[sub.index(static_cast<int>(a), static_cast<int>(b))] = m.bw(fast[a], fast[b]);
      sub.latency[sub.index(static_cast<int>(a), static_cast<int>(b))] = m.lat(fast[a], fast[b]);
    }
  }
  const std::vector<int> sub_order = best_ring_order(sub, exact_max);
  std::vector<int> ring;
  for (int x : sub_order) ring.push_back(fast[static_cast<size_t>(x)]);
  const Strategy sub_ring = ring_over(sub_order);

  Strategy s{"slow_leaf_ring", {}};
  const size_t size = ring.size();
  for (size_t k = 0; k < sub_ring.pairs.size(); ++k) {
    std::vector<int> up(static_cast<size_t>(m.n));
    std::vector<int> down(static_cast<size_t>(m.n));
    for (size_t x = 0; x < fast.size(); ++x) {
      const int u = sub_ring.pairs[k].reduce.parent(static_cast<int>(x));
      const int d = sub_ring.pairs[k].broadcast.parent(static_cast<int>(x));
      up[static_cast<size_t>(fast[x])] = u < 0 ? -1 : fast[static_cast<size_t>(u)];
      down[static_cast<size_t>(fast[x])] = d < 0 ? -1 : fast[static_cast<size_t>(d)];
    }
    for (size_t j = 0; j < slow.size(); ++j) {
      const int at = ring[(k + j) % size];
      up[static_cast<size_t>(slow[j])] = at;
      down[static_cast<size_t>(slow[j])] = at;
    }
    s.pairs.push_back({Graph(std::move(up)), Graph(std::move(down))});
  }
  return s;
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%#.3g", s);
  return buf;
}

}  // namespace

std::vector<int> latency_clusters(const LinkMatrix& measured_links, double fraction) {
  const int n = std::max(measured_links.n, 0);
  std::vector<int> label(static_cast<size_t>(n));
  std::iota(label.begin(), label.end(), 0);
  const size_t cells = static_cast<size_t>(n) * static_cast<size_t>(n);
  if (n < 2 || !(fraction > 0) || measured_links.bandwidth.size() != cells ||
      measured_links.latency.size() != cells) {
    return label;
  }
  const LinkMatrix m = fill_unknown_links(measured_links);
  std::vector<double> off;
  for (int u = 0; u < n; ++u) {
    for (int v = 0; v < n; ++v) {
      if (u != v) off.push_back(m.lat(u, v));
    }
  }
  const double below = fraction * median(std::move(off));
  // Flood from each unlabelled rank in rank order, so labels follow first appearance.
  std::fill(label.begin(), label.end(), -1);
  int next = 0;
  for (int r = 0; r < n; ++r) {
    if (label[static_cast<size_t>(r)] >= 0) continue;
    label[static_cast<size_t>(r)] = next;
    std::vector<int> stack{r};
    while (!stack.empty()) {
      const int u = stack.back();
      stack.pop_back();
      for (int v = 0; v < n; ++v) {
        if (label[static_cast<size_t>(v)] < 0 && m.lat(u, v) < below && m.lat(v, u) < below) {
          label[static_cast<size_t>(v)] = next;
          stack.push_back(v);
        }
      }
    }
    ++next;
  }
  return label;
}

Result<OptimizeResult> optimize_topology(const LinkMatrix& measured_links,
                                         const OptimizeOptions& options) {
  const int n = measured_links.n;
  if (n < 1) return invalid("link matrix: need at least 1 rank, got " + std::to_string(n));
  const size_t cells = static_cast<size_t>(n) * static_cast<size_t>(n);
  if (measured_links.bandwidth.size() != cells || measured_links.latency.size() != cells) {
    return invalid("link matrix for " + std::to_string(n) + " ranks needs " +
                   std::to_string(cells) + " entries, got " +
                   std::to_string(measured_links.bandwidth.size()) + " bandwidths and " +
                   std::to_string(measured_links.latency.size()) + " latencies");
  }
  const LinkMatrix m = fill_unknown_links(measured_links);
  OptimizeResult result;
  result.ring_order = best_ring_order(m, options.exact_ring_max);
  result.host_of = latency_clusters(m, options.host_latency_fraction);
  const std::vector<double> egress = egress_capacities(m);

  std::vector<Strategy> strategies;
  strategies.push_back(ring_over(result.ring_order));
  strategies.push_back(slow_leaf_tree(egress));
  if (Strategy s = slow_leaf_ring(m, egress, options.exact_ring_max); !s.pairs.empty()) {
    strategies.push_back(std::move(s));
  }
  for (std::string_view name : strategy_names()) {
    Result<Strategy> s = make_strategy(name, n, result.host_of);
    if (!s.is_ok()) return s.status();
    strategies.push_back(std::move(s.value()));
  }

  for (const Strategy& s : strategies) {
    // A candidate the runtime would refuse must never be offered, whatever the matrix.
    if (Status v = validate_strategy(s, n); !v.is_ok()) {
      return Status{Code::Internal, "candidate " + s.name + ": " + v.message()};
    }
    result.candidates.push_back(
        {s.name, predict_allreduce(s, m, options.bytes, options.chunk_bytes)});
  }
  std::vector<size_t> ranking(result.candidates.size());
  std::iota(ranking.begin(), ranking.end(), 0);
  std::stable_sort(ranking.begin(), ranking.end(), [&](size_t a, size_t b) {
    return result.candidates[a].cost.seconds < result.candidates[b].cost.seconds;
  });

  const Candidate& winner = result.candidates[ranking[0]];
  result.strategy = std::move(strategies[ranking[0]]);
  result.cost = winner.cost;
  result.explanation = winner.name + " " + seconds_text(winner.cost.seconds) + " s (" +
                       winner.cost.bottleneck + ") for " + std::to_string(options.bytes) +
                       " B; next:";
  for (size_t i = 1; i < std::min<size_t>(3, ranking.size()); ++i) {
    const Candidate& c = result.candidates[ranking[i]];
    result.explanation +=
        (i == 1 ? " " : ", ") + c.name + " " + seconds_text(c.cost.seconds) + " s";
  }
  return result;
}

}  // namespace taiji
