// The limits a member that completed the handshake runs into: everything rank 0 holds
// for ops it has not posted counts against TAIJI_UNEXPECTED_BYTES (names and Abort
// reasons too, and one early frame cannot overshoot it), a rank that asks stall Queries
// without reading the Answers cannot make rank 0 queue without bound, and a rank that
// stops reading cannot keep rank 0 from being destroyed. Each test prints what it
// measured.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "fake_member.h"
#include "live_peers.h"
#include "log_capture.h"

using namespace taiji;
using namespace wire;

namespace {

constexpr int64_t kStallMs = 1000;
constexpr size_t kSlack = 2 * kMiB;

struct Flood {
  size_t frames = 0;     // sent whole
  bool stalled = false;  // rank 0 stopped reading
  double seconds = 0;
};

// Sends make(0), make(1), ... until `limit` frames went out or rank 0 stops reading
// (a frame does not fit within kStallMs).
Flood flood(FakeMember& fake, size_t limit, const std::function<std::vector<uint8_t>(size_t)>& make) {
  Flood f;
  auto start = Clock::now();
  while (f.frames < limit) {
    if (!fake.socket().send_all(make(f.frames), after_ms(kStallMs))) {
      f.stalled = true;
      break;
    }
    f.frames++;
  }
  f.seconds = ms_between(start, Clock::now()) / 1000;
  return f;
}

FrameHeader op_header(MsgType type) {
  FrameHeader h;
  h.type = type;
  h.op_kind = OpKind::Allreduce;
  h.src_rank = 1;
  h.cluster_version = kClusterVersion;
  h.op_version = 1;
  h.count = 2;
  return h;
}

struct Member {
  LogCapture log;
  Rendezvous rv;
  FakeMember fake;
  std::unique_ptr<Peer> victim;

  explicit Member(const std::function<void(Config&)>& tweak) {
    std::string error;
    rv = start_rendezvous(&error);
    REQUIRE(error.empty());
    Config c = base_config(0, rv.address, "wire-limits");
    tweak(c);
    error = start_with_fake(c, "", &fake, &victim);
    INFO(error);
    REQUIRE(error.empty());
  }
};

constexpr size_t kQueryBytes = kHeaderSize + 1;  // a Query for op "q"

Flood flood_queries(FakeMember& fake, size_t n, size_t first_version = 0) {
  return flood(fake, n, [first_version](size_t i) {
    FrameHeader h = op_header(MsgType::Query);
    h.op_version = first_version + i + 1;
    return frame(h, "q");
  });
}

struct Destroyed {
  bool unaided = false;  // finished within 5 s while rank 1 read nothing
  double ms = 0;
};

// Destroys rank 0. If that has not finished after 5 s, rank 1 starts reading what rank 0
// queued for it, which lets rank 0's graceful close end.
Destroyed destroy(Member& m) {
  Destroyed d;
  auto start = Clock::now();
  auto done = std::async(std::launch::async, [&m] { m.victim.reset(); });
  d.unaided = done.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  if (!d.unaided) m.fake.socket().wait_closed(after_ms(60000));
  // A destroy still running uses this Member, and the future's destructor would wait for
  // it anyway: stop with a reason rather than hang.
  if (done.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    std::fprintf(stderr, "wire limits: rank 0's destroy did not end within 60 s of rank 1 reading again\n");
    std::abort();
  }
  d.ms = ms_between(start, Clock::now());
  return d;
}

// What rank 0 has read from rank 1 so far.
uint64_t read_from_fake(Member& m) { return m.victim->metrics().link_counters()[1].received.load(); }

// Waits until rank 0 has read `bytes` more from rank 1 than `before`: what a test measures
// next then covers every frame sent. False after 20 s.
bool await_read(Member& m, uint64_t before, uint64_t bytes) {
  auto deadline = after_ms(20000);
  while (read_from_fake(m) - before < bytes) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

double kib(size_t before, size_t after) {
  return (static_cast<double>(after) - static_cast<double>(before)) / 1024;
}

}  // namespace

TEST_CASE("limits: early Aborts count their reasons against the early-arrival cap", "[limits]") {
  constexpr uint64_t kCap = 1 * kMiB;
  Member m([](Config& c) { c.unexpected_bytes = kCap; });
  const size_t before = resident_bytes();
  // Aborts for ops rank 0 never posted, each with the longest reason it accepts (4 KiB).
  Flood f = flood(m.fake, 40000, [](size_t i) {
    FrameHeader h = op_header(MsgType::Abort);
    h.chunk = static_cast<uint32_t>(-static_cast<int32_t>(Code::Mismatch));
    return frame(h, "abort/" + std::to_string(i), std::vector<uint8_t>(4096, 'x'));
  });
  const size_t after = resident_bytes();
  std::printf("wire limits: %zu early Aborts (4 KiB reasons) before rank 0 stopped reading: RSS %+.0f KiB, "
              "cap %llu KiB\n", f.frames, kib(before, after), static_cast<unsigned long long>(kCap / 1024));
  CHECK(f.stalled);  // the cap does stop reading, eventually
  CHECK(after < before + kCap + kSlack);
}

TEST_CASE("limits: early Readys count their names against the early-arrival cap", "[limits]") {
  constexpr uint64_t kCap = 1 * kMiB;
  constexpr uint32_t kNameLen = 4096;
  Member m([](Config& c) {
    c.unexpected_bytes = kCap;
    c.max_name_len = kNameLen;
  });
  const size_t before = resident_bytes();
  Flood f = flood(m.fake, 40000, [](size_t i) {
    std::string name = "ready/" + std::to_string(i) + "/";
    name.resize(kNameLen, 'n');
    return frame(op_header(MsgType::Ready), name);
  });
  const size_t after = resident_bytes();
  std::printf("wire limits: %zu early Readys (4 KiB names) before rank 0 stopped reading: RSS %+.0f KiB, "
              "cap %llu KiB\n", f.frames, kib(before, after), static_cast<unsigned long long>(kCap / 1024));
  CHECK(f.stalled);
  CHECK(after < before + kCap + kSlack);
}

TEST_CASE("limits: an early Data frame larger than the early-arrival cap is refused unread",
          "[limits]") {
  constexpr uint64_t kCap = 1 * kMiB;
  constexpr uint64_t kPayload = 32 * kMiB;
  Member m([](Config& c) {
    c.unexpected_bytes = kCap;
    c.max_payload = 64 * kMiB;
  });
  const size_t before = resident_bytes();
  // A real member never sends a chunk over TAIJI_EAGER_BYTES before the receiver's Ready.
  Flood f = flood(m.fake, 4, [](size_t i) {
    FrameHeader h = op_header(MsgType::Data);
    h.dtype = static_cast<uint8_t>(DType::U8);
    h.count = kPayload;
    return frame(h, "big/" + std::to_string(i), std::vector<uint8_t>(kPayload, 1));
  });
  const size_t after = resident_bytes();
  std::printf("wire limits: %zu early Data frames of 32 MiB sent whole before the link closed: RSS %+.0f KiB, "
              "cap %llu KiB\n",
              f.frames, kib(before, after), static_cast<unsigned long long>(kCap / 1024));
  CHECK(after < before + kCap + kSlack);
  CHECK(m.fake.socket().wait_closed(after_ms(10000)) != RawSocket::Closed::StillOpen);
  std::string wrong = expect_lines(m.log.take_at_least(1, 10000), 1, spdlog::level::err,
                                   "link to rank 1 lost: early data for 'big/0' version 1 of 33554432 "
                                   "bytes exceeds the early-arrival cap 1048576");
  INFO(wrong);
  CHECK(wrong.empty());
}

TEST_CASE("limits: Queries from a rank that never reads its Answers cost nothing after a warm-up",
          "[limits]") {
  Member m([](Config&) {});
  constexpr size_t kBatch = 200000;
  // The first batch fills the kernel's socket buffers and whatever rank 0 allows itself
  // to queue; the second must then cost nothing more.
  const size_t start = resident_bytes();
  const uint64_t read_before = read_from_fake(m);
  // Rank 0 never stops reading Queries, and answers each as it reads it.
  flood_queries(m.fake, kBatch, 0);
  REQUIRE(await_read(m, read_before, kBatch * kQueryBytes));
  const size_t before = resident_bytes();
  Flood f = flood_queries(m.fake, kBatch, kBatch);
  REQUIRE(await_read(m, read_before, 2 * kBatch * kQueryBytes));
  const size_t after = resident_bytes();
  std::printf("wire limits: 2 x %zu Queries (%.1f MiB each), none of the Answers read: RSS %+.0f KiB after "
              "the first, %+.0f KiB more after the second\n",
              kBatch, static_cast<double>(kBatch * kQueryBytes) / kMiB, kib(start, before),
              kib(before, after));
  REQUIRE(f.frames == kBatch);
  CHECK(after < before + kSlack);
  CHECK(destroy(m).unaided);
}

TEST_CASE("limits: rank 0 is destroyed promptly while rank 1 does not read", "[limits]") {
  Member m([](Config&) {});
  // Enough Answers to fill the kernel's socket buffers and rank 0's own queue: its
  // graceful close can never drain them, so only its forced close can end it.
  const uint64_t read_before = read_from_fake(m);
  Flood f = flood_queries(m.fake, 300000);
  REQUIRE_FALSE(f.stalled);
  // Let rank 0 read every Query first: one arriving during its close would fail a write
  // and drop the link at once, skipping the forced close under test.
  REQUIRE(await_read(m, read_before, f.frames * kQueryBytes));
  Destroyed d = destroy(m);
  std::printf("wire limits: rank 0 with Answers for %zu Queries unread by rank 1: destroyed in %.0f ms%s\n",
              f.frames, d.ms, d.unaided ? "" : " (only once rank 1 read them)");
  CHECK(d.unaided);
}
