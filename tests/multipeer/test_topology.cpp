// Topology objects through the C API (creation, validation, text round trips, digests) and
// the run-time swap: a swap in the middle of a thousand asynchronous allreduces, proposals
// that disagree, a swap back to the automatic choice, sizes that do not fit the job, and a
// custom topology chosen per op through its text.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common.h"
#include "harness.h"

namespace {

using namespace taiji_test;

constexpr int64_t kOpTimeoutMs = 20000;
constexpr int64_t kWaitMs = 40000;
// Large enough to exceed the eager limit and, with 16 KiB chunks, to spread over the pairs
// of a multi-pair topology.
constexpr size_t kLargeCount = 70001;
constexpr const char* kChunkBytes = "16K";

const char* const kBuiltins[] = {"star",         "ring",
                                 "clique",       "tree",
                                 "binary_tree",  "binary_tree_star",
                                 "multi_binary_tree_star", "hierarchical"};

struct TopologyDeleter {
  void operator()(taiji_topology_t* t) const { taiji_topology_destroy(t); }
};
using Topology = std::unique_ptr<taiji_topology_t, TopologyDeleter>;

std::string topology_text(const taiji_topology_t* t) {
  size_t len = taiji_topology_text(t, nullptr, 0);
  std::string s(len + 1, '\0');
  taiji_topology_text(t, s.data(), s.size());
  s.resize(len);
  return s;
}

Topology from_parents(int size, const std::vector<std::vector<int>>& reduce,
                      const std::vector<std::vector<int>>& bcast, std::string* error = nullptr) {
  std::vector<int> up;
  std::vector<int> down;
  for (const auto& g : reduce) up.insert(up.end(), g.begin(), g.end());
  for (const auto& g : bcast) down.insert(down.end(), g.begin(), g.end());
  taiji_topology_t* t = nullptr;
  taiji_status_t s =
      taiji_topology_from_parents(size, static_cast<int>(reduce.size()), up.data(), down.data(), &t);
  if (s != TAIJI_OK && error) *error = status_text(s) + ": " + taiji_peer_last_error(nullptr);
  return Topology(t);
}

Topology from_text(const taiji_peer_t* peer, const char* text, int size, std::string* error = nullptr) {
  taiji_topology_t* t = nullptr;
  taiji_status_t s = taiji_topology_from_text(peer, text, size, &t);
  if (s != TAIJI_OK && error) *error = status_text(s) + ": " + taiji_peer_last_error(nullptr);
  return Topology(t);
}

// Parent arrays of a few shapes, written out here rather than taken from the runtime.
std::vector<int> chain_to_last(int n) {
  std::vector<int> p(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) p[static_cast<size_t>(r)] = r + 1 < n ? r + 1 : -1;
  return p;
}
std::vector<int> chain_from_first(int n) {
  std::vector<int> p(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) p[static_cast<size_t>(r)] = r - 1;
  return p;
}
std::vector<int> star_at(int n, int root) {
  std::vector<int> p(static_cast<size_t>(n), root);
  p[static_cast<size_t>(root)] = -1;
  return p;
}

// Two pairs of different roots: a chain toward the last rank used both ways, and a star
// reduced into rank 0 with a chain broadcast from it.
Topology custom_two_pairs(int n) {
  return from_parents(n, {chain_to_last(n), star_at(n, 0)}, {chain_to_last(n), chain_from_first(n)});
}

// ---- allreduces with checked results ------------------------------------------------------

struct Allreduce {
  std::string name;
  ReduceCase rc;
  std::unique_ptr<GuardedBuffer> in;
  std::unique_ptr<GuardedBuffer> out;
  taiji_request_t* request = nullptr;
  uint64_t digest_used = 0;
};

std::unique_ptr<Allreduce> post_allreduce(taiji_peer_t* peer, int rank, const std::string& name, size_t count,
                                          taiji_dtype_t dtype, Failures& failures,
                                          const char* topology = nullptr, int64_t timeout_ms = kOpTimeoutMs) {
  auto a = std::make_unique<Allreduce>();
  a->name = name;
  a->rc.dtype = dtype;
  a->rc.op = TAIJI_SUM;
  a->rc.count = count;
  a->rc.salt = salt_of(name);
  const size_t bytes = count * dtype_size(dtype);
  a->in = std::make_unique<GuardedBuffer>(bytes);
  a->out = std::make_unique<GuardedBuffer>(bytes);
  fill_input(a->rc, rank, a->in->data());
  taiji_op_options_t opt = op_options(timeout_ms, topology);
  taiji_status_t s = taiji_allreduce(peer, name.c_str(), a->in->data(), a->out->data(), count, dtype, TAIJI_SUM,
                                     &opt, &a->request);
  if (!failures.expect_status(rank, "posting " + name, s, TAIJI_OK)) {
    failures.add(rank, std::string("  last error: ") + taiji_peer_last_error(peer));
    return nullptr;
  }
  return a;
}

// Waits, checks the result against the serial reference and records the topology digest
// the op ran on. Returns whether the op succeeded.
bool finish_allreduce(taiji_peer_t* peer, Allreduce& a, int n, int rank, Failures& failures) {
  taiji_status_t s = wait_bounded(peer, a.request, kWaitMs, failures, rank, a.name);
  a.digest_used = taiji_request_topology_digest(a.request);
  taiji_request_free(a.request);
  a.request = nullptr;
  if (!failures.expect_status(rank, a.name, s, TAIJI_OK)) return false;
  failures.expect(rank, a.out->guard_intact(), a.name + ": wrote past the buffer");
  std::string err = check_reduce(a.rc, n, a.out->data());
  if (!err.empty()) failures.add(rank, a.name + ": " + err);
  return true;
}

// One small and one large allreduce, blocking in effect; returns the digests they ran on.
std::pair<uint64_t, uint64_t> probe(taiji_peer_t* peer, int n, int rank, const std::string& name,
                                    Failures& failures) {
  auto small = post_allreduce(peer, rank, name + "/small", 7, TAIJI_I32, failures);
  auto large = post_allreduce(peer, rank, name + "/large", kLargeCount, TAIJI_F32, failures);
  std::pair<uint64_t, uint64_t> used{0, 0};
  if (small && finish_allreduce(peer, *small, n, rank, failures)) used.first = small->digest_used;
  if (large && finish_allreduce(peer, *large, n, rank, failures)) used.second = large->digest_used;
  return used;
}

uint64_t builtin_digest(taiji_peer_t* peer, const char* name, Failures& failures, int rank) {
  std::string error;
  Topology t = from_text(peer, name, 0, &error);
  failures.expect(rank, t != nullptr, std::string("topology_from_text(peer, ") + name + "): " + error);
  return taiji_topology_digest(t.get());
}

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

// ---- the swap while ops run --------------------------------------------------------------

TEST_CASE("topology: a swap in the middle of a thousand asynchronous allreduces", "[topology]") {
  // From the automatic choice to a built-in and to a custom graph, and from a configured
  // topology to a custom graph. All peers share one host here, where the automatic small-op
  // choice (tree) is the star itself; binary_tree ignores hosts, so it differs from both of
  // the automatic choices.
  const std::string variant = GENERATE(as<std::string>{}, "auto->binary_tree", "auto->custom", "ring->custom");
  const int n = 4;
  CAPTURE(variant, n);
  EnvOverride chunk("TAIJI_CHUNK_BYTES", kChunkBytes);
  Failures failures;
  // Every op's deadline runs from its post, and each rank posts all 1000 before waiting on
  // any: the whole stream must fit in one deadline, 4-6 s under TSan on 2 cores.
  constexpr int64_t kStreamTimeoutMs = 60000;
  PeerOptions options;
  options.timeout_ms = kOpTimeoutMs;
  if (variant.rfind("ring", 0) == 0) options.topology = "ring";
  constexpr int kHalf = 500;
  std::atomic<int> running_at_swap{0};
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    std::string error;
    Topology next = variant.find("binary_tree") != std::string::npos ? from_text(peer, "binary_tree", 0, &error)
                                                                      : custom_two_pairs(n);
    if (!failures.expect(rank, next != nullptr, "building the new topology: " + error)) return;
    const uint64_t new_digest = taiji_topology_digest(next.get());
    const uint64_t ring = builtin_digest(peer, "ring", failures, rank);
    const uint64_t tree = builtin_digest(peer, "tree", failures, rank);

    std::vector<std::unique_ptr<Allreduce>> before;
    std::vector<std::unique_ptr<Allreduce>> after;
    auto post_half = [&](const char* prefix, std::vector<std::unique_ptr<Allreduce>>& into) {
      for (int i = 0; i < kHalf; ++i) {
        const size_t count = i % 50 == 7 ? kLargeCount : static_cast<size_t>(1 + (i * 37) % 211);
        const taiji_dtype_t dtype = i % 3 == 0 ? TAIJI_F32 : i % 3 == 1 ? TAIJI_I32 : TAIJI_F64;
        auto a = post_allreduce(peer, rank, std::string(prefix) + std::to_string(i), count, dtype, failures,
                                nullptr, kStreamTimeoutMs);
        if (a) into.push_back(std::move(a));
      }
    };
    post_half("swap/before/", before);
    taiji_request_t* swap = nullptr;
    taiji_op_options_t opt = op_options(kStreamTimeoutMs);
    taiji_status_t s = taiji_set_topology(peer, next.get(), &opt, &swap);
    // The call copied what it needs; the object may go at once.
    next.reset();
    for (const auto& a : before) running_at_swap += taiji_request_test(a->request) == TAIJI_IN_PROGRESS;
    if (!failures.expect_status(rank, "posting set_topology", s, TAIJI_OK)) {
      failures.add(rank, std::string("  last error: ") + taiji_peer_last_error(peer));
    }
    post_half("swap/after/", after);

    int wrong_before = 0;
    int wrong_after = 0;
    std::string first_before;
    std::string first_after;
    for (auto& a : before) {
      if (!finish_allreduce(peer, *a, n, rank, failures)) continue;
      const bool expected_old = options.topology ? a->digest_used == ring
                                                 : a->digest_used == ring || a->digest_used == tree;
      if (a->digest_used == new_digest || !expected_old) {
        if (wrong_before++ == 0) first_before = a->name + " ran on " + hex(a->digest_used);
      }
    }
    if (swap) {
      s = wait_bounded(peer, swap, kStreamTimeoutMs + 30000, failures, rank, "set_topology");
      failures.expect_status(rank, "set_topology", s, TAIJI_OK);
      const uint64_t reported = taiji_request_topology_digest(swap);
      failures.expect(rank, reported == new_digest,
                      "set_topology's request reports topology " + hex(reported) + ", not the one in force after it (" +
                          hex(new_digest) + ")");
      taiji_request_free(swap);
    }
    for (auto& a : after) {
      if (!finish_allreduce(peer, *a, n, rank, failures)) continue;
      if (a->digest_used != new_digest && wrong_after++ == 0) {
        first_after = a->name + " ran on " + hex(a->digest_used);
      }
    }
    failures.expect(rank, wrong_before == 0,
                    std::to_string(wrong_before) + " ops posted before the swap did not run on the old topology, e.g. " +
                        first_before + " (new " + hex(new_digest) + ")");
    failures.expect(rank, wrong_after == 0,
                    std::to_string(wrong_after) + " ops posted after the swap did not run on the new topology " +
                        hex(new_digest) + ", e.g. " + first_after);
    taiji_op_options_t end = op_options(30000);
    failures.expect_status(rank, "end barrier", taiji_barrier(peer, "swap/end", &end, nullptr), TAIJI_OK);
  }, options);
  failures.add_all(lines);
  // Otherwise the test would not have swapped under running ops at all.
  failures.expect(-1, running_at_swap.load() > 0, "no op was still running when set_topology was posted");
  check_no_failures(failures);
}

TEST_CASE("topology: peers that propose different topologies all get ERR_MISMATCH", "[topology]") {
  const std::string variant = GENERATE(as<std::string>{}, "builtin", "custom");
  const int n = GENERATE(2, 4);
  CAPTURE(variant, n);
  EnvOverride chunk("TAIJI_CHUNK_BYTES", kChunkBytes);
  Failures failures;
  // Far longer than the agreement takes (even under TSan): MISMATCH must come from the
  // proposals, never from the deadline.
  constexpr int64_t kSwapTimeoutMs = 20000;
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    const auto before = probe(peer, n, rank, "disagree/before", failures);
    std::string error;
    Topology mine;
    if (variant == "builtin") {
      mine = from_text(peer, rank == 0 ? "ring" : "star", 0, &error);
    } else {
      mine = rank == 0 ? from_parents(n, {chain_to_last(n)}, {chain_to_last(n)}, &error)
                       : from_parents(n, {star_at(n, 0)}, {star_at(n, 0)}, &error);
    }
    if (!failures.expect(rank, mine != nullptr, "building the proposal: " + error)) return;
    taiji_op_options_t opt = op_options(kSwapTimeoutMs);
    auto start = Clock::now();
    taiji_status_t s = taiji_set_topology(peer, mine.get(), &opt, nullptr);
    const double took = ms_since(start);
    failures.expect_status(rank, "set_topology with disagreeing proposals", s, TAIJI_ERR_MISMATCH);
    failures.expect(rank, took < kSwapTimeoutMs + 1000,
                    "set_topology took " + std::to_string(static_cast<int>(took)) + " ms against a timeout of " +
                        std::to_string(kSwapTimeoutMs));
    const auto after = probe(peer, n, rank, "disagree/after", failures);
    failures.expect(rank, after == before,
                    "the old topology did not stay: ops ran on " + hex(after.first) + "/" + hex(after.second) +
                        " after the failed swap, " + hex(before.first) + "/" + hex(before.second) + " before it");

    // Again from an explicit topology, which must stay as well.
    Topology star = from_text(peer, "star", 0, &error);
    if (!failures.expect(rank, star != nullptr, "star: " + error)) return;
    failures.expect_status(rank, "set_topology(star)", taiji_set_topology(peer, star.get(), &opt, nullptr),
                           TAIJI_OK);
    s = taiji_set_topology(peer, mine.get(), &opt, nullptr);
    failures.expect_status(rank, "set_topology with disagreeing proposals over star", s, TAIJI_ERR_MISMATCH);
    const auto on_star = probe(peer, n, rank, "disagree/star", failures);
    const uint64_t star_digest = taiji_topology_digest(star.get());
    failures.expect(rank, on_star.first == star_digest && on_star.second == star_digest,
                    "star did not stay after a failed swap: ops ran on " + hex(on_star.first) + "/" +
                        hex(on_star.second) + ", star is " + hex(star_digest));
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("topology: a swap that one peer never joins times out and keeps the old topology", "[topology]") {
  const int n = 3;
  Failures failures;
  constexpr int64_t kSwapTimeoutMs = 1500;
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    const auto before = probe(peer, n, rank, "unjoined/before", failures);
    if (rank != 0) {
      Topology ring = from_text(peer, "ring", 0);
      taiji_op_options_t opt = op_options(kSwapTimeoutMs);
      auto start = Clock::now();
      taiji_status_t s = taiji_set_topology(peer, ring.get(), &opt, nullptr);
      const double took = ms_since(start);
      failures.expect_status(rank, "set_topology without rank 0", s, TAIJI_ERR_TIMEOUT);
      // Ends on its own deadline: the slack allows a sanitizer's slowdown, not a hang.
      failures.expect(rank, took < kSwapTimeoutMs + 8000,
                      "set_topology took " + std::to_string(static_cast<int>(took)) + " ms against a timeout of " +
                          std::to_string(kSwapTimeoutMs));
    }
    const auto after = probe(peer, n, rank, "unjoined/after", failures);
    failures.expect(rank, after == before,
                    "ops after the failed swap ran on " + hex(after.first) + "/" + hex(after.second) + ", before it on " +
                        hex(before.first) + "/" + hex(before.second));
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

namespace {

// Rank 0 of the tests below: joins nothing while rank 1 works, for at most 30 s.
void idle_until_done(const std::atomic<bool>& rank1_done, Failures& failures) {
  auto deadline = Clock::now() + std::chrono::seconds(30);
  while (!rank1_done.load() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  failures.expect(0, rank1_done.load(), "rank 1 did not finish within 30 s");
}

}  // namespace

TEST_CASE("topology: ops held back by an unfinished swap complete when the peer finalizes", "[topology]") {
  // Rank 1 proposes a swap that rank 0 never joins and posts an op behind it; finalize
  // must not leave that op waiting for an agreement that cannot come.
  const int n = 2;
  Failures failures;
  std::atomic<bool> rank1_done{false};
  PeerOptions options;
  options.timeout_ms = 1500;  // how long finalize waits for ops in flight
  options.finalize_ok = [](int rank, taiji_status_t s) { return rank == 1 || s == TAIJI_OK || s == TAIJI_ERR_PEER_LOST; };
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    if (rank == 0) return idle_until_done(rank1_done, failures);
    Topology ring = from_text(peer, "ring", 0);
    taiji_op_options_t opt = op_options(30000);
    taiji_request_t* swap = nullptr;
    failures.expect_status(rank, "posting set_topology", taiji_set_topology(peer, ring.get(), &opt, &swap), TAIJI_OK);
    auto held = post_allreduce(peer, rank, "held/behind/swap", 7, TAIJI_I32, failures);
    auto start = Clock::now();
    taiji_status_t fin = taiji_peer_finalize(peer);
    const double took = ms_since(start);
    failures.expect(rank, took < 10000, "finalize took " + std::to_string(static_cast<int>(took)) + " ms (" + status_text(fin) + ")");
    if (swap) {
      taiji_status_t s = taiji_request_test(swap);
      failures.expect(rank, s != TAIJI_IN_PROGRESS && s != TAIJI_OK,
                      "the unfinished swap reports " + status_text(s) + " after finalize");
      wait_bounded(peer, swap, 10000, failures, rank, "set_topology after finalize");
      taiji_request_free(swap);
    }
    if (held) {
      taiji_status_t s = taiji_request_test(held->request);
      failures.expect(rank, s != TAIJI_IN_PROGRESS && s != TAIJI_OK,
                      "the op held behind the swap reports " + status_text(s) + " after finalize");
      wait_bounded(peer, held->request, 10000, failures, rank, "held op after finalize");
      taiji_request_free(held->request);
    }
    rank1_done.store(true);
  }, options);
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("topology: ops held behind several unfinished swaps end when the peer aborts", "[topology]") {
  // Three swaps that rank 0 never joins, then an op: the first swap runs, the rest wait at
  // the gate. When abort ends the first, each later swap fails at once as it starts; the
  // gate must go on to the op behind them instead of waiting on a loop that has closed.
  const int n = 2;
  Failures failures;
  std::atomic<bool> rank1_done{false};
  PeerOptions options;
  options.finalize_ok = [](int rank, taiji_status_t s) {
    return rank == 1 || s == TAIJI_OK || s == TAIJI_ERR_PEER_LOST;
  };
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    if (rank == 0) return idle_until_done(rank1_done, failures);
    Topology ring = from_text(peer, "ring", 0);
    taiji_op_options_t opt = op_options(30000);
    std::vector<taiji_request_t*> swaps(3, nullptr);
    for (auto& swap : swaps) {
      failures.expect_status(rank, "posting set_topology", taiji_set_topology(peer, ring.get(), &opt, &swap),
                             TAIJI_OK);
    }
    auto held = post_allreduce(peer, rank, "held/behind/swaps", 7, TAIJI_I32, failures);
    // The first swap is running (it is in the flight recorder) and the rest wait at the gate.
    size_t started = 0;
    auto deadline = Clock::now() + std::chrono::seconds(10);
    while ((started = count_named(peer, "taiji.set_topology")) == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    failures.expect(rank, started == 1, std::to_string(started) + " swaps started, expected the first only");
    failures.expect_status(rank, "abort", taiji_peer_abort(peer), TAIJI_OK);
    for (taiji_request_t* swap : swaps) {
      if (swap == nullptr) continue;
      wait_bounded(peer, swap, 10000, failures, rank, "set_topology after abort");
      taiji_status_t s = taiji_request_test(swap);
      failures.expect(rank, s != TAIJI_IN_PROGRESS && s != TAIJI_OK, "a swap reports " + status_text(s) + " after abort");
      taiji_request_free(swap);
    }
    if (held) {
      wait_bounded(peer, held->request, 10000, failures, rank, "held op after abort");
      taiji_status_t s = taiji_request_test(held->request);
      failures.expect(rank, s == TAIJI_ERR_ABORTED, "the op held behind the swaps reports " + status_text(s));
      taiji_request_free(held->request);
    }
    rank1_done.store(true);
  }, options);
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("topology: a swap back to the automatic choice with NULL", "[topology]") {
  const int n = GENERATE(1, 3, 5);
  CAPTURE(n);
  EnvOverride chunk("TAIJI_CHUNK_BYTES", kChunkBytes);
  Failures failures;
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    const auto automatic = probe(peer, n, rank, "back/auto", failures);
    Topology custom = custom_two_pairs(n);
    if (!failures.expect(rank, custom != nullptr, "custom topology")) return;
    const uint64_t custom_digest = taiji_topology_digest(custom.get());
    taiji_op_options_t opt = op_options(kOpTimeoutMs);
    failures.expect_status(rank, "set_topology(custom)", taiji_set_topology(peer, custom.get(), &opt, nullptr),
                           TAIJI_OK);
    const auto on_custom = probe(peer, n, rank, "back/custom", failures);
    failures.expect(rank, on_custom.first == custom_digest && on_custom.second == custom_digest,
                    "ops after the swap ran on " + hex(on_custom.first) + "/" + hex(on_custom.second) +
                        ", not the custom topology " + hex(custom_digest));
    failures.expect_status(rank, "set_topology(NULL)", taiji_set_topology(peer, nullptr, &opt, nullptr), TAIJI_OK);
    const auto back = probe(peer, n, rank, "back/again", failures);
    failures.expect(rank, back == automatic,
                    "after the swap back to automatic ops ran on " + hex(back.first) + "/" + hex(back.second) +
                        ", before any swap on " + hex(automatic.first) + "/" + hex(automatic.second));
    // An automatic swap is also an op of the stream, asynchronous like the others.
    taiji_request_t* req = nullptr;
    failures.expect_status(rank, "posting set_topology(NULL) again", taiji_set_topology(peer, nullptr, &opt, &req),
                           TAIJI_OK);
    if (req) {
      failures.expect_status(rank, "set_topology(NULL) again", wait_bounded(peer, req, kWaitMs, failures, rank, "set_topology(NULL)"),
                             TAIJI_OK);
      taiji_request_free(req);
    }
    failures.expect(rank, probe(peer, n, rank, "back/twice", failures) == automatic,
                    "a second automatic swap changed the topology");
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("topology: equal graphs proposed in different forms", "[topology]") {
  // The agreement compares digests, which ignore how a topology was made: equal graphs
  // must agree, every peer must answer the same and the ops after it must run on them. With
  // all ranks on one host, tree (a star to the host's leader) and binary_tree over 3 ranks
  // are the same graphs.
  const std::string variant = GENERATE(as<std::string>{}, "star text vs parents", "tree vs binary_tree");
  const int n = 3;
  CAPTURE(variant, n);
  Failures failures;
  std::vector<uint64_t> proposed(static_cast<size_t>(n), 0);
  std::vector<taiji_status_t> answered(static_cast<size_t>(n), TAIJI_OK);
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    std::string error;
    Topology mine;
    if (variant == "star text vs parents") {
      mine = rank == 0 ? from_text(peer, "star", 0, &error) : from_parents(n, {star_at(n, 0)}, {star_at(n, 0)}, &error);
    } else {
      mine = from_text(peer, rank == 0 ? "tree" : "binary_tree", 0, &error);
    }
    if (!failures.expect(rank, mine != nullptr, "building the proposal: " + error)) return;
    const uint64_t d = taiji_topology_digest(mine.get());
    proposed[static_cast<size_t>(rank)] = d;
    taiji_op_options_t opt = op_options(kOpTimeoutMs);
    taiji_status_t s = taiji_set_topology(peer, mine.get(), &opt, nullptr);
    answered[static_cast<size_t>(rank)] = s;
    failures.expect(rank, s == TAIJI_OK, "set_topology: " + status_text(s) + ": " + taiji_peer_last_error(peer));
    auto a = post_allreduce(peer, rank, "forms/after", 7, TAIJI_I32, failures);
    if (a && finish_allreduce(peer, *a, n, rank, failures)) {
      failures.expect(rank, a->digest_used == d, "after an agreed swap the op ran on " + hex(a->digest_used) +
                                                      ", the proposals' digest is " + hex(d));
    }
  });
  failures.add_all(lines);
  for (int r = 1; r < n; ++r) {
    failures.expect(r, proposed[static_cast<size_t>(r)] == proposed[0],
                    "the proposals are not the same graphs: " + hex(proposed[static_cast<size_t>(r)]) + " vs " +
                        hex(proposed[0]));
    failures.expect(r, answered[static_cast<size_t>(r)] == answered[0],
                    "set_topology answered " + status_text(answered[static_cast<size_t>(r)]) + " here, " +
                        status_text(answered[0]) + " on rank 0");
  }
  check_no_failures(failures);
}

TEST_CASE("topology: a topology for another world size is refused by set_topology", "[topology]") {
  const int n = 3;
  Failures failures;
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    // Only rank 0 tries: a refused call posts nothing, so the swap that follows must still
    // line up with the other peers' first swap.
    if (rank == 0) {
      for (int size : {2, 4}) {
        Topology wrong = from_text(nullptr, "ring", size);
        if (!failures.expect(rank, wrong != nullptr, "ring over " + std::to_string(size))) continue;
        taiji_request_t* req = nullptr;
        taiji_op_options_t opt = op_options(kOpTimeoutMs);
        taiji_status_t s = taiji_set_topology(peer, wrong.get(), &opt, &req);
        failures.expect_status(rank, "set_topology(size " + std::to_string(size) + ") with a request", s,
                               TAIJI_ERR_INVALID_ARGUMENT);
        failures.expect(rank, req == nullptr, "a refused set_topology set *request");
        failures.expect(rank, std::string(taiji_peer_last_error(peer)).find("rank") != std::string::npos,
                        std::string("last error does not name the size: ") + taiji_peer_last_error(peer));
        s = taiji_set_topology(peer, wrong.get(), &opt, nullptr);
        failures.expect_status(rank, "blocking set_topology(size " + std::to_string(size) + ")", s,
                               TAIJI_ERR_INVALID_ARGUMENT);
      }
    }
    Topology star = from_text(peer, "star", 0);
    taiji_op_options_t opt = op_options(kOpTimeoutMs);
    failures.expect_status(rank, "set_topology(star) after the refused ones",
                           taiji_set_topology(peer, star.get(), &opt, nullptr), TAIJI_OK);
    auto a = post_allreduce(peer, rank, "size/after", 7, TAIJI_I32, failures);
    if (a && finish_allreduce(peer, *a, n, rank, failures)) {
      failures.expect(rank, a->digest_used == taiji_topology_digest(star.get()), "the op after the swap did not run on star");
    }
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

// ---- a custom topology chosen per op -------------------------------------------------------

namespace {

int32_t small_value(uint64_t salt, int rank, size_t i) { return static_cast<int32_t>(gen64(salt, rank, i) % 201) - 100; }

std::vector<int32_t> inputs(uint64_t salt, int rank, size_t count) {
  std::vector<int32_t> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = small_value(salt, rank, i);
  return v;
}

std::vector<int32_t> summed(uint64_t salt, int n, size_t offset, size_t count) {
  std::vector<int32_t> v(count, 0);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) v[i] += small_value(salt, r, offset + i);
  }
  return v;
}

std::vector<int32_t> concatenated(uint64_t salt, int n, size_t count) {
  std::vector<int32_t> v;
  for (int r = 0; r < n; ++r) {
    auto block = inputs(salt, r, count);
    v.insert(v.end(), block.begin(), block.end());
  }
  return v;
}

}  // namespace

TEST_CASE("topology: a custom topology chosen per op through its text", "[topology]") {
  const int n = GENERATE(1, 4, 5);
  CAPTURE(n);
  Topology custom = custom_two_pairs(n);
  REQUIRE(custom != nullptr);
  const std::string text = topology_text(custom.get());
  const uint64_t want_digest = taiji_topology_digest(custom.get());
  EnvOverride chunk("TAIJI_CHUNK_BYTES", kChunkBytes);
  Failures failures;
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    taiji_op_options_t opt = op_options(kOpTimeoutMs, text.c_str());
    taiji_request_t* req = nullptr;
    auto check = [&](const std::string& what, taiji_status_t s, const std::vector<int32_t>* got,
                     const std::vector<int32_t>* want) {
      if (s != TAIJI_OK) {
        failures.add(rank, "posting " + what + ": " + status_text(s) + ": " + taiji_peer_last_error(peer));
        return;
      }
      s = wait_bounded(peer, req, kWaitMs, failures, rank, what);
      const uint64_t used = taiji_request_topology_digest(req);
      taiji_request_free(req);
      req = nullptr;
      if (!failures.expect_status(rank, what, s, TAIJI_OK)) return;
      failures.expect(rank, used == want_digest, what + ": ran on " + hex(used) + ", not the custom " + hex(want_digest));
      if (got && want && *got != *want) failures.add(rank, what + ": wrong result");
    };
    for (size_t count : {size_t{7}, kLargeCount}) {
      const std::string c = "/" + std::to_string(count);
      {
        const uint64_t salt = salt_of("per-op/allreduce" + c);
        auto in = inputs(salt, rank, count);
        std::vector<int32_t> out(count, -1);
        auto want = summed(salt, n, 0, count);
        check("allreduce" + c, taiji_allreduce(peer, ("per-op/allreduce" + c).c_str(), in.data(), out.data(), count,
                                               TAIJI_I32, TAIJI_SUM, &opt, &req), &out, &want);
      }
      {
        const uint64_t salt = salt_of("per-op/allgather" + c);
        auto in = inputs(salt, rank, count);
        std::vector<int32_t> out(count * static_cast<size_t>(n), -1);
        auto want = concatenated(salt, n, count);
        check("allgather" + c, taiji_allgather(peer, ("per-op/allgather" + c).c_str(), in.data(), out.data(), count,
                                               TAIJI_I32, &opt, &req), &out, &want);
      }
      {
        const uint64_t salt = salt_of("per-op/reduce_scatter" + c);
        auto in = inputs(salt, rank, count * static_cast<size_t>(n));
        std::vector<int32_t> out(count, -1);
        auto want = summed(salt, n, static_cast<size_t>(rank) * count, count);
        check("reduce_scatter" + c, taiji_reduce_scatter(peer, ("per-op/reduce_scatter" + c).c_str(), in.data(),
                                                         out.data(), count, TAIJI_I32, TAIJI_SUM, &opt, &req),
              &out, &want);
      }
      for (int root = 0; root < n; ++root) {
        const std::string r = c + "/root" + std::to_string(root);
        const uint64_t salt = salt_of("per-op/rooted" + r);
        auto in = inputs(salt, rank, count);
        std::vector<int32_t> buf = rank == root ? in : std::vector<int32_t>(count, -1);
        auto root_in = inputs(salt, root, count);
        check("broadcast" + r, taiji_broadcast(peer, ("per-op/broadcast" + r).c_str(), buf.data(), count, TAIJI_I32,
                                               root, &opt, &req), &buf, &root_in);
        std::vector<int32_t> out(rank == root ? count : 0, -1);
        auto want = summed(salt, n, 0, count);
        check("reduce" + r, taiji_reduce(peer, ("per-op/reduce" + r).c_str(), in.data(), rank == root ? out.data() : nullptr,
                                         count, TAIJI_I32, TAIJI_SUM, root, &opt, &req),
              rank == root ? &out : nullptr, &want);
        std::vector<int32_t> all(rank == root ? count * static_cast<size_t>(n) : 0, -1);
        auto gathered = concatenated(salt, n, count);
        check("gather" + r, taiji_gather(peer, ("per-op/gather" + r).c_str(), in.data(), rank == root ? all.data() : nullptr,
                                         count, TAIJI_I32, root, &opt, &req),
              rank == root ? &all : nullptr, &gathered);
      }
      {
        std::vector<uint8_t> bytes(count, 0x42);
        int agree = -1;
        check("consensus" + c, taiji_consensus(peer, ("per-op/consensus" + c).c_str(), bytes.data(), bytes.size(), &agree,
                                               &opt, &req), nullptr, nullptr);
        failures.expect(rank, agree == 1, "consensus" + c + ": agree " + std::to_string(agree));
      }
      check("barrier" + c, taiji_barrier(peer, ("per-op/barrier" + c).c_str(), &opt, &req), nullptr, nullptr);
    }
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

// ---- creation and validation without peers -------------------------------------------------

namespace {

struct Refusal {
  std::string what;
  taiji_status_t status;
  bool nulled;
  std::string error;
};

template <typename Make>
Refusal attempt(const std::string& what, Make make) {
  // A non-NULL value the call must overwrite with NULL.
  auto* sentinel = reinterpret_cast<taiji_topology_t*>(static_cast<uintptr_t>(0x1000));
  taiji_topology_t* t = sentinel;
  taiji_status_t s = make(&t);
  Refusal r{what, s, t == nullptr, taiji_peer_last_error(nullptr)};
  if (s == TAIJI_OK && t != sentinel) taiji_topology_destroy(t);
  return r;
}

constexpr int kRanks = 4;

bool contains_ci(std::string haystack, std::string needle) {
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  return lower(std::move(haystack)).find(lower(std::move(needle))) != std::string::npos;
}

}  // namespace

TEST_CASE("topology: invalid graphs are refused and the fault is named", "[topology]") {
  constexpr int n = kRanks;
  const std::vector<int> ok = star_at(n, 0);
  auto parents = [&](std::vector<int> up, std::vector<int> down, int size = kRanks, int pairs = 1) {
    return [=](taiji_topology_t** t) mutable {
      return taiji_topology_from_parents(size, pairs, up.data(), down.data(), t);
    };
  };
  auto edges = [&](std::vector<int> up, std::vector<int> down, int size = kRanks) {
    return [=](taiji_topology_t** t) mutable { return taiji_topology_from_edges(size, 1, up.data(), down.data(), t); };
  };
  auto text = [&](const char* s, int size = kRanks) {
    return [=](taiji_topology_t** t) { return taiji_topology_from_text(nullptr, s, size, t); };
  };
  const std::vector<int> star_edges = {1, 0, 2, 0, 3, 0};
  const std::vector<int> many(static_cast<size_t>(2000 * n), 0);
  struct Case {
    Refusal got;
    const char* keyword;
  };
  std::vector<Case> cases = {
      {attempt("two roots", parents({-1, -1, 0, 0}, ok)), "more than one root"},
      {attempt("two roots in the broadcast graph", parents(ok, {-1, 0, -1, 0})), "more than one root"},
      {attempt("no root", parents({1, 2, 3, 0}, ok)), "no root"},
      {attempt("cycle", parents({-1, 2, 1, 0}, ok)), "cycle"},
      {attempt("cycle in the broadcast graph", parents(ok, {-1, 0, 3, 2})), "cycle"},
      {attempt("parent out of range", parents({-1, 0, 7, 0}, ok)), "out of range"},
      {attempt("negative parent other than -1", parents({-1, 0, -2, 0}, ok)), "out of range"},
      {attempt("own parent", parents({-1, 1, 0, 0}, ok)), "itself"},
      {attempt("broadcast rooted elsewhere", parents(ok, star_at(n, 2))), "rooted at 2"},
      {attempt("second pair broadcast rooted elsewhere",
               parents({-1, 0, 0, 0, 1, -1, 1, 1}, {-1, 0, 0, 0, -1, 0, 0, 0}, n, 2)), "pair 1"},
      {attempt("size 0", parents(ok, ok, 0)), "size"},
      {attempt("negative size", parents(ok, ok, -3)), "size"},
      {attempt("pairs 0", parents(ok, ok, n, 0)), "pairs"},
      {attempt("negative pairs", parents(ok, ok, n, -1)), "pairs"},
      {attempt("too many pairs",
               [&](taiji_topology_t** t) { return taiji_topology_from_parents(n, 2000, many.data(), many.data(), t); }),
       "pairs"},
      {attempt("NULL reduce parents",
               [&](taiji_topology_t** t) { return taiji_topology_from_parents(n, 1, nullptr, ok.data(), t); }), "NULL"},
      {attempt("NULL broadcast parents",
               [&](taiji_topology_t** t) { return taiji_topology_from_parents(n, 1, ok.data(), nullptr, t); }), "NULL"},
      {attempt("edges: duplicate child", edges({1, 0, 1, 2, 3, 0}, star_edges)), "duplicate child"},
      {attempt("edges: child out of range", edges({1, 0, 9, 0, 3, 0}, star_edges)), "out of range"},
      {attempt("edges: parent out of range", edges({1, 0, 2, -1, 3, 0}, star_edges)), "out of range"},
      {attempt("edges: own parent", edges({1, 0, 2, 2, 3, 0}, star_edges)), "own parent"},
      {attempt("edges: cycle", edges({1, 2, 2, 1, 3, 0}, star_edges)), "cycle"},
      {attempt("edges: broadcast rooted elsewhere", edges(star_edges, {0, 1, 2, 1, 3, 1})), "rooted at 1"},
      {attempt("edges: pairs 0",
               [&](taiji_topology_t** t) { return taiji_topology_from_edges(n, 0, star_edges.data(), star_edges.data(), t); }),
       "pairs"},
      {attempt("edges: size 0",
               [&](taiji_topology_t** t) { return taiji_topology_from_edges(0, 1, star_edges.data(), star_edges.data(), t); }),
       "size"},
      {attempt("edges: NULL",
               [&](taiji_topology_t** t) { return taiji_topology_from_edges(n, 1, star_edges.data(), nullptr, t); }), "NULL"},
      {attempt("text: NULL", [&](taiji_topology_t** t) { return taiji_topology_from_text(nullptr, nullptr, n, t); }), "NULL"},
      {attempt("text: unknown name", text("rign")), "rign"},
      {attempt("text: size 0 without a peer", text("ring", 0)), "size"},
      {attempt("text: for 3 ranks, size 4", text("pairs=1;n=3;R0:-1,0,0|B0:-1,0,0")), "expected 4"},
      {attempt("text: 3 parents for 4 ranks", text("pairs=1;n=4;R0:-1,0,0|B0:-1,0,0,0")), "pair 0"},
      {attempt("text: two roots", text("pairs=1;n=4;R0:-1,-1,0,0|B0:-1,0,0,0")), "more than one root"},
      {attempt("text: cycle", text("pairs=1;n=4;R0:-1,2,1,0|B0:-1,0,0,0")), "cycle"},
      {attempt("text: broadcast rooted elsewhere", text("pairs=1;n=4;R0:-1,0,0,0|B0:1,-1,1,1")), "rooted at 1"},
      {attempt("text: pairs 0", text("pairs=0;n=4")), "pairs"},
      {attempt("text: leading zero", text("pairs=1;n=04;R0:-1,0,0,0|B0:-1,0,0,0")), "offset"},
      {attempt("text: wrong pair index", text("pairs=1;n=4;R1:-1,0,0,0|B1:-1,0,0,0")), "offset"},
      {attempt("text: trailing bytes", text("pairs=1;n=4;R0:-1,0,0,0|B0:-1,0,0,0;")), "offset"},
      // Built for 100000 ranks, a ring would be 10^10 parents.
      {attempt("text: built-in for a huge size without a peer", text("ring", 100000)), "at most 4096"},
      {attempt("text: padded built-in for a huge size", text(" \tclique", 4097)), "at most 4096"},
      // Not a built-in: its own error, whatever the size.
      {attempt("text: misspelt built-in for a huge size", text("rnig", 100000)), "unknown strategy 'rnig'"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.got.what, c.got.error);
    CHECK(c.got.status == TAIJI_ERR_INVALID_ARGUMENT);
    CHECK(c.got.nulled);
    CHECK(contains_ci(c.got.error, c.keyword));
  }
  // A NULL output pointer is refused without a crash.
  CHECK(taiji_topology_from_parents(n, 1, ok.data(), ok.data(), nullptr) == TAIJI_ERR_INVALID_ARGUMENT);
  CHECK(taiji_topology_from_edges(n, 1, star_edges.data(), star_edges.data(), nullptr) == TAIJI_ERR_INVALID_ARGUMENT);
  CHECK(taiji_topology_from_text(nullptr, "ring", n, nullptr) == TAIJI_ERR_INVALID_ARGUMENT);
  // NULL topologies in the accessors.
  CHECK(taiji_topology_digest(nullptr) == 0);
  CHECK(taiji_topology_size(nullptr) == -1);
  CHECK(taiji_topology_text(nullptr, nullptr, 0) == 0);
  char written[4] = {'x', 'x', 'x', 'x'};
  CHECK(taiji_topology_text(nullptr, written, sizeof written) == 0);
  CHECK(written[0] == '\0');
  taiji_topology_destroy(nullptr);
}

TEST_CASE("topology: text, digest and size of valid topologies", "[topology]") {
  // The ring over 3 ranks as text.h spells it.
  const char* ring3 = "pairs=3;n=3;R0:-1,2,0|B0:-1,0,1;R1:1,-1,0|B1:2,-1,1;R2:1,2,-1|B2:2,0,-1";
  Topology ring = from_text(nullptr, "ring", 3);
  REQUIRE(ring != nullptr);
  CHECK(topology_text(ring.get()) == ring3);
  CHECK(taiji_topology_size(ring.get()) == 3);
  Topology parsed = from_text(nullptr, (std::string(" \t") + ring3 + "\r\n").c_str(), 3);
  REQUIRE(parsed != nullptr);
  CHECK(taiji_topology_digest(parsed.get()) == taiji_topology_digest(ring.get()));
  // Truncation: the full length comes back, the buffer holds a NUL-terminated prefix.
  char small[6];
  std::memset(small, 'x', sizeof small);
  CHECK(taiji_topology_text(ring.get(), small, sizeof small) == std::strlen(ring3));
  CHECK(std::string(small) == std::string(ring3, 5));
  CHECK(taiji_topology_text(ring.get(), small, 1) == std::strlen(ring3));
  CHECK(small[0] == '\0');
  // Equal graphs, equal digests, whichever constructor made them.
  const std::vector<int> star = star_at(4, 0);
  Topology a = from_parents(4, {star}, {star});
  const int star_edges[] = {1, 0, 2, 0, 3, 0};
  const int reversed_edges[] = {3, 0, 2, 0, 1, 0};
  taiji_topology_t* b = nullptr;
  REQUIRE(taiji_topology_from_edges(4, 1, star_edges, reversed_edges, &b) == TAIJI_OK);
  Topology bb(b);
  Topology c = from_text(nullptr, "star", 4);
  REQUIRE(a != nullptr);
  REQUIRE(c != nullptr);
  CHECK(taiji_topology_digest(a.get()) == taiji_topology_digest(bb.get()));
  CHECK(taiji_topology_digest(a.get()) == taiji_topology_digest(c.get()));
  CHECK(topology_text(a.get()) == "pairs=1;n=4;R0:-1,0,0,0|B0:-1,0,0,0");
  Topology other = from_parents(4, {chain_to_last(4)}, {chain_to_last(4)});
  REQUIRE(other != nullptr);
  CHECK(taiji_topology_digest(other.get()) != taiji_topology_digest(a.get()));
  // Every built-in name over 1..8 ranks, round-tripped through its text.
  for (int size = 1; size <= 8; ++size) {
    for (const char* name : kBuiltins) {
      CAPTURE(size, name);
      Topology t = from_text(nullptr, name, size);
      REQUIRE(t != nullptr);
      Topology back = from_text(nullptr, topology_text(t.get()).c_str(), size);
      REQUIRE(back != nullptr);
      CHECK(taiji_topology_digest(back.get()) == taiji_topology_digest(t.get()));
      CHECK(topology_text(back.get()) == topology_text(t.get()));
    }
  }
}

namespace {

// Independent of the runtime: whether parent[] is a tree over its ranks with one root
// that every rank reaches.
bool valid_tree(const std::vector<int>& parent, int* root) {
  const int n = static_cast<int>(parent.size());
  int roots = 0;
  for (int r = 0; r < n; ++r) {
    const int p = parent[static_cast<size_t>(r)];
    if (p == -1) {
      ++roots;
      *root = r;
    } else if (p < 0 || p >= n || p == r) {
      return false;
    }
  }
  if (roots != 1) return false;
  for (int r = 0; r < n; ++r) {
    int x = r;
    int steps = 0;
    while (parent[static_cast<size_t>(x)] != -1) {
      x = parent[static_cast<size_t>(x)];
      if (++steps > n) return false;
    }
  }
  return true;
}

// Edges (child, parent) into a parent array, under the rules of taiji_topology_from_edges.
bool edges_to_parents(int n, const int* edges, std::vector<int>* parent) {
  parent->assign(static_cast<size_t>(n), -1);
  std::vector<bool> child(static_cast<size_t>(n), false);
  for (int e = 0; e < n - 1; ++e) {
    const int c = edges[2 * e];
    const int p = edges[2 * e + 1];
    if (c < 0 || c >= n || p < 0 || p >= n || c == p || child[static_cast<size_t>(c)]) return false;
    child[static_cast<size_t>(c)] = true;
    (*parent)[static_cast<size_t>(c)] = p;
  }
  int root = -1;
  return valid_tree(*parent, &root);
}

bool valid_pairs(int n, int pairs, const std::vector<int>& up, const std::vector<int>& down) {
  for (int p = 0; p < pairs; ++p) {
    const auto at = static_cast<std::ptrdiff_t>(p) * n;
    std::vector<int> u(up.begin() + at, up.begin() + at + n);
    std::vector<int> d(down.begin() + at, down.begin() + at + n);
    int ru = -1;
    int rd = -2;
    if (!valid_tree(u, &ru) || !valid_tree(d, &rd) || ru != rd) return false;
  }
  return true;
}

// A random tree: ranks in random order, each below a random earlier one.
std::vector<int> random_tree(std::mt19937_64& rng, int n, int root) {
  std::vector<int> order(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) order[static_cast<size_t>(r)] = r;
  std::shuffle(order.begin(), order.end(), rng);
  std::swap(*std::find(order.begin(), order.end(), root), order[0]);
  std::vector<int> parent(static_cast<size_t>(n), -1);
  for (size_t i = 1; i < order.size(); ++i) {
    parent[static_cast<size_t>(order[i])] = order[std::uniform_int_distribution<size_t>(0, i - 1)(rng)];
  }
  return parent;
}

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

}  // namespace

TEST_CASE("topology: random graphs, edge lists and texts", "[topology]") {
  std::mt19937_64 rng(20240611);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  constexpr int kIterations = 6000;
  int accepted[3] = {0, 0, 0};
  int rejected[3] = {0, 0, 0};
  std::vector<std::string> faults;
  auto fault = [&](const std::string& f) {
    if (faults.size() < 20) faults.push_back(f);
  };
  // Every accepted topology must survive text -> topology -> same digest and text.
  auto round_trip = [&](const taiji_topology_t* t, int size, const std::string& from) {
    const std::string text = topology_text(t);
    if (taiji_topology_size(t) != size) fault(from + ": size " + std::to_string(taiji_topology_size(t)));
    std::string error;
    Topology back = from_text(nullptr, text.c_str(), size, &error);
    if (!back) {
      fault(from + ": its text '" + text + "' is refused: " + error);
      return;
    }
    if (taiji_topology_digest(back.get()) != taiji_topology_digest(t)) fault(from + ": digest changed through '" + text + "'");
    if (topology_text(back.get()) != text) fault(from + ": text changed: '" + text + "' -> '" + topology_text(back.get()) + "'");
  };
  auto check_refusal = [&](taiji_status_t s, taiji_topology_t* t, const std::string& from) {
    if (s != TAIJI_ERR_INVALID_ARGUMENT) fault(from + ": refused with " + status_text(s));
    if (t != nullptr) fault(from + ": refused but *topology is not NULL");
    if (std::strlen(taiji_peer_last_error(nullptr)) == 0) fault(from + ": refused without a message");
  };
  auto random_parents = [&](int n, int pairs, std::vector<int>& up, std::vector<int>& down) {
    up.clear();
    down.clear();
    for (int p = 0; p < pairs; ++p) {
      const int root = pick(0, n - 1);
      auto u = random_tree(rng, n, root);
      auto d = random_tree(rng, n, pick(0, 3) == 0 ? pick(0, n - 1) : root);
      up.insert(up.end(), u.begin(), u.end());
      down.insert(down.end(), d.begin(), d.end());
    }
    for (int m = pick(0, 3) - 1; m > 0; --m) {
      auto& v = pick(0, 1) ? up : down;
      v[static_cast<size_t>(pick(0, static_cast<int>(v.size()) - 1))] = pick(-2, n + 1);
    }
  };
  std::vector<std::string> texts;  // canonical texts of accepted topologies, seeds for mutation
  for (int it = 0; it < kIterations; ++it) {
    const int kind = it % 3;
    const int n = pick(1, 9);
    const int pairs = pick(1, 3);
    const std::string from = "iteration " + std::to_string(it);
    taiji_topology_t* t = reinterpret_cast<taiji_topology_t*>(static_cast<uintptr_t>(0x1000));
    if (kind == 0) {
      std::vector<int> up;
      std::vector<int> down;
      random_parents(n, pairs, up, down);
      const bool valid = valid_pairs(n, pairs, up, down);
      taiji_status_t s = taiji_topology_from_parents(n, pairs, up.data(), down.data(), &t);
      if ((s == TAIJI_OK) != valid) fault(from + ": from_parents " + status_text(s) + " for a " + (valid ? "valid" : "invalid") + " graph");
      if (s == TAIJI_OK) {
        ++accepted[0];
        round_trip(t, n, from + " (parents)");
        texts.push_back(topology_text(t));
        taiji_topology_destroy(t);
      } else {
        ++rejected[0];
        check_refusal(s, t, from + " (parents)");
      }
    } else if (kind == 1) {
      std::vector<int> up;
      std::vector<int> down;
      random_parents(n, pairs, up, down);
      // Edge lists of those graphs in random order, then a few more random changes.
      std::vector<int> ue;
      std::vector<int> de;
      for (int p = 0; p < pairs; ++p) {
        for (auto* side : {&up, &down}) {
          std::vector<std::pair<int, int>> edges;
          for (int r = 0; r < n; ++r) {
            const int parent = (*side)[static_cast<size_t>(p * n + r)];
            if (parent != -1) edges.emplace_back(r, parent);
          }
          while (static_cast<int>(edges.size()) < n - 1) edges.emplace_back(pick(-1, n), pick(-1, n));
          edges.resize(static_cast<size_t>(n - 1));
          std::shuffle(edges.begin(), edges.end(), rng);
          for (auto [c, par] : edges) {
            (side == &up ? ue : de).push_back(c);
            (side == &up ? ue : de).push_back(par);
          }
        }
      }
      if (n > 1 && pick(0, 3) == 0) {
        auto& v = pick(0, 1) ? ue : de;
        v[static_cast<size_t>(pick(0, static_cast<int>(v.size()) - 1))] = pick(-1, n);
      }
      // Single-rank graphs have no edges; the arrays still must not be NULL.
      ue.push_back(0);
      de.push_back(0);
      bool valid = true;
      std::vector<int> pu;
      std::vector<int> pd;
      for (int p = 0; p < pairs && valid; ++p) {
        std::vector<int> u;
        std::vector<int> d;
        valid = edges_to_parents(n, ue.data() + 2 * p * (n - 1), &u) && edges_to_parents(n, de.data() + 2 * p * (n - 1), &d);
        pu.insert(pu.end(), u.begin(), u.end());
        pd.insert(pd.end(), d.begin(), d.end());
      }
      valid = valid && valid_pairs(n, pairs, pu, pd);
      taiji_status_t s = taiji_topology_from_edges(n, pairs, ue.data(), de.data(), &t);
      if ((s == TAIJI_OK) != valid) fault(from + ": from_edges " + status_text(s) + " for " + (valid ? "valid" : "invalid") + " edges");
      if (s == TAIJI_OK) {
        ++accepted[1];
        round_trip(t, n, from + " (edges)");
        if (valid) {
          taiji_topology_t* same = nullptr;
          if (taiji_topology_from_parents(n, pairs, pu.data(), pd.data(), &same) != TAIJI_OK ||
              taiji_topology_digest(same) != taiji_topology_digest(t)) {
            fault(from + ": edges and the parent arrays they describe give different topologies");
          }
          taiji_topology_destroy(same);
        }
        taiji_topology_destroy(t);
      } else {
        ++rejected[1];
        check_refusal(s, t, from + " (edges)");
      }
    } else {
      std::string text;
      const int shape = pick(0, 9);
      if (shape == 0) {
        text = kBuiltins[pick(0, 7)];
      } else if (shape == 1 || texts.empty()) {
        const char alphabet[] = "pairs=n;RB:|,-0123456789 \tx";
        for (int len = pick(0, 40); len > 0; --len) text += alphabet[pick(0, static_cast<int>(sizeof alphabet) - 2)];
      } else {
        text = texts[static_cast<size_t>(pick(0, static_cast<int>(texts.size()) - 1))];
        for (int m = pick(0, 3); m > 0 && !text.empty(); --m) {
          const size_t at = static_cast<size_t>(pick(0, static_cast<int>(text.size()) - 1));
          const char c = static_cast<char>(pick(0, 3) == 0 ? pick(1, 255) : "0123456789-,;:|RB="[pick(0, 17)]);
          switch (pick(0, 2)) {
            case 0: text[at] = c; break;
            case 1: text.insert(text.begin() + static_cast<std::ptrdiff_t>(at), c); break;
            default: text.erase(at, 1); break;
          }
        }
      }
      if (pick(0, 4) == 0) text = " \n" + text + "\t ";
      // The text's own rank count, where it has one, so that mutated texts are mostly
      // judged on their graphs rather than refused for their size.
      int size = n;
      if (auto at = text.find(";n="); at != std::string::npos) {
        size = std::atoi(text.c_str() + at + 3);
        if (size < 1 || size > 64) size = n;
      }
      taiji_status_t s = taiji_topology_from_text(nullptr, text.c_str(), size, &t);
      const std::string what = from + " (text '" + text + "')";
      if (s == TAIJI_OK) {
        ++accepted[2];
        round_trip(t, size, what);
        const std::string trimmed = trim(text);
        const bool name = std::find(std::begin(kBuiltins), std::end(kBuiltins), trimmed) != std::end(kBuiltins);
        if (!name && topology_text(t) != trimmed) fault(what + ": accepted, but its one spelling is '" + topology_text(t) + "'");
        taiji_topology_destroy(t);
      } else {
        ++rejected[2];
        check_refusal(s, t, what);
      }
    }
  }
  CAPTURE(accepted[0], rejected[0], accepted[1], rejected[1], accepted[2], rejected[2]);
  for (const auto& f : faults) FAIL_CHECK(f);
  CHECK(faults.empty());
  // The generator must exercise both outcomes of every constructor.
  for (int k = 0; k < 3; ++k) {
    CHECK(accepted[k] > 100);
    CHECK(rejected[k] > 100);
  }
}
