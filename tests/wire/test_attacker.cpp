// An attacker on the listening port of a live peer. Two real peers (world size 2) run; the
// attacker learns rank 0's address from the rendezvous, connects with a plain socket and
// sends one malformed or unwelcome opening per connection. Every case must end with the
// attacker's connection closed by rank 0, one log line naming the cause, the real link
// untouched (an exact allreduce after every batch) and flat resident memory over 1,000
// repeats.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "attack_runner.h"
#include "monitor/refusals.h"
#include "runtime/p2p_key.h"

using namespace taiji;
using namespace wire;

namespace {

// A well-formed Data frame of an allreduce of two f32, as rank 1 would send it.
FrameHeader data_header() {
  FrameHeader h;
  h.type = MsgType::Data;
  h.op_kind = OpKind::Allreduce;
  h.src_rank = 1;
  h.cluster_version = kClusterVersion;
  h.dtype = static_cast<uint8_t>(DType::F32);
  h.redop = static_cast<uint8_t>(RedOp::Sum);
  h.op_version = 1;
  h.count = 2;
  return h;
}

std::vector<uint8_t> header_only(const FrameHeader& h) { return raw_frame(h); }

template <typename Edit>
std::vector<uint8_t> data_frame(Edit edit) {
  FrameHeader h = data_header();
  edit(h);
  return frame(h, "w", std::vector<uint8_t>(8, 0));
}

template <typename Edit>
std::vector<uint8_t> edited_hello(Edit edit) {
  FrameHeader h = hello_header();
  h.name_len = static_cast<uint16_t>(std::string(kJob).size());
  edit(h);
  return raw_frame(h, kJob);
}

std::vector<Attack> immediate_attacks() {
  std::vector<uint8_t> cut = hello();
  cut.resize(40);
  FrameHeader bad_dtype = data_header();
  bad_dtype.dtype = 200;
  FrameHeader bad_redop = data_header();
  bad_redop.redop = 200;
  FrameHeader ready = data_header();
  ready.type = MsgType::Ready;
  return {
      {"truncated header, then close", cut,
       "connection closed by peer after 40 of the 64 bytes of a frame header", true},
      {"bad magic", edited_hello([](FrameHeader& h) { h.magic = 0xDEADBEEF; }), "bad magic 0xdeadbeef"},
      {"wrong protocol version", edited_hello([](FrameHeader& h) { h.protocol = 2; }),
       "unsupported protocol 2 (expected 1)"},
      {"unknown message type", edited_hello([](FrameHeader& h) { h.type = static_cast<MsgType>(kMaxMsgType + 1); }),
       "bad type " + std::to_string(kMaxMsgType + 1)},
      {"message type 0", edited_hello([](FrameHeader& h) { h.type = static_cast<MsgType>(0); }),
       "bad type 0"},
      {"name_len over the cap", edited_hello([](FrameHeader& h) { h.name_len = 65535; }),
       // The cap leaves room for a point-to-point op's pair.
       "name_len 65535 exceeds cap " + std::to_string(kMaxNameLen + kP2pKeyOverhead)},
      {"payload_len one over the cap",
       header_only([] {
         FrameHeader h = hello_header();
         h.name_len = 1;
         h.payload_len = kMaxPayload + 1;
         return h;
       }()),
       "payload_len 1048577 exceeds cap 1048576"},
      {"payload_len 2^64-1",
       header_only([] {
         FrameHeader h = hello_header();
         h.name_len = 1;
         h.payload_len = UINT64_MAX;
         return h;
       }()),
       "payload_len 18446744073709551615 exceeds cap 1048576"},
      {"Data frame with an unknown dtype", frame(bad_dtype, "w", garbage(8)), "bad dtype 200"},
      {"Data frame with an unknown redop", frame(bad_redop, "w", garbage(8)), "bad redop 200"},
      {"Data frame with an unknown op kind",
       data_frame([](FrameHeader& h) { h.op_kind = static_cast<OpKind>(kMaxOpKind + 1); }),
       "bad op_kind " + std::to_string(kMaxOpKind + 1)},
      {"Data frame without an op kind", data_frame([](FrameHeader& h) { h.op_kind = OpKind::None; }),
       "op_kind 0 in a Data frame"},
      {"Data frame with stage 2", data_frame([](FrameHeader& h) { h.stage = 2; }), "bad stage 2"},
      {"Data frame with root = world size", data_frame([](FrameHeader& h) { h.root = 2; }),
       "root 2 not below world_size 2"},
      {"Data payload not a whole number of elements", frame(data_header(), "w", garbage(7)),
       "payload_len 7 not a multiple of dtype size 4 (f32)"},
      {"Data frame without a name", frame(data_header(), "", garbage(8)), "name_len 0 in a Data frame"},
      {"src_rank = world size", hello(kJob, 2), "src_rank 2 not below world_size 2"},
      {"src_rank 2^32-1", hello(kJob, 0xFFFFFFFF), "src_rank 4294967295 not below world_size 2"},
      {"stale cluster version", edited_hello([](FrameHeader& h) { h.cluster_version = 0; }),
       "cluster_version 0 does not match 1 (a member of cluster version 0 where this "
       "membership is version 1: a stale or partitioned peer)"},
      {"future cluster version", edited_hello([](FrameHeader& h) { h.cluster_version = 2; }),
       "cluster_version 2 does not match 1 (a member of cluster version 2 where this "
       "membership is version 1: a stale or partitioned peer)"},
      {"a Data frame first", frame(data_header(), "w", garbage(8)),
       "frame of type 3 before the handshake finished"},
      {"a Ready frame first", frame(ready, "w"), "frame of type 2 before the handshake finished"},
      {"Hello naming another job", hello("intruder"),
       "Hello from rank 1 names job 'intruder', this is job 'wire-attack'"},
      {"Hello claiming the connected rank 1", hello(), "Hello from rank 1: rank already connected"},
      {"Hello claiming rank 0 itself", hello(kJob, 0),
       "Hello from rank 0: only higher ranks dial this peer"},
      {"Hello with a 33-byte payload", hello(kJob, 1, garbage(33)),
       "handshake frame with a 33-byte payload"},
      {"Hello with a 4096-byte payload", hello(kJob, 1, garbage(4096)),
       "handshake frame with a 4096-byte payload"},
      {"Hello offering authentication to a peer without a secret", hello(kJob, 1, garbage(32)),
       "Hello from rank 1 offers authentication, but this peer has no job secret"},
      {"a valid Hello followed by garbage", concat({hello(), garbage(256)}),
       "Hello from rank 1: rank already connected"},
  };
}

}  // namespace

TEST_CASE("attacker: every malformed opening closes only its own connection", "[attacker]") {
  for (const Attack& a : immediate_attacks()) {
    DYNAMIC_SECTION(a.what) {
      AttackedPair f;
      repeat_attack(f, a, 16);
    }
  }
}

TEST_CASE("attacker: silent and stalled connections are closed at the handshake deadline",
          "[attacker]") {
  std::vector<uint8_t> cut = hello();
  cut.resize(40);
  const std::string cause = "handshake not finished within " + std::to_string(kHandshakeMs) + " ms";
  const Attack stalled[] = {{"truncated header, then silence", cut, cause},
                            {"a client that connects and sends nothing", {}, cause}};
  for (const Attack& a : stalled) {
    DYNAMIC_SECTION(a.what) {
      AttackedPair f;
      // Loop time may lag the wall clock by a few ms; never by a quarter of the deadline.
      repeat_attack(f, a, 48, kHandshakeMs * 3 / 4);
    }
  }
}

TEST_CASE("attacker: connections over the pending cap are refused at once", "[attacker]") {
  constexpr int kCap = 4;
  constexpr int kExcessPerRound = 50;
  // A deadline far beyond the test's pace: the holders stay pending until released.
  constexpr int64_t kLongHandshakeMs = 30000;
  AttackedPair f({kLongHandshakeMs, kCap, ""});
  const std::string refused = std::to_string(kCap) + " connections are already in their handshake";
  size_t before = 0;
  double slowest = 0;
  auto start = Clock::now();
  for (int round = 0; round <= kRepeats / kExcessPerRound; ++round) {
    INFO("round " << round);
    std::vector<RawSocket> holders(kCap);
    std::string error;
    for (RawSocket& h : holders) {
      h = RawSocket::connect_to(f.target(), &error);
      REQUIRE(h.valid());
    }
    // Accepts are served in arrival order, so every excess connection finds the holders.
    for (int i = 0; i < kExcessPerRound; ++i) {
      auto opened = Clock::now();
      RawSocket excess = RawSocket::connect_to(f.target(), &error);
      REQUIRE(excess.valid());
      RawSocket::Closed c = excess.wait_closed(after_ms(kCloseBoundMs));
      INFO("excess connection " << i << ": " << closed_name(c));
      REQUIRE(c != RawSocket::Closed::StillOpen);
      slowest = std::max(slowest, ms_between(opened, Clock::now()));
    }
    for (RawSocket& h : holders) REQUIRE(h.open_and_quiet());
    std::string wrong = expect_refusals(f.take_log(kExcessPerRound), kExcessPerRound, refused);
    INFO(wrong);
    REQUIRE(wrong.empty());
    for (RawSocket& h : holders) h.shutdown_write();
    for (RawSocket& h : holders) REQUIRE(h.wait_closed(after_ms(kCloseBoundMs)) != RawSocket::Closed::StillOpen);
    wrong = expect_refusals(f.take_log(kCap), kCap, "connection closed by peer");
    INFO(wrong);
    REQUIRE(wrong.empty());
    std::string sick = f.healthy();
    INFO(sick);
    REQUIRE(sick.empty());
    if (round == 0) {
      before = resident_bytes();  // round 0 is the warm-up
      start = Clock::now();
    }
  }
  const size_t after = resident_bytes();
  std::printf("wire attacker: %-58s %d in %5.2f s, refused within %.1f ms, RSS %+.0f KiB\n",
              "connections over the pending cap", kRepeats, ms_between(start, Clock::now()) / 1000,
              slowest, (static_cast<double>(after) - static_cast<double>(before)) / 1024);
  // Refused long before the handshake deadline that holds the other pending connections.
  CHECK(slowest < kLongHandshakeMs / 3);
  CHECK(after < before + 2 * kMiB);
}

namespace {

// The value of taiji_refused_connections_total for `reason` in rank 0's Prometheus text.
uint64_t refused_total(taiji::Peer& peer, const std::string& reason) {
  const std::string text = peer.metrics().prometheus();
  const std::string key = "taiji_refused_connections_total{rank=\"0\",reason=\"" + reason + "\"} ";
  const size_t at = text.find(key);
  REQUIRE(at != std::string::npos);
  return std::stoull(text.substr(at + key.size()));
}

}  // namespace

TEST_CASE("attacker: a flood of refused connections logs a few warnings and counts them all",
          "[attacker]") {
  constexpr int kFlood = 300;
  AttackedPair f;
  const uint64_t before = refused_total(f.peer(0), "malformed");
  const std::vector<uint8_t> bad = edited_hello([](FrameHeader& h) { h.magic = 0xDEADBEEF; });
  const auto start = Clock::now();
  for (int i = 0; i < kFlood; ++i) {
    std::string error;
    RawSocket s = RawSocket::connect_to(f.target(), &error);
    REQUIRE(s.valid());
    s.send_all(bad);
    REQUIRE(s.wait_closed(after_ms(kCloseBoundMs)) != RawSocket::Closed::StillOpen);
  }
  const double seconds = ms_between(start, Clock::now()) / 1000;
  const std::vector<LogLine> lines = f.take_log(kFlood);
  CHECK(expect_refusals(lines, kFlood, "bad magic 0xdeadbeef").empty());
  size_t warnings = 0;
  for (const LogLine& l : lines) warnings += l.level == spdlog::level::warn;
  // kBurst warnings per 10 s interval (and one summary line for the rest of each); the
  // others only at debug.
  const size_t intervals = static_cast<size_t>(seconds / 10) + 1;
  INFO(kFlood << " refusals in " << seconds << " s gave " << warnings << " warnings");
  CHECK(warnings >= static_cast<size_t>(taiji::RefusalLog::kBurst));
  CHECK(warnings <= intervals * (taiji::RefusalLog::kBurst + 1));
  CHECK(refused_total(f.peer(0), "malformed") - before == kFlood);
  CHECK(refused_total(f.peer(0), "auth") == 0);
  // Once an interval is over, one line says how many of its refusals were not logged at
  // warn, and the last one's reason: with the warnings, they add up to the flood.
  std::vector<LogLine> all = lines;
  auto accounted = [&] {
    uint64_t n = 0;
    const std::string prefix = "refused ";
    for (const LogLine& l : all) {
      if (l.level != spdlog::level::warn) continue;
      if (l.text.rfind(prefix, 0) == 0) {
        CHECK(l.text.find("more connections (malformed) in the last") != std::string::npos);
        CHECK(l.text.find("the last: bad magic 0xdeadbeef") != std::string::npos);
        n += std::stoull(l.text.substr(prefix.size()));
      } else {
        n++;
      }
    }
    return n;
  };
  const auto deadline = after_ms(15000);
  while (accounted() < kFlood && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (LogLine& l : f.take_log(0)) all.push_back(std::move(l));
  }
  CHECK(accounted() == kFlood);
  CHECK(f.healthy().empty());
}
