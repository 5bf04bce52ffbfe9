// Barrier: no peer leaves before the last one arrived. Ranks arrive staggered (in both
// orders, and through every strategy); each records the time just before posting, and each
// completion must come after the latest of those.
#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "common.h"
#include "harness.h"

namespace {

using namespace taiji_test;

constexpr int kStaggerMs = 30;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

}  // namespace

TEST_CASE("barrier: completes only after every peer posted it", "[barrier]") {
  const int n = GENERATE(range(1, 9));
  CAPTURE(n);
  struct Round {
    std::string name;
    bool reverse;
    bool async;
    const char* topology;
  };
  const Round rounds[] = {
      {"barrier/ascending", false, false, nullptr},
      {"barrier/descending", true, true, nullptr},
      {"barrier/ring", false, false, "ring"},
      {"barrier/tree", true, false, "tree"},
      {"barrier/star", false, true, "star"},
  };
  constexpr size_t kRounds = sizeof(rounds) / sizeof(rounds[0]);
  std::array<std::array<std::atomic<int64_t>, 8>, kRounds> posted{};
  Failures failures;
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    for (size_t k = 0; k < kRounds; ++k) {
      const Round& round = rounds[k];
      // An untimed barrier first, so every rank starts its stagger from the same moment.
      taiji_op_options_t sync_opt = op_options();
      failures.expect_status(rank, "sync before " + round.name,
                             taiji_barrier(peer, ("sync/" + round.name).c_str(), &sync_opt, nullptr),
                             TAIJI_OK);
      int slot = round.reverse ? n - 1 - rank : rank;
      std::this_thread::sleep_for(std::chrono::milliseconds(kStaggerMs * slot));
      taiji_op_options_t opt = op_options(20000, round.topology);
      posted[k][rank].store(now_ns());
      taiji_status_t s;
      if (round.async) {
        taiji_request_t* req = nullptr;
        s = taiji_barrier(peer, round.name.c_str(), &opt, &req);
        if (s == TAIJI_OK) {
          s = wait_bounded(peer, req, 30000, failures, rank, round.name);
          taiji_request_free(req);
        }
      } else {
        s = taiji_barrier(peer, round.name.c_str(), &opt, nullptr);
      }
      const int64_t done = now_ns();
      if (!failures.expect_status(rank, round.name, s, TAIJI_OK)) continue;
      int64_t latest = 0;
      int latest_rank = 0;
      for (int r = 0; r < n; ++r) {
        int64_t t = posted[k][r].load();
        // 0: that rank has not even recorded its post time yet.
        if (t == 0) t = INT64_MAX;
        if (t > latest) {
          latest = t;
          latest_rank = r;
        }
      }
      if (done < latest) {
        failures.add(rank, round.name + ": completed " +
                               (latest == INT64_MAX ? std::string("before rank ") + std::to_string(latest_rank) + " posted"
                                                    : std::to_string((latest - done) / 1000) +
                                                          " us before rank " + std::to_string(latest_rank) + " posted"));
      }
    }
  });
  failures.add_all(lines);
  check_no_failures(failures);
}
