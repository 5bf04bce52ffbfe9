// Sub-groups (taiji_peer_split): children formed by color and ranked by (key, parent
// rank), each a full peer whose collectives involve its members only; a negative color
// gets no child; parents and children run side by side under the same names; splits
// repeat and nest; misuse fails at once; a rank that never calls makes the others time
// out with nothing left running; a child outlives its parent safely.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "harness.h"

namespace {

using namespace taiji_test;

constexpr int64_t kOpMs = 20000;

// Blocking split with a deadline; records a failure unless it returns `want`.
taiji_peer_t* split(taiji_peer_t* peer, int color, int key, Failures& failures, int rank,
                    const std::string& what, taiji_status_t want = TAIJI_OK, int64_t timeout_ms = kOpMs) {
  taiji_op_options_t opt = op_options(timeout_ms);
  taiji_peer_t* child = reinterpret_cast<taiji_peer_t*>(&opt);  // must be overwritten
  taiji_status_t s = taiji_peer_split(peer, color, key, &opt, &child);
  if (!failures.expect_status(rank, what + ": " + taiji_peer_last_error(peer), s, want)) {
    if (s == TAIJI_OK) taiji_peer_destroy(child);
    return nullptr;
  }
  if (s != TAIJI_OK) failures.expect(rank, child == nullptr, what + ": *child is not NULL after an error");
  return child;
}

int64_t sum(taiji_peer_t* peer, const char* name, int64_t value, Failures& failures, int rank) {
  int64_t out = -1;
  taiji_op_options_t opt = op_options(kOpMs);
  failures.expect_status(rank, std::string("allreduce ") + name,
                         taiji_allreduce(peer, name, &value, &out, 1, TAIJI_I64, TAIJI_SUM, &opt, nullptr),
                         TAIJI_OK);
  return out;
}

// Every member's value, in the peer's rank order.
std::vector<int64_t> gather(taiji_peer_t* peer, const char* name, int64_t value, Failures& failures,
                            int rank) {
  std::vector<int64_t> out(static_cast<size_t>(taiji_peer_size(peer)), -1);
  taiji_op_options_t opt = op_options(kOpMs);
  failures.expect_status(rank, std::string("allgather ") + name,
                         taiji_allgather(peer, name, &value, out.data(), 1, TAIJI_I64, &opt, nullptr),
                         TAIJI_OK);
  return out;
}

std::string list(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return "[" + s + "]";
}

// Checks the child's size and, through an allgather of parent ranks, its rank order.
void expect_members(taiji_peer_t* child, const std::vector<int64_t>& members, Failures& failures, int rank,
                    const std::string& what) {
  if (!failures.expect(rank, child != nullptr, what + ": no child")) return;
  failures.expect(rank, taiji_peer_size(child) == static_cast<int>(members.size()),
                  what + ": child size " + std::to_string(taiji_peer_size(child)));
  const std::vector<int64_t> got = gather(child, "members", rank, failures, rank);
  failures.expect(rank, got == members, what + ": child ranks hold parent ranks " + list(got) + ", want " +
                                            list(members));
  failures.expect(rank, taiji_peer_rank(child) >= 0 && got[static_cast<size_t>(taiji_peer_rank(child))] == rank,
                  what + ": child rank " + std::to_string(taiji_peer_rank(child)));
}

void finalize_and_destroy(taiji_peer_t* child, Failures& failures, int rank, const std::string& what) {
  if (child == nullptr) return;
  failures.expect_status(rank, what + " finalize", taiji_peer_finalize(child), TAIJI_OK);
  taiji_peer_destroy(child);
}

int threads_in_process() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

}  // namespace

TEST_CASE("split: even and odd ranks form children whose collectives sum their members only", "[split]") {
  for (int n : {4, 3}) {
    Failures failures;
    failures.add_all(run_peers(n, [&](taiji_peer_t* peer, int rank) {
      taiji_peer_t* child = split(peer, rank % 2, rank, failures, rank, "split");
      std::vector<int64_t> members;
      int64_t want = 0;
      for (int r = rank % 2; r < n; r += 2) {
        members.push_back(r);
        want += 100 + r;
      }
      expect_members(child, members, failures, rank, "even/odd");
      if (child != nullptr) {
        failures.expect(rank, taiji_peer_rank(child) == rank / 2,
                        "child rank " + std::to_string(taiji_peer_rank(child)));
        const int64_t got = sum(child, "sum", 100 + rank, failures, rank);
        failures.expect(rank, got == want, "child sum " + std::to_string(got) + ", want " + std::to_string(want));
      }
      finalize_and_destroy(child, failures, rank, "child");
    }));
    INFO("n = " << n);
    check_no_failures(failures);
  }
}

TEST_CASE("split: child ranks follow the key, then the parent rank", "[split]") {
  constexpr int n = 4;
  Failures failures;
  failures.add_all(run_peers(n, [&](taiji_peer_t* peer, int rank) {
    // key = -rank reverses the order.
    taiji_peer_t* reversed = split(peer, 7, -rank, failures, rank, "reversing split");
    expect_members(reversed, {3, 2, 1, 0}, failures, rank, "key -rank");
    // Equal keys keep the parent's order between them: keys 1,1,0,0 give ranks 2,3,0,1.
    taiji_peer_t* ties = split(peer, 0, rank < 2 ? 1 : 0, failures, rank, "split with ties");
    expect_members(ties, {2, 3, 0, 1}, failures, rank, "equal keys");
    finalize_and_destroy(ties, failures, rank, "ties child");
    finalize_and_destroy(reversed, failures, rank, "reversed child");
  }));
  check_no_failures(failures);
}

TEST_CASE("split: a rank passing a negative color takes part and gets no child", "[split]") {
  for (int n : {4, 3}) {
    Failures failures;
    failures.add_all(run_peers(n, [&](taiji_peer_t* peer, int rank) {
      const bool out = rank == 1;
      taiji_peer_t* child = split(peer, out ? -5 : 3, 0, failures, rank, "split");
      if (out) {
        failures.expect(rank, child == nullptr, "a negative color got a child");
        return;
      }
      std::vector<int64_t> members;
      for (int r = 0; r < n; ++r) {
        if (r != 1) members.push_back(r);
      }
      expect_members(child, members, failures, rank, "without rank 1");
      finalize_and_destroy(child, failures, rank, "child");
    }));
    INFO("n = " << n);
    check_no_failures(failures);
  }
}

TEST_CASE("split: parent and child ops under the same names do not meet", "[split]") {
  constexpr int n = 4;
  constexpr int rounds = 5;
  Failures failures;
  failures.add_all(run_peers(n, [&](taiji_peer_t* peer, int rank) {
    taiji_peer_t* child = split(peer, rank / 2, rank, failures, rank, "split");
    if (child == nullptr) return;
    const int base = rank / 2 * 2;  // the child holds parent ranks base and base + 1
    for (int k = 0; k < rounds; ++k) {
      int64_t in_parent = 1000 * k + rank, in_child = 10 * k + rank;
      int64_t out_parent = -1, out_child = -1;
      taiji_request_t* on_parent = nullptr;
      taiji_request_t* on_child = nullptr;
      taiji_op_options_t opt = op_options(kOpMs);
      // The two ops are in flight together; even ranks post the parent's first.
      auto post_parent = [&] {
        return taiji_allreduce(peer, "x", &in_parent, &out_parent, 1, TAIJI_I64, TAIJI_SUM, &opt, &on_parent);
      };
      auto post_child = [&] {
        return taiji_allreduce(child, "x", &in_child, &out_child, 1, TAIJI_I64, TAIJI_SUM, &opt, &on_child);
      };
      if (rank % 2 == 0) {
        failures.expect_status(rank, "post on parent", post_parent(), TAIJI_OK);
        failures.expect_status(rank, "post on child", post_child(), TAIJI_OK);
      } else {
        failures.expect_status(rank, "post on child", post_child(), TAIJI_OK);
        failures.expect_status(rank, "post on parent", post_parent(), TAIJI_OK);
      }
      if (on_child != nullptr) {
        failures.expect_status(rank, "child x", wait_bounded(child, on_child, 30000, failures, rank, "child x"),
                               TAIJI_OK);
      }
      if (on_parent != nullptr) {
        failures.expect_status(rank, "parent x",
                               wait_bounded(peer, on_parent, 30000, failures, rank, "parent x"), TAIJI_OK);
      }
      if (on_parent != nullptr && on_child != nullptr) {
        failures.expect(rank, taiji_request_version(on_parent) == static_cast<uint64_t>(k + 1) &&
                                  taiji_request_version(on_child) == static_cast<uint64_t>(k + 1),
                        "versions count per peer");
      }
      taiji_request_free(on_parent);
      taiji_request_free(on_child);
      const int64_t want_parent = 1000 * k * n + (0 + 1 + 2 + 3);
      const int64_t want_child = 10 * k * 2 + base + base + 1;
      failures.expect(rank, out_parent == want_parent,
                      "round " + std::to_string(k) + ": parent sum " + std::to_string(out_parent) + ", want " +
                          std::to_string(want_parent));
      failures.expect(rank, out_child == want_child,
                      "round " + std::to_string(k) + ": child sum " + std::to_string(out_child) + ", want " +
                          std::to_string(want_child));
    }
    finalize_and_destroy(child, failures, rank, "child");
  }));
  check_no_failures(failures);
}

TEST_CASE("split: successive splits, children of one, and a split of a child", "[split]") {
  for (int n : {4, 3}) {
    Failures failures;
    failures.add_all(run_peers(n, [&](taiji_peer_t* peer, int rank) {
      // Two children of the same parent live at once.
      taiji_peer_t* halves = split(peer, rank < n / 2 ? 0 : 1, rank, failures, rank, "first split");
      taiji_peer_t* all = split(peer, 0, rank, failures, rank, "second split");
      std::vector<int64_t> everyone;
      for (int r = 0; r < n; ++r) everyone.push_back(r);
      expect_members(all, everyone, failures, rank, "second split");
      std::vector<int64_t> half;
      for (int r = 0; r < n; ++r) {
        if ((r < n / 2) == (rank < n / 2)) half.push_back(r);
      }
      expect_members(halves, half, failures, rank, "first split");
      // Every rank its own child: a job of one.
      taiji_peer_t* alone = split(peer, rank, 0, failures, rank, "split into ones");
      expect_members(alone, {rank}, failures, rank, "a child of one");
      if (alone != nullptr) {
        failures.expect(rank, sum(alone, "sum", 41 + rank, failures, rank) == 41 + rank, "sum over one rank");
      }
      // A grandchild: the second split's child split by parity again.
      taiji_peer_t* grandchild = nullptr;
      if (all != nullptr) {
        grandchild = split(all, taiji_peer_rank(all) % 2, 0, failures, rank, "split of a child");
        std::vector<int64_t> parity;
        for (int r = rank % 2; r < n; r += 2) parity.push_back(r);
        expect_members(grandchild, parity, failures, rank, "grandchild");
        if (grandchild != nullptr) {
          int64_t want = 0;
          for (int64_t r : parity) want += r;
          failures.expect(rank, sum(grandchild, "sum", rank, failures, rank) == want, "grandchild sum");
        }
      }
      // Children first, then (in the harness) the parent.
      finalize_and_destroy(grandchild, failures, rank, "grandchild");
      finalize_and_destroy(alone, failures, rank, "child of one");
      finalize_and_destroy(all, failures, rank, "second child");
      finalize_and_destroy(halves, failures, rank, "first child");
    }));
    INFO("n = " << n);
    check_no_failures(failures);
  }
}

TEST_CASE("split: a one-peer job splits into a child of one or none", "[split]") {
  Failures failures;
  failures.add_all(run_peers(1, [&](taiji_peer_t* peer, int rank) {
    taiji_peer_t* child = split(peer, 0, 0, failures, rank, "split");
    expect_members(child, {0}, failures, rank, "child");
    finalize_and_destroy(child, failures, rank, "child");
    failures.expect(rank, split(peer, -1, 0, failures, rank, "split out") == nullptr, "negative color");
    failures.expect_status(rank, "finalize", taiji_peer_finalize(peer), TAIJI_OK);
    split(peer, 0, 0, failures, rank, "split after finalize", TAIJI_ERR_FINALIZED);
  }));
  check_no_failures(failures);
}

TEST_CASE("split: a parent job id at the length cap still gives children a valid one", "[split]") {
  constexpr int n = 2;
  static const std::string long_id(256, 'j');  // the default TAIJI_MAX_NAME_LEN
  PeerOptions options;
  options.configure = [](int, taiji_config_t& cfg) { cfg.job_id = long_id.c_str(); };
  Failures failures;
  failures.add_all(run_peers(n, [&](taiji_peer_t* peer, int rank) {
    taiji_peer_t* child = split(peer, 0, 0, failures, rank, "split");
    expect_members(child, {0, 1}, failures, rank, "child");
    taiji_peer_t* grandchild = child ? split(child, 0, -rank, failures, rank, "split of the child") : nullptr;
    expect_members(grandchild, {1, 0}, failures, rank, "grandchild");
    finalize_and_destroy(grandchild, failures, rank, "grandchild");
    finalize_and_destroy(child, failures, rank, "child");
  }, options));
  check_no_failures(failures);
}

namespace {

// The digest of the topology an allreduce of one i64 runs on.
uint64_t allreduce_digest(taiji_peer_t* peer, Failures& failures, int rank, const std::string& what) {
  int64_t in = rank, out = -1;
  taiji_request_t* req = nullptr;
  taiji_op_options_t opt = op_options(kOpMs);
  if (!failures.expect_status(rank, what + " post",
                              taiji_allreduce(peer, "digest", &in, &out, 1, TAIJI_I64, TAIJI_SUM, &opt, &req),
                              TAIJI_OK)) {
    return 0;
  }
  failures.expect_status(rank, what, wait_bounded(peer, req, 30000, failures, rank, what), TAIJI_OK);
  const uint64_t digest = taiji_request_topology_digest(req);
  taiji_request_free(req);
  return digest;
}

uint64_t digest_of(taiji_peer_t* peer, const char* name) {
  taiji_topology_t* t = nullptr;
  if (taiji_topology_from_text(peer, name, 0, &t) != TAIJI_OK) return 0;
  const uint64_t d = taiji_topology_digest(t);
  taiji_topology_destroy(t);
  return d;
}

}  // namespace

TEST_CASE("split: the child takes the parent's settings and built-in topology", "[split]") {
  constexpr int n = 4;
  std::vector<taiji_config_t> configs(n);
  PeerOptions options;
  options.topology = "star";
  options.configure = [&](int rank, taiji_config_t& cfg) {
    taiji_config_set(&cfg, "TAIJI_MAX_NAME_LEN", "64");
    configs[static_cast<size_t>(rank)] = cfg;  // shares the settings, cleared after init
  };
  Failures failures;
  failures.add_all(run_peers(n, [&](taiji_peer_t* peer, int rank) {
    taiji_config_clear(&configs[static_cast<size_t>(rank)]);
    taiji_peer_t* child = split(peer, rank % 2, rank, failures, rank, "split");
    if (child == nullptr) return;
    const uint64_t star = digest_of(child, "star");
    failures.expect(rank, star != 0 && star != digest_of(child, "clique"), "star and clique differ on 2 ranks");
    failures.expect(rank, allreduce_digest(child, failures, rank, "child op") == star, "the child runs on star");
    int64_t in = 1, out = -1;
    taiji_op_options_t opt = op_options(kOpMs);
    const std::string longest(64, 'n'), too_long(65, 'n');
    failures.expect_status(rank, "a 64-byte name",
                           taiji_allreduce(child, longest.c_str(), &in, &out, 1, TAIJI_I64, TAIJI_SUM, &opt, nullptr),
                           TAIJI_OK);
    failures.expect_status(rank, "a 65-byte name",
                           taiji_allreduce(child, too_long.c_str(), &in, &out, 1, TAIJI_I64, TAIJI_SUM, &opt, nullptr),
                           TAIJI_ERR_INVALID_ARGUMENT);
    finalize_and_destroy(child, failures, rank, "child");
  }, options));
  check_no_failures(failures);
}

TEST_CASE("split: a parent on an explicit graph gives children the automatic choice", "[split]") {
  constexpr int n = 4;
  // A star rooted at rank 2, as text: a graph over exactly four ranks.
  const int parents[n] = {2, 2, -1, 2};
  taiji_topology_t* graph = nullptr;
  REQUIRE(taiji_topology_from_parents(n, 1, parents, parents, &graph) == TAIJI_OK);
  std::string text(taiji_topology_text(graph, nullptr, 0), '\0');
  taiji_topology_text(graph, text.data(), text.size() + 1);
  const uint64_t graph_digest = taiji_topology_digest(graph);
  taiji_topology_destroy(graph);
  PeerOptions options;
  options.topology = text.c_str();
  Failures failures;
  failures.add_all(run_peers(n, [&](taiji_peer_t* peer, int rank) {
    failures.expect(rank, allreduce_digest(peer, failures, rank, "parent op") == graph_digest,
                    "the parent runs on its graph");
    taiji_peer_t* child = split(peer, rank % 2, rank, failures, rank, "split");
    if (child == nullptr) return;
    // One element on two ranks: the automatic choice is a clique (topology/selection.h).
    failures.expect(rank, allreduce_digest(child, failures, rank, "child op") == digest_of(child, "clique"),
                    "the child chooses by size");
    finalize_and_destroy(child, failures, rank, "child");
  }, options));
  check_no_failures(failures);
}

namespace {

struct FromCallback {
  taiji_peer_t* peer = nullptr;
  std::atomic<int> status{1000};
  std::atomic<bool> child_null{false};
};

void split_in_callback(taiji_status_t, void* user_data) {
  auto* f = static_cast<FromCallback*>(user_data);
  taiji_peer_t* child = reinterpret_cast<taiji_peer_t*>(f);
  const taiji_status_t s = taiji_peer_split(f->peer, 0, 0, nullptr, &child);
  f->child_null = child == nullptr;
  f->status = s;
}

}  // namespace

TEST_CASE("split: misuse fails at once with ERR_INVALID_ARGUMENT and loses nothing", "[split]") {
  constexpr int n = 2;
  taiji_peer_t* dummy = nullptr;
  CHECK(taiji_peer_split(nullptr, 0, 0, nullptr, &dummy) == TAIJI_ERR_INVALID_ARGUMENT);
  CHECK(dummy == nullptr);
  Failures failures;
  failures.add_all(run_peers(n, [&](taiji_peer_t* peer, int rank) {
    failures.expect_status(rank, "NULL child", taiji_peer_split(peer, 0, 0, nullptr, nullptr),
                           TAIJI_ERR_INVALID_ARGUMENT);
    failures.expect(rank, std::string(taiji_peer_last_error(peer)).find("NULL") != std::string::npos,
                    std::string("NULL child error text: ") + taiji_peer_last_error(peer));
    taiji_op_options_t negative = op_options(-1);
    taiji_peer_t* child = peer;
    failures.expect_status(rank, "negative timeout", taiji_peer_split(peer, 0, 0, &negative, &child),
                           TAIJI_ERR_INVALID_ARGUMENT);
    failures.expect(rank, child == nullptr, "*child after a negative timeout");
    taiji_op_options_t bad_size = op_options();
    bad_size.struct_size = 0;
    failures.expect_status(rank, "unset struct_size", taiji_peer_split(peer, 0, 0, &bad_size, &child),
                           TAIJI_ERR_INVALID_ARGUMENT);
    // Inside a group.
    failures.expect_status(rank, "group_start", taiji_group_start(peer), TAIJI_OK);
    child = peer;
    failures.expect_status(rank, "split in a group", taiji_peer_split(peer, 0, 0, nullptr, &child),
                           TAIJI_ERR_INVALID_ARGUMENT);
    failures.expect(rank, child == nullptr, "*child after a split in a group");
    failures.expect_status(rank, "group_end", taiji_group_end(peer), TAIJI_OK);
    // From a completion callback.
    FromCallback f;
    f.peer = peer;
    taiji_op_options_t opt = op_options(kOpMs);
    opt.callback = split_in_callback;
    opt.user_data = &f;
    taiji_request_t* req = nullptr;
    failures.expect_status(rank, "post barrier", taiji_barrier(peer, "b", &opt, &req), TAIJI_OK);
    if (req != nullptr) {
      failures.expect_status(rank, "barrier", wait_bounded(peer, req, 30000, failures, rank, "barrier"), TAIJI_OK);
      taiji_request_free(req);
      const auto until = Clock::now() + std::chrono::seconds(10);
      while (f.status == 1000 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      failures.expect(rank, f.status == TAIJI_ERR_INVALID_ARGUMENT,
                      "split from a callback: " + status_text(static_cast<taiji_status_t>(f.status.load())));
      failures.expect(rank, f.child_null, "*child after a split from a callback");
    }
    // None of it counted: the next split is the first on every rank and works.
    taiji_peer_t* good = split(peer, 0, 0, failures, rank, "split after misuse");
    expect_members(good, {0, 1}, failures, rank, "after misuse");
    finalize_and_destroy(good, failures, rank, "child");
  }));
  check_no_failures(failures);
}

TEST_CASE("split: when one rank never calls, the others time out with nothing left running", "[split]") {
  constexpr int n = 4;
  constexpr int64_t kTimeoutMs = 1500;
  Failures failures;
  std::atomic<int> threads_before{-1}, threads_after{-1};
  failures.add_all(run_peers(n, [&](taiji_peer_t* peer, int rank) {
    taiji_op_options_t opt = op_options(kOpMs);
    failures.expect_status(rank, "barrier before", taiji_barrier(peer, "before", &opt, nullptr), TAIJI_OK);
    if (rank == 0) threads_before = threads_in_process();
    failures.expect_status(rank, "barrier counted", taiji_barrier(peer, "counted", &opt, nullptr), TAIJI_OK);
    if (rank != 3) {
      const auto start = Clock::now();
      split(peer, 0, rank, failures, rank, "split without rank 3", TAIJI_ERR_TIMEOUT, kTimeoutMs);
      const double took = ms_since(start);
      failures.expect(rank, took >= kTimeoutMs - 50 && took < kTimeoutMs + 3000,
                      "the split failed after " + std::to_string(took) + " ms");
    }
    // The parent is as it was: every rank, rank 3 too, still runs collectives on it.
    const int64_t got = sum(peer, "after", rank + 1, failures, rank);
    failures.expect(rank, got == 10, "parent sum after the failed split: " + std::to_string(got));
    if (rank == 0) threads_after = threads_in_process();
    failures.expect_status(rank, "barrier after", taiji_barrier(peer, "after", &opt, nullptr), TAIJI_OK);
  }));
  check_no_failures(failures);
  INFO("threads before " << threads_before.load() << ", after " << threads_after.load());
  CHECK(threads_before.load() > 0);
  CHECK(threads_after.load() == threads_before.load());
}

TEST_CASE("split: a child outlives its destroyed parent and keeps working", "[split]") {
  constexpr int n = 4;
  Failures failures;
  std::vector<taiji_peer_t*> children(n, nullptr);
  failures.add_all(run_peers(n, [&](taiji_peer_t* peer, int rank) {
    children[static_cast<size_t>(rank)] = split(peer, rank % 2, rank, failures, rank, "split");
  }));
  // The harness has finalized and destroyed every parent; the children run on.
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      taiji_peer_t* child = children[static_cast<size_t>(rank)];
      if (child == nullptr) return;
      const int64_t want = rank % 2 == 0 ? 0 + 2 : 1 + 3;
      const int64_t got = sum(child, "orphan", rank, failures, rank);
      failures.expect(rank, got == want, "orphaned child sum " + std::to_string(got));
      finalize_and_destroy(child, failures, rank, "orphaned child");
    });
  }
  for (auto& t : threads) t.join();
  check_no_failures(failures);
}
