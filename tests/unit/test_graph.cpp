#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "topology/graph.h"
#include "topology/selection.h"
#include "topology/strategies.h"
#include "topology/text.h"

using namespace taiji;

namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

void require_rejected(const Graph& g, int n, const std::string& fragment) {
  Status s = validate_graph(g, n);
  REQUIRE_FALSE(s.is_ok());
  CHECK(s.code() == Code::InvalidArgument);
  INFO("message: " << s.message());
  CHECK(contains(s.message(), fragment));
}

// Deliberately naive: walk up at most n steps from every rank.
bool reference_valid(const std::vector<int>& parent, int n) {
  if (static_cast<int>(parent.size()) != n || n < 1) return false;
  int roots = 0;
  int root = -1;
  for (int r = 0; r < n; ++r) {
    if (parent[r] == -1) {
      ++roots;
      root = r;
    } else if (parent[r] < 0 || parent[r] >= n || parent[r] == r) {
      return false;
    }
  }
  if (roots != 1) return false;
  for (int r = 0; r < n; ++r) {
    int x = r;
    for (int steps = 0; steps < n && x != root; ++steps) x = parent[x];
    if (x != root) return false;
  }
  return true;
}

// Undirected edges as (low, high) rank pairs, sorted.
std::vector<std::pair<int, int>> edges(const Graph& g) {
  std::vector<std::pair<int, int>> e;
  for (int r = 0; r < g.size(); ++r) {
    if (g.parent(r) >= 0) e.emplace_back(std::min(r, g.parent(r)), std::max(r, g.parent(r)));
  }
  std::sort(e.begin(), e.end());
  return e;
}

void check_rooted(const std::vector<Graph>& got, const Strategy& s, int root, bool reduce) {
  const auto pick = [reduce](const GraphPair& p) -> const Graph& {
    return reduce ? p.reduce : p.broadcast;
  };
  std::vector<Graph> want;
  for (const GraphPair& p : s.pairs) {
    if (pick(p).root() == root) want.push_back(pick(p));
  }
  if (want.empty()) {
    REQUIRE(got.size() == s.pairs.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(edges(got[i]) == edges(pick(s.pairs[i])));
  } else {
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i].parents() == want[i].parents());
  }
  for (const Graph& g : got) {
    CHECK(g.root() == root);
    CHECK(validate_graph(g, static_cast<int>(g.size())).is_ok());
  }
}

}  // namespace

TEST_CASE("built-in strategies validate for 1..8 ranks", "[graph]") {
  for (int n = 1; n <= 8; ++n) {
    for (const char* name : {"ring", "tree", "star"}) {
      INFO(name << " n=" << n);
      Result<Strategy> s = make_strategy(name, n);
      REQUIRE(s.is_ok());
      CHECK(s.value().name == name);
      const size_t want_pairs = std::string(name) == "ring" ? static_cast<size_t>(n) : 1;
      REQUIRE(s.value().pairs.size() == want_pairs);
      for (const GraphPair& p : s.value().pairs) {
        Status st = validate_pair(p, n);
        INFO(st.message());
        CHECK(st.is_ok());
        // Children lists partition the non-root ranks, each list ascending.
        for (const Graph* g : {&p.reduce, &p.broadcast}) {
          size_t total = 0;
          for (int r = 0; r < n; ++r) {
            const std::vector<int>& ch = g->children(r);
            CHECK(std::is_sorted(ch.begin(), ch.end()));
            for (int c : ch) CHECK(g->parent(c) == r);
            total += ch.size();
          }
          CHECK(total == static_cast<size_t>(n - 1));
        }
      }
    }
  }
}

TEST_CASE("ring pairs are rooted at k with exact chains", "[graph]") {
  Strategy s = make_ring(4);
  CHECK(s.name == "ring");
  REQUIRE(s.pairs.size() == 4);
  const std::vector<std::vector<int>> reduce = {
      {-1, 2, 3, 0}, {1, -1, 3, 0}, {1, 2, -1, 0}, {1, 2, 3, -1}};
  const std::vector<std::vector<int>> bcast = {
      {-1, 0, 1, 2}, {3, -1, 1, 2}, {3, 0, -1, 2}, {3, 0, 1, -1}};
  for (int k = 0; k < 4; ++k) {
    INFO("pair " << k);
    CHECK(s.pairs[k].reduce.root() == k);
    CHECK(s.pairs[k].broadcast.root() == k);
    CHECK(s.pairs[k].reduce.parents() == reduce[k]);
    CHECK(s.pairs[k].broadcast.parents() == bcast[k]);
  }
  // Pair 1 reduces 2 -> 3 -> 0 -> 1: the chain starts at k+1, which has no children.
  CHECK(s.pairs[1].reduce.children(2).empty());
  CHECK(s.pairs[1].reduce.children(1) == std::vector<int>{0});
  CHECK(s.pairs[1].broadcast.children(1) == std::vector<int>{2});
  CHECK(s.pairs[1].broadcast.children(0).empty());
}

TEST_CASE("ring of one rank is a single root", "[graph]") {
  Strategy s = make_ring(1);
  REQUIRE(s.pairs.size() == 1);
  CHECK(s.pairs[0].reduce.parents() == std::vector<int>{-1});
  CHECK(s.pairs[0].broadcast.parents() == std::vector<int>{-1});
  CHECK(s.pairs[0].reduce.root() == 0);
  CHECK(validate_pair(s.pairs[0], 1).is_ok());
}

TEST_CASE("tree and star parents", "[graph]") {
  Strategy t = make_tree(7);
  CHECK(t.name == "tree");
  REQUIRE(t.pairs.size() == 1);
  CHECK(t.pairs[0].reduce.parents() == std::vector<int>{-1, 0, 0, 1, 1, 2, 2});
  CHECK(t.pairs[0].broadcast.parents() == t.pairs[0].reduce.parents());
  CHECK(t.pairs[0].reduce.children(0) == std::vector<int>{1, 2});
  CHECK(t.pairs[0].reduce.children(2) == std::vector<int>{5, 6});
  CHECK(t.pairs[0].reduce.children(3).empty());
  CHECK(t.pairs[0].reduce.root() == 0);

  Strategy s = make_star(5);
  CHECK(s.name == "star");
  REQUIRE(s.pairs.size() == 1);
  CHECK(s.pairs[0].reduce.parents() == std::vector<int>{-1, 0, 0, 0, 0});
  CHECK(s.pairs[0].broadcast.parents() == s.pairs[0].reduce.parents());
  CHECK(s.pairs[0].reduce.children(0) == std::vector<int>{1, 2, 3, 4});

  CHECK(make_tree(1).pairs[0].reduce.parents() == std::vector<int>{-1});
  CHECK(make_star(1).pairs[0].reduce.parents() == std::vector<int>{-1});
}

TEST_CASE("unknown strategy names are rejected", "[graph]") {
  Result<Strategy> s = make_strategy("mesh", 4);
  REQUIRE_FALSE(s.is_ok());
  CHECK(s.status().code() == Code::InvalidArgument);
  CHECK(contains(s.status().message(), "mesh"));
  CHECK(contains(s.status().message(), "ring"));
  CHECK(contains(s.status().message(), "tree"));
  CHECK(contains(s.status().message(), "star"));
  CHECK_FALSE(make_strategy("", 4).is_ok());
  CHECK_FALSE(make_strategy("Ring", 4).is_ok());
  CHECK_FALSE(make_strategy("ring", 0).is_ok());
}

TEST_CASE("rotated renames every rank", "[graph]") {
  Graph tree = make_tree(5).pairs[0].reduce;  // {-1, 0, 0, 1, 1}
  Graph r2 = tree.rotated(2);
  CHECK(r2.parents() == std::vector<int>{3, 3, -1, 2, 2});
  CHECK(r2.root() == 2);
  CHECK(r2.children(2) == std::vector<int>{3, 4});
  CHECK(r2.children(3) == std::vector<int>{0, 1});
  CHECK(validate_graph(r2, 5).is_ok());

  CHECK(tree.rotated(0).parents() == tree.parents());
  CHECK(tree.rotated(5).parents() == tree.parents());
  CHECK(tree.rotated(-3).parents() == r2.parents());
  CHECK(tree.rotated(7).parents() == r2.parents());

  // Ring pair k is pair 0 renamed by k.
  Strategy ring = make_ring(6);
  for (int k = 0; k < 6; ++k) {
    CHECK(ring.pairs[0].reduce.rotated(k).parents() == ring.pairs[k].reduce.parents());
    CHECK(ring.pairs[0].broadcast.rotated(k).parents() == ring.pairs[k].broadcast.parents());
  }
  CHECK(Graph().rotated(3).size() == 0);
}

TEST_CASE("rerooted reverses the path to the old root", "[graph]") {
  Graph tree = make_tree(7).pairs[0].reduce;  // {-1, 0, 0, 1, 1, 2, 2}
  Graph r5 = tree.rerooted(5);
  CHECK(r5.parents() == std::vector<int>{2, 0, 5, 1, 1, -1, 2});
  CHECK(r5.root() == 5);
  CHECK(r5.children(5) == std::vector<int>{2});
  CHECK(r5.children(2) == std::vector<int>{0, 6});
  CHECK(r5.children(0) == std::vector<int>{1});
  CHECK(validate_graph(r5, 7).is_ok());
  CHECK(edges(r5) == edges(tree));
  CHECK(r5.rerooted(0).parents() == tree.parents());

  CHECK(tree.rerooted(0).parents() == tree.parents());
  CHECK(tree.rerooted(1).parents() == std::vector<int>{1, -1, 0, 1, 1, 2, 2});
  CHECK(make_star(5).pairs[0].reduce.rerooted(3).parents() == std::vector<int>{3, 0, 0, -1, 0});
  // A chain rerooted in the middle becomes two chains.
  CHECK(Graph({-1, 0, 1, 2}).rerooted(2).parents() == std::vector<int>{1, 2, -1, 2});
  CHECK(Graph({-1}).rerooted(0).parents() == std::vector<int>{-1});

  // Out of range or invalid: unchanged, and no hang on a cycle.
  CHECK(tree.rerooted(7).parents() == tree.parents());
  CHECK(tree.rerooted(-1).parents() == tree.parents());
  CHECK(Graph({-1, 2, 1}).rerooted(1).parents() == std::vector<int>{-1, 2, 1});
  CHECK(Graph({1, 2, 0}).rerooted(0).parents() == std::vector<int>{1, 2, 0});
  CHECK(Graph({-1, 9}).rerooted(1).parents() == std::vector<int>{-1, 9});
  CHECK(Graph().rerooted(0).size() == 0);
}

TEST_CASE("random trees rerooted at every rank keep their edges", "[graph]") {
  std::mt19937 rng(77);
  for (int iter = 0; iter < 500; ++iter) {
    const int n = std::uniform_int_distribution<int>(1, 12)(rng);
    std::vector<int> order(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<int> parent(static_cast<size_t>(n));
    parent[order[0]] = -1;
    for (int i = 1; i < n; ++i) {
      parent[order[i]] = order[std::uniform_int_distribution<int>(0, i - 1)(rng)];
    }
    Graph g(parent);
    for (int r = 0; r < n; ++r) {
      INFO("iteration " << iter << " root " << r);
      Graph h = g.rerooted(r);
      REQUIRE(validate_graph(h, n).is_ok());
      CHECK(h.root() == r);
      CHECK(edges(h) == edges(g));
      for (int x = 0; x < n; ++x) {
        CHECK(std::is_sorted(h.children(x).begin(), h.children(x).end()));
      }
    }
  }
}

TEST_CASE("rooted op graphs keep pairs already rooted there, else reroot", "[graph]") {
  const std::vector<std::vector<int>> host_maps = {{}, {0, 0, 1, 1, 2, 2, 3, 3}};
  for (int n = 1; n <= 8; ++n) {
    for (std::string_view name : strategy_names()) {
      for (const std::vector<int>& hosts_all : host_maps) {
        const std::vector<int> hosts(hosts_all.begin(),
                                     hosts_all.empty() ? hosts_all.end()
                                                       : hosts_all.begin() + n);
        Strategy s = make_strategy(name, n, hosts).value();
        for (int root = 0; root < n; ++root) {
          INFO(name << " n=" << n << " root=" << root << " hosts=" << hosts.size());
          check_rooted(broadcast_graphs(s, root), s, root, false);
          check_rooted(reduce_graphs(s, root), s, root, true);
        }
      }
    }
  }
  // A ring broadcast from 2 over 4 ranks is the one chain 2 -> 3 -> 0 -> 1; a reduce to 2
  // is the chain 3 -> 0 -> 1 -> 2.
  std::vector<Graph> b = broadcast_graphs(make_ring(4), 2);
  REQUIRE(b.size() == 1);
  CHECK(b[0].parents() == std::vector<int>{3, 0, -1, 2});
  std::vector<Graph> r = reduce_graphs(make_ring(4), 2);
  REQUIRE(r.size() == 1);
  CHECK(r[0].parents() == std::vector<int>{1, 2, -1, 0});
  // A tree keeps its edges: 3 -> 1 -> 0 -> 2.
  CHECK(broadcast_graphs(make_tree(4), 3)[0].parents() == std::vector<int>{1, 3, 0, -1});
  CHECK(reduce_graphs(make_tree(4), 0)[0].parents() == std::vector<int>{-1, 0, 0, 1});
  // Hierarchical over two hosts: the pair rooted at leader 2 only, local stars intact.
  Strategy h = make_strategy("hierarchical", 4, {0, 0, 1, 1}).value();
  std::vector<Graph> hb = broadcast_graphs(h, 2);
  REQUIRE(hb.size() == 1);
  CHECK(hb[0].parents() == std::vector<int>{2, 0, -1, 2});
  // Rooted at a non-leader: both pairs rerooted.
  std::vector<Graph> hr = reduce_graphs(h, 3);
  REQUIRE(hr.size() == 2);
  CHECK(hr[0].parents() == std::vector<int>{2, 0, 3, -1});
  CHECK(hr[1].parents() == std::vector<int>{2, 0, 3, -1});
  CHECK(broadcast_graphs(Strategy{}, 0).empty());
}

TEST_CASE("a limit keeps the first rooted graphs and builds no others", "[graph]") {
  // Every built-in, every root: the limited list is the unlimited one's prefix, and the
  // count says how long the unlimited one is.
  for (int n = 1; n <= 8; ++n) {
    for (std::string_view name : strategy_names()) {
      const std::vector<int> hosts_all = {0, 0, 1, 1, 2, 2, 3, 3};
      Strategy s = make_strategy(name, n, std::vector<int>(hosts_all.begin(), hosts_all.begin() + n)).value();
      for (int root = 0; root < n; ++root) {
        INFO(name << " n=" << n << " root=" << root);
        const std::vector<Graph> all = broadcast_graphs(s, root);
        CHECK(rooted_graph_count(s, root) == all.size());
        for (size_t limit : {size_t{0}, size_t{1}, size_t{2}, all.size() + 1}) {
          const std::vector<Graph> some = broadcast_graphs(s, root, limit);
          REQUIRE(some.size() == std::min(limit, all.size()));
          for (size_t i = 0; i < some.size(); ++i) CHECK(some[i].parents() == all[i].parents());
          const std::vector<Graph> reduce_all = reduce_graphs(s, root);
          const std::vector<Graph> reduce_some = reduce_graphs(s, root, limit);
          REQUIRE(reduce_some.size() == std::min(limit, reduce_all.size()));
          for (size_t i = 0; i < reduce_some.size(); ++i) CHECK(reduce_some[i].parents() == reduce_all[i].parents());
        }
      }
    }
  }
  // Many pairs, none rooted at 5: every pair would be rerooted without a limit.
  Strategy many;
  for (int k = 0; k < 64; ++k) many.pairs.push_back(make_tree(8).pairs[0]);
  CHECK(rooted_graph_count(many, 5) == 64);
  CHECK(broadcast_graphs(many, 5, 3).size() == 3);
  CHECK(rooted_graph_count(many, 0) == 64);
  CHECK(broadcast_graphs(many, 0, 3).size() == 3);
}

TEST_CASE("invalid graphs are rejected with the fault named", "[graph]") {
  SECTION("two roots") {
    require_rejected(Graph({-1, 0, -1, 2}), 4, "more than one root");
    require_rejected(Graph({-1, 0, -1, 2}), 4, "ranks 0, 2");
  }
  SECTION("no root") {
    require_rejected(Graph({1, 2, 0}), 3, "no root");
  }
  SECTION("parent out of range") {
    require_rejected(Graph({-1, 0, 0, 7}), 4, "rank 3: parent 7 out of range for 4 ranks");
    require_rejected(Graph({-1, -2}), 2, "rank 1: parent -2 out of range for 2 ranks");
    require_rejected(Graph({4, -1, 1, 1}), 4, "rank 0: parent 4 out of range");
  }
  SECTION("self parent") {
    require_rejected(Graph({-1, 1, 0}), 3, "rank 1: parent is itself");
  }
  SECTION("cycle") {
    require_rejected(Graph({-1, 2, 1}), 3, "cycle through ranks 1 -> 2 -> 1");
    require_rejected(Graph({-1, 0, 4, 2, 3}), 5, "cycle through ranks 2 -> 4 -> 3 -> 2");
  }
  SECTION("wrong size") {
    require_rejected(Graph({-1, 0, 0}), 4, "graph has 3 ranks, expected 4");
    require_rejected(Graph(), 2, "graph has 0 ranks, expected 2");
    CHECK_FALSE(validate_graph(Graph(), 0).is_ok());
  }
  SECTION("pair with mismatched roots") {
    GraphPair p{Graph({-1, 0, 0}), Graph({1, -1, 1})};
    Status s = validate_pair(p, 3);
    REQUIRE_FALSE(s.is_ok());
    CHECK(s.code() == Code::InvalidArgument);
    CHECK(contains(s.message(), "broadcast graph rooted at 1"));
    CHECK(contains(s.message(), "reduce graph ends at 0"));
  }
  SECTION("pair names the invalid graph") {
    GraphPair bad_reduce{Graph({-1, 2, 1}), Graph({-1, 0, 0})};
    CHECK(contains(validate_pair(bad_reduce, 3).message(), "reduce graph: cycle"));
    GraphPair bad_bcast{Graph({-1, 0, 0}), Graph({-1, -1, 0})};
    CHECK(contains(validate_pair(bad_bcast, 3).message(), "broadcast graph: more than one"));
  }
}

TEST_CASE("unvalidated graphs are safe to inspect", "[graph]") {
  Graph g({5, 0, 2, -7, -1, -1});
  CHECK(g.root() == 4);
  CHECK(g.children(0) == std::vector<int>{1});
  CHECK(g.children(2).empty());  // the self link is not a child
  Graph none({1, 0});
  CHECK(none.root() == -1);
  CHECK(Graph().root() == -1);
}

TEST_CASE("random parent arrays agree with a reference check", "[graph]") {
  std::mt19937 rng(20240611);
  int valid = 0;
  for (int iter = 0; iter < 10000; ++iter) {
    const int n = std::uniform_int_distribution<int>(1, 9)(rng);
    std::vector<int> parent(static_cast<size_t>(n));
    if (iter % 2 == 0) {
      // Arbitrary values, out-of-range ones included.
      std::uniform_int_distribution<int> any(-3, n + 2);
      for (int& p : parent) p = any(rng);
    } else {
      // A random tree with ranks shuffled, then sometimes one link changed; mostly valid,
      // so the accepting paths get exercised too.
      std::vector<int> order(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), rng);
      parent[order[0]] = -1;
      for (int i = 1; i < n; ++i) {
        parent[order[i]] = order[std::uniform_int_distribution<int>(0, i - 1)(rng)];
      }
      if (iter % 3 == 0) {
        parent[std::uniform_int_distribution<int>(0, n - 1)(rng)] =
            std::uniform_int_distribution<int>(-1, n - 1)(rng);
      }
    }
    const int claimed = (iter % 17 == 0) ? n + 1 : n;
    Graph g(parent);
    Status s = validate_graph(g, claimed);
    const bool want = reference_valid(parent, claimed);
    INFO("iteration " << iter << " message " << s.message());
    REQUIRE(s.is_ok() == want);
    if (!want) {
      REQUIRE(s.code() == Code::InvalidArgument);
      REQUIRE_FALSE(s.message().empty());
      continue;
    }
    ++valid;
    size_t total = 0;
    for (int r = 0; r < n; ++r) total += g.children(r).size();
    REQUIRE(total == static_cast<size_t>(n - 1));
    const int shift = std::uniform_int_distribution<int>(-20, 20)(rng);
    Graph rot = g.rotated(shift);
    REQUIRE(validate_graph(rot, n).is_ok());
    REQUIRE(rot.root() == ((g.root() + shift) % n + n) % n);
  }
  CHECK(valid > 2000);
}

TEST_CASE("the strategy cache builds each built-in once, whichever thread asks first", "[graph]") {
  const std::vector<int> host_of = {0, 0, 1, 1, 1};
  StrategyCache cache(5, host_of);
  const auto& names = strategy_names();
  std::vector<std::vector<BoundStrategy>> seen(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < seen.size(); ++t) {
    seen[t].resize(names.size());
    threads.emplace_back([&, t] {
      for (size_t k = 0; k < names.size(); ++k) {
        // Every thread walks the ids from another starting point.
        const size_t i = (k + t * 3) % names.size();
        seen[t][i] = cache.get(static_cast<uint8_t>(i + 1));
      }
    });
  }
  for (auto& th : threads) th.join();
  for (size_t i = 0; i < names.size(); ++i) {
    CAPTURE(names[i]);
    auto made = make_strategy(names[i], 5, host_of);
    REQUIRE(made.is_ok());
    const uint64_t digest = topology_digest(made.value());
    for (const auto& s : seen) {
      REQUIRE(s[i].strategy != nullptr);
      CHECK(s[i].strategy == seen[0][i].strategy);  // one build, shared
      CHECK(s[i].digest == digest);
      CHECK(s[i].id == wire_id(digest));
      CHECK(s[i].tag == wire_tag(digest));
    }
  }
  CHECK(cache.get(0).strategy == nullptr);
  CHECK(cache.get(static_cast<uint8_t>(names.size() + 1)).strategy == nullptr);
}
