// The device backend inside real peers (threads of this process, on loopback), over the
// fake device runtime: named device ops posted in any order run in one order on every
// rank, a disagreement is a Mismatch before anything reaches the device, and every failure
// (a hang past the deadline, an asynchronous error, a rank that never posts, an abort, a
// lost rank) ends the ops on every rank within their deadline instead of hanging.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fake_peers.h"

using namespace taiji;
using taiji_test::FakeInstalled;
using taiji_test::PeerBody;
using taiji_test::PeerFailures;
using taiji_test::run_fake_peers;
using taiji_test::wait_request;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

PostArgs allreduce(const std::string& name, const float* send, float* recv, uint64_t count,
                   int memory = 0, int64_t timeout_ms = 0) {
  PostArgs a;
  a.kind = OpKind::Allreduce;
  a.name = name;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.dtype = DType::F32;
  a.redop = RedOp::Sum;
  a.memory = memory;
  a.timeout_ms = timeout_ms;
  return a;
}

Status wait(const std::shared_ptr<RequestState>& req, int64_t ms = 20000) { return wait_request(req, ms); }

// Runs `body` on `n` peers of one host.
void run_peers(int n, const std::string& job, const PeerBody& body, PeerFailures& failures) {
  run_fake_peers(std::vector<std::string>(static_cast<size_t>(n)), job, body, failures);
}

// Posts, and waits; the post's own error when it has one.
Status run(Peer& peer, PostArgs args, int64_t ms = 20000) {
  auto req = peer.post(std::move(args));
  if (!req.is_ok()) return req.status();
  return wait(req.value(), ms);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("device backend: named ops posted in any order run in one order on every rank", "[device_backend]") {
  FakeInstalled installed;
  auto& fake = *installed.fake;
  constexpr int kPeers = 4;
  constexpr int kOps = 24;
  constexpr uint64_t kCount = 64;
  PeerFailures failures;
  run_peers(kPeers, "device-order", [&](int r, Peer& peer, PeerFailures& f) {
    std::vector<float*> send(kOps), recv(kOps);
    for (int i = 0; i < kOps; ++i) {
      send[i] = static_cast<float*>(fake.alloc(kCount * sizeof(float)));
      recv[i] = static_cast<float*>(fake.alloc(kCount * sizeof(float)));
      for (uint64_t j = 0; j < kCount; ++j) send[i][j] = static_cast<float>((r + 1) * (i + 1) + j);
    }
    std::vector<int> order(kOps);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(100 + r));
    std::vector<std::shared_ptr<RequestState>> reqs(kOps);
    for (int i : order) {
      // Sizes differ per op, so that a wrong pairing shows as a violation in the fake.
      auto req = peer.post(allreduce("grad." + std::to_string(i), send[i], recv[i], kCount - i));
      if (!req.is_ok()) return f.add(r, "post: " + req.status().message());
      reqs[i] = req.value();
    }
    for (int i = 0; i < kOps; ++i) {
      Status s = wait(reqs[i]);
      if (!s.is_ok()) return f.add(r, "grad." + std::to_string(i) + ": " + s.message());
      for (uint64_t j = 0; j < kCount - i; ++j) {
        const float want = static_cast<float>((1 + 2 + 3 + 4) * (i + 1) + kPeers * j);
        if (recv[i][j] != want) {
          return f.add(r, "grad." + std::to_string(i) + "[" + std::to_string(j) + "] = " +
                              std::to_string(recv[i][j]) + ", want " + std::to_string(want));
        }
      }
    }
    // A host op beside them is the host backend's, untouched.
    std::vector<float> hs(8, 1.0f), hr(8, 0.0f);
    Status hs_ok = run(peer, allreduce("host", hs.data(), hr.data(), hs.size()));
    if (!hs_ok.is_ok() || hr[0] != kPeers) f.add(r, "host allreduce: " + hs_ok.message());
    for (int i = 0; i < kOps; ++i) {
      fake.release(send[i]);
      fake.release(recv[i]);
    }
  }, failures);
  failures.check();
  CHECK(fake.violations() == 0);
  INFO(fake.violation_text());
  const auto first = fake.launched(0);
  CHECK(first.size() == static_cast<size_t>(kOps));
  for (int r = 1; r < kPeers; ++r) CHECK(fake.launched(r) == first);
}

TEST_CASE("device backend: a disagreement is a mismatch on every rank, and the next op runs", "[device_backend]") {
  FakeInstalled installed;
  auto& fake = *installed.fake;
  PeerFailures failures;
  run_peers(3, "device-mismatch", [&](int r, Peer& peer, PeerFailures& f) {
    auto* buf = static_cast<float*>(fake.alloc(16 * sizeof(float)));
    std::fill(buf, buf + 16, 1.0f);
    Status s = run(peer, allreduce("w", buf, buf, r == 2 ? 8 : 16));
    if (s.code() != Code::Mismatch) f.add(r, "want a mismatch, got: " + s.message());
    if (!contains(s.message(), "rank 2 allreduce f32 sum count 8")) f.add(r, "the text names no rank: " + s.message());
    std::fill(buf, buf + 16, 1.0f);
    Status next = run(peer, allreduce("w", buf, buf, 16));
    if (!next.is_ok() || buf[15] != 3.0f) f.add(r, "the next op: " + next.message());
    fake.release(buf);
  }, failures);
  failures.check();
  CHECK(fake.violations() == 0);
}

TEST_CASE("device backend: where buffers live decides the backend; errors at post", "[device_backend]") {
  FakeInstalled installed;
  auto& fake = *installed.fake;
  PeerFailures failures;
  run_peers(2, "device-place", [&](int r, Peer& peer, PeerFailures& f) {
    auto* dev = static_cast<float*>(fake.alloc(4 * sizeof(float)));
    std::vector<float> host(4, 1.0f);
    auto mixed = peer.post(allreduce("mixed", host.data(), dev, 4));
    if (mixed.is_ok() || mixed.status().code() != Code::InvalidArgument) f.add(r, "mixed memories were accepted");
    auto lie = peer.post(allreduce("lie", host.data(), host.data(), 4, /*memory=*/2));
    if (lie.is_ok() || lie.status().code() != Code::InvalidArgument) f.add(r, "DEVICE on host buffers was accepted");
    PostArgs gather = allreduce("gather", dev, dev, 1);
    gather.kind = OpKind::Gather;
    auto g = peer.post(std::move(gather));
    if (g.is_ok() || g.status().code() != Code::Unsupported) f.add(r, "a device gather was accepted");
    // The names of refused posts stay free: the same names then run.
    std::fill(dev, dev + 4, 2.0f);
    Status ok = run(peer, allreduce("mixed", dev, dev, 4));
    if (!ok.is_ok() || dev[0] != 4.0f) f.add(r, "device allreduce after refusals: " + ok.message());
    fake.release(dev);
  }, failures);
  failures.check();
}

TEST_CASE("device backend: no usable device fails device ops at once, host ops run", "[device_backend]") {
  FakeInstalled installed;
  auto& fake = *installed.fake;
  auto* dev = static_cast<float*>(fake.alloc(4 * sizeof(float)));
  fake.make_unusable("no CUDA-capable device is detected");
  PeerFailures failures;
  run_peers(2, "device-none", [&](int r, Peer& peer, PeerFailures& f) {
    auto posted = peer.post(allreduce("d", dev, dev, 4, /*memory=*/2));
    if (posted.is_ok() || posted.status().code() != Code::NoDevice ||
        !contains(posted.status().message(), "no CUDA-capable device")) {
      f.add(r, "want NoDevice naming why, got: " + (posted.is_ok() ? "ok" : posted.status().message()));
    }
    std::vector<float> hs(4, 1.0f), hr(4, 0.0f);
    Status h = run(peer, allreduce("h", hs.data(), hr.data(), 4));
    if (!h.is_ok() || hr[3] != 2.0f) f.add(r, "host allreduce: " + h.message());
  }, failures);
  failures.check();
  fake.release(dev);
}

TEST_CASE("device backend: a hang on the device ends at the deadline on every rank, and stays an error",
          "[device_backend]") {
  FakeInstalled installed;
  auto& fake = *installed.fake;
  fake.hang_batch(1, 1);  // the second batch never completes
  PeerFailures failures;
  run_peers(3, "device-hang", [&](int r, Peer& peer, PeerFailures& f) {
    auto* buf = static_cast<float*>(fake.alloc(4 * sizeof(float)));
    if (Status s = run(peer, allreduce("a", buf, buf, 4)); !s.is_ok()) f.add(r, "first op: " + s.message());
    const auto t0 = Clock::now();
    Status s = run(peer, allreduce("b", buf, buf, 4, 0, /*timeout_ms=*/800));
    const double took = ms_since(t0);
    if (s.code() != Code::Timeout && s.code() != Code::Aborted) f.add(r, "hang: " + s.message());
    if (took > 800 + 3000) f.add(r, "the hang ended after " + std::to_string(took) + " ms");
    Status after = run(peer, allreduce("c", buf, buf, 4));
    if (after.is_ok()) f.add(r, "a device op after the failure ran");
    std::vector<float> hs(4, 1.0f), hr(4, 0.0f);
    Status h = run(peer, allreduce("h", hs.data(), hr.data(), 4));
    if (!h.is_ok() || hr[0] != 3.0f) f.add(r, "host allreduce after the device failed: " + h.message());
    fake.release(buf);
  }, failures);
  failures.check();
  CHECK(fake.aborts() >= 3);
}

TEST_CASE("device backend: an asynchronous error on one rank fails the ops of every rank", "[device_backend]") {
  FakeInstalled installed;
  auto& fake = *installed.fake;
  fake.async_error_after(1, 0, {Code::Io, "NCCL WARN net: connection closed by remote peer"});
  fake.device_time_us(20000);
  PeerFailures failures;
  run_peers(3, "device-async", [&](int r, Peer& peer, PeerFailures& f) {
    auto* buf = static_cast<float*>(fake.alloc(4 * sizeof(float)));
    (void)run(peer, allreduce("a", buf, buf, 4));
    // Ops after the error fail within their deadline, whoever saw it first.
    const auto t0 = Clock::now();
    Status s = run(peer, allreduce("b", buf, buf, 4, 0, 3000));
    if (s.is_ok()) f.add(r, "an op after the asynchronous error succeeded");
    if (ms_since(t0) > 3000 + 2000) f.add(r, "took " + std::to_string(ms_since(t0)) + " ms");
    fake.release(buf);
  }, failures);
  failures.check();
}

TEST_CASE("device backend: an op one rank never posts times out everywhere, and a late post of it too",
          "[device_backend]") {
  FakeInstalled installed;
  auto& fake = *installed.fake;
  PeerFailures failures;
  run_peers(3, "device-withdraw", [&](int r, Peer& peer, PeerFailures& f) {
    auto* buf = static_cast<float*>(fake.alloc(4 * sizeof(float)));
    if (r != 2) {
      const auto t0 = Clock::now();
      Status s = run(peer, allreduce("lonely", buf, buf, 4, 0, 600));
      if (s.code() != Code::Timeout) f.add(r, "want a timeout, got: " + s.message());
      if (ms_since(t0) > 600 + 3000) f.add(r, "took " + std::to_string(ms_since(t0)) + " ms");
    }
    // Every rank then meets here; rank 2 posts "lonely" late and is told it was withdrawn.
    std::vector<float> hs(1, 1.0f), hr(1, 0.0f);
    (void)run(peer, allreduce("meet", hs.data(), hr.data(), 1));
    if (r == 2) {
      Status s = run(peer, allreduce("lonely", buf, buf, 4, 0, 5000));
      if (s.code() != Code::Timeout || !contains(s.message(), "withdrew")) f.add(r, "late post: " + s.message());
    }
    std::fill(buf, buf + 4, 1.0f);
    Status next = run(peer, allreduce("after", buf, buf, 4));
    if (!next.is_ok() || buf[0] != 3.0f) f.add(r, "the next device op: " + next.message());
    fake.release(buf);
  }, failures);
  failures.check();
  CHECK(fake.violations() == 0);
}

TEST_CASE("device backend: slow communicator init still runs the first op", "[device_backend]") {
  FakeInstalled installed;
  auto& fake = *installed.fake;
  fake.init_delay_ms(1, 500);
  PeerFailures failures;
  run_peers(2, "device-slow-init", [&](int r, Peer& peer, PeerFailures& f) {
    auto* buf = static_cast<float*>(fake.alloc(4 * sizeof(float)));
    std::fill(buf, buf + 4, 1.0f);
    Status s = run(peer, allreduce("first", buf, buf, 4));
    if (!s.is_ok() || buf[0] != 2.0f) f.add(r, "first op: " + s.message());
    fake.release(buf);
  }, failures);
  failures.check();
}

TEST_CASE("device backend: an abort ends a hanging device op at once", "[device_backend]") {
  FakeInstalled installed;
  auto& fake = *installed.fake;
  fake.hang_batch(0, 0);
  PeerFailures failures;
  run_peers(2, "device-abort", [&](int r, Peer& peer, PeerFailures& f) {
    auto* buf = static_cast<float*>(fake.alloc(4 * sizeof(float)));
    auto req = peer.post(allreduce("stuck", buf, buf, 4, 0, 60000));
    if (!req.is_ok()) return f.add(r, "post: " + req.status().message());
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto t0 = Clock::now();
    if (r == 0) peer.abort();
    Status s = wait(req.value(), 5000);
    if (s.is_ok() || contains(s.message(), "still running")) f.add(r, "after the abort: " + s.message());
    if (ms_since(t0) > 4000) f.add(r, "took " + std::to_string(ms_since(t0)) + " ms");
    fake.release(buf);
  }, failures);
  failures.check();
}
