// The bottleneck ring order of link_optimizer.h. A ring's allreduce time is set by its
// slowest link, so the order maximises the smallest bandwidth along the tour; the matrix is
// directed, which makes this an asymmetric bottleneck travelling-salesman problem.
//
// Exact (n <= kMaxExactRanks): two dynamic programs over subsets of ranks (Held-Karp), one
// for the best bottleneck and one for the least latency among the tours that reach it; a
// lexicographic objective does not decompose over subpaths, the two separate ones do. The
// order is rebuilt from rank 0 taking the smallest next rank that stays optimal, which
// makes it the lexicographically smallest optimal tour. Cost 2^n n^2 steps.
//
// Heuristic (above): greedy tours from every start (each step to the fastest unvisited
// rank), the best kept; then a binary search over the distinct bandwidths for the highest
// one some tour keeps every link at or above: a cycle cover over those links (a matching;
// none means no such tour), patched into one tour, and local search minimising the number
// of links below the target; then the latency is lowered without letting any link fall
// below the bottleneck reached. The moves relocate a segment of the tour to another gap
// without reversing it (or-opt, and the orientation-keeping 3-opt move), since a reversed
// segment would run over other links of an asymmetric matrix.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "topology/link_optimizer.h"

namespace taiji {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// 2^16 * 16 doubles is 8 MiB, and 2^16 * 16^2 steps take tens of milliseconds.
constexpr int kMaxExactRanks = 16;
// The heuristic's work, counted in move evaluations rather than time so that the result does
// not depend on the machine: about 0.2-0.5 s at n = 1024; small rings finish long before.
// A quarter is kept for the latency, and one target bandwidth gets at most an eighth.
constexpr long kMoveBudget = 30'000'000;
constexpr long kTargetBudget = kMoveBudget / 8;
constexpr long kLatencyBudget = kMoveBudget / 4;
// Move evaluations one pass may cost, which bounds the longest segment moved.
constexpr long kPassBudget = 4'000'000;

double bottleneck(const LinkMatrix& m, const std::vector<int>& t) {
  double b = kInf;
  for (size_t i = 0; i < t.size(); ++i) b = std::min(b, m.bw(t[i], t[(i + 1) % t.size()]));
  return b;
}

double latency_sum(const LinkMatrix& m, const std::vector<int>& t) {
  double sum = 0;
  for (size_t i = 0; i < t.size(); ++i) sum += m.lat(t[i], t[(i + 1) % t.size()]);
  return sum;
}

std::vector<int> starting_at_zero(std::vector<int> t) {
  std::rotate(t.begin(), std::find(t.begin(), t.end(), 0), t.end());
  return t;
}

// Higher bottleneck, then lower latency, then the smaller order (both start at rank 0).
bool better(const LinkMatrix& m, const std::vector<int>& a, const std::vector<int>& b) {
  const double ba = bottleneck(m, a);
  const double bb = bottleneck(m, b);
  if (ba != bb) return ba > bb;
  const double la = latency_sum(m, a);
  const double lb = latency_sum(m, b);
  if (la != lb) return la < lb;
  return a < b;
}

std::vector<int> exact_order(const LinkMatrix& m) {
  const int n = m.n;
  const size_t full = (size_t{1} << n) - 1;
  // best[mask * n + last]: the best completion from `last`, having visited `mask` (which
  // holds rank 0 and `last`), through the other ranks and back to rank 0.
  std::vector<double> best(static_cast<size_t>(n) << n);
  const auto at = [&](size_t mask, int last) -> double& {
    return best[mask * static_cast<size_t>(n) + static_cast<size_t>(last)];
  };
  // Only masks holding rank 0 are reached, larger masks first as they complete smaller ones.
  const auto each_state = [&](auto visit) {
    for (size_t high = (full >> 1) + 1; high-- > 0;) {
      const size_t mask = high << 1 | 1;
      for (int last = 1; last < n; ++last) {
        if (mask >> last & 1) visit(mask, last);
      }
      if (mask == 1) visit(mask, 0);
    }
  };
  // Pass 1: the best bottleneck.
  each_state([&](size_t mask, int last) {
    double v = -kInf;
    if (mask == full) {
      v = m.bw(last, 0);
    } else {
      for (int next = 1; next < n; ++next) {
        if (mask >> next & 1) continue;
        v = std::max(v, std::min(m.bw(last, next), at(mask | size_t{1} << next, next)));
      }
    }
    at(mask, last) = v;
  });
  const double target = at(1, 0);
  // Pass 2: the least latency over links no slower than that bottleneck.
  const auto via = [&](size_t mask, int last, int next) {
    if (m.bw(last, next) < target) return kInf;
    return m.lat(last, next) + at(mask | size_t{1} << next, next);
  };
  each_state([&](size_t mask, int last) {
    double v = kInf;
    if (mask == full) {
      if (m.bw(last, 0) >= target) v = m.lat(last, 0);
    } else {
      for (int next = 1; next < n; ++next) {
        if (!(mask >> next & 1)) v = std::min(v, via(mask, last, next));
      }
    }
    at(mask, last) = v;
  });
  std::vector<int> order{0};
  size_t mask = 1;
  int last = 0;
  while (mask != full) {
    int pick = -1;
    for (int next = 1; next < n && pick < 0; ++next) {
      // The same expression that computed the table, so equality is exact.
      if (!(mask >> next & 1) && via(mask, last, next) == at(mask, last)) pick = next;
    }
    order.push_back(pick);
    mask |= size_t{1} << pick;
    last = pick;
  }
  return order;
}

// From `start`, always to the fastest unvisited rank (then the lowest latency, then the
// lowest rank): `prefer[u]` lists the ranks in that order for u.
std::vector<int> greedy_tour(const std::vector<std::vector<int>>& prefer, int start) {
  const size_t n = prefer.size();
  std::vector<char> seen(n, 0);
  std::vector<int> t{start};
  seen[static_cast<size_t>(start)] = 1;
  while (t.size() < n) {
    for (int v : prefer[static_cast<size_t>(t.back())]) {
      if (!seen[static_cast<size_t>(v)]) {
        seen[static_cast<size_t>(v)] = 1;
        t.push_back(v);
        break;
      }
    }
  }
  return t;
}

// A cycle cover over links at or above the target: succ[u], a permutation without fixed
// points, by augmenting paths (Kuhn) after a greedy start. Empty when none exists, which
// proves that no ring reaches the target, or when the budget runs out first.
std::vector<int> cycle_cover(const LinkMatrix& m, double target, long& budget) {
  const int n = m.n;
  std::vector<int> succ(static_cast<size_t>(n), -1);
  std::vector<int> pred(static_cast<size_t>(n), -1);
  const auto good = [&](int u, int v) { return u != v && m.bw(u, v) >= target; };
  for (int u = 0; u < n; ++u) {
    for (int v = 0; v < n && succ[static_cast<size_t>(u)] < 0; ++v) {
      if (good(u, v) && pred[static_cast<size_t>(v)] < 0) {
        succ[static_cast<size_t>(u)] = v;
        pred[static_cast<size_t>(v)] = u;
      }
    }
  }
  budget -= long{n} * n;
  std::vector<int> stamp(static_cast<size_t>(n), -1);
  const auto augment = [&](auto& self, int u, int round) -> bool {
    for (int v = 0; v < n; ++v) {
      if (--budget < 0) return false;
      if (!good(u, v) || stamp[static_cast<size_t>(v)] == round) continue;
      stamp[static_cast<size_t>(v)] = round;
      const int holder = pred[static_cast<size_t>(v)];
      if (holder < 0 || self(self, holder, round)) {
        succ[static_cast<size_t>(u)] = v;
        pred[static_cast<size_t>(v)] = u;
        return true;
      }
    }
    return false;
  };
  for (int u = 0; u < n; ++u) {
    if (succ[static_cast<size_t>(u)] < 0 && !augment(augment, u, u)) return {};
  }
  return succ;
}

// One tour from a cycle cover: the cycle through rank 0 absorbs the others one at a time,
// by exchanging the successors of a rank on each (which joins the two cycles), choosing
// the exchange whose two new links are fastest at their slower one.
std::vector<int> patched_tour(const LinkMatrix& m, std::vector<int> succ) {
  const int n = m.n;
  std::vector<char> joined(static_cast<size_t>(n), 0);
  for (int u = 0; !joined[static_cast<size_t>(u)]; u = succ[static_cast<size_t>(u)]) {
    joined[static_cast<size_t>(u)] = 1;
  }
  for (int b0 = 0; b0 < n; ++b0) {
    if (joined[static_cast<size_t>(b0)]) continue;
    std::vector<int> other;
    int b = b0;
    do {
      other.push_back(b);
      b = succ[static_cast<size_t>(b)];
    } while (b != b0);
    int best_a = -1;
    int best_b = -1;
    double best = -kInf;
    for (int a = 0; a < n; ++a) {
      if (!joined[static_cast<size_t>(a)]) continue;
      for (int o : other) {
        const double slower =
            std::min(m.bw(a, succ[static_cast<size_t>(o)]), m.bw(o, succ[static_cast<size_t>(a)]));
        if (slower > best) {
          best = slower;
          best_a = a;
          best_b = o;
        }
      }
    }
    for (int o : other) joined[static_cast<size_t>(o)] = 1;
    std::swap(succ[static_cast<size_t>(best_a)], succ[static_cast<size_t>(best_b)]);
  }
  std::vector<int> t{0};
  for (int u = succ[0]; u != 0; u = succ[static_cast<size_t>(u)]) t.push_back(u);
  return t;
}

int position(const std::vector<int>& t, int pos) { return t[static_cast<size_t>(pos) % t.size()]; }

// The longest segment a move takes: all of them on small rings (every orientation-keeping
// 3-opt move), fewer on large ones so that a pass stays within kPassBudget.
int longest_segment(int n) {
  const long fit = kPassBudget / (long{n} * n);
  return static_cast<int>(std::min<long>(n - 2, std::max<long>(3, fit)));
}

// What moving the `len` ranks at positions i.. (mod n) to the gap after position g adds to
// the sum of cost over the tour's links; g lies in [i + len, i + n - 2], outside the
// segment and not the gap it leaves.
template <typename Cost>
double move_delta(const std::vector<int>& t, const Cost& cost, int i, int len, int g) {
  const int n = static_cast<int>(t.size());
  const int p = position(t, i + n - 1);
  const int first = position(t, i);
  const int last = position(t, i + len - 1);
  const int q = position(t, i + len);
  const int a = position(t, g);
  const int b = position(t, g + 1);
  return cost(p, q) + cost(a, first) + cost(last, b) - cost(p, first) - cost(last, q) - cost(a, b);
}

void relocate(std::vector<int>& t, int i, int len, int g) {
  const int n = static_cast<int>(t.size());
  std::vector<int> moved;
  moved.reserve(t.size());
  for (int k = i + len; k < i + n; ++k) {
    moved.push_back(position(t, k));
    if (k == g) {
      for (int s = i; s < i + len; ++s) moved.push_back(position(t, s));
    }
  }
  t = std::move(moved);
}

// First-improvement descent on the sum of cost over the tour's links, over every move.
// Stops when no move improves by more than `tolerance` or the budget is spent.
template <typename Cost>
void descend(std::vector<int>& t, const Cost& cost, double tolerance, long& budget) {
  const int n = static_cast<int>(t.size());
  const int max_len = longest_segment(n);
  bool improved = true;
  while (improved && budget > 0) {
    improved = false;
    for (int i = 0; i < n && budget > 0; ++i) {
      for (int len = 1; len <= max_len && budget > 0; ++len) {
        for (int g = i + len; g < i + n - 1; ++g) {
          --budget;
          if (move_delta(t, cost, i, len, g) < -tolerance) {
            relocate(t, i, len, g);
            improved = true;
            break;
          }
        }
      }
    }
  }
}

std::vector<int> links_below(const LinkMatrix& m, const std::vector<int>& t, double target) {
  std::vector<int> at;
  for (size_t x = 0; x < t.size(); ++x) {
    if (m.bw(t[x], t[(x + 1) % t.size()]) < target) at.push_back(static_cast<int>(x));
  }
  return at;
}

// Descent on the number of links below the target, trying only the moves that can lower
// it: those that remove such a link (a segment starting just after it, ending just before
// it, or one moved into its gap). Much cheaper than every move once few links are left.
void repair(const LinkMatrix& m, std::vector<int>& t, double target, long& budget) {
  const int n = static_cast<int>(t.size());
  const int max_len = longest_segment(n);
  const auto below = [&](int u, int v) { return m.bw(u, v) < target ? 1.0 : 0.0; };
  const auto improves = [&](int i, int len, int g) {
    --budget;
    if (move_delta(t, below, i, len, g) > -0.5) return false;
    relocate(t, i, len, g);
    return true;
  };
  bool improved = true;
  while (improved && budget > 0) {
    improved = false;
    for (int x : links_below(m, t, target)) {
      for (int len = 1; len <= max_len && !improved; ++len) {
        for (int i : {x + 1, x + n + 1 - len}) {
          for (int g = i + len; g < i + n - 1 && !improved; ++g) improved = improves(i, len, g);
        }
        for (int s = 2; s <= n - len && !improved; ++s) improved = improves(x + s, len, x + n);
      }
      if (improved || budget <= 0) break;
    }
  }
}

// A tour with no link below the target, or empty. Starts from the best tour so far and
// from the patched cycle cover, repairs both, then kicks the better one: a random segment
// exchange at one of its slow links, repaired again, kept unless it has more slow links
// (iterated local search). The generator has a fixed seed, so the result is the same
// everywhere.
std::vector<int> reach(const LinkMatrix& m, const std::vector<int>& tour, double target,
                       long& budget) {
  long allowance = std::min(budget, kTargetBudget);
  const long start = allowance;
  std::vector<int> best;
  size_t best_count = SIZE_MAX;
  const std::vector<int> cover = cycle_cover(m, target, allowance);
  if (cover.empty()) {
    budget -= start - allowance;
    return {};
  }
  for (std::vector<int> t : {tour, patched_tour(m, cover)}) {
    repair(m, t, target, allowance);
    const size_t count = links_below(m, t, target).size();
    if (count < best_count) {
      best_count = count;
      best = std::move(t);
    }
  }
  const int n = m.n;
  std::mt19937 rng(20240611);
  while (best_count > 0 && allowance > 0) {
    const std::vector<int> slow = links_below(m, best, target);
    const int i = slow[rng() % slow.size()] + 1;
    const int len = 1 + static_cast<int>(rng() % static_cast<unsigned>(n - 2));
    const int then = 1 + static_cast<int>(rng() % static_cast<unsigned>(n - 1 - len));
    std::vector<int> t = best;
    relocate(t, i, len, i + len + then - 1);
    allowance -= n;
    repair(m, t, target, allowance);
    const size_t count = links_below(m, t, target).size();
    if (count <= best_count) {
      best_count = count;
      best = std::move(t);
    }
  }
  budget -= start - allowance;
  return best_count == 0 ? best : std::vector<int>{};
}

std::vector<int> heuristic_order(const LinkMatrix& m) {
  const int n = m.n;
  std::vector<std::vector<int>> prefer(static_cast<size_t>(n));
  for (int u = 0; u < n; ++u) {
    std::vector<int>& p = prefer[static_cast<size_t>(u)];
    for (int v = 0; v < n; ++v) {
      if (v != u) p.push_back(v);
    }
    std::sort(p.begin(), p.end(), [&](int a, int b) {
      if (m.bw(u, a) != m.bw(u, b)) return m.bw(u, a) > m.bw(u, b);
      if (m.lat(u, a) != m.lat(u, b)) return m.lat(u, a) < m.lat(u, b);
      return a < b;
    });
  }
  std::vector<int> tour = starting_at_zero(greedy_tour(prefer, 0));
  for (int start = 1; start < n; ++start) {
    std::vector<int> t = starting_at_zero(greedy_tour(prefer, start));
    if (better(m, t, tour)) tour = std::move(t);
  }

  // No ring beats the slowest of the ranks' fastest outgoing or incoming links.
  std::vector<double> speeds;
  double ceiling = kInf;
  for (int u = 0; u < n; ++u) {
    double out = 0;
    double in = 0;
    for (int v = 0; v < n; ++v) {
      if (v == u) continue;
      speeds.push_back(m.bw(u, v));
      out = std::max(out, m.bw(u, v));
      in = std::max(in, m.bw(v, u));
    }
    ceiling = std::min({ceiling, out, in});
  }
  std::sort(speeds.begin(), speeds.end());
  speeds.erase(std::unique(speeds.begin(), speeds.end()), speeds.end());
  const auto rank_of = [&](double bw) {
    return std::lower_bound(speeds.begin(), speeds.end(), bw) - speeds.begin();
  };

  // Binary search over the distinct bandwidths for the highest target reached; the ceiling
  // first, as it is often reached where the links split into fast and slow. A target with
  // no cycle cover is out of reach for certain; one the search misses is only probably so.
  long budget = kMoveBudget - kLatencyBudget;
  auto low = rank_of(bottleneck(m, tour));
  auto high = rank_of(ceiling);
  const auto attempt = [&](std::ptrdiff_t target) {
    std::vector<int> t = reach(m, tour, speeds[static_cast<size_t>(target)], budget);
    if (t.empty()) return false;
    tour = starting_at_zero(std::move(t));
    low = rank_of(bottleneck(m, tour));
    return true;
  };
  if (low < high && !attempt(high)) --high;
  while (low < high && budget > 0) {
    const auto mid = (low + high + 1) / 2;
    if (!attempt(mid)) high = mid - 1;
  }

  const double floor = bottleneck(m, tour);
  double longest = 0;
  for (double l : m.latency) longest = std::max(longest, l);
  if (longest > 0) {
    budget = kLatencyBudget;
    const auto latency = [&](int u, int v) { return m.bw(u, v) < floor ? kInf : m.lat(u, v); };
    descend(tour, latency, longest * 1e-9, budget);
  }
  return starting_at_zero(std::move(tour));
}

}  // namespace

std::vector<int> best_ring_order(const LinkMatrix& measured_links, int exact_max) {
  const int n = measured_links.n;
  const size_t cells = static_cast<size_t>(std::max(n, 0)) * static_cast<size_t>(std::max(n, 0));
  if (n < 1 || measured_links.bandwidth.size() != cells || measured_links.latency.size() != cells) {
    return {};
  }
  if (n <= 2) return n == 1 ? std::vector<int>{0} : std::vector<int>{0, 1};
  const LinkMatrix m = fill_unknown_links(measured_links);
  if (n <= std::min(exact_max, kMaxExactRanks)) return exact_order(m);
  return heuristic_order(m);
}

Strategy ring_over(const std::vector<int>& order) {
  const int n = static_cast<int>(order.size());
  Strategy s{"measured_ring", {}};
  std::vector<int> position(order.size(), -1);
  for (int i = 0; i < n; ++i) {
    const int r = order[static_cast<size_t>(i)];
    if (r < 0 || r >= n || position[static_cast<size_t>(r)] >= 0) return s;
    position[static_cast<size_t>(r)] = i;
  }
  // As make_ring over positions: reduce i -> i+1, broadcast i-1 -> i, pair k rooted at k.
  for (int k = 0; k < n; ++k) {
    std::vector<int> up(order.size());
    std::vector<int> down(order.size());
    for (int i = 0; i < n; ++i) {
      const size_t r = static_cast<size_t>(order[static_cast<size_t>(i)]);
      up[r] = i == k ? -1 : order[static_cast<size_t>((i + 1) % n)];
      down[r] = i == k ? -1 : order[static_cast<size_t>((i + n - 1) % n)];
    }
    s.pairs.push_back({Graph(std::move(up)), Graph(std::move(down))});
  }
  return s;
}

}  // namespace taiji
