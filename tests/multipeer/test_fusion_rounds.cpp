// Fusion's negotiation rounds when ranks see them differently: more ops waiting than a
// round lists, a round that fails on one rank only, a short deadline among later ops.
// Each case passes with fusion off; with it on, the ops every rank posts must still
// complete.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "harness.h"

namespace {

using namespace taiji_test;

// The hash fusion lists names by (64-bit FNV-1a, src/runtime/fusion_plan.cpp).
uint64_t name_hash(const std::string& name) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::vector<std::string> names_with_hash(const std::string& prefix, size_t want, bool low) {
  std::vector<std::string> out;
  for (int i = 0; out.size() < want; ++i) {
    const std::string name = prefix + std::to_string(i);
    const uint64_t h = name_hash(name);
    if (low ? h < (1ull << 62) : h > (3ull << 62)) out.push_back(name);
  }
  return out;
}

void run_fused(int n, Failures& failures, const std::function<void(taiji_peer_t*, int)>& body) {
  EnvOverride fusion("TAIJI_FUSION", "on");
  failures.add_all(run_peers(n, body));
}

}  // namespace

TEST_CASE("fusion rounds: an op beyond the first 128 waiting is still listed in turn", "[fusion_rounds]") {
  // Rank 0 has 128 ops waiting that hash below Q, then Q; rank 1 posts Q alone, waits for
  // it, and only then the 128. A round lists 128 ops: Q must get its turn on rank 0.
  const std::vector<std::string> low = names_with_hash("low/", 128, true);
  const std::string q = names_with_hash("q/", 1, false)[0];
  Failures failures;
  run_fused(2, failures, [&](taiji_peer_t* peer, int rank) {
    std::vector<std::vector<int32_t>> out(low.size(), std::vector<int32_t>(16, 0));
    std::vector<int32_t> in(16, rank + 1);
    std::vector<int32_t> q_out(16, 0);
    std::vector<taiji_request_t*> reqs(low.size(), nullptr);
    taiji_op_options_t opt = op_options(30000);
    auto post_low = [&] {
      for (size_t k = 0; k < low.size(); ++k) {
        failures.expect_status(rank, "post " + low[k],
                               taiji_allreduce(peer, low[k].c_str(), in.data(), out[k].data(), 16, TAIJI_I32,
                                               TAIJI_SUM, &opt, &reqs[k]),
                               TAIJI_OK);
      }
    };
    if (rank == 0) post_low();
    taiji_request_t* qr = nullptr;
    failures.expect_status(rank, "post q",
                           taiji_allreduce(peer, q.c_str(), in.data(), q_out.data(), 16, TAIJI_I32, TAIJI_SUM,
                                           &opt, &qr),
                           TAIJI_OK);
    if (qr != nullptr) {
      failures.expect_status(rank, "q", wait_bounded(peer, qr, 30000, failures, rank, "q"), TAIJI_OK);
      failures.expect(rank, q_out == std::vector<int32_t>(16, 3), "q: wrong sum");
      taiji_request_free(qr);
    }
    if (rank == 1) post_low();
    for (size_t k = 0; k < low.size(); ++k) {
      if (reqs[k] == nullptr) continue;
      failures.expect_status(rank, low[k], wait_bounded(peer, reqs[k], 30000, failures, rank, low[k]), TAIJI_OK);
      failures.expect(rank, out[k] == std::vector<int32_t>(16, 3), low[k] + ": wrong sum");
      taiji_request_free(reqs[k]);
    }
  });
  check_no_failures(failures);
}

TEST_CASE("fusion rounds: a round's failure fails only the ops it listed", "[fusion_rounds]") {
  // Rank 0 posts A (500 ms, no other rank posts it), then B (20 s); rank 1 posts B after
  // a second. A's round times out on rank 0; B, posted after that round began, waits for
  // the next round instead of failing with it.
  Failures failures;
  std::atomic<bool> a_done{false};
  run_fused(2, failures, [&](taiji_peer_t* peer, int rank) {
    std::vector<int32_t> in(64, rank + 1);
    std::vector<int32_t> a_out(64, 0);
    std::vector<int32_t> b_out(64, 0);
    taiji_op_options_t a_opt = op_options(500);
    taiji_op_options_t b_opt = op_options(20000);
    taiji_request_t* b = nullptr;
    if (rank == 0) {
      taiji_request_t* a = nullptr;
      failures.expect_status(rank, "post A",
                             taiji_allreduce(peer, "A", in.data(), a_out.data(), 64, TAIJI_I32, TAIJI_SUM, &a_opt, &a),
                             TAIJI_OK);
      // B only once A's round has started (its flight recorder entry appears then), so
      // that the round lists A alone. count_named reads 0 when the recorder changed
      // between its two reads, so the loop keeps what it saw.
      const auto started = Clock::now() + std::chrono::seconds(20);
      size_t rounds = 0;
      while ((rounds = count_named(peer, "taiji.fuse.round")) == 0 && Clock::now() < started) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      failures.expect(rank, rounds > 0, "A's round never started");
      failures.expect_status(rank, "post B",
                             taiji_allreduce(peer, "B", in.data(), b_out.data(), 64, TAIJI_I32, TAIJI_SUM, &b_opt, &b),
                             TAIJI_OK);
      if (a != nullptr) {
        failures.expect_status(rank, "A", wait_bounded(peer, a, 30000, failures, rank, "A"), TAIJI_ERR_TIMEOUT);
        taiji_request_free(a);
      }
      a_done = true;
    } else {
      // B only once A has failed on rank 0 (bounded: A's deadline is 500 ms).
      const auto deadline = Clock::now() + std::chrono::seconds(20);
      while (!a_done && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      failures.expect(rank, a_done.load(), "A never ended on rank 0");
      failures.expect_status(rank, "post B",
                             taiji_allreduce(peer, "B", in.data(), b_out.data(), 64, TAIJI_I32, TAIJI_SUM, &b_opt, &b),
                             TAIJI_OK);
    }
    if (b != nullptr) {
      failures.expect_status(rank, "B", wait_bounded(peer, b, 30000, failures, rank, "B"), TAIJI_OK);
      failures.expect(rank, b_out == std::vector<int32_t>(64, 3), "B: wrong sum");
      taiji_request_free(b);
    }
  });
  check_no_failures(failures);
}

TEST_CASE("fusion rounds: a round that failed on one rank only leaves the ranks deciding alike",
          "[fusion_rounds]") {
  // The early rank posts X with a 300 ms deadline: its round times out there. The other
  // rank posts X (8 s) and W in one group later, completing that round from the frames
  // that arrived early, and counts it as deferred; the early rank does not. Then the early
  // rank posts W. Both ranks posted W in time: it must complete on both.
  for (int early : {0, 1}) {
    CAPTURE(early);
    Failures failures;
    std::atomic<bool> x_done{false};
    run_fused(2, failures, [&](taiji_peer_t* peer, int rank) {
      std::vector<int32_t> in(64, rank + 1);
      std::vector<int32_t> x_out(64, 0);
      std::vector<int32_t> w_out(64, 0);
      taiji_op_options_t x_short = op_options(300);
      taiji_op_options_t x_long = op_options(8000);
      taiji_op_options_t w_opt = op_options(6000);
      taiji_request_t* x = nullptr;
      taiji_request_t* w = nullptr;
      if (rank == early) {
        failures.expect_status(rank, "post X",
                               taiji_allreduce(peer, "X", in.data(), x_out.data(), 64, TAIJI_I32, TAIJI_SUM,
                                               &x_short, &x),
                               TAIJI_OK);
        if (x != nullptr) wait_bounded(peer, x, 20000, failures, rank, "X");
        x_done = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(800));
        failures.expect_status(rank, "post W",
                               taiji_allreduce(peer, "W", in.data(), w_out.data(), 64, TAIJI_I32, TAIJI_SUM,
                                               &w_opt, &w),
                               TAIJI_OK);
      } else {
        const auto deadline = Clock::now() + std::chrono::seconds(20);
        while (!x_done && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        taiji_group_start(peer);
        taiji_allreduce(peer, "X", in.data(), x_out.data(), 64, TAIJI_I32, TAIJI_SUM, &x_long, &x);
        taiji_allreduce(peer, "W", in.data(), w_out.data(), 64, TAIJI_I32, TAIJI_SUM, &w_opt, &w);
        failures.expect_status(rank, "group end", taiji_group_end(peer), TAIJI_OK);
      }
      if (w != nullptr) {
        failures.expect_status(rank, "W", wait_bounded(peer, w, 20000, failures, rank, "W"), TAIJI_OK);
        failures.expect(rank, w_out == std::vector<int32_t>(64, 3), "W: wrong sum");
        taiji_request_free(w);
      }
      // X: the early rank's timed out; the other's cannot complete (nobody else posts it).
      if (x != nullptr) {
        wait_bounded(peer, x, 20000, failures, rank, "X");
        taiji_request_free(x);
      }
    });
    check_no_failures(failures);
  }
}
