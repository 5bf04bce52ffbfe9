// Adaptive progress across real peers: many caller threads posting and waiting while the
// I/O thread switches between polling and sleeping lose no op and no wake-up, whatever
// the spin window; and a peer with nothing to do sleeps instead of spinning.
#include <catch2/catch.hpp>

#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "harness.h"

namespace {

using namespace taiji_test;

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Every rank runs `threads` caller threads; thread t posts `iters` allreduces of one i64
// under its own name (automatic versions), alternating asynchronous waits, polling with
// taiji_request_test, and blocking calls, and checks every sum.
void hammer(int n, int threads, int iters, Failures& failures) {
  auto errors = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    std::vector<std::thread> callers;
    for (int t = 0; t < threads; ++t) {
      callers.emplace_back([&, t] {
        const std::string name = "progress.t" + std::to_string(t);
        taiji_op_options_t opts = op_options(20000);
        for (int i = 0; i < iters; ++i) {
          int64_t value = (rank + 1) * 1000 + i;
          int64_t want = 0;
          for (int r = 0; r < n; ++r) want += (r + 1) * 1000 + i;
          int64_t out = -1;
          const std::string what = name + " #" + std::to_string(i);
          taiji_status_t s;
          if (i % 3 == 2) {
            s = taiji_allreduce(peer, name.c_str(), &value, &out, 1, TAIJI_I64, TAIJI_SUM, &opts,
                                nullptr);
          } else {
            taiji_request_t* req = nullptr;
            s = taiji_allreduce(peer, name.c_str(), &value, &out, 1, TAIJI_I64, TAIJI_SUM, &opts,
                                &req);
            if (s == TAIJI_OK && i % 3 == 1) {
              auto deadline = Clock::now() + std::chrono::seconds(20);
              while ((s = taiji_request_test(req)) == TAIJI_IN_PROGRESS && Clock::now() < deadline) {
                std::this_thread::yield();
              }
              if (s == TAIJI_IN_PROGRESS) s = wait_bounded(peer, req, 1000, failures, rank, what);
            } else if (s == TAIJI_OK) {
              s = wait_bounded(peer, req, 20000, failures, rank, what);
            }
            if (req != nullptr) taiji_request_free(req);
          }
          if (!failures.expect_status(rank, what, s, TAIJI_OK)) return;
          if (!failures.expect(rank, out == want, what + ": got " + std::to_string(out) +
                                                      ", want " + std::to_string(want))) {
            return;
          }
        }
      });
    }
    for (auto& c : callers) c.join();
  });
  failures.add_all(errors);
}

}  // namespace

TEST_CASE("many threads posting and waiting lose no wake-up, whatever the spin window",
          "[progress]") {
  // 1 us: windows end constantly, racing posts against the loop going back to sleep;
  // 200 us: the default; 0: waiters and loop always sleep.
  for (const char* spin : {"1", "200", "0"}) {
    SECTION(std::string("TAIJI_SPIN_US=") + spin) {
      EnvOverride env("TAIJI_SPIN_US", spin);
      Failures failures;
      hammer(3, 4, 120, failures);
      check_no_failures(failures);
    }
  }
  SECTION("TAIJI_PROGRESS=blocking") {
    EnvOverride env("TAIJI_PROGRESS", "blocking");
    Failures failures;
    hammer(2, 4, 120, failures);
    check_no_failures(failures);
  }
}

TEST_CASE("an idle peer sleeps: little CPU time over an idle second", "[progress]") {
  Failures failures;
  std::atomic<double> idle_cpu{-1};
  auto errors = run_peers(2, [&](taiji_peer_t* peer, int rank) {
    taiji_op_options_t opts = op_options(20000);
    // Traffic first, so that the loop has just been polling when the idle time begins.
    for (int i = 0; i < 200; ++i) {
      int32_t v = rank;
      int32_t out = 0;
      taiji_status_t s = taiji_allreduce(peer, "idle.warm", &v, &out, 1, TAIJI_I32, TAIJI_SUM, &opts, nullptr);
      if (!failures.expect_status(rank, "warm-up allreduce", s, TAIJI_OK)) return;
    }
    failures.expect_status(rank, "barrier before idling",
                           taiji_barrier(peer, "idle.before", &opts, nullptr), TAIJI_OK);
    // Both peers' I/O threads and both callers are in this process: its CPU time over a
    // second in which nobody posts anything is what idling costs.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (rank == 0) {
      double start = process_cpu_seconds();
      std::this_thread::sleep_for(std::chrono::seconds(1));
      idle_cpu = process_cpu_seconds() - start;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1050));
    }
    failures.expect_status(rank, "barrier after idling",
                           taiji_barrier(peer, "idle.after", &opts, nullptr), TAIJI_OK);
  });
  failures.add_all(errors);
  check_no_failures(failures);
  INFO("process CPU time over an idle second: " << idle_cpu.load() << " s");
  REQUIRE(idle_cpu.load() >= 0);
  // A spinning peer would use close to a whole second per I/O thread.
  CHECK(idle_cpu.load() < 0.3);
}
