// The model service over a recording transport: replies go in chunks that borrow the
// stored bytes (alive past their eviction until sent), one reply at a time per rank with
// a bounded wait list, errors refused past the queue cap; on the requester's side a reply
// that does not fit closes the link, a late one is dropped, and a request past its
// deadline completes only once the frame being read into its buffer ends.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "runtime/model_service.h"

using namespace taiji;

namespace {

class RecordingTransport final : public Transport {
 public:
  std::vector<OutMessage> sent;
  uint64_t queued = 0;
  void send(int dst, OutMessage m) override {
    m.header.src_rank = static_cast<uint32_t>(dst);  // where it went, for the checks
    sent.push_back(std::move(m));
  }
  void pause_reading(int) override {}
  void resume_reading(int) override {}
  uint64_t queued_bytes(int) const override { return queued; }
  void drop(int, const Status&) override {}
  void shutdown(std::function<void()>) override {}
  void close_now(std::function<void()>) override {}
  void defer(std::function<void()>) override {}
  // Reports every message sent so far as sent, as the loop would.
  void finish_sends() {
    std::vector<OutMessage> done;
    done.swap(sent);
    for (OutMessage& m : done) {
      if (m.on_sent) m.on_sent({});
    }
  }
};

FrameHeader request_frame(uint32_t id, uint64_t version, uint64_t bytes) {
  FrameHeader h;
  h.type = MsgType::ModelRequest;
  h.op_version = version;
  h.count = bytes;
  h.chunk = id;
  return h;
}

void ask(ModelService& s, int src, uint32_t id, const std::string& name, uint64_t version, uint64_t bytes) {
  uint8_t* target = nullptr;
  FrameHeader h = request_frame(id, version, bytes);
  REQUIRE(s.accept_frame(src, h, name, nullptr, &target).is_ok());
  s.frame_done(src, h, name);
}

std::vector<uint8_t> pattern(size_t n, uint8_t salt) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + salt);
  return v;
}

}  // namespace

TEST_CASE("model service: a reply goes in chunks borrowing the stored bytes", "[modelservice]") {
  ModelStore store(1, 1 << 20);
  ModelService service(0, 2, &store, 1000);
  RecordingTransport t;
  service.set_transport(&t);
  const std::vector<uint8_t> model = pattern(2500, 1);
  REQUIRE(store.save("w", model.data(), model.size(), 0).is_ok());
  ask(service, 1, 9, "w", 0, 2500);
  REQUIRE(t.sent.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    const OutMessage& m = t.sent[i];
    CHECK(m.header.type == MsgType::ModelReply);
    CHECK(m.header.stage == 0);
    CHECK(m.header.chunk == 9);
    CHECK(m.header.count == 2500);
    CHECK(m.header.op_version == 1);
    CHECK(m.header.offset == i * 1000);
    CHECK(m.payload_size() == (i < 2 ? 1000u : 500u));
    CHECK(std::memcmp(m.payload_data(), model.data() + i * 1000, m.payload_size()) == 0);
  }
  // Evicted while its chunks are still queued: the borrowed bytes stay valid.
  REQUIRE(store.save("w", pattern(10, 2).data(), 10, 0).is_ok());
  CHECK(std::memcmp(t.sent[2].payload_data(), model.data() + 2000, 500) == 0);
  t.finish_sends();
}

TEST_CASE("model service: one reply at a time per rank, a bounded wait list, no answers to a rank that does not read",
          "[modelservice]") {
  ModelStore store(3, 1 << 20);
  ModelService service(0, 3, &store, 1 << 20);
  RecordingTransport t;
  service.set_transport(&t);
  REQUIRE(store.save("w", pattern(100, 3).data(), 100, 0).is_ok());
  const uint32_t n = 1 + ModelService::kMaxWaitingRequests + 5;
  for (uint32_t id = 1; id <= n; ++id) ask(service, 1, id, "w", 0, 100);
  // The first is sent, 64 wait, the 5 beyond are refused.
  REQUIRE(t.sent.size() == 6);
  CHECK(t.sent[0].header.chunk == 1);
  CHECK(t.sent[0].header.stage == 0);
  for (size_t i = 1; i < 6; ++i) {
    CHECK(t.sent[i].header.stage == 1);
    CHECK(t.sent[i].header.root == static_cast<uint32_t>(-static_cast<int32_t>(Code::NoMemory)));
    CHECK(std::string(t.sent[i].owned.begin(), t.sent[i].owned.end()) == "rank 0 holds 64 model requests of this rank already");
  }
  // Another rank is served meanwhile.
  ask(service, 2, 1, "w", 0, 100);
  REQUIRE(t.sent.size() == 7);
  CHECK(t.sent[6].header.src_rank == 2);
  // Once a reply is sent, the next waiting one goes.
  std::function<void(const Status&)> first_sent = t.sent[0].on_sent;
  t.sent.clear();
  first_sent({});
  REQUIRE(t.sent.size() == 1);
  CHECK(t.sent[0].header.chunk == 2);
  // A rank with more than kMaxQueuedForAnswer queued gets no error replies.
  t.queued = kMaxQueuedForAnswer + 1;
  t.sent.clear();
  ask(service, 2, 50, "nothing", 0, 1);
  ask(service, 2, 51, "w", 0, 99);
  CHECK(t.sent.empty());
  // A lost rank's wait list goes with it.
  service.link_down(1, false, {Code::PeerLost, "gone"});
  ask(service, 1, 999, "w", 0, 100);
  CHECK(t.sent.empty());
}

TEST_CASE("model service: the requester reads replies into the buffer and guards it", "[modelservice]") {
  ModelStore store(3, 1 << 20);
  ModelService service(1, 2, &store, 1 << 20);
  RecordingTransport t;
  service.set_transport(&t);
  std::vector<uint8_t> buf(100, 0);
  auto state = std::make_shared<RequestState>(0, nullptr);
  service.start(0, "w", 0, buf.data(), 100, 0, 500, state);
  REQUIRE(t.sent.size() == 1);
  const uint32_t id = t.sent[0].header.chunk;
  FrameHeader h;
  h.type = MsgType::ModelReply;
  h.chunk = id;
  h.count = 100;
  h.op_version = 4;
  uint8_t* target = nullptr;

  SECTION("a reply past the buffer closes the link") {
    h.offset = 60;
    h.payload_len = 41;
    Status s = service.accept_frame(0, h, "w", nullptr, &target);
    CHECK(s.code() == Code::Protocol);
    CHECK_FALSE(state->test(nullptr));
  }
  SECTION("a reply from another rank, or for another id, is dropped") {
    h.payload_len = 100;
    REQUIRE(service.accept_frame(0, [&] { FrameHeader o = h; o.chunk = id + 1; return o; }(), "w", nullptr, &target).is_ok());
    CHECK(target == nullptr);
    service.frame_done(0, h, "w");
    CHECK_FALSE(state->test(nullptr));
  }
  SECTION("two chunks complete it") {
    h.payload_len = 50;
    for (uint64_t off : {50u, 0u}) {
      h.offset = off;
      REQUIRE(service.accept_frame(0, h, "w", nullptr, &target).is_ok());
      REQUIRE(target == buf.data() + off);
      std::memset(target, static_cast<int>(off + 1), 50);
      service.frame_done(0, h, "w");
    }
    Status s;
    REQUIRE(state->test(&s));
    CHECK(s.is_ok());
    CHECK(buf[0] == 1);
    CHECK(buf[99] == 51);
    CHECK(service.pending() == 0);
  }
  SECTION("past its deadline with a frame open, it completes when the frame ends") {
    h.payload_len = 100;
    REQUIRE(service.accept_frame(0, h, "w", nullptr, &target).is_ok());
    service.tick(600);
    CHECK_FALSE(state->test(nullptr));
    service.frame_done(0, h, "w");
    Status s;
    REQUIRE(state->test(&s));
    CHECK(s.code() == Code::Timeout);
    CHECK(s.message() == "model request for 'w' (latest) from rank 0 timed out after 600 ms (0 of 100 bytes arrived)");
  }
  SECTION("an error reply carries the owner's status and text") {
    h.stage = 1;
    h.root = static_cast<uint32_t>(-static_cast<int32_t>(Code::NotFound));
    const std::string why = "no model 'w' was saved";
    h.payload_len = why.size();
    REQUIRE(service.accept_frame(0, h, "w", nullptr, &target).is_ok());
    std::memcpy(target, why.data(), why.size());
    service.frame_done(0, h, "w");
    Status s;
    REQUIRE(state->test(&s));
    CHECK(s.code() == Code::NotFound);
    CHECK(s.message() == "rank 0: no model 'w' was saved");
  }
  SECTION("a lost link fails it at once, and later requests to that rank") {
    service.link_down(0, false, {Code::PeerLost, "connection reset"});
    Status s;
    REQUIRE(state->test(&s));
    CHECK(s.code() == Code::PeerLost);
    CHECK(s.message() == "model request for 'w' (latest) from rank 0: rank 0 was lost: connection reset");
    auto later = std::make_shared<RequestState>(0, nullptr);
    service.start(0, "w", 2, buf.data(), 100, 0, 500, later);
    REQUIRE(later->test(&s));
    CHECK(s.code() == Code::PeerLost);
  }
}
