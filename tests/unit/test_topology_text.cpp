#include <catch2/catch.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "topology/graph.h"
#include "topology/strategies.h"
#include "topology/text.h"

using namespace taiji;

namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Host maps worth covering for n ranks: none, one host, all distinct, hosts of 2, blocks of
// 3+1+4 (repeating), and interleaved 0,1,0,1.
std::vector<std::vector<int>> host_maps(int n) {
  std::vector<std::vector<int>> maps(6);
  const int blocks[] = {0, 0, 0, 1, 2, 2, 2, 2};
  for (int r = 0; r < n; ++r) {
    maps[1].push_back(0);
    maps[2].push_back(r);
    maps[3].push_back(r / 2);
    maps[4].push_back(blocks[r % 8] + 3 * (r / 8));
    maps[5].push_back(r % 2);
  }
  return maps;
}

int host_count(int n, const std::vector<int>& hosts) {
  if (hosts.empty()) return n;
  return static_cast<int>(std::set<int>(hosts.begin(), hosts.end()).size());
}

std::vector<std::vector<int>> all_parents(const Strategy& s) {
  std::vector<std::vector<int>> out;
  for (const GraphPair& p : s.pairs) {
    out.push_back(p.reduce.parents());
    out.push_back(p.broadcast.parents());
  }
  return out;
}

// A random tree over n ranks rooted at `root`.
std::vector<int> random_tree(int n, int root, std::mt19937& rng) {
  std::vector<int> order;
  for (int r = 0; r < n; ++r) {
    if (r != root) order.push_back(r);
  }
  std::shuffle(order.begin(), order.end(), rng);
  order.insert(order.begin(), root);
  std::vector<int> parent(static_cast<size_t>(n));
  parent[root] = -1;
  for (int i = 1; i < n; ++i) {
    parent[order[i]] = order[std::uniform_int_distribution<int>(0, i - 1)(rng)];
  }
  return parent;
}

Strategy random_strategy(int n, int pairs, std::mt19937& rng) {
  Strategy s{"custom", {}};
  for (int i = 0; i < pairs; ++i) {
    const int root = std::uniform_int_distribution<int>(0, n - 1)(rng);
    s.pairs.push_back({Graph(random_tree(n, root, rng)), Graph(random_tree(n, root, rng))});
  }
  return s;
}

void require_parse_error(std::string_view text, int n, const std::string& fragment,
                         const std::vector<int>& hosts = {}) {
  Result<Strategy> r = parse_topology(text, n, hosts);
  INFO("text: " << printable(text, 200));
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().code() == Code::InvalidArgument);
  INFO("message: " << r.status().message());
  CHECK(contains(r.status().message(), fragment));
}

}  // namespace

TEST_CASE("strategy names are in wire-id order", "[topology]") {
  const std::vector<std::string_view> want = {"star",        "ring",
                                              "clique",      "tree",
                                              "binary_tree", "binary_tree_star",
                                              "multi_binary_tree_star", "hierarchical"};
  CHECK(strategy_names() == want);
  Result<Strategy> bad = make_strategy("mesh", 4, {});
  REQUIRE_FALSE(bad.is_ok());
  for (std::string_view name : want) CHECK(contains(bad.status().message(), std::string(name)));
  CHECK(contains(make_strategy("tree", 4, {0, 1}).status().message(),
                 "host map has 2 entries for 4 ranks"));
  CHECK(contains(make_strategy("tree", 2, {0, -3}).status().message(), "negative host -3"));
  CHECK_FALSE(make_strategy("clique", 0, {}).is_ok());
  // Host labels need not be dense: they are renumbered by first appearance.
  CHECK(make_strategy("hierarchical", 4, {7, 7, 2, 2}).value().pairs[1].reduce.parents() ==
        make_strategy("hierarchical", 4, {0, 0, 1, 1}).value().pairs[1].reduce.parents());
}

TEST_CASE("every built-in validates for 1..16 ranks and several host maps", "[topology]") {
  for (int n = 1; n <= 16; ++n) {
    for (const std::vector<int>& hosts : host_maps(n)) {
      const int h = host_count(n, hosts);
      for (std::string_view name : strategy_names()) {
        INFO(name << " n=" << n << " hosts=" << h << " map size " << hosts.size());
        Result<Strategy> made = make_strategy(name, n, hosts);
        REQUIRE(made.is_ok());
        const Strategy& s = made.value();
        CHECK(s.name == name);
        Status st = validate_strategy(s, n);
        INFO(st.message());
        REQUIRE(st.is_ok());
        size_t want_pairs = 1;
        if (name == "ring" || name == "clique") want_pairs = static_cast<size_t>(n);
        if (name == "multi_binary_tree_star" || name == "hierarchical") {
          want_pairs = static_cast<size_t>(h);
        }
        CHECK(s.pairs.size() == want_pairs);
        // Chunks cycle over the pairs; each chunk's graphs must reach every rank.
        for (size_t chunk = 0; chunk < 2 * s.pairs.size(); ++chunk) {
          const GraphPair& p = s.pairs[chunk % s.pairs.size()];
          for (const Graph* g : {&p.reduce, &p.broadcast}) {
            for (int r = 0; r < n; ++r) {
              int x = r;
              for (int steps = 0; steps < n && x != g->root(); ++steps) x = g->parent(x);
              CHECK(x == g->root());
              CHECK(std::is_sorted(g->children(r).begin(), g->children(r).end()));
            }
          }
        }
      }
      // The degenerate cases named in the design.
      const auto parents_of = [&](std::string_view name) {
        return all_parents(make_strategy(name, n, hosts).value());
      };
      if (h == n) {
        CHECK(parents_of("hierarchical") == all_parents(make_ring(n)));
        CHECK(parents_of("tree") == all_parents(make_tree(n)));
        CHECK(parents_of("binary_tree_star") == all_parents(make_tree(n)));
      }
      if (h == 1) CHECK(parents_of("hierarchical") == all_parents(make_star(n)));
      CHECK(parents_of("tree") == parents_of("binary_tree_star"));
      CHECK(parents_of("binary_tree") == all_parents(make_tree(n)));
    }
  }
}

TEST_CASE("built-in shapes", "[topology]") {
  CHECK(all_parents(make_clique(3)) ==
        std::vector<std::vector<int>>{{-1, 0, 0}, {-1, 0, 0}, {1, -1, 1}, {1, -1, 1},
                                      {2, 2, -1}, {2, 2, -1}});
  CHECK(make_binary_tree(6).pairs[0].reduce.parents() == std::vector<int>{-1, 0, 0, 1, 1, 2});
  // Interleaved hosts: leaders 0 and 1, each with its local star.
  CHECK(make_tree(4, {0, 1, 0, 1}).pairs[0].reduce.parents() == std::vector<int>{-1, 0, 0, 1});
  // Leaders 0, 2, 4, 6 in a heap: 2 and 4 under 0, 6 under 2.
  CHECK(make_binary_tree_star(8, {0, 0, 1, 1, 2, 2, 3, 3}).pairs[0].reduce.parents() ==
        std::vector<int>{-1, 0, 0, 2, 0, 4, 2, 6});
  CHECK(all_parents(make_multi_binary_tree_star(6, {0, 0, 1, 1, 2, 2})) ==
        std::vector<std::vector<int>>{{-1, 0, 0, 2, 0, 4},
                                      {-1, 0, 0, 2, 0, 4},
                                      {2, 0, -1, 2, 2, 4},
                                      {2, 0, -1, 2, 2, 4},
                                      {4, 0, 4, 2, -1, 4},
                                      {4, 0, 4, 2, -1, 4}});
  // 3+1+4: leaders 0, 3, 4. Pair 0 reduces 3 -> 4 -> 0 and broadcasts 0 -> 3 -> 4.
  Strategy h = make_hierarchical(8, {0, 0, 0, 1, 2, 2, 2, 2});
  REQUIRE(h.pairs.size() == 3);
  CHECK(h.pairs[0].reduce.parents() == std::vector<int>{-1, 0, 0, 4, 0, 4, 4, 4});
  CHECK(h.pairs[0].broadcast.parents() == std::vector<int>{-1, 0, 0, 0, 3, 4, 4, 4});
  CHECK(h.pairs[1].reduce.parents() == std::vector<int>{3, 0, 0, -1, 0, 4, 4, 4});
  CHECK(h.pairs[2].broadcast.parents() == std::vector<int>{4, 0, 0, 0, -1, 4, 4, 4});
  // The two-argument form is the one with no hosts.
  CHECK(all_parents(make_strategy("tree", 5).value()) == all_parents(make_tree(5)));
}

TEST_CASE("to_text writes the explicit form", "[topology]") {
  CHECK(to_text(make_ring(3)) ==
        "pairs=3;n=3;R0:-1,2,0|B0:-1,0,1;R1:1,-1,0|B1:2,-1,1;R2:1,2,-1|B2:2,0,-1");
  CHECK(to_text(make_star(1)) == "pairs=1;n=1;R0:-1|B0:-1");
  CHECK(to_text(Strategy{}) == "pairs=0;n=0");
  // Invalid graphs are written as they are.
  CHECK(to_text(Strategy{"x", {{Graph({-1, 7}), Graph({-5, 0})}}}) ==
        "pairs=1;n=2;R0:-1,7|B0:-5,0");
}

TEST_CASE("text round trips for built-ins and random strategies", "[topology]") {
  for (int n = 1; n <= 8; ++n) {
    for (const std::vector<int>& hosts : host_maps(n)) {
      for (std::string_view name : strategy_names()) {
        Strategy s = make_strategy(name, n, hosts).value();
        const std::string text = to_text(s);
        INFO(text);
        Result<Strategy> back = parse_topology(text, n, {});
        REQUIRE(back.is_ok());
        CHECK(back.value().name == "custom");
        CHECK(all_parents(back.value()) == all_parents(s));
        CHECK(to_text(back.value()) == text);
        CHECK(topology_digest(back.value()) == topology_digest(s));
        // By name, with surrounding whitespace.
        Result<Strategy> named = parse_topology(" \t" + std::string(name) + "\n ", n, hosts);
        REQUIRE(named.is_ok());
        CHECK(named.value().name == name);
        CHECK(all_parents(named.value()) == all_parents(s));
      }
    }
  }
  std::mt19937 rng(4242);
  for (int iter = 0; iter < 2000; ++iter) {
    const int n = std::uniform_int_distribution<int>(1, 12)(rng);
    const int pairs = std::uniform_int_distribution<int>(1, 6)(rng);
    Strategy s = random_strategy(n, pairs, rng);
    REQUIRE(validate_strategy(s, n).is_ok());
    const std::string text = to_text(s);
    INFO(text);
    Result<Strategy> back = parse_topology("  " + text + "\r\n", n, {});
    REQUIRE(back.is_ok());
    CHECK(all_parents(back.value()) == all_parents(s));
    CHECK(to_text(back.value()) == text);
  }
}

TEST_CASE("parse errors name the fault", "[topology]") {
  require_parse_error("", 4, "empty topology text");
  require_parse_error(" \n\t ", 4, "empty topology text");
  require_parse_error("mesh", 4, "unknown strategy 'mesh' (known: star, ring, clique");
  require_parse_error("Ring", 4, "unknown strategy 'Ring'");
  require_parse_error("ring!", 4, "unexpected character '!' at offset 4");
  require_parse_error("  ri ng", 4, "unexpected character ' ' at offset 4");
  require_parse_error("tree", 4, "host map has 2 entries for 4 ranks", {0, 0});
  require_parse_error("ring", 0, "at least 1 rank, got 0");
  require_parse_error("pairs=1;n=3;R0:-1,0,0|B0:-1,0,0", 4, "expected 4 ranks, got 3");
  require_parse_error("pairs=1;n=4;R0:-1,0,0|B0:-1,0,0,0", 4,
                      "pair 0 reduce graph: expected 4 ranks, got 3");
  require_parse_error("pairs=1;n=4;R0:-1,0,0,0|B0:-1,0,0", 4,
                      "pair 0 broadcast graph: expected 4 ranks, got 3");
  require_parse_error("pairs=1;n=3;R0:-1,0,0,0|B0:-1,0,0", 3,
                      "pair 0 reduce graph: expected 3 ranks, got more");
  require_parse_error("pairs=1;n=3;R0:-1,2,1|B0:-1,0,0", 3,
                      "pair 0 reduce graph: cycle through ranks 1 -> 2 -> 1");
  require_parse_error(
      "pairs=3;n=3;R0:-1,0,0|B0:-1,0,0;R1:-1,0,0|B1:-1,0,0;R2:-1,2,1|B2:-1,0,0", 3,
      "pair 2 reduce graph: cycle through ranks 1 -> 2 -> 1");
  require_parse_error("pairs=1;n=3;R0:-1,0,0|B0:1,-1,1", 3,
                      "pair 0 broadcast graph rooted at 1 but reduce graph ends at 0");
  require_parse_error("pairs=1;n=3;R0:-1,0,0|B0:-1,0,3", 3,
                      "pair 0 broadcast graph: rank 2: parent 3 out of range");
  require_parse_error("pairs=1;n=3;R0:-1,-1,0|B0:-1,0,0", 3,
                      "pair 0 reduce graph: more than one root");
  require_parse_error("pairs=1;n=4;R0:-1,0,0,x|B0:-1,0,0,0", 4,
                      "unexpected character 'x' at offset 22 (expected a rank or -1)");
  require_parse_error("  pairs=1;n=4;R0:-1,0,0,x", 4, "unexpected character 'x' at offset 24");
  require_parse_error("pairs=1;n=3;R0:-1,0,0;B0:-1,0,0", 3,
                      "unexpected character ';' at offset 21 (expected ',' or '|')");
  require_parse_error("pairs=1;n=3;R0:-1,0,0|B0:-1,0,0;", 3,
                      "unexpected character ';' at offset 31 (expected end of text");
  require_parse_error("pairs=1;n=3;R0:-1,0,0|B0:-1,0,0 x", 3, "unexpected character ' '");
  require_parse_error("pairs=1;n=3;R0:-1,0,0|B0:-1,0", 3, "expected 3 ranks, got 2");
  require_parse_error("pairs=1;n=3;R0:-1,0,0|B0:-1,0,", 3, "unexpected end of text at offset 30");
  require_parse_error("pairs=1;n=3;R0:-1,0,0|", 3, "unexpected end of text at offset 22");
  require_parse_error("pairs=2;n=3;R0:-1,0,0|B0:-1,0,0", 3, "expected 2 pairs, got 1");
  require_parse_error("pairs=1;n=3;R1:-1,0,0|B1:-1,0,0", 3,
                      "pair index 1 at offset 13, expected 0");
  require_parse_error("pairs=1;n=3;R0:-1,0,0|B1:-1,0,0", 3,
                      "pair index 1 at offset 23, expected 0");
  require_parse_error("pairs=1;n=3;R0:-2,0,0|B0:-1,0,0", 3, "only -1 (the root) may be negative");
  require_parse_error("pairs=1;n=3;R0:--1,0,0|B0:-1,0,0", 3,
                      "unexpected character '-' at offset 16");
  require_parse_error("pairs=1;n=3;R0:-1,00,0|B0:-1,0,0", 3, "leading zero in number at offset 18");
  require_parse_error("pairs=01;n=3", 3, "leading zero");
  require_parse_error("pairs=0;n=3", 3, "at least one pair");
  require_parse_error("pairs=1025;n=3", 3, "at most 1024 pairs");
  require_parse_error("pairs=99999999999999999999999;n=3", 3, "number at offset 6 too large");
  require_parse_error("pairs=2147483648;n=3", 3, "too large");
  require_parse_error("pairs=1;n=2147483647", 3, "expected 3 ranks, got 2147483647");
  require_parse_error("pairs=1;n=3;R0:-1,0,4294967296|B0:-1,0,0", 3, "too large");
  require_parse_error("pairs=1;n=3;R0:-1,0,2147483647|B0:-1,0,0", 3,
                      "parent 2147483647 out of range");
  require_parse_error("pairs=1;N=3", 3, "unexpected character 'N' at offset 8 (expected ';n=')");
  require_parse_error("pairs=", 3, "unexpected end of text at offset 6 (expected the pair count)");
  require_parse_error(std::string_view("pairs=1;n=3;R0:-1,0\0,0|B0:-1,0,0", 32), 3,
                      "unexpected character '\\x00' at offset 19");
  require_parse_error(std::string_view("ring\0", 5), 3, "unexpected character '\\x00' at offset 4");
  require_parse_error("pairs=1;n=3;R0:-1,0,0|B0:-1,0,0\xff", 3, "'\\xff' at offset 31");
}

TEST_CASE("parse survives huge and hostile input", "[topology]") {
  require_parse_error(std::string(kMaxTopologyTextBytes + 1, ' '), 4, "more than the 1048576");
  // A 1 MiB name: rejected with a short message.
  Result<Strategy> long_name = parse_topology(std::string(kMaxTopologyTextBytes, 'a'), 4, {});
  REQUIRE_FALSE(long_name.is_ok());
  CHECK(long_name.status().message().size() < 400);
  // 1 MiB of pseudo-random bytes.
  std::mt19937 rng(99);
  std::string garbage(kMaxTopologyTextBytes, '\0');
  for (char& c : garbage) c = static_cast<char>(rng());
  CHECK_FALSE(parse_topology(garbage, 4, {}).is_ok());
  // A parent list as long as the cap allows stops at n entries, and a long digit run at
  // INT_MAX, whatever the text says.
  std::string long_list = "pairs=1;n=2;R0:-1";
  while (long_list.size() < kMaxTopologyTextBytes - 2) long_list += ",0";
  require_parse_error(long_list, 2, "pair 0 reduce graph: expected 2 ranks, got more");
  CHECK_FALSE(parse_topology("pairs=1;n=2;R0:-1," + std::string(1 << 20, '1').substr(20), 2, {})
                  .is_ok());
  // Every valid ring up to the size cap parses; a ring over 1024+ ranks is within the limit.
  Strategy big = make_ring(40);
  CHECK(parse_topology(to_text(big), 40, {}).is_ok());
  CHECK(validate_strategy(make_ring(1100), 1100).is_ok());
}

TEST_CASE("fuzzed topology texts never crash and successes round trip", "[topology]") {
  std::mt19937 rng(20240917);
  std::vector<std::pair<std::string, int>> seeds;
  for (int n = 1; n <= 5; ++n) {
    for (const std::vector<int>& hosts : host_maps(n)) {
      for (std::string_view name : strategy_names()) {
        seeds.emplace_back(to_text(make_strategy(name, n, hosts).value()), n);
        seeds.emplace_back(std::string(name), n);
      }
    }
    seeds.emplace_back(to_text(random_strategy(n, 3, rng)), n);
  }
  const std::string alphabet = std::string("0123456789-,;|:=RBpairsn \t\nx\xff") + '\0';
  const auto pick = [&rng](size_t size) {
    return std::uniform_int_distribution<size_t>(0, size - 1)(rng);
  };
  int successes = 0;
  for (int iter = 0; iter < 25000; ++iter) {
    const auto& [seed, seed_n] = seeds[pick(seeds.size())];
    std::string text = seed;
    const int mode = static_cast<int>(pick(8));
    if (mode == 0) {  // random string over the grammar's characters
      text.clear();
      const size_t len = pick(64);
      for (size_t i = 0; i < len; ++i) text += alphabet[pick(alphabet.size())];
    } else if (mode == 1) {  // random bytes
      text.assign(pick(48), '\0');
      for (char& c : text) c = static_cast<char>(rng());
    } else {
      const int edits = 1 + static_cast<int>(pick(3));
      for (int e = 0; e < edits; ++e) {
        const size_t at = text.empty() ? 0 : pick(text.size() + 1);
        switch (pick(6)) {
          case 0: if (at < text.size()) text[at] = alphabet[pick(alphabet.size())]; break;
          case 1: text.insert(at, 1, alphabet[pick(alphabet.size())]); break;
          case 2: text.erase(at, pick(4)); break;
          case 3: text.insert(at, text.substr(at, pick(12))); break;
          case 4: text.insert(at, std::string(1 + pick(30), '9')); break;
          default: text.resize(at); break;
        }
      }
    }
    const int n = pick(4) == 0 ? 1 + static_cast<int>(pick(6)) : seed_n;
    Result<Strategy> r = parse_topology(text, n, {});
    INFO("iteration " << iter << " text " << printable(text, 300));
    if (!r.is_ok()) {
      REQUIRE(r.status().code() == Code::InvalidArgument);
      REQUIRE_FALSE(r.status().message().empty());
      REQUIRE(r.status().message().size() < 600);
      continue;
    }
    ++successes;
    REQUIRE(validate_strategy(r.value(), n).is_ok());
    const std::string again = to_text(r.value());
    size_t b = text.find_first_not_of(" \t\r\n");
    size_t e = text.find_last_not_of(" \t\r\n");
    const std::string trimmed = text.substr(b, e - b + 1);
    if (trimmed.starts_with("pairs=")) REQUIRE(again == trimmed);
    Result<Strategy> back = parse_topology(again, n, {});
    REQUIRE(back.is_ok());
    REQUIRE(to_text(back.value()) == again);
  }
  CHECK(successes > 500);
}

TEST_CASE("graph_from_edges", "[topology]") {
  using Edges = std::vector<std::pair<int, int>>;
  CHECK(graph_from_edges(1, {}).value().parents() == std::vector<int>{-1});
  CHECK(graph_from_edges(4, Edges{{1, 0}, {2, 0}, {3, 1}}).value().parents() ==
        std::vector<int>{-1, 0, 0, 1});
  Result<Graph> g = graph_from_edges(4, Edges{{3, 0}, {0, 2}, {1, 2}});
  REQUIRE(g.is_ok());
  CHECK(g.value().parents() == std::vector<int>{2, 2, -1, 0});
  CHECK(g.value().root() == 2);
  CHECK(g.value().children(2) == std::vector<int>{0, 1});

  const auto error = [](int n, const Edges& e) {
    Result<Graph> r = graph_from_edges(n, e);
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().code() == Code::InvalidArgument);
    return r.status().message();
  };
  std::string m = error(3, {{1, 0}, {2, 0}, {1, 2}});
  CHECK(contains(m, "duplicate child: rank 1 has two parents"));
  CHECK(contains(m, "edge 0 (1 -> 0)"));
  CHECK(contains(m, "edge 2 (1 -> 2)"));
  CHECK(contains(error(3, {{1, 0}, {5, 0}}), "edge 1 (5 -> 0): rank 5 out of range for 3 ranks"));
  CHECK(contains(error(3, {{1, -1}, {2, 0}}), "rank -1 out of range"));
  CHECK(contains(error(3, {{1, 1}, {2, 0}}), "edge 0 (1 -> 1): rank is its own parent"));
  CHECK(contains(error(4, {{1, 0}}), "missing edges: 3 ranks are nobody's child (0, 2, 3)"));
  CHECK(contains(error(3, {{0, 1}, {1, 2}, {2, 0}}), "no root"));
  CHECK(contains(error(4, {{1, 2}, {2, 1}, {3, 0}}), "cycle through ranks 1 -> 2 -> 1"));
  CHECK(contains(error(0, {}), "at least 1 rank"));
  // A huge n with few edges is refused without allocating n entries.
  m = error(INT_MAX, {{1, 0}});
  CHECK(contains(m, "(0, 2, 3, 4, 5, 6, 7, 8, ... (2147483646 in all)"));
}

TEST_CASE("topology_digest", "[topology]") {
  // Fixed values: the digest must be the same on every machine and in every release.
  CHECK(topology_digest(make_star(1)) == 0xa09c3ad0eef9c38dULL);
  CHECK(topology_digest(make_ring(3)) == 0x1e044118fbb010fdULL);

  Strategy ring = make_ring(6);
  Strategy renamed = ring;
  renamed.name = "something else";
  CHECK(topology_digest(renamed) == topology_digest(ring));
  CHECK(topology_digest(make_strategy("hierarchical", 6, {}).value()) == topology_digest(ring));
  CHECK(topology_digest(make_tree(6)) == topology_digest(make_binary_tree(6)));

  Strategy changed = ring;
  std::vector<int> parents = changed.pairs[3].broadcast.parents();
  parents[1] = parents[1] == 0 ? 2 : 0;
  changed.pairs[3].broadcast = Graph(parents);
  CHECK(topology_digest(changed) != topology_digest(ring));

  // All built-ins over 8 ranks on three hosts are told apart, except where the graphs
  // coincide (tree is binary_tree_star).
  std::set<uint64_t> seen;
  for (std::string_view name : strategy_names()) {
    if (name == "tree") continue;
    seen.insert(topology_digest(make_strategy(name, 8, {0, 0, 0, 1, 1, 1, 2, 2}).value()));
  }
  CHECK(seen.size() == strategy_names().size() - 1);
}

TEST_CASE("validate_strategy", "[topology]") {
  CHECK(validate_strategy(make_ring(4), 4).is_ok());
  CHECK(contains(validate_strategy(Strategy{"empty", {}}, 4).message(), "'empty' has no pairs"));
  CHECK(contains(validate_strategy(make_ring(4), 5).message(),
                 "pair 0 reduce graph: graph has 4 ranks, expected 5"));
  Strategy s = make_ring(3);
  s.pairs[1].broadcast = Graph({-1, 0, 0});
  CHECK(contains(validate_strategy(s, 3).message(),
                 "pair 1 broadcast graph rooted at 0 but reduce graph ends at 1"));
  Strategy many{"many", {}};
  many.pairs.assign(1025, make_star(2).pairs[0]);
  CHECK(contains(validate_strategy(many, 2).message(), "1025 pairs, more than the 1024 allowed"));
  many.pairs.resize(1024);
  CHECK(validate_strategy(many, 2).is_ok());
  CHECK(printable(std::string_view("a\0'\\\x7f", 5)) == "a\\x00\\x27\\x5c\\x7f");
  CHECK(printable(std::string(100, 'z'), 3) == "zzz... (100 bytes)");
}
