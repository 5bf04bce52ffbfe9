// Allreduce correctness: every dtype x op x small count for world sizes 1..8, a subset with
// multi-MiB buffers, every strategy, in-place and out-of-place. Each world size runs its
// whole plan inside one job (peer set-up is the expensive part).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "common.h"
#include "harness.h"

namespace {

using namespace taiji_test;

constexpr size_t kBigCount = 1000003;  // odd, and several chunks of 1 MiB for 4-byte types
// Under the sanitizers (quick()), the staggered posts' buffers: a quarter of kBigCount, still
// chunks far over the eager limit, which wait for their receiver's Ready.
constexpr size_t kStaggeredQuickCount = 250001;
// A few MiB over loopback take up to 3 s per op with 5 peers on 2 cores under TSan, more
// on a busier machine; a failed op abandons the rest of its plan, so a long deadline
// costs little when something breaks.
constexpr int64_t kOpTimeoutMs = 20000;

struct Case {
  std::string name;
  ReduceCase rc;
  bool in_place = false;
  const char* topology = nullptr;
};

void add_case(std::vector<Case>& plan, taiji_dtype_t dtype, taiji_reduce_op_t op, size_t count,
              bool in_place, const char* topology = nullptr, Values values = Values::Exact) {
  Case c;
  c.rc.dtype = dtype;
  c.rc.op = op;
  c.rc.count = count;
  c.rc.values = values;
  c.in_place = in_place;
  c.topology = topology;
  c.name = "ar/" + std::to_string(plan.size()) + "/" + dtype_name(dtype) + "/" + op_name(op) +
           "/" + std::to_string(count) + (in_place ? "/inplace" : "") +
           (topology ? std::string("/") + topology : std::string()) +
           (values == Values::Inexact ? "/inexact" : "");
  c.rc.salt = salt_of(c.name);
  plan.push_back(std::move(c));
}

std::string describe(const Case& c) {
  return "'" + c.name + "' (" + taiji_test::describe(c.rc) + (c.in_place ? ", in place" : "") +
         (c.topology ? std::string(", ") + c.topology : std::string()) + ")";
}

// Runs the plan on n peers. Every rank checks its status, its guard zone and (out of place)
// that its input was left alone; one rank per case, rotating, checks the serial reference;
// all ranks' output digests are compared afterwards, so every rank is held to the reference.
void run_plan(int n, const std::vector<Case>& plan, const PeerOptions& options = {}) {
  Failures failures;
  constexpr uint64_t kMissing = 0;
  std::mutex mu;
  std::vector<std::vector<uint64_t>> digests(plan.size(), std::vector<uint64_t>(n, kMissing));
  std::atomic<bool> abandoned{false};
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    for (size_t k = 0; k < plan.size(); ++k) {
      const Case& c = plan[k];
      // After a failed op the rest of the plan would mostly wait out deadlines; stop
      // posting so that one runtime fault costs seconds, not the whole suite's time.
      if (abandoned.load()) {
        if (rank == 0) failures.add(rank, "stopped before " + describe(c) + " after an earlier failure");
        break;
      }
      const size_t bytes = c.rc.count * dtype_size(c.rc.dtype);
      GuardedBuffer out(bytes);
      GuardedBuffer in(c.in_place ? 0 : bytes);
      fill_input(c.rc, rank, c.in_place ? out.data() : in.data());
      const uint64_t in_digest = digest(in.data(), in.size());
      taiji_op_options_t opt = op_options(kOpTimeoutMs, c.topology);
      const void* send = c.in_place ? out.data() : in.data();
      taiji_status_t s = taiji_allreduce(peer, c.name.c_str(), send, out.data(), c.rc.count,
                                         c.rc.dtype, c.rc.op, &opt, nullptr);
      if (!failures.expect_status(rank, describe(c), s, TAIJI_OK)) {
        failures.add(rank, std::string("  last error: ") + taiji_peer_last_error(peer));
        abandoned.store(true);
        continue;
      }
      failures.expect(rank, out.guard_intact(), describe(c) + ": wrote past the output buffer");
      failures.expect(rank, in.guard_intact() && digest(in.data(), in.size()) == in_digest,
                      describe(c) + ": changed the input buffer");
      {
        std::lock_guard<std::mutex> lock(mu);
        digests[k][rank] = digest(out.data(), bytes);
      }
      if (static_cast<int>(k % n) == rank) {
        std::string err = check_reduce(c.rc, n, out.data());
        if (!err.empty()) failures.add(rank, describe(c) + ": " + err);
      }
    }
    // Nobody finalizes while others still work on the plan: a departed peer would fail
    // their remaining ops and hide the first fault behind a cascade.
    taiji_op_options_t end = op_options(30000);
    failures.expect_status(rank, "end-of-plan barrier", taiji_barrier(peer, "plan/end", &end, nullptr), TAIJI_OK);
  }, options);
  failures.add_all(lines);
  for (size_t k = 0; k < plan.size(); ++k) {
    for (int r = 1; r < n; ++r) {
      if (digests[k][r] != kMissing && digests[k][0] != kMissing && digests[k][r] != digests[k][0]) {
        failures.add(r, describe(plan[k]) + ": output differs from rank 0's");
      }
    }
  }
  check_no_failures(failures);
}

}  // namespace

TEST_CASE("allreduce: every dtype, op and small count, in place and not", "[allreduce]") {
  const int n = GENERATE(filter([](int k) { return in_quick_range(k); }, range(1, 9)));
  CAPTURE(n);
  std::vector<Case> plan;
  for (taiji_dtype_t dtype : kAllDtypes) {
    for (taiji_reduce_op_t op : kAllOps) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}}) {
        for (bool in_place : {false, true}) add_case(plan, dtype, op, count, in_place);
      }
    }
  }
  run_plan(n, plan);
}

TEST_CASE("allreduce: floating-point rounding stays within the per-step bound", "[allreduce]") {
  const int n = GENERATE(filter([](int k) { return in_quick_range(k, 5); }, values({2, 3, 5, 8})));
  CAPTURE(n);
  std::vector<Case> plan;
  for (taiji_dtype_t dtype : {TAIJI_F32, TAIJI_F64, TAIJI_F16, TAIJI_BF16}) {
    for (taiji_reduce_op_t op : {TAIJI_SUM, TAIJI_PROD, TAIJI_AVG}) {
      add_case(plan, dtype, op, 1001, op == TAIJI_PROD, nullptr, Values::Inexact);
    }
  }
  run_plan(n, plan);
}

TEST_CASE("allreduce: multi-MiB buffers", "[allreduce]") {
  // Under the sanitizers each op takes seconds at n = 5, and the reductions it runs are the
  // same at n = 3.
  const int n = GENERATE(filter([](int k) { return in_quick_range(k, 3); }, values({2, 3, 5, 8})));
  CAPTURE(n);
  std::vector<Case> plan;
  bool in_place = false;
  for (taiji_dtype_t dtype : {TAIJI_F32, TAIJI_I32, TAIJI_BF16}) {
    for (taiji_reduce_op_t op : {TAIJI_SUM, TAIJI_MAX}) {
      add_case(plan, dtype, op, kBigCount, in_place);
      in_place = !in_place;
    }
  }
  run_plan(n, plan);
}

TEST_CASE("allreduce: every strategy chosen per op", "[allreduce]") {
  const int n = GENERATE(filter([](int k) { return in_quick_range(k); }, range(1, 9)));
  CAPTURE(n);
  std::vector<Case> plan;
  for (const char* topology : {"ring", "tree", "star"}) {
    for (taiji_dtype_t dtype : {TAIJI_F32, TAIJI_I64, TAIJI_F16, TAIJI_U8}) {
      for (taiji_reduce_op_t op : {TAIJI_SUM, TAIJI_AVG, TAIJI_MIN}) {
        // 0 and 7 elements leave some ring chunks empty or absent; 40000 bytes-plus
        // payloads exceed the eager limit and take the Ready handshake.
        for (size_t count : {size_t{0}, size_t{7}, size_t{20011}}) {
          add_case(plan, dtype, op, count, count == 7, topology);
        }
      }
    }
    if (n == 3 || n == 8) add_case(plan, TAIJI_F32, TAIJI_SUM, kBigCount, false, topology);
  }
  run_plan(n, plan);
}

TEST_CASE("allreduce: the peer's default strategy from its configuration", "[allreduce]") {
  const char* topology = GENERATE("ring", "tree", "star");
  CAPTURE(topology);
  std::vector<Case> plan;
  add_case(plan, TAIJI_F64, TAIJI_SUM, 7, false);
  add_case(plan, TAIJI_I32, TAIJI_PROD, 30011, true);
  add_case(plan, TAIJI_BF16, TAIJI_MAX, 300007, false);
  PeerOptions options;
  options.topology = topology;
  run_plan(5, plan, options);
}

TEST_CASE("allreduce: peers posting at different times", "[allreduce]") {
  // Rank r posts r * 60 ms after the others started, so data arrives for ops not yet
  // posted and large chunks wait for their receiver's Ready.
  const int n = GENERATE(filter([](int k) { return in_quick_range(k, 3); }, values({2, 3, 5})));
  const char* topology = GENERATE(as<const char*>{}, "ring", "tree", "star");
  CAPTURE(n, topology);
  Failures failures;
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    for (bool reversed : {false, true}) {
      ReduceCase rc;
      rc.dtype = TAIJI_F32;
      rc.op = TAIJI_SUM;
      rc.count = quick() ? kStaggeredQuickCount : kBigCount;
      const std::string name = std::string("staggered/") + topology + (reversed ? "/reversed" : "");
      rc.salt = salt_of(name);
      GuardedBuffer buf(rc.count * sizeof(float));
      fill_input(rc, rank, buf.data());
      const int slot = reversed ? n - 1 - rank : rank;
      std::this_thread::sleep_for(std::chrono::milliseconds(60 * slot));
      taiji_op_options_t opt = op_options(kOpTimeoutMs, topology);
      taiji_status_t s = taiji_allreduce(peer, name.c_str(), buf.data(), buf.data(), rc.count, rc.dtype, rc.op,
                                         &opt, nullptr);
      if (failures.expect_status(rank, name, s, TAIJI_OK)) {
        std::string err = check_reduce(rc, n, buf.data());
        if (!err.empty()) failures.add(rank, name + ": " + err);
      } else {
        failures.add(rank, std::string("  last error: ") + taiji_peer_last_error(peer));
      }
      taiji_op_options_t sync = op_options(20000);
      failures.expect_status(rank, name + " sync", taiji_barrier(peer, (name + "/sync").c_str(), &sync, nullptr),
                             TAIJI_OK);
    }
  });
  failures.add_all(lines);
  check_no_failures(failures);
}
