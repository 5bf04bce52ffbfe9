#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "topology/graph.h"
#include "topology/link_matrix.h"
#include "topology/link_optimizer.h"
#include "topology/strategies.h"
#include "topology/text.h"

using namespace taiji;

namespace {

constexpr double kGB = 1e9;
constexpr uint64_t kMiB = uint64_t{1} << 20;

LinkMatrix uniform(int n, double bw, double lat) {
  LinkMatrix m = LinkMatrix::sized(n);
  for (int u = 0; u < n; ++u) {
    for (int v = 0; v < n; ++v) {
      if (u == v) continue;
      m.bandwidth[m.index(u, v)] = bw;
      m.latency[m.index(u, v)] = lat;
    }
  }
  return m;
}

void set_bw(LinkMatrix& m, int u, int v, double bw) { m.bandwidth[m.index(u, v)] = bw; }

double ring_bottleneck(const LinkMatrix& m, const std::vector<int>& order) {
  double b = INFINITY;
  for (size_t i = 0; i < order.size(); ++i) {
    b = std::min(b, m.bw(order[i], order[(i + 1) % order.size()]));
  }
  return b;
}

double ring_latency(const LinkMatrix& m, const std::vector<int>& order) {
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) sum += m.lat(order[i], order[(i + 1) % order.size()]);
  return sum;
}

bool uses_link(const std::vector<int>& order, int u, int v) {
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] == u && order[(i + 1) % order.size()] == v) return true;
  }
  return false;
}

// A permutation of 0..n-1 that starts at rank 0.
bool is_tour(const std::vector<int>& order, int n) {
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  return sorted == all && !order.empty() && order[0] == 0;
}

// Every tour from rank 0 in lexicographic order, keeping the first that is strictly
// better: the contract's optimum, computed the slow and obvious way.
std::vector<int> brute_force_order(const LinkMatrix& m) {
  std::vector<int> t(static_cast<size_t>(m.n));
  std::iota(t.begin(), t.end(), 0);
  std::vector<int> best = t;
  do {
    const double b = ring_bottleneck(m, t);
    const double bb = ring_bottleneck(m, best);
    if (b > bb || (b == bb && ring_latency(m, t) < ring_latency(m, best))) best = t;
  } while (std::next_permutation(t.begin() + 1, t.end()));
  return best;
}

// Tours from rank 0 whose links are all at least `fast`.
std::vector<std::vector<int>> fast_tours(const LinkMatrix& m, double fast) {
  std::vector<int> t(static_cast<size_t>(m.n));
  std::iota(t.begin(), t.end(), 0);
  std::vector<std::vector<int>> found;
  do {
    if (ring_bottleneck(m, t) >= fast) found.push_back(t);
  } while (std::next_permutation(t.begin() + 1, t.end()));
  return found;
}

// Slow everywhere but along `cycle` and the `extra` links.
LinkMatrix planted(int n, const std::vector<int>& cycle,
                   const std::vector<std::pair<int, int>>& extra) {
  LinkMatrix m = uniform(n, 1 * kGB, 1e-5);
  for (size_t i = 0; i < cycle.size(); ++i) {
    set_bw(m, cycle[i], cycle[(i + 1) % cycle.size()], 10 * kGB);
  }
  for (auto [u, v] : extra) set_bw(m, u, v, 10 * kGB);
  return m;
}

LinkMatrix random_matrix(int n, std::mt19937& rng, double unknown_fraction) {
  std::uniform_real_distribution<double> bw(0.5 * kGB, 20 * kGB);
  std::uniform_real_distribution<double> lat(1e-6, 1e-4);
  std::uniform_real_distribution<double> coin(0, 1);
  LinkMatrix m = LinkMatrix::sized(n);
  for (int u = 0; u < n; ++u) {
    for (int v = 0; v < n; ++v) {
      if (u == v) continue;
      m.bandwidth[m.index(u, v)] = coin(rng) < unknown_fraction ? 0 : bw(rng);
      m.latency[m.index(u, v)] = coin(rng) < unknown_fraction ? 0 : lat(rng);
    }
  }
  return m;
}

const Candidate& candidate(const OptimizeResult& r, const std::string& name) {
  for (const Candidate& c : r.candidates) {
    if (c.name == name) return c;
  }
  FAIL("no candidate " << name);
  return r.candidates.front();
}

bool has_candidate(const OptimizeResult& r, const std::string& name) {
  return std::any_of(r.candidates.begin(), r.candidates.end(),
                     [&](const Candidate& c) { return c.name == name; });
}

OptimizeResult optimize(const LinkMatrix& m, uint64_t bytes = 16 * kMiB) {
  OptimizeOptions o;
  o.bytes = bytes;
  Result<OptimizeResult> r = optimize_topology(m, o);
  INFO(r.status().message());
  REQUIRE(r.is_ok());
  return r.value();
}

std::string three_digits(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%#.3g", s);
  return buf;
}

}  // namespace

TEST_CASE("ring_over the identity order is make_ring", "[links]") {
  for (int n = 1; n <= 6; ++n) {
    INFO("n=" << n);
    std::vector<int> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    const Strategy s = ring_over(order);
    CHECK(validate_strategy(s, n).is_ok());
    CHECK(topology_digest(s) == topology_digest(make_ring(n)));
    CHECK(s.name == "measured_ring");
  }
  // Another order is the same ring with the ranks renamed: rank order[i] sends to order[i+1].
  const Strategy s = ring_over({0, 2, 1, 3});
  REQUIRE(s.pairs.size() == 4);
  CHECK(s.pairs[0].reduce.parents() == std::vector<int>{-1, 3, 1, 0});
  CHECK(s.pairs[0].broadcast.parents() == std::vector<int>{-1, 2, 0, 1});
  CHECK(ring_over({0, 2, 2}).pairs.empty());
  CHECK(ring_over({0, 3, 1}).pairs.empty());
}

TEST_CASE("best_ring_order finds the known optimal rings", "[links]") {
  SECTION("n=4 with 0->1 and 2->3 throttled") {
    LinkMatrix m = uniform(4, 10 * kGB, 1e-5);
    set_bw(m, 0, 1, 0.1 * kGB);
    set_bw(m, 2, 3, 0.1 * kGB);
    for (int exact : {13, 0}) {
      INFO("exact_max=" << exact);
      const std::vector<int> order = best_ring_order(m, exact);
      REQUIRE(is_tour(order, 4));
      CHECK(ring_bottleneck(m, order) == 10 * kGB);
      CHECK_FALSE(uses_link(order, 0, 1));
      CHECK_FALSE(uses_link(order, 2, 3));
    }
  }
  SECTION("n=5 and n=6 with exactly one fast Hamiltonian cycle") {
    const std::vector<std::pair<std::vector<int>, std::vector<std::pair<int, int>>>> cases = {
        {{0, 2, 4, 1, 3}, {{0, 1}, {1, 2}, {3, 4}}},
        {{0, 3, 5, 1, 4, 2}, {{0, 1}, {2, 3}, {4, 5}, {3, 1}}},
    };
    for (const auto& [cycle, extra] : cases) {
      const int n = static_cast<int>(cycle.size());
      INFO("n=" << n);
      const LinkMatrix m = planted(n, cycle, extra);
      REQUIRE(fast_tours(m, 10 * kGB) == std::vector<std::vector<int>>{cycle});
      CHECK(best_ring_order(m, 13) == cycle);
      CHECK(best_ring_order(m, 0) == cycle);
    }
  }
  SECTION("the exact search agrees with brute force, ties included") {
    // Few distinct values, so that bottleneck and latency ties are common and the
    // tie-breaks (least latency, then the smallest order) decide.
    std::mt19937 rng(20240611);
    std::uniform_int_distribution<int> level(1, 4);
    for (int n = 3; n <= 8; ++n) {
      for (int trial = 0; trial < 20; ++trial) {
        LinkMatrix m = LinkMatrix::sized(n);
        for (int u = 0; u < n; ++u) {
          for (int v = 0; v < n; ++v) {
            if (u == v) continue;
            m.bandwidth[m.index(u, v)] = level(rng) * kGB;
            m.latency[m.index(u, v)] = level(rng);  // integers: sums are exact in any order
          }
        }
        INFO("n=" << n << " trial=" << trial);
        const std::vector<int> want = brute_force_order(m);
        CHECK(best_ring_order(m, 13) == want);
        // The heuristic is not exact, but it never returns a tour better than the optimum.
        const std::vector<int> h = best_ring_order(m, 0);
        REQUIRE(is_tour(h, n));
        CHECK(ring_bottleneck(m, h) <= ring_bottleneck(m, want));
      }
    }
  }
}

TEST_CASE("the heuristic ring avoids slow links at n=20 and n=64", "[links]") {
  for (int n : {20, 64}) {
    INFO("n=" << n);
    std::mt19937 rng(static_cast<unsigned>(n));
    std::vector<int> cycle(static_cast<size_t>(n));
    std::iota(cycle.begin(), cycle.end(), 0);
    std::shuffle(cycle.begin() + 1, cycle.end(), rng);
    // Most links slow (0.1-1 GB/s), a few decoys as fast as the planted cycle, so that the
    // greedy tours run into dead ends and the moves have to repair them.
    std::uniform_real_distribution<double> slow(0.1 * kGB, 1 * kGB);
    std::uniform_real_distribution<double> coin(0, 1);
    LinkMatrix m = LinkMatrix::sized(n);
    for (int u = 0; u < n; ++u) {
      for (int v = 0; v < n; ++v) {
        if (u == v) continue;
        m.bandwidth[m.index(u, v)] = coin(rng) < 0.05 ? 10 * kGB : slow(rng);
        m.latency[m.index(u, v)] = 1e-5 * (1 + coin(rng));
      }
    }
    for (size_t i = 0; i < cycle.size(); ++i) {
      set_bw(m, cycle[i], cycle[(i + 1) % cycle.size()], 10 * kGB);
    }

    const auto start = std::chrono::steady_clock::now();
    const std::vector<int> order = best_ring_order(m, 13);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    REQUIRE(is_tour(order, n));
    CHECK(ring_bottleneck(m, order) == 10 * kGB);
    CHECK(took < 2.0);
  }
}

TEST_CASE("optimize_topology is deterministic", "[links]") {
  std::mt19937 rng(7);
  for (int n : {6, 20}) {
    INFO("n=" << n);
    const LinkMatrix m = random_matrix(n, rng, 0.1);
    const LinkMatrix copy = m;
    const OptimizeResult a = optimize(m);
    const OptimizeResult b = optimize(m);
    const OptimizeResult c = optimize(copy);
    for (const OptimizeResult* r : {&b, &c}) {
      CHECK(to_text(r->strategy) == to_text(a.strategy));
      CHECK(r->strategy.name == a.strategy.name);
      CHECK(r->ring_order == a.ring_order);
      CHECK(r->host_of == a.host_of);
      CHECK(r->explanation == a.explanation);
    }
  }
}

TEST_CASE("optimize_topology always gives a valid strategy", "[links]") {
  std::mt19937 rng(12345);
  for (int n = 1; n <= 16; ++n) {
    for (double unknown : {0.0, 0.2, 1.0}) {
      INFO("n=" << n << " unknown=" << unknown);
      const LinkMatrix m = random_matrix(n, rng, unknown);
      const OptimizeResult r = optimize(m);
      CHECK(validate_strategy(r.strategy, n).is_ok());
      CHECK(is_tour(r.ring_order, n));
      CHECK(r.host_of.size() == static_cast<size_t>(n));
      REQUIRE(r.candidates.size() >= 2 + strategy_names().size());
      CHECK(r.candidates[0].name == "measured_ring");
      CHECK(r.candidates[1].name == "slow_leaf_tree");
      bool winner_listed = false;
      for (const Candidate& c : r.candidates) {
        INFO(c.name);
        // One rank sends nothing; otherwise every candidate moves bytes and takes time.
        if (n == 1) {
          CHECK(c.cost.seconds == 0);
        } else {
          CHECK(std::isfinite(c.cost.seconds));
          CHECK(c.cost.seconds > 0);
        }
        CHECK(c.cost.seconds >= r.cost.seconds);
        winner_listed =
            winner_listed || (c.name == r.strategy.name && c.cost.seconds == r.cost.seconds);
      }
      CHECK(winner_listed);
    }
  }
}

TEST_CASE("the cost model", "[links]") {
  SECTION("a ring on a uniform matrix: 2(n-1)/n of the buffer over each link") {
    const uint64_t bytes = 64 * kMiB;
    for (int n = 2; n <= 8; ++n) {
      INFO("n=" << n);
      const CostBreakdown c = predict_allreduce(make_ring(n), uniform(n, 5 * kGB, 0), bytes, kMiB);
      CHECK(c.bandwidth_seconds == Approx(2.0 * (n - 1) / n * bytes / (5 * kGB)).epsilon(1e-9));
      // The pipeline fill: one chunk over n-1 hops to the root and n-1 back.
      CHECK(c.latency_seconds == Approx(2.0 * (n - 1) * kMiB / (5 * kGB)).epsilon(1e-9));
      CHECK(c.seconds == c.bandwidth_seconds + c.latency_seconds);
      CHECK(c.bottleneck == "link 0->1");
    }
  }
  SECTION("latency adds up along the deepest path") {
    // A star over 3 ranks, 1 byte so that the bandwidth term is negligible: the deepest
    // reduce path is 2->0 and the deepest broadcast path 0->1.
    LinkMatrix m = uniform(3, 1 * kGB, 1e-3);
    m.latency[m.index(2, 0)] = 5e-3;
    m.latency[m.index(0, 1)] = 7e-3;
    const CostBreakdown c = predict_allreduce(make_star(3), m, 1, 1);
    CHECK(c.latency_seconds == Approx(12e-3 + 2 / (1 * kGB)).epsilon(1e-9));
  }
  SECTION("a slow host") {
    LinkMatrix m = uniform(4, 4 * kGB, 1e-5);
    for (int r = 0; r < 4; ++r) {
      if (r == 2) continue;
      set_bw(m, 2, r, 1 * kGB);
      set_bw(m, r, 2, 1 * kGB);
    }
    const OptimizeResult r = optimize(m, 64 * kMiB);
    CHECK(candidate(r, "ring").cost.bottleneck == "link 1->2");
    REQUIRE(has_candidate(r, "slow_leaf_ring"));
    const double leaves = std::min(candidate(r, "slow_leaf_tree").cost.seconds,
                                   candidate(r, "slow_leaf_ring").cost.seconds);
    CHECK(leaves < candidate(r, "ring").cost.seconds);
  }
  SECTION("two throttled links crossed by the identity ring") {
    LinkMatrix m = uniform(6, 10 * kGB, 1e-5);
    set_bw(m, 1, 2, 0.1 * kGB);
    set_bw(m, 4, 5, 0.1 * kGB);
    const OptimizeResult r = optimize(m, 64 * kMiB);
    CHECK(r.strategy.name == "measured_ring");
    CHECK(r.cost.seconds * 1.5 <= candidate(r, "ring").cost.seconds);
    CHECK_FALSE(uses_link(r.ring_order, 1, 2));
    CHECK_FALSE(uses_link(r.ring_order, 4, 5));
    CHECK(topology_digest(r.strategy) == topology_digest(ring_over(r.ring_order)));
    // The explanation: the winner, its time and bottleneck, then the next two.
    const std::string head = "measured_ring " + three_digits(r.cost.seconds) + " s (" +
                             r.cost.bottleneck + ") for 67108864 B; next: ";
    CHECK(r.explanation.rfind(head, 0) == 0);
    CHECK(std::count(r.explanation.begin(), r.explanation.end(), ',') == 1);
  }
  SECTION("slow ranks hang off the ring, round robin") {
    // Ranks 4 and 5 at 0.4x: as leaves they send one buffer each instead of the ring's
    // 2(n-1)/n, and unlike the tree no fast rank sends three shares.
    LinkMatrix m = uniform(6, 10 * kGB, 1e-5);
    for (int s : {4, 5}) {
      for (int r = 0; r < 6; ++r) {
        if (r == s) continue;
        set_bw(m, s, r, 4 * kGB);
        set_bw(m, r, s, 4 * kGB);
      }
    }
    const OptimizeResult r = optimize(m, 64 * kMiB);
    REQUIRE(r.strategy.name == "slow_leaf_ring");
    REQUIRE(r.strategy.pairs.size() == 4);
    for (int k = 0; k < 4; ++k) {
      INFO("pair " << k);
      const GraphPair& p = r.strategy.pairs[static_cast<size_t>(k)];
      CHECK(p.reduce.root() == k);
      CHECK(p.reduce.parent(4) == k);
      CHECK(p.broadcast.parent(4) == k);
      CHECK(p.reduce.parent(5) == (k + 1) % 4);
      CHECK(p.broadcast.parent(5) == (k + 1) % 4);
      CHECK(p.reduce.children(4).empty());
      CHECK(p.reduce.children(5).empty());
    }
  }
  SECTION("an unknown link counts as the slowest measured one") {
    LinkMatrix m = uniform(4, 10 * kGB, 1e-5);
    set_bw(m, 2, 3, 5 * kGB);
    LinkMatrix unknown = m;
    set_bw(unknown, 0, 1, 0);
    unknown.latency[unknown.index(0, 1)] = 0;
    LinkMatrix slowest = m;
    set_bw(slowest, 0, 1, 5 * kGB);
    const CostBreakdown a = predict_allreduce(make_ring(4), unknown, 16 * kMiB, kMiB);
    const CostBreakdown b = predict_allreduce(make_ring(4), slowest, 16 * kMiB, kMiB);
    CHECK(a.seconds == b.seconds);
    CHECK(a.bottleneck == "link 0->1");
    const LinkMatrix f = fill_unknown_links(unknown);
    CHECK(f.bw(0, 1) == 5 * kGB);
    CHECK(f.lat(0, 1) == 1e-5);
    CHECK(f.bw(1, 0) == 10 * kGB);
    // Nothing measured: all alike.
    const LinkMatrix none = fill_unknown_links(LinkMatrix::sized(3));
    CHECK(none.bw(0, 1) == 1);
    CHECK(none.lat(2, 1) == 0);
    CHECK(none.bw(1, 1) == 0);
  }
  SECTION("any valid strategy, and nothing else") {
    const LinkMatrix m = uniform(5, 1 * kGB, 1e-5);
    Result<Strategy> custom = parse_topology("pairs=1;n=5;R0:-1,0,1,2,3|B0:-1,0,1,2,3", 5, {});
    REQUIRE(custom.is_ok());
    const CostBreakdown chain = predict_allreduce(custom.value(), m, 8 * kMiB, kMiB);
    // Inner ranks of the chain send the buffer up and again down.
    CHECK(chain.bandwidth_seconds == Approx(2 * 8.0 * kMiB / kGB).epsilon(1e-9));
    CHECK(chain.bottleneck == "egress of 1");
    CHECK(std::isinf(predict_allreduce(make_ring(4), m, 8 * kMiB, kMiB).seconds));
    CHECK(predict_allreduce(Strategy{}, m, 8 * kMiB, kMiB).bottleneck == "invalid strategy");
  }
}

TEST_CASE("latency_clusters", "[links]") {
  const auto two_groups = [](const std::vector<int>& group) {
    LinkMatrix m = uniform(6, 1 * kGB, 1e-4);
    for (int u = 0; u < 6; ++u) {
      for (int v = 0; v < 6; ++v) {
        if (u != v && group[static_cast<size_t>(u)] == group[static_cast<size_t>(v)]) {
          m.latency[m.index(u, v)] = 1e-6;
        }
      }
    }
    return m;
  };
  CHECK(latency_clusters(two_groups({0, 0, 0, 1, 1, 1}), 0.25) ==
        std::vector<int>{0, 0, 0, 1, 1, 1});
  CHECK(latency_clusters(two_groups({5, 2, 5, 2, 5, 2}), 0.25) ==
        std::vector<int>{0, 1, 0, 1, 0, 1});
  CHECK(latency_clusters(two_groups({0, 0, 0, 1, 1, 1}), 0) == std::vector<int>{0, 1, 2, 3, 4, 5});
  // All alike: nothing is below a quarter of the median, so every rank is its own host.
  CHECK(latency_clusters(uniform(5, 1 * kGB, 1e-4), 0.25) == std::vector<int>{0, 1, 2, 3, 4});
  CHECK(latency_clusters(LinkMatrix::sized(4), 0.25) == std::vector<int>{0, 1, 2, 3});
  // Fast one way only is not a host.
  LinkMatrix one_way = uniform(4, 1 * kGB, 1e-4);
  one_way.latency[one_way.index(0, 1)] = 1e-6;
  CHECK(latency_clusters(one_way, 0.25) == std::vector<int>{0, 1, 2, 3});
  CHECK(optimize(two_groups({0, 0, 0, 1, 1, 1})).host_of == std::vector<int>{0, 0, 0, 1, 1, 1});
}

TEST_CASE("optimize_topology rejects a malformed matrix", "[links]") {
  OptimizeOptions o;
  CHECK(optimize_topology(LinkMatrix{}, o).status().code() == Code::InvalidArgument);
  LinkMatrix negative;
  negative.n = -1;
  CHECK(optimize_topology(negative, o).status().code() == Code::InvalidArgument);
  LinkMatrix short_bw = uniform(3, 1 * kGB, 1e-5);
  short_bw.bandwidth.pop_back();
  CHECK(optimize_topology(short_bw, o).status().code() == Code::InvalidArgument);
  LinkMatrix long_lat = uniform(3, 1 * kGB, 1e-5);
  long_lat.latency.push_back(1e-5);
  CHECK(optimize_topology(long_lat, o).status().code() == Code::InvalidArgument);
  CHECK(best_ring_order(short_bw, 13).empty());
  CHECK(best_ring_order(LinkMatrix{}, 13).empty());
}
