// The probe schedule of the link measurement: every pair once, no rank twice in a round.
#include <catch2/catch.hpp>

#include <set>

#include "runtime/link_measure.h"

using namespace taiji;

TEST_CASE("probe schedule: every pair meets exactly once, in rounds of disjoint pairs", "[links]") {
  for (int n = 1; n <= 33; ++n) {
    INFO("n = " << n);
    const auto rounds = probe_schedule(n);
    CHECK(rounds.size() == static_cast<size_t>(n < 2 ? 0 : (n % 2 == 0 ? n - 1 : n)));
    std::set<std::pair<int, int>> met;
    for (const auto& round : rounds) {
      std::set<int> busy;
      for (const auto& [a, b] : round) {
        CHECK(a < b);
        CHECK(a >= 0);
        CHECK(b < n);
        CHECK(busy.insert(a).second);
        CHECK(busy.insert(b).second);
        CHECK(met.insert({a, b}).second);
      }
      // Everyone but at most one rank (odd n) is busy.
      CHECK(busy.size() >= static_cast<size_t>(n - 1));
    }
    CHECK(met.size() == static_cast<size_t>(n * (n - 1) / 2));
  }
}
