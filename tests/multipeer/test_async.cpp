// Asynchronous use: ops matched by name whatever order peers post and wait in, automatic
// versions of a reused name, several caller threads per peer, completion callbacks, and
// request_test / request_wait semantics.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "harness.h"

namespace {

using namespace taiji_test;


enum class Kind { Allreduce, Broadcast, Barrier };

struct AsyncOp {
  std::string name;
  Kind kind = Kind::Allreduce;
  ReduceCase rc;   // allreduce: dtype, op, count, salt; broadcast: dtype, count, salt
  int root = 0;
};

std::vector<AsyncOp> mixed_ops(int n, int count, const std::string& prefix) {
  std::vector<AsyncOp> ops;
  for (int k = 0; k < count; ++k) {
    AsyncOp o;
    o.name = prefix + std::to_string(k);
    o.kind = k % 8 == 7 ? Kind::Barrier : k % 8 == 3 ? Kind::Broadcast : Kind::Allreduce;
    o.rc.dtype = kAllDtypes[k % 10];
    o.rc.op = kAllOps[(k / 2) % 5];
    // Every fourth op is big enough to exceed the eager limit and wait for Ready.
    o.rc.count = k % 4 == 0 ? 40009 : static_cast<size_t>(1 + k * 13);
    if (o.kind == Kind::Broadcast) o.rc.count = k % 16 == 3 ? 100003 : 17;
    o.rc.salt = salt_of(o.name);
    o.root = k % n;
    ops.push_back(o);
  }
  return ops;
}

// Buffers of one posted op on one rank.
struct OpBuffers {
  std::unique_ptr<GuardedBuffer> in;
  std::unique_ptr<GuardedBuffer> out;
  std::vector<uint8_t> expected;  // broadcast
};

OpBuffers prepare(const AsyncOp& o, int rank) {
  OpBuffers b;
  const size_t bytes = o.rc.count * dtype_size(o.rc.dtype);
  if (o.kind == Kind::Allreduce) {
    b.in = std::make_unique<GuardedBuffer>(bytes);
    b.out = std::make_unique<GuardedBuffer>(bytes);
    fill_input(o.rc, rank, b.in->data());
  } else if (o.kind == Kind::Broadcast) {
    b.out = std::make_unique<GuardedBuffer>(bytes, 0xEE);
    b.expected.resize(bytes);
    fill_bytes(o.rc.salt, b.expected.data(), bytes);
    if (rank == o.root && bytes > 0) std::memcpy(b.out->data(), b.expected.data(), bytes);
  }
  return b;
}

taiji_status_t post(taiji_peer_t* peer, const AsyncOp& o, OpBuffers& b,
                    const taiji_op_options_t* opt, taiji_request_t** req) {
  switch (o.kind) {
    case Kind::Allreduce:
      return taiji_allreduce(peer, o.name.c_str(), b.in->data(), b.out->data(), o.rc.count,
                             o.rc.dtype, o.rc.op, opt, req);
    case Kind::Broadcast:
      return taiji_broadcast(peer, o.name.c_str(), b.out->data(), o.rc.count, o.rc.dtype, o.root,
                             opt, req);
    case Kind::Barrier:
      return taiji_barrier(peer, o.name.c_str(), opt, req);
  }
  return TAIJI_ERR_INTERNAL;
}

void verify(const AsyncOp& o, OpBuffers& b, int n, int rank, Failures& failures) {
  if (o.kind == Kind::Barrier) return;
  failures.expect(rank, b.out->guard_intact(), o.name + ": wrote past the buffer");
  if (o.kind == Kind::Allreduce) {
    std::string err = check_reduce(o.rc, n, b.out->data());
    if (!err.empty()) failures.add(rank, o.name + ": " + err);
  } else if (!b.expected.empty() &&
             std::memcmp(b.out->data(), b.expected.data(), b.expected.size()) != 0) {
    failures.add(rank, o.name + ": broadcast buffer differs from the root's");
  }
}

}  // namespace

TEST_CASE("async: 64 ops posted and waited in a different order on every peer", "[async]") {
  const int n = GENERATE(4, 7);
  CAPTURE(n);
  const auto ops = mixed_ops(n, 64, "shuffled/");
  Failures failures;
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    std::vector<OpBuffers> bufs;
    for (const AsyncOp& o : ops) bufs.push_back(prepare(o, rank));
    std::vector<size_t> post_order(ops.size());
    std::iota(post_order.begin(), post_order.end(), size_t{0});
    std::vector<size_t> wait_order = post_order;
    std::mt19937 rng(1000 + rank);
    std::shuffle(post_order.begin(), post_order.end(), rng);
    std::shuffle(wait_order.begin(), wait_order.end(), rng);
    std::vector<taiji_request_t*> reqs(ops.size(), nullptr);
    taiji_op_options_t opt = op_options(30000);
    for (size_t k : post_order) {
      failures.expect_status(rank, "post " + ops[k].name, post(peer, ops[k], bufs[k], &opt, &reqs[k]),
                             TAIJI_OK);
    }
    for (size_t k : wait_order) {
      if (reqs[k] == nullptr) continue;
      taiji_status_t s = wait_bounded(peer, reqs[k], 40000, failures, rank, ops[k].name);
      if (failures.expect_status(rank, ops[k].name, s, TAIJI_OK)) verify(ops[k], bufs[k], n, rank, failures);
      failures.expect_status(rank, ops[k].name + ": test after wait", taiji_request_test(reqs[k]), s);
      failures.expect(rank, taiji_request_version(reqs[k]) == 1, ops[k].name + ": version is not 1");
      taiji_request_free(reqs[k]);
    }
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("async: one name reused 1000 times gets versions 1..1000", "[async]") {
  constexpr int n = 3;
  constexpr int kRepeats = 1000;
  Failures failures;
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    taiji_op_options_t opt = op_options();
    for (int i = 0; i < kRepeats; ++i) {
      const std::string at = " #" + std::to_string(i + 1);
      // Blocking, automatic version: inputs change every time, so an op matched with the
      // wrong version on another peer shows up as a wrong sum.
      int64_t in[4], out[4];
      for (int j = 0; j < 4; ++j) in[j] = static_cast<int64_t>(rank + 1) * (i + 1) + j * 1000003;
      taiji_status_t s = taiji_allreduce(peer, "repeat/blocking", in, out, 4, TAIJI_I64, TAIJI_SUM,
                                         &opt, nullptr);
      if (!failures.expect_status(rank, "repeat/blocking" + at, s, TAIJI_OK)) return;
      for (int j = 0; j < 4; ++j) {
        int64_t want = static_cast<int64_t>(i + 1) * n * (n + 1) / 2 + int64_t{n} * j * 1000003;
        if (out[j] != want) {
          failures.add(rank, "repeat/blocking" + at + ": element " + std::to_string(j) + " is " +
                                 std::to_string(out[j]) + ", expected " + std::to_string(want));
          return;
        }
      }
      // Asynchronous, automatic version, in place.
      double buf[3];
      for (int j = 0; j < 3; ++j) buf[j] = rank * 1000.0 + i + j;
      taiji_request_t* req = nullptr;
      s = taiji_allreduce(peer, "repeat/async", buf, buf, 3, TAIJI_F64, TAIJI_MAX, &opt, &req);
      if (!failures.expect_status(rank, "post repeat/async" + at, s, TAIJI_OK)) return;
      uint64_t version = taiji_request_version(req);
      failures.expect(rank, version == static_cast<uint64_t>(i + 1),
                      "repeat/async" + at + ": version " + std::to_string(version));
      s = wait_bounded(peer, req, 30000, failures, rank, "repeat/async" + at);
      taiji_request_free(req);
      if (!failures.expect_status(rank, "repeat/async" + at, s, TAIJI_OK)) return;
      for (int j = 0; j < 3; ++j) {
        if (buf[j] != (n - 1) * 1000.0 + i + j) {
          failures.add(rank, "repeat/async" + at + ": wrong maximum " + std::to_string(buf[j]));
          return;
        }
      }
    }
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("async: four caller threads per peer at once", "[async]") {
  constexpr int n = 4;
  constexpr int kThreads = 4;
  constexpr int kIterations = 40;
  Failures failures;
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    std::vector<std::thread> callers;
    for (int t = 0; t < kThreads; ++t) {
      callers.emplace_back([&, t] {
        const std::string prefix = "thread" + std::to_string(t) + "/";
        taiji_op_options_t opt = op_options();
        for (int i = 0; i < kIterations; ++i) {
          const std::string at = " #" + std::to_string(i + 1);
          // The same names every iteration: automatic versions per name must line up
          // across peers even though other threads post in between.
          ReduceCase rc;
          rc.dtype = kAllDtypes[(t + i) % 10];
          rc.op = kAllOps[i % 5];
          rc.count = static_cast<size_t>(64 + 97 * t + i);
          rc.salt = salt_of(prefix + std::to_string(i));
          GuardedBuffer in(rc.count * dtype_size(rc.dtype));
          GuardedBuffer out(in.size());
          fill_input(rc, rank, in.data());
          taiji_status_t s = taiji_allreduce(peer, (prefix + "ar").c_str(), in.data(), out.data(),
                                             rc.count, rc.dtype, rc.op, &opt, nullptr);
          if (failures.expect_status(rank, prefix + "ar" + at, s, TAIJI_OK)) {
            std::string err = check_reduce(rc, n, out.data());
            if (!err.empty()) failures.add(rank, prefix + "ar" + at + ": " + err);
          }
          const int root = (i + t) % n;
          std::vector<uint8_t> expected(333), buf(333, 0);
          fill_bytes(rc.salt + 1, expected.data(), expected.size());
          if (rank == root) buf = expected;
          s = taiji_broadcast(peer, (prefix + "bc").c_str(), buf.data(), buf.size(), TAIJI_U8, root,
                              &opt, nullptr);
          if (failures.expect_status(rank, prefix + "bc" + at, s, TAIJI_OK)) {
            failures.expect(rank, buf == expected, prefix + "bc" + at + ": wrong bytes");
          }
          if (i % 5 == 4) {
            failures.expect_status(rank, prefix + "bar" + at,
                                   taiji_barrier(peer, (prefix + "bar").c_str(), &opt, nullptr), TAIJI_OK);
          }
        }
      });
    }
    for (auto& c : callers) c.join();
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

namespace {

struct Chain {
  taiji_peer_t* peer = nullptr;
  CallbackLog first;
  float data[5] = {};
  std::atomic<int> post_status{1000};
  std::atomic<taiji_request_t*> second{nullptr};
};

// Posts a follow-up op from the I/O thread, as the callback contract allows.
void post_from_callback(taiji_status_t status, void* user_data) {
  auto* chain = static_cast<Chain*>(user_data);
  chain->first.status.store(status);
  taiji_op_options_t opt = op_options();
  taiji_request_t* req = nullptr;
  taiji_status_t s = taiji_allreduce(chain->peer, "callback/chained", chain->data, chain->data, 5,
                                     TAIJI_F32, TAIJI_SUM, &opt, &req);
  chain->post_status.store(s);
  if (s == TAIJI_OK) chain->second.store(req);
  chain->first.calls.fetch_add(1);
}

}  // namespace

TEST_CASE("async: completion callbacks run exactly once, with the op's status", "[async]") {
  constexpr int n = 3;
  constexpr int kOps = 16;
  Failures failures;
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    const auto ops = mixed_ops(n, kOps, "callback/");
    std::vector<OpBuffers> bufs;
    for (const AsyncOp& o : ops) bufs.push_back(prepare(o, rank));
    std::array<CallbackLog, kOps> logs;
    std::vector<taiji_request_t*> reqs(kOps, nullptr);
    for (int k = 0; k < kOps; ++k) {
      taiji_op_options_t opt = op_options();
      opt.callback = record_callback;
      opt.user_data = &logs[k];
      logs[k].waiter = std::this_thread::get_id();
      failures.expect_status(rank, "post " + ops[k].name, post(peer, ops[k], bufs[k], &opt, &reqs[k]),
                             TAIJI_OK);
    }
    for (int k = 0; k < kOps; ++k) {
      if (reqs[k] == nullptr) continue;
      taiji_status_t s = wait_bounded(peer, reqs[k], 30000, failures, rank, ops[k].name);
      taiji_request_free(reqs[k]);
      if (!failures.expect_status(rank, ops[k].name, s, TAIJI_OK)) continue;
      verify(ops[k], bufs[k], n, rank, failures);
    }
    for (int k = 0; k < kOps; ++k) {
      if (!await_calls(logs[k], 1, std::chrono::milliseconds(2000))) {
        failures.add(rank, ops[k].name + ": callback ran " + std::to_string(logs[k].calls.load()) +
                               " times, expected once");
      } else {
        failures.expect_status(rank, ops[k].name + ": callback status",
                               static_cast<taiji_status_t>(logs[k].status.load()), TAIJI_OK);
        // The I/O thread's, even when the waiting caller ran the loop that completed it.
        failures.expect(rank, logs[k].on_waiter == 0, ops[k].name + ": callback ran on the waiting thread");
      }
    }

    // A request freed before its op completes: the op goes on and the callback still runs.
    CallbackLog freed_log;
    std::vector<int32_t> in(1000, rank + 1), out(1000, 0);
    taiji_op_options_t opt = op_options();
    opt.callback = record_callback;
    opt.user_data = &freed_log;
    taiji_request_t* req = nullptr;
    if (failures.expect_status(rank, "post callback/freed",
                               taiji_allreduce(peer, "callback/freed", in.data(), out.data(), in.size(),
                                               TAIJI_I32, TAIJI_SUM, &opt, &req),
                               TAIJI_OK)) {
      taiji_request_free(req);
      if (!await_calls(freed_log, 1, std::chrono::milliseconds(20000))) {
        failures.add(rank, "callback/freed: callback ran " + std::to_string(freed_log.calls.load()) +
                               " times after its request was freed, expected once");
        // Its buffers may still be in use: make sure the op ends before they go away.
        taiji_peer_abort(peer);
        std::this_thread::sleep_for(std::chrono::seconds(1));
      } else {
        failures.expect_status(rank, "callback/freed: status",
                               static_cast<taiji_status_t>(freed_log.status.load()), TAIJI_OK);
        failures.expect(rank, out == std::vector<int32_t>(1000, n * (n + 1) / 2),
                        "callback/freed: wrong sum");
      }
    }
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("async: a callback may post a new op", "[async]") {
  constexpr int n = 2;
  Failures failures;
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    Chain chain;
    chain.peer = peer;
    for (int j = 0; j < 5; ++j) chain.data[j] = static_cast<float>(rank + j);
    taiji_op_options_t opt = op_options();
    opt.callback = post_from_callback;
    opt.user_data = &chain;
    taiji_request_t* req = nullptr;
    int32_t v = rank + 1;
    if (!failures.expect_status(rank, "post callback/first",
                                taiji_allreduce(peer, "callback/first", &v, &v, 1, TAIJI_I32, TAIJI_SUM,
                                                &opt, &req),
                                TAIJI_OK)) {
      return;
    }
    taiji_status_t s = wait_bounded(peer, req, 20000, failures, rank, "callback/first");
    taiji_request_free(req);
    failures.expect_status(rank, "callback/first", s, TAIJI_OK);
    failures.expect(rank, v == 3, "callback/first: wrong sum");
    if (!await_calls(chain.first, 1, std::chrono::milliseconds(5000))) {
      failures.add(rank, "callback/first: callback ran " + std::to_string(chain.first.calls.load()) + " times");
      taiji_peer_abort(peer);
      std::this_thread::sleep_for(std::chrono::seconds(1));
      return;
    }
    if (!failures.expect_status(rank, "post from callback",
                                static_cast<taiji_status_t>(chain.post_status.load()), TAIJI_OK)) {
      return;
    }
    taiji_request_t* second = chain.second.load();
    s = wait_bounded(peer, second, 20000, failures, rank, "callback/chained");
    taiji_request_free(second);
    if (failures.expect_status(rank, "callback/chained", s, TAIJI_OK)) {
      for (int j = 0; j < 5; ++j) {
        failures.expect(rank, chain.data[j] == static_cast<float>(1 + 2 * j), "callback/chained: wrong sum");
      }
    }
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("async: request_test and request_wait while a peer is late", "[async]") {
  constexpr int n = 2;
  Failures failures;
  std::atomic<bool> rank0_checked{false};
  std::array<taiji_request_t*, n> kept{};
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    int64_t v = 10 * (rank + 1);
    taiji_op_options_t opt = op_options();
    taiji_request_t* req = nullptr;
    if (rank == 1) {
      // Post only once rank 0 has seen its op in progress, and then 300 ms later still.
      auto deadline = Clock::now() + std::chrono::seconds(10);
      while (!rank0_checked.load() && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    if (!failures.expect_status(rank, "post late/op",
                                taiji_allreduce(peer, "late/op", &v, &v, 1, TAIJI_I64, TAIJI_SUM, &opt, &req),
                                TAIJI_OK)) {
      rank0_checked.store(true);
      return;
    }
    if (rank == 0) {
      failures.expect_status(rank, "test right after posting", taiji_request_test(req), TAIJI_IN_PROGRESS);
      failures.expect_status(rank, "wait(0) before the partner posts", taiji_request_wait(req, 0),
                             TAIJI_IN_PROGRESS);
      auto start = Clock::now();
      failures.expect_status(rank, "wait(100) before the partner posts", taiji_request_wait(req, 100),
                             TAIJI_IN_PROGRESS);
      double waited = ms_since(start);
      failures.expect(rank, waited >= 90, "wait(100) returned after " + std::to_string(waited) + " ms");
      failures.expect_status(rank, "test before the partner posts", taiji_request_test(req), TAIJI_IN_PROGRESS);
      rank0_checked.store(true);
      // Several threads may wait on one request; all see the final status.
      std::vector<std::thread> waiters;
      std::array<std::atomic<int>, 3> seen{};
      for (int w = 0; w < 3; ++w) {
        waiters.emplace_back([&, w] { seen[w].store(taiji_request_wait(req, 20000)); });
      }
      for (auto& t : waiters) t.join();
      for (int w = 0; w < 3; ++w) {
        failures.expect_status(rank, "waiter thread " + std::to_string(w),
                               static_cast<taiji_status_t>(seen[w].load()), TAIJI_OK);
      }
    }
    taiji_status_t s = wait_bounded(peer, req, 20000, failures, rank, "late/op");
    failures.expect_status(rank, "late/op", s, TAIJI_OK);
    failures.expect(rank, v == 30, "late/op: wrong sum " + std::to_string(v));
    failures.expect_status(rank, "test after completion", taiji_request_test(req), TAIJI_OK);
    failures.expect_status(rank, "wait(0) after completion", taiji_request_wait(req, 0), TAIJI_OK);
    kept[rank] = req;
  });
  failures.add_all(lines);
  // Requests stay valid after their peer is destroyed, until freed.
  for (int r = 0; r < n; ++r) {
    if (kept[r] == nullptr) continue;
    failures.expect_status(r, "test after the peer was destroyed", taiji_request_test(kept[r]), TAIJI_OK);
    failures.expect_status(r, "wait after the peer was destroyed", taiji_request_wait(kept[r], 0), TAIJI_OK);
    failures.expect(r, taiji_request_version(kept[r]) == 1, "version after the peer was destroyed");
    taiji_request_free(kept[r]);
  }
  check_no_failures(failures);
}
