// Where the runtime does not yet meet the reliability goal: a member that completed the
// handshake can make rank 0 hold far more memory than TAIJI_UNEXPECTED_BYTES, or hold
// memory without any cap at all ("buffered bytes are capped and checked"), and a member
// that stops reading keeps rank 0 from ever being destroyed ("destroyed promptly"). Each
// test states the bound it expects and prints what it measured. They carry the hidden tag
// [.wire-open] and are not registered with meson until the runtime meets them; run them
// with `taiji-wire-tests "[.wire-open]"`.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
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
    Config c = base_config(0, rv.address, "wire-open");
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
};

// Destroys rank 0. If that has not finished after 5 s, rank 1 starts reading what rank 0
// queued for it, which lets rank 0's graceful close end.
Destroyed destroy(Member& m) {
  Destroyed d;
  auto done = std::async(std::launch::async, [&m] { m.victim.reset(); });
  d.unaided = done.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  if (!d.unaided) m.fake.socket().wait_closed(after_ms(60000));
  done.wait();
  return d;
}

double kib(size_t before, size_t after) {
  return (static_cast<double>(after) - static_cast<double>(before)) / 1024;
}

}  // namespace

TEST_CASE("open: early Aborts are charged 128 bytes but hold their whole reason", "[.wire-open]") {
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
  std::printf("wire open: %zu early Aborts (4 KiB reasons) before rank 0 stopped reading: RSS %+.0f KiB, "
              "cap %llu KiB\n", f.frames, kib(before, after), static_cast<unsigned long long>(kCap / 1024));
  CHECK(f.stalled);  // the cap does stop reading, eventually
  CHECK(after < before + kCap + kSlack);
}

TEST_CASE("open: early Readys are charged 128 bytes but hold their whole name", "[.wire-open]") {
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
  std::printf("wire open: %zu early Readys (4 KiB names) before rank 0 stopped reading: RSS %+.0f KiB, "
              "cap %llu KiB\n", f.frames, kib(before, after), static_cast<unsigned long long>(kCap / 1024));
  CHECK(f.stalled);
  CHECK(after < before + kCap + kSlack);
}

TEST_CASE("open: one early Data frame may be as large as the payload cap, whatever the early cap",
          "[.wire-open]") {
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
  std::printf("wire open: %zu early Data frames of 32 MiB taken in whole: RSS %+.0f KiB, cap %llu KiB\n",
              f.frames, kib(before, after), static_cast<unsigned long long>(kCap / 1024));
  CHECK(after < before + kCap + kSlack);
}

TEST_CASE("open: Queries from a rank that never reads its Answers queue without bound",
          "[.wire-open]") {
  Member m([](Config&) {});
  constexpr size_t kBatch = 200000;
  // The first batch fills the kernel's socket buffers and whatever rank 0 allows itself
  // to queue; the second must then cost nothing more.
  const size_t start = resident_bytes();
  flood_queries(m.fake, kBatch, 0);
  // Rank 0 never stops reading Queries; give it a moment to answer what is in flight.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const size_t before = resident_bytes();
  Flood f = flood_queries(m.fake, kBatch, kBatch);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const size_t after = resident_bytes();
  std::printf("wire open: 2 x %zu Queries (%.1f MiB each), none of the Answers read: RSS %+.0f KiB after "
              "the first, %+.0f KiB more after the second\n",
              kBatch, static_cast<double>(kBatch * kQueryBytes) / kMiB, kib(start, before),
              kib(before, after));
  REQUIRE(f.frames == kBatch);
  CHECK(after < before + kSlack);
  destroy(m);  // see the next test for why this may need help
}

TEST_CASE("open: destroying rank 0 waits forever for a rank 1 that does not read", "[.wire-open]") {
  Member m([](Config&) {});
  // More Answers than the kernel's socket buffers hold: the rest wait in rank 0's queue.
  Flood f = flood_queries(m.fake, 300000);
  REQUIRE_FALSE(f.stalled);
  // Let rank 0 read every Query first: one arriving during its close would fail a write
  // and drop the link, which hides the hang.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  Destroyed d = destroy(m);
  std::printf("wire open: destroying rank 0 with %zu Answers queued for a rank that does not read: %s\n",
              f.frames, d.unaided ? "done" : "still closing after 5 s");
  CHECK(d.unaided);
}
