// The hierarchical device allreduce (runtime/device_hierarchy.h) inside real peers, threads
// of this process over the fake device runtime, with host labels making several "hosts":
// the result is the plain allreduce's, bit for bit, whatever order ranks post in; the
// device runs reduces and broadcasts (the exchange between hosts is on the host backend);
// one host falls back to the plain allreduce; a disagreement fails every rank in time.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "fake_peers.h"

using namespace taiji;
using taiji_test::FakeInstalled;
using taiji_test::PeerFailures;
using taiji_test::wait_request;

namespace {

using Clock = std::chrono::steady_clock;

PostArgs allreduce(const std::string& name, const void* send, void* recv, uint64_t count, DType dtype,
                   RedOp redop, bool hierarchical, int64_t timeout_ms = 0) {
  PostArgs a;
  a.kind = OpKind::Allreduce;
  a.name = name;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.dtype = dtype;
  a.redop = redop;
  a.memory = 2;  // TAIJI_MEMORY_DEVICE
  a.timeout_ms = timeout_ms;
  if (hierarchical) a.topology = "hierarchical";
  return a;
}

Status wait(const std::shared_ptr<RequestState>& req, int64_t ms = 30000) { return wait_request(req, ms); }

size_t count_kind(const std::vector<taiji_test::LaunchedOp>& ops, OpKind kind) {
  return static_cast<size_t>(std::count_if(ops.begin(), ops.end(), [kind](const auto& o) { return o.kind == kind; }));
}

// One case of an op: its dtype and reduction, and rank r's input element j.
struct Case {
  const char* name;
  DType dtype;
  RedOp redop;
};
const Case kCases[] = {{"f32sum", DType::F32, RedOp::Sum},
                       {"i32sum", DType::I32, RedOp::Sum},
                       {"f32max", DType::F32, RedOp::Max},
                       {"i32max", DType::I32, RedOp::Max},
                       {"f32avg", DType::F32, RedOp::Avg}};
constexpr int kCaseCount = sizeof(kCases) / sizeof(kCases[0]);

void fill(const Case& c, int r, int round, void* buf, uint64_t count) {
  for (uint64_t j = 0; j < count; ++j) {
    // Small integers (exact in f32, any order of summing); max varies the winning rank.
    const int v = static_cast<int>((r * 7 + static_cast<int>(j) * 3 + round) % 11) - 3;
    if (c.dtype == DType::F32) {
      static_cast<float*>(buf)[j] = static_cast<float>(v);
    } else {
      static_cast<int32_t*>(buf)[j] = v;
    }
  }
}

// Every rank posts, per round, each case hierarchically and plainly (names differ per
// round; the order is shuffled per rank), and checks the two results are the same bytes.
void check_hierarchical(const std::vector<std::string>& hosts, const std::string& job) {
  FakeInstalled installed;
  auto& fake = *installed.fake;
  constexpr uint64_t kCount = 37;
  constexpr int kRounds = 3;
  PeerFailures failures;
  taiji_test::run_fake_peers(hosts, job, [&](int r, Peer& peer, PeerFailures& f) {
    for (int round = 0; round < kRounds; ++round) {
      struct Slot {
        void* send;
        void* hier;
        void* plain;
        std::shared_ptr<RequestState> hreq, preq;
      };
      std::vector<Slot> slots(kCaseCount);
      for (int i = 0; i < kCaseCount; ++i) {
        slots[i].send = fake.alloc(kCount * 4);
        slots[i].hier = fake.alloc(kCount * 4);
        slots[i].plain = fake.alloc(kCount * 4);
        fill(kCases[i], r, round, slots[i].send, kCount);
      }
      // 2 posts per case: even = hierarchical, odd = plain.
      std::vector<int> order(2 * kCaseCount);
      for (int i = 0; i < 2 * kCaseCount; ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), std::mt19937(1000 * round + r));
      for (int k : order) {
        const int i = k / 2;
        const bool h = k % 2 == 0;
        const std::string name = std::string(kCases[i].name) + ".r" + std::to_string(round) + (h ? ".h" : ".p");
        auto req = peer.post(allreduce(name, slots[i].send, h ? slots[i].hier : slots[i].plain, kCount,
                                       kCases[i].dtype, kCases[i].redop, h));
        if (!req.is_ok()) return f.add(r, "post " + name + ": " + req.status().message());
        (h ? slots[i].hreq : slots[i].preq) = req.value();
      }
      for (int i = 0; i < kCaseCount; ++i) {
        Status hs = wait(slots[i].hreq);
        Status ps = wait(slots[i].preq);
        if (!hs.is_ok()) f.add(r, std::string(kCases[i].name) + " hierarchical: " + hs.message());
        if (!ps.is_ok()) f.add(r, std::string(kCases[i].name) + " plain: " + ps.message());
        if (hs.is_ok() && ps.is_ok() && std::memcmp(slots[i].hier, slots[i].plain, kCount * 4) != 0) {
          f.add(r, std::string(kCases[i].name) + " round " + std::to_string(round) +
                       ": the hierarchical result differs from the plain one");
        }
        // And against the host's own arithmetic, for one element.
        const uint64_t j = 5;
        double expect = kCases[i].redop == RedOp::Max ? -1e9 : 0;
        for (int q = 0; q < static_cast<int>(hosts.size()); ++q) {
          const int v = static_cast<int>((q * 7 + static_cast<int>(j) * 3 + round) % 11) - 3;
          expect = kCases[i].redop == RedOp::Max ? std::max<double>(expect, v) : expect + v;
        }
        if (kCases[i].redop == RedOp::Avg) expect /= static_cast<double>(hosts.size());
        const double got = kCases[i].dtype == DType::F32 ? static_cast<float*>(slots[i].hier)[j]
                                                         : static_cast<int32_t*>(slots[i].hier)[j];
        if (hs.is_ok() && kCases[i].dtype == DType::F32 && static_cast<float>(expect) != static_cast<float>(got)) {
          f.add(r, std::string(kCases[i].name) + ": " + std::to_string(got) + ", not " + std::to_string(expect));
        }
        if (hs.is_ok() && kCases[i].dtype == DType::I32 && static_cast<int32_t>(expect) != static_cast<int32_t>(got)) {
          f.add(r, std::string(kCases[i].name) + ": " + std::to_string(got) + ", not " + std::to_string(expect));
        }
      }
      for (Slot& s : slots) {
        fake.release(s.send);
        fake.release(s.hier);
        fake.release(s.plain);
      }
    }
  }, failures);
  failures.check();
  INFO(fake.violation_text());
  CHECK(fake.violations() == 0);
  // The parent's world ran the plain allreduces only; the per-host worlds ran a reduce and
  // a broadcast per hierarchical op (rank 0 of each host's world is "rank 0").
  const size_t ops = static_cast<size_t>(kRounds) * kCaseCount;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) CHECK(count_kind(fake.launched(r), OpKind::Allreduce) == ops);
  auto zero = fake.launched(0);
  CHECK(count_kind(zero, OpKind::Reduce) >= ops);
  CHECK(count_kind(zero, OpKind::Broadcast) >= ops);
  // Each leader copied down and up once per op.
  CHECK(fake.copies() >= 2 * ops);
}

}  // namespace

TEST_CASE("hierarchical device allreduce: 4 ranks on 2 hosts equal the plain allreduce", "[device_hierarchy]") {
  check_hierarchical({"a", "a", "b", "b"}, "hier-4");
}

TEST_CASE("hierarchical device allreduce: 3 ranks, hosts a b a", "[device_hierarchy]") {
  check_hierarchical({"a", "b", "a"}, "hier-3");
}

TEST_CASE("hierarchical device allreduce: one host runs the plain allreduce", "[device_hierarchy]") {
  FakeInstalled installed;
  auto& fake = *installed.fake;
  constexpr uint64_t kCount = 16;
  PeerFailures failures;
  taiji_test::run_fake_peers({"a", "a", "a"}, "hier-one-host", [&](int r, Peer& peer, PeerFailures& f) {
    auto* send = static_cast<float*>(fake.alloc(kCount * 4));
    auto* recv = static_cast<float*>(fake.alloc(kCount * 4));
    for (uint64_t j = 0; j < kCount; ++j) send[j] = static_cast<float>(r + j);
    auto req = peer.post(allreduce("w", send, recv, kCount, DType::F32, RedOp::Sum, true));
    if (!req.is_ok()) return f.add(r, "post: " + req.status().message());
    Status s = wait(req.value());
    if (!s.is_ok()) return f.add(r, s.message());
    for (uint64_t j = 0; j < kCount; ++j) {
      if (recv[j] != static_cast<float>(3 + 3 * j)) return f.add(r, "wrong result at " + std::to_string(j));
    }
  }, failures);
  failures.check();
  for (int r = 0; r < 3; ++r) {
    auto ops = fake.launched(r);
    CHECK(count_kind(ops, OpKind::Allreduce) == 1);
    CHECK(count_kind(ops, OpKind::Reduce) == 0);
  }
  CHECK(fake.copies() == 0);
}

TEST_CASE("hierarchical device allreduce: a disagreement fails every rank within the deadline",
          "[device_hierarchy]") {
  FakeInstalled installed;
  auto& fake = *installed.fake;
  constexpr int64_t kTimeoutMs = 2000;
  PeerFailures failures;
  std::mutex mu;
  std::vector<Code> codes(4, Code::Ok);
  taiji_test::run_fake_peers({"a", "a", "b", "b"}, "hier-mismatch", [&](int r, Peer& peer, PeerFailures& f) {
    auto* send = static_cast<float*>(fake.alloc(16 * 4));
    auto* recv = static_cast<float*>(fake.alloc(16 * 4));
    const auto t0 = Clock::now();
    auto req = peer.post(allreduce("bad", send, recv, r == 1 ? 8 : 16, DType::F32, RedOp::Sum, true, kTimeoutMs));
    if (!req.is_ok()) return f.add(r, "post: " + req.status().message());
    Status s = wait(req.value(), 30000);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lock(mu);
      codes[static_cast<size_t>(r)] = s.code();
    }
    if (s.is_ok()) return f.add(r, "succeeded");
    if (s.code() != Code::Mismatch && s.code() != Code::Timeout) return f.add(r, "unexpected: " + s.message());
    // The first post also makes the child jobs; the op's deadline counts from after that.
    if (ms > 15000) f.add(r, "took " + std::to_string(ms) + " ms");
    // The peer goes on: a good op after the failed one.
    std::fill(send, send + 16, 1.0f);
    auto again = peer.post(allreduce("good", send, recv, 16, DType::F32, RedOp::Sum, true, 10000));
    if (!again.is_ok()) return f.add(r, "post good: " + again.status().message());
    if (Status g = wait(again.value()); !g.is_ok()) return f.add(r, "good: " + g.message());
    if (recv[3] != 4.0f) f.add(r, "good: " + std::to_string(recv[3]));
  }, failures);
  failures.check();
  // Host a's ranks disagree at the reduce: a Mismatch there.
  CHECK(codes[0] == Code::Mismatch);
  CHECK(codes[1] == Code::Mismatch);
  CHECK(fake.violations() == 0);
}
