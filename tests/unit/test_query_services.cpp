// The router's query services over a recording transport: the stall watchdog asks every
// rank that has not finalized and answers whether this peer posted an op, and the
// round-trip probes ask every rank that has not finalized and answer every probe at once.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "runtime/rtt_probes.h"
#include "runtime/stall_watchdog.h"

using namespace taiji;

namespace {

struct Sent {
  int dst;
  MsgType type;
  std::string name;
  uint64_t version;
  uint32_t chunk;
};

class RecordingTransport final : public Transport {
 public:
  std::vector<Sent> sent;
  uint64_t queued = 0;
  void send(int dst, OutMessage m) override {
    sent.push_back({dst, m.header.type, m.name, m.header.op_version, m.header.chunk});
  }
  void pause_reading(int) override {}
  void resume_reading(int) override {}
  uint64_t queued_bytes(int) const override { return queued; }
  void drop(int, const Status&) override {}
  void shutdown(std::function<void()>) override {}
  void close_now(std::function<void()>) override {}
  void defer(std::function<void()>) override {}
};

FrameHeader frame(MsgType type, uint64_t version, uint32_t chunk = 0) {
  FrameHeader h;
  h.type = type;
  h.op_version = version;
  h.chunk = chunk;
  return h;
}

void deliver(ReceiveHandler& service, int src, const FrameHeader& h, const std::string& name) {
  uint8_t* target = nullptr;
  REQUIRE(service.accept_frame(src, h, name, nullptr, &target).is_ok());
  CHECK(target == nullptr);
  service.frame_done(src, h, name);
}

}  // namespace

TEST_CASE("query services: the watchdog answers whether the op is posted here and not held",
          "[services]") {
  NameTable names;
  REQUIRE(names.reserve("w", 1).is_ok());
  REQUIRE(names.reserve("g", 1).is_ok());
  RecordingTransport t;
  StallWatchdog w({0, 3, [](const std::string& name, uint64_t) { return name == "g"; }}, &names,
                  [](const StallWatchdog::Key&, StallWatchdog::OpState*) { return false; });
  w.set_transport(&t);
  deliver(w, 1, frame(MsgType::Query, 1), "w");
  deliver(w, 2, frame(MsgType::Query, 2), "w");
  deliver(w, 2, frame(MsgType::Query, 1), "g");
  t.queued = (64 << 10) + 1;  // a rank that asks without reading gets no more answers
  deliver(w, 1, frame(MsgType::Query, 1), "w");
  REQUIRE(t.sent.size() == 3);
  CHECK((t.sent[0].dst == 1 && t.sent[0].type == MsgType::Answer && t.sent[0].name == "w" &&
         t.sent[0].version == 1 && t.sent[0].chunk == 1));
  CHECK((t.sent[1].dst == 2 && t.sent[1].version == 2 && t.sent[1].chunk == 0));
  CHECK((t.sent[2].dst == 2 && t.sent[2].name == "g" && t.sent[2].chunk == 0));

  FrameHeader payload = frame(MsgType::Answer, 1);
  payload.payload_len = 1;
  uint8_t* target = nullptr;
  CHECK(w.accept_frame(1, payload, "w", nullptr, &target).code() == Code::Protocol);
}

TEST_CASE("query services: the watchdog asks the ranks that have not finalized and keeps their answers",
          "[services]") {
  NameTable names;
  RecordingTransport t;
  bool running = true;
  StallWatchdog w({1, 4, {}}, &names, [&](const StallWatchdog::Key&, StallWatchdog::OpState* out) {
    *out = {"allreduce 'late' version 1", 10, {}};
    return running;
  });
  w.set_transport(&t);
  const StallWatchdog::Key key{"late", 1};
  w.ask(key, frame(MsgType::Query, 1), {false, false, false, true});
  REQUIRE(t.sent.size() == 2);
  CHECK((t.sent[0].dst == 0 && t.sent[0].type == MsgType::Query && t.sent[0].name == "late"));
  CHECK(t.sent[1].dst == 2);
  CHECK(w.unposted(key) == std::vector<int>{3});
  deliver(w, 0, frame(MsgType::Answer, 1, 0), "late");
  deliver(w, 0, frame(MsgType::Answer, 1, 1), "late");  // a second answer changes nothing
  CHECK(w.unposted(key) == std::vector<int>{0, 3});
  running = false;  // the op failed: its answers are ignored
  deliver(w, 2, frame(MsgType::Answer, 1, 0), "late");
  CHECK(w.unposted(key) == std::vector<int>{0, 3});
  w.forget(key);
  CHECK(w.unposted(key).empty());
  CHECK(rank_list({0, 2, 5}) == "0 2 5");
}

TEST_CASE("query services: probes go to every rank that has not finalized and are answered at once",
          "[services]") {
  RecordingTransport t;
  RttProbes probes(1, 4, nullptr);
  probes.set_transport(&t);
  probes.link_down(2, true, {});
  probes.link_down(3, false, {Code::PeerLost, "gone"});  // lost, not finalized: still probed
  probes.send(7);
  REQUIRE(t.sent.size() == 2);
  CHECK((t.sent[0].dst == 0 && t.sent[0].type == MsgType::Query && t.sent[0].name == "taiji.probe" &&
         t.sent[0].version == 7));
  CHECK(t.sent[1].dst == 3);
  t.sent.clear();
  deliver(probes, 3, frame(MsgType::Query, 9), RttProbes::kName);
  deliver(probes, 0, frame(MsgType::Answer, 7), RttProbes::kName);  // no metrics: nothing to note
  REQUIRE(t.sent.size() == 1);
  CHECK((t.sent[0].dst == 3 && t.sent[0].type == MsgType::Answer && t.sent[0].name == "taiji.probe" &&
         t.sent[0].version == 9 && t.sent[0].chunk == 0));
}
