// Broadcast: every world size 1..8, every root, small and multi-MiB counts, several dtypes
// and every strategy. Payloads are arbitrary bytes (NaN and subnormal patterns included for
// the float types): a broadcast copies, it never interprets.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <string>
#include <vector>

#include "common.h"
#include "harness.h"

namespace {

using namespace taiji_test;

struct Case {
  std::string name;
  taiji_dtype_t dtype;
  size_t count;
  int root;
  const char* topology;
  uint64_t salt;
};

std::string describe(const Case& c) {
  return "'" + c.name + "' (" + dtype_name(c.dtype) + " count " + std::to_string(c.count) +
         " root " + std::to_string(c.root) + (c.topology ? std::string(" ") + c.topology : "") + ")";
}

void add_case(std::vector<Case>& plan, taiji_dtype_t dtype, size_t count, int root,
              const char* topology = nullptr) {
  std::string name = "bc/" + std::to_string(plan.size()) + "/" + dtype_name(dtype) + "/" +
                     std::to_string(count) + "/root" + std::to_string(root) +
                     (topology ? std::string("/") + topology : std::string());
  plan.push_back({name, dtype, count, root, topology, salt_of(name)});
}

// Deadlines for a few MiB over loopback with 8 peers on 2 cores, where TSan takes seconds
// per op; the late cases post 200-300 ms behind the root.
constexpr int64_t kOpTimeoutMs = 20000;
constexpr int64_t kLateTimeoutMs = 20000;

void run_plan(int n, const std::vector<Case>& plan) {
  Failures failures;
  std::atomic<bool> abandoned{false};
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    for (const Case& c : plan) {
      // After a failed op the rest of the plan would mostly wait out deadlines; stop
      // posting so that one runtime fault costs seconds, not the whole suite's time.
      if (abandoned.load()) {
        if (rank == 0) failures.add(rank, "stopped before " + describe(c) + " after an earlier failure");
        break;
      }
      const size_t bytes = c.count * dtype_size(c.dtype);
      std::vector<uint8_t> expected(bytes);
      fill_bytes(c.salt, expected.data(), bytes);
      GuardedBuffer buf(bytes, static_cast<uint8_t>(0x11 * (rank + 1)));
      if (rank == c.root && bytes > 0) std::memcpy(buf.data(), expected.data(), bytes);
      taiji_op_options_t opt = op_options(kOpTimeoutMs, c.topology);
      taiji_status_t s = taiji_broadcast(peer, c.name.c_str(), buf.data(), c.count, c.dtype,
                                         c.root, &opt, nullptr);
      if (!failures.expect_status(rank, describe(c), s, TAIJI_OK)) {
        failures.add(rank, std::string("  last error: ") + taiji_peer_last_error(peer));
        abandoned.store(true);
        continue;
      }
      failures.expect(rank, buf.guard_intact(), describe(c) + ": wrote past the buffer");
      if (bytes > 0 && std::memcmp(buf.data(), expected.data(), bytes) != 0) {
        size_t first = 0;
        while (buf.data()[first] == expected[first]) ++first;
        failures.add(rank, describe(c) + ": buffer differs from the root's at byte " +
                               std::to_string(first) + " of " + std::to_string(bytes));
      }
    }
    // Nobody finalizes while others still work on the plan: a departed peer would fail
    // their remaining ops and hide the first fault behind a cascade.
    taiji_op_options_t end = op_options(30000);
    failures.expect_status(rank, "end-of-plan barrier", taiji_barrier(peer, "plan/end", &end, nullptr), TAIJI_OK);
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

}  // namespace

TEST_CASE("broadcast: every root, small and large counts", "[broadcast]") {
  const int n = GENERATE(filter([](int k) { return in_quick_range(k); }, range(1, 9)));
  CAPTURE(n);
  const taiji_dtype_t small_dtypes[] = {TAIJI_U8, TAIJI_F16, TAIJI_I32, TAIJI_F64};
  const taiji_dtype_t big_dtypes[] = {TAIJI_U8, TAIJI_BF16, TAIJI_F32, TAIJI_I64};
  std::vector<Case> plan;
  for (int root = 0; root < n; ++root) {
    for (taiji_dtype_t dtype : small_dtypes) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}}) add_case(plan, dtype, count, root);
    }
    add_case(plan, big_dtypes[root % 4], 1000003, root);
  }
  run_plan(n, plan);
}

TEST_CASE("broadcast: every strategy chosen per op", "[broadcast]") {
  const int n = GENERATE(filter([](int k) { return in_quick_range(k); }, range(1, 9)));
  CAPTURE(n);
  std::vector<Case> plan;
  for (const char* topology : {"ring", "tree", "star"}) {
    for (int root : {0, n - 1, n / 2}) {
      add_case(plan, TAIJI_F32, 7, root, topology);
      add_case(plan, TAIJI_U8, 0, root, topology);
      add_case(plan, TAIJI_F64, 300007, root, topology);
    }
  }
  run_plan(n, plan);
}

TEST_CASE("broadcast: receivers that post late still get large payloads", "[broadcast]") {
  // The root posts at once and the others 200 ms later, so every chunk the root sends
  // must wait for its receiver's Ready instead of going out eagerly.
  const int n = GENERATE(2, 3, 5);
  const char* topology = GENERATE(as<const char*>{}, "ring", "tree", "star");
  CAPTURE(n, topology);
  Failures failures;
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    for (int root : {0, n - 1}) {
      const std::string name = std::string("late/") + topology + "/root" + std::to_string(root);
      const size_t bytes = 1000003;
      std::vector<uint8_t> expected(bytes);
      fill_bytes(salt_of(name), expected.data(), bytes);
      GuardedBuffer buf(bytes, 0x5A);
      if (rank == root && bytes > 0) std::memcpy(buf.data(), expected.data(), bytes);
      if (rank != root) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      taiji_op_options_t opt = op_options(kLateTimeoutMs, topology);
      auto start = Clock::now();
      taiji_status_t s = taiji_broadcast(peer, name.c_str(), buf.data(), bytes, TAIJI_U8, root, &opt, nullptr);
      const double took = ms_since(start);
      if (failures.expect_status(rank, name + " (took " + std::to_string(static_cast<int>(took)) + " ms)", s,
                                 TAIJI_OK)) {
        failures.expect(rank, std::memcmp(buf.data(), expected.data(), bytes) == 0,
                        name + ": buffer differs from the root's");
      } else {
        failures.add(rank, std::string("  last error: ") + taiji_peer_last_error(peer));
      }
      // Line up again before the next root, so the next round is late in the same way.
      taiji_op_options_t sync = op_options(20000);
      failures.expect_status(rank, name + " sync", taiji_barrier(peer, (name + "/sync").c_str(), &sync, nullptr),
                             TAIJI_OK);
    }
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("broadcast: a root may finalize once its broadcast completed", "[broadcast]") {
  // The root's op completed, so its part is done and finalize has nothing in flight to
  // wait for; receivers that post afterwards must still get the payload.
  const int n = GENERATE(2, 3);
  const size_t bytes = GENERATE(size_t{7}, size_t{1000003});
  CAPTURE(n, bytes);
  Failures failures;
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    std::vector<uint8_t> expected(bytes);
    fill_bytes(salt_of("finalizing-root"), expected.data(), bytes);
    GuardedBuffer buf(bytes, 0x5A);
    if (rank == 0 && bytes > 0) std::memcpy(buf.data(), expected.data(), bytes);
    if (rank != 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    taiji_op_options_t opt = op_options(kLateTimeoutMs);
    taiji_status_t s = taiji_broadcast(peer, "finalizing-root", buf.data(), bytes, TAIJI_U8, 0, &opt, nullptr);
    if (failures.expect_status(rank, "finalizing-root", s, TAIJI_OK)) {
      failures.expect(rank, std::memcmp(buf.data(), expected.data(), bytes) == 0, "buffer differs from the root's");
    } else {
      failures.add(rank, std::string("  last error: ") + taiji_peer_last_error(peer));
    }
    if (rank == 0) failures.expect_status(rank, "root finalize", taiji_peer_finalize(peer), TAIJI_OK);
  });
  failures.add_all(lines);
  check_no_failures(failures);
}
