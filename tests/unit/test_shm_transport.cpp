// The shared-memory transport between this rank (0) and a rank 1 played by the test: the
// test hands rank 0 the frames its TCP link would deliver, writes rank 1's side of the
// segments itself, and records what rank 0 sends, drops and asks of its loop.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "transport/shm_transport.h"

using namespace taiji;

namespace {

constexpr uint32_t kVersion = 1;

// Stands in for the TCP transport under the shared-memory one.
struct FakeTcp : Transport {
  std::vector<OutMessage> sent;
  std::vector<Status> drops;
  void send(int, OutMessage msg) override { sent.push_back(std::move(msg)); }
  void pause_reading(int) override {}
  void resume_reading(int) override {}
  uint64_t queued_bytes(int) const override { return 0; }
  void drop(int, const Status& why) override { drops.push_back(why); }
  void shutdown(std::function<void()> on_closed) override { on_closed(); }
  void close_now(std::function<void()> on_closed) override { on_closed(); }
  void defer(std::function<void()> fn) override { deferred.push_back(std::move(fn)); }
  std::vector<std::function<void()>> deferred;
  // What the loop would run next.
  void run_deferred() {
    auto fns = std::move(deferred);
    deferred.clear();
    for (auto& fn : fns) fn();
  }
};

// The engine above: takes every frame, and calls on_frame after each.
struct Engine : ReceiveHandler {
  std::function<void()> on_frame;
  int frames = 0;
  Status accept_frame(int, const FrameHeader&, const std::string&, const uint8_t*,
                      uint8_t** target) override {
    *target = nullptr;
    return {};
  }
  void frame_done(int, const FrameHeader&, const std::string&) override {
    ++frames;
    if (on_frame) on_frame();
  }
  void link_down(int, bool, const Status&) override {}
};

FrameHeader from_rank1(MsgType type) {
  FrameHeader h;
  h.type = type;
  h.src_rank = 1;
  h.cluster_version = kVersion;
  return h;
}

// Rank 0's ShmTransport, with both rings between it and rank 1 mapped.
struct Pair {
  Cluster cluster{kVersion, 0, 2, {}, {0, 0}};
  FakeTcp tcp;
  Engine engine;
  int polls_requested = 0;
  std::unique_ptr<ShmTransport> shm;
  std::unique_ptr<ShmProducer> rank1_out;  // rank 1's ring to rank 0
  ShmSegment rank0_ring;                   // rank 0's ring to rank 1, as rank 1 maps it

  Pair() {
    ShmOptions o;
    o.cluster = &cluster;
    o.ring_bytes = kShmMinRingBytes;
    o.request_poll = [this] { ++polls_requested; };
    shm = std::make_unique<ShmTransport>(o, &tcp, &engine);
    shm->start({0, 0});
    REQUIRE(tcp.sent.size() == 1);
    REQUIRE(tcp.sent[0].header.type == MsgType::ShmOffer);
    auto theirs = ShmSegment::open(decode_offer(tcp.sent[0].owned.data()));
    REQUIRE(theirs.is_ok());
    rank0_ring = std::move(theirs.value());
    auto ours = ShmSegment::create(kShmMinRingBytes);
    REQUIRE(ours.is_ok());
    std::vector<uint8_t> offer(kShmOfferBytes);
    encode_offer(ours.value().info(), offer.data());
    rank1_out = std::make_unique<ShmProducer>(std::move(ours.value()));
    deliver_tcp(from_rank1(MsgType::ShmOffer), offer);  // TCP frame 1
    FrameHeader mapped = from_rank1(MsgType::ShmReply);
    mapped.chunk = 1;
    deliver_tcp(mapped, {});  // TCP frame 2
    REQUIRE(shm->active_to(1));
    tcp.sent.clear();
  }

  void deliver_tcp(FrameHeader h, const std::vector<uint8_t>& payload) {
    const std::string name = "shm";
    h.name_len = static_cast<uint16_t>(name.size());
    h.payload_len = payload.size();
    uint8_t* target = nullptr;
    REQUIRE(shm->accept_frame(1, h, name, nullptr, &target).is_ok());
    if (target != nullptr) std::memcpy(target, payload.data(), payload.size());
    shm->frame_done(1, h, name);
  }

  // Posts an Answer frame in rank 1's mailbox, to follow its first two TCP frames.
  bool mail_answer() {
    FrameHeader h = from_rank1(MsgType::Answer);
    h.op_kind = OpKind::Allreduce;
    const std::string name = "w";
    h.name_len = static_cast<uint16_t>(name.size());
    uint8_t header[kHeaderSize];
    encode_header(h, header);
    return rank1_out->post(2, header, name, nullptr, 0);
  }
};

}  // namespace

TEST_CASE("shm transport: one poll delivers only the mail published before it", "[shm]") {
  // Rank 1 posts a record each time rank 0 takes one, as fast as it is read: a poll that
  // went on to whatever came meanwhile would never give the loop back.
  Pair p;
  constexpr int kFlood = 1000;
  p.engine.on_frame = [&] {
    if (p.engine.frames < kFlood) REQUIRE(p.mail_answer());
  };
  REQUIRE(p.mail_answer());
  p.shm->poll();
  CHECK(p.engine.frames == 1);
  CHECK(p.polls_requested == 1);
  // Each poll the loop makes takes the next one.
  p.shm->poll();
  CHECK(p.engine.frames == 2);
  CHECK(p.polls_requested == 2);
  CHECK(p.tcp.drops.empty());
}

TEST_CASE("shm transport: a rank claiming more of the ring than was sent loses its link", "[shm]") {
  // Waiting for room it will never report would stall every frame to it until the op's
  // deadline, with no word of the cause.
  Pair p;
  p.rank0_ring.consumed().store(1ull << 40);
  OutMessage data;
  data.header.type = MsgType::Data;
  data.header.op_kind = OpKind::Allreduce;
  data.name = "w";
  data.owned.assign(kShmMinPayload, 7);
  p.shm->send(1, std::move(data));
  CHECK(p.tcp.drops.empty());  // not from inside the caller's send
  p.tcp.run_deferred();
  REQUIRE(p.tcp.drops.size() == 1);
  CHECK(p.tcp.drops[0].code() == Code::Protocol);
  CHECK(p.tcp.drops[0].message() ==
        "rank 1: shared-memory ring consumed to position 1099511627776, past the 0 bytes produced");
  // The frame itself went over TCP, whole: nothing waits for room.
  REQUIRE(p.tcp.sent.size() == 1);
  CHECK(p.tcp.sent[0].header.type == MsgType::Data);
  CHECK(p.tcp.sent[0].payload_size() == kShmMinPayload);
  CHECK(p.shm->queued_bytes(1) == 0);
  CHECK_FALSE(p.shm->active_to(1));
}
