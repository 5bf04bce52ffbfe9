// The shared-memory transport between this rank (0) and a rank 1 played by the test: the
// test hands rank 0 the frames its TCP link would deliver, writes rank 1's side of the
// segments itself, and records what rank 0 sends, drops and asks of its loop.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "common/dtype.h"
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

// The engine above: takes every frame, reading ModelReply payloads into `into`, and calls
// on_frame after each.
struct Engine : ReceiveHandler {
  std::function<void()> on_frame;
  int frames = 0;
  std::vector<FrameHeader> headers;
  std::vector<std::string> names;
  std::vector<uint8_t> into;
  Status accept_frame(int, const FrameHeader& h, const std::string& name, const uint8_t*,
                      uint8_t** target) override {
    headers.push_back(h);
    names.push_back(name);
    into.assign(h.type == MsgType::ModelReply ? h.payload_len : 0, 0);
    *target = into.empty() ? nullptr : into.data();
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

  void deliver_tcp(FrameHeader h, const std::vector<uint8_t>& payload,
                   const std::string& name = "shm") {
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

namespace {

// A ModelReply's data frame as the model service builds it (runtime/model_service.cpp).
FrameHeader model_reply(uint64_t offset) {
  FrameHeader h = from_rank1(MsgType::ModelReply);
  h.op_version = 3;
  h.count = 3 * kShmMinPayload;
  h.chunk = 9;
  h.offset = offset;
  return h;
}

std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 1);
  return bytes;
}

}  // namespace

TEST_CASE("shm transport: a large ModelReply goes through the ring as a ShmData frame without an op", "[shm]") {
  Pair p;
  const std::vector<uint8_t> bytes = pattern(kShmMinPayload);
  int sent = 0;
  OutMessage reply;
  reply.header = model_reply(kShmMinPayload);
  reply.name = "model";
  reply.payload = bytes.data();
  reply.payload_len = bytes.size();
  reply.on_sent = [&](const Status& s) { sent += s.is_ok() ? 1 : 100; };
  p.shm->send(1, std::move(reply));
  // The descriptor went through the mailbox: nothing over TCP but its doorbell.
  REQUIRE(p.tcp.sent.size() == 1);
  CHECK(p.tcp.sent[0].header.type == MsgType::ShmBell);
  p.tcp.run_deferred();
  CHECK(sent == 1);

  ShmConsumer rank1_in(std::move(p.rank0_ring));
  ShmRecord rec;
  REQUIRE(rank1_in.peek(&rec, rank1_in.mail_end()).is_ok());
  REQUIRE(rec.frame != nullptr);
  FrameLimits l;
  l.world_size = 2;
  l.cluster_version = kVersion;
  FrameHeader h;
  REQUIRE(decode_header(rec.frame, l, &h).is_ok());
  CHECK(h.type == MsgType::ShmData);
  CHECK(h.op_kind == OpKind::None);
  CHECK(h.op_version == 3);
  CHECK(h.count == 3 * kShmMinPayload);
  CHECK(h.chunk == 9);
  CHECK(h.offset == kShmMinPayload);
  CHECK(h.payload_len == kShmDataPayload);
  CHECK(std::string(reinterpret_cast<const char*>(rec.frame + kHeaderSize), h.name_len) == "model");
  const ShmDescriptor where = decode_descriptor(rec.frame + kHeaderSize + h.name_len);
  REQUIRE(rank1_in.check(where, kShmMinRingBytes).is_ok());
  CHECK(where.length == kShmMinPayload);
  CHECK(std::memcmp(rank1_in.at(where), bytes.data(), bytes.size()) == 0);
}

TEST_CASE("shm transport: a ShmData frame without an op arrives as the ModelReply it stands for", "[shm]") {
  Pair p;
  const std::vector<uint8_t> bytes = pattern(kShmMinPayload);
  ShmDescriptor where;
  REQUIRE(p.rank1_out->push(bytes.data(), bytes.size(), &where));
  std::vector<uint8_t> descriptor(kShmDescriptorBytes);
  encode_descriptor(where, descriptor.data());
  FrameHeader h = model_reply(2 * kShmMinPayload);
  h.type = MsgType::ShmData;
  p.deliver_tcp(h, descriptor, "model");
  CHECK(p.tcp.drops.empty());
  REQUIRE(p.engine.headers.size() == 1);
  const FrameHeader& got = p.engine.headers[0];
  CHECK(got.type == MsgType::ModelReply);
  CHECK(got.op_kind == OpKind::None);
  CHECK(got.src_rank == 1);
  CHECK(got.stage == 0);
  CHECK(got.op_version == 3);
  CHECK(got.count == 3 * kShmMinPayload);
  CHECK(got.chunk == 9);
  CHECK(got.offset == 2 * kShmMinPayload);
  CHECK(got.payload_len == kShmMinPayload);
  CHECK(p.engine.names[0] == "model");
  CHECK(p.engine.into == bytes);
  CHECK(p.engine.frames == 1);
}

TEST_CASE("shm transport: a ShmData frame is checked as the frame it stands for", "[shm]") {
  // The header of a ShmData frame without an op is only checked once rebuilt: a ModelReply
  // that would be refused over TCP is refused from the ring too, and so is a Data frame.
  struct Case {
    std::function<void(FrameHeader&)> edit;
    std::string says;
  };
  const std::vector<Case> cases = {
      {[](FrameHeader& h) { h.stage = 2; }, "rank 1: ShmData: bad stage 2 in a ModelReply frame"},
      {[](FrameHeader& h) {
         h.op_kind = OpKind::Allreduce;
         h.dtype = static_cast<uint8_t>(DType::F32);
         h.stage = 2;
       },
       "rank 1: ShmData: bad stage 2"},
  };
  for (const Case& c : cases) {
    Pair p;
    const std::vector<uint8_t> bytes = pattern(kShmMinPayload);
    ShmDescriptor where;
    REQUIRE(p.rank1_out->push(bytes.data(), bytes.size(), &where));
    std::vector<uint8_t> descriptor(kShmDescriptorBytes);
    encode_descriptor(where, descriptor.data());
    FrameHeader h = model_reply(0);
    h.type = MsgType::ShmData;
    c.edit(h);
    p.deliver_tcp(h, descriptor, "model");
    REQUIRE(p.tcp.drops.size() == 1);
    CHECK(p.tcp.drops[0].code() == Code::Protocol);
    CHECK(p.tcp.drops[0].message() == c.says);
    CHECK(p.engine.headers.empty());
  }
}
