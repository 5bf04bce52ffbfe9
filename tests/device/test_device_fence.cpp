// A device op's fence with the caller's stream, inside real peers over the fake device
// runtime: the op starts after the work queued on its stream before the post, not after
// work queued later (which may itself wait for the op), and every fence recorded at a post
// is released on each path the op ends: launched, a mismatch, withdrawn before every rank
// posted, an abort, a post refused after its placement.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fake_peers.h"

using namespace taiji;
using taiji_test::FakeDeviceRuntime;
using taiji_test::FakeInstalled;
using taiji_test::FenceWait;
using taiji_test::PeerBody;
using taiji_test::PeerFailures;
using taiji_test::run_fake_peers;
using taiji_test::wait_request;

namespace {

PostArgs allreduce(const std::string& name, float* buf, uint64_t count, void* stream = nullptr,
                   int64_t timeout_ms = 0) {
  PostArgs a;
  a.kind = OpKind::Allreduce;
  a.name = name;
  a.send = buf;
  a.recv = buf;
  a.count = count;
  a.dtype = DType::F32;
  a.redop = RedOp::Sum;
  a.stream = stream;
  a.timeout_ms = timeout_ms;
  return a;
}

void run_peers(int n, const std::string& job, const PeerBody& body, PeerFailures& failures) {
  run_fake_peers(std::vector<std::string>(static_cast<size_t>(n)), job, body, failures);
}

Status run(Peer& peer, PostArgs args, int64_t ms = 20000) {
  auto req = peer.post(std::move(args));
  if (!req.is_ok()) return req.status();
  return wait_request(req.value(), ms);
}

// A host allreduce every rank posts: once it completes here, every rank has come this far.
Status meet(Peer& peer, const std::string& name) {
  std::vector<float> v(1, 1.0f);
  PostArgs a = allreduce(name, v.data(), 1);
  a.memory = 1;  // TAIJI_MEMORY_HOST
  return run(peer, std::move(a));
}

// Waits (bounded) until `flag` reaches `want`.
bool wait_for(const std::atomic<int>& flag, int want, int64_t ms = 10000) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (flag.load() < want) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace

TEST_CASE("device fence: an op starts at its stream's position at the post, not at the launch",
          "[device_fence]") {
  FakeInstalled installed;
  FakeDeviceRuntime& fake = *installed.fake;
  constexpr int kPeers = 3;
  std::array<void*, kPeers> streams{};
  for (void*& s : streams) s = fake.make_stream();
  std::atomic<int> posted{0};
  PeerFailures failures;
  run_peers(kPeers, "device-fence-order", [&](int r, Peer& peer, PeerFailures& f) {
    auto* buf = static_cast<float*>(fake.alloc(4 * sizeof(float)));
    std::fill(buf, buf + 4, 1.0f);
    void* stream = streams[static_cast<size_t>(r)];
    fake.queue_work(stream, static_cast<uint64_t>(r + 1));
    // The last rank posts only once the others have posted and queued more work behind
    // their post: the op cannot launch anywhere before that.
    if (r == kPeers - 1 && !wait_for(posted, kPeers - 1)) f.add(r, "the other ranks did not post");
    auto req = peer.post(allreduce("fenced", buf, 4, stream));
    if (!req.is_ok()) return f.add(r, "post: " + req.status().message());
    fake.queue_work(stream, 10);
    posted.fetch_add(1);
    Status s = wait_request(req.value(), 20000);
    if (!s.is_ok() || buf[0] != static_cast<float>(kPeers)) f.add(r, "the op: " + s.message());
    fake.release(buf);
  }, failures);
  failures.check();
  for (int r = 0; r < kPeers; ++r) {
    INFO("rank " << r);
    std::vector<FenceWait> waits = fake.fence_waits(r);
    REQUIRE(waits.size() == 1);
    CHECK(waits[0].fenced);
    CHECK(waits[0].stream == streams[static_cast<size_t>(r)]);
    CHECK(waits[0].position == static_cast<uint64_t>(r + 1));
  }
  CHECK(fake.fences_recorded() == kPeers);
  CHECK(fake.fences_held() == 0);
  CHECK(fake.stray_fence_releases() == 0);
}

TEST_CASE("device fence: every fence is released, however the op ends", "[device_fence]") {
  FakeInstalled installed;
  FakeDeviceRuntime& fake = *installed.fake;
  PeerFailures failures;

  SECTION("launched and completed, and a post refused after its placement") {
    run_peers(2, "device-fence-done", [&](int r, Peer& peer, PeerFailures& f) {
      auto* buf = static_cast<float*>(fake.alloc(4 * sizeof(float)));
      std::fill(buf, buf + 4, 1.0f);
      if (Status s = run(peer, allreduce("ok", buf, 4)); !s.is_ok() || buf[0] != 2.0f) f.add(r, "op: " + s.message());
      if (Status s = meet(peer, "meet.1"); !s.is_ok()) f.add(r, "meet: " + s.message());
      if (r == 0 && fake.fences_held() != 0) f.add(r, std::to_string(fake.fences_held()) + " fences held after the op");
      // The count is every rank's: no rank records its next fence before rank 0 counted.
      if (Status s = meet(peer, "meet.counted"); !s.is_ok()) f.add(r, "meet: " + s.message());
      // Placed (and fenced), then refused: version 1 of "ok" has ended.
      PostArgs stale = allreduce("ok", buf, 4);
      stale.version = 1;
      auto refused = peer.post(std::move(stale));
      if (refused.is_ok() || refused.status().code() != Code::StaleVersion) f.add(r, "a stale version was accepted");
      if (Status s = meet(peer, "meet.2"); !s.is_ok()) f.add(r, "meet: " + s.message());
      if (r == 0 && fake.fences_held() != 0) f.add(r, std::to_string(fake.fences_held()) + " fences held after refusals");
      fake.release(buf);
    }, failures);
    failures.check();
    CHECK(fake.fences_recorded() == 4);
  }

  SECTION("a mismatch") {
    run_peers(2, "device-fence-mismatch", [&](int r, Peer& peer, PeerFailures& f) {
      auto* buf = static_cast<float*>(fake.alloc(8 * sizeof(float)));
      Status s = run(peer, allreduce("w", buf, r == 1 ? 4 : 8));
      if (s.code() != Code::Mismatch) f.add(r, "want a mismatch, got: " + s.message());
      if (Status m = meet(peer, "meet"); !m.is_ok()) f.add(r, "meet: " + m.message());
      if (r == 0 && fake.fences_held() != 0) f.add(r, std::to_string(fake.fences_held()) + " fences held after it");
      fake.release(buf);
    }, failures);
    failures.check();
    CHECK(fake.fences_recorded() == 2);
  }

  SECTION("withdrawn before every rank posted it, and its late post") {
    run_peers(2, "device-fence-withdraw", [&](int r, Peer& peer, PeerFailures& f) {
      auto* buf = static_cast<float*>(fake.alloc(4 * sizeof(float)));
      if (r == 0) {
        Status s = run(peer, allreduce("lonely", buf, 4, nullptr, 500));
        if (s.code() != Code::Timeout) f.add(r, "want a timeout, got: " + s.message());
        if (fake.fences_held() != 0) f.add(r, std::to_string(fake.fences_held()) + " fences held after it");
      }
      if (Status m = meet(peer, "meet.1"); !m.is_ok()) f.add(r, "meet: " + m.message());
      if (r == 1) {
        Status s = run(peer, allreduce("lonely", buf, 4, nullptr, 5000));
        if (s.code() != Code::Timeout) f.add(r, "late post: " + s.message());
        if (fake.fences_held() != 0) f.add(r, std::to_string(fake.fences_held()) + " fences held after it");
      }
      if (Status m = meet(peer, "meet.2"); !m.is_ok()) f.add(r, "meet: " + m.message());
      fake.release(buf);
    }, failures);
    failures.check();
    CHECK(fake.fences_recorded() == 2);
    CHECK(fake.fence_waits(0).empty());
  }

  SECTION("an abort, with one op not launched and one launched and hanging") {
    fake.hang_batch(0, 0);
    std::atomic<int> launched{0};
    run_peers(2, "device-fence-abort", [&](int r, Peer& peer, PeerFailures& f) {
      auto* buf = static_cast<float*>(fake.alloc(4 * sizeof(float)));
      auto stuck = peer.post(allreduce("stuck", buf, 4, nullptr, 60000));
      if (!stuck.is_ok()) return f.add(r, "post: " + stuck.status().message());
      // Only rank 0 posts this one: it waits for rank 1 until the abort.
      std::shared_ptr<RequestState> pending;
      if (r == 0) {
        auto p = peer.post(allreduce("pending", buf, 4, nullptr, 60000));
        if (!p.is_ok()) return f.add(r, "post: " + p.status().message());
        pending = p.value();
      }
      // "stuck" is launched on both ranks (and hangs) before the abort.
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (fake.launched(r).empty() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      launched.fetch_add(1);
      if (!wait_for(launched, 2)) f.add(r, "the other rank did not launch");
      // A launch releases its op's fence at once, though the op hangs: only rank 0's
      // "pending" holds one now.
      if (r == 0) {
        auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (fake.fences_held() != 1 && std::chrono::steady_clock::now() < until)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (fake.fences_held() != 1) f.add(r, std::to_string(fake.fences_held()) + " fences held, want 1");
      }
      if (r == 0) peer.abort();
      if (wait_request(stuck.value(), 5000).is_ok()) f.add(r, "the hanging op succeeded");
      if (pending && wait_request(pending, 5000).is_ok()) f.add(r, "the op not launched succeeded");
      fake.release(buf);
    }, failures);
    failures.check();
    CHECK(fake.fences_recorded() == 3);
    CHECK(fake.launched(0).size() == 1);
  }

  CHECK(fake.fences_held() == 0);
  CHECK(fake.stray_fence_releases() == 0);
}
