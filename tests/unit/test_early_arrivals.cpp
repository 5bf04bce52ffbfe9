// The early-arrival pool on its own: what it holds counts against the cap, reads from a
// sender pause past it and resume below it, discarding frees what is held, and a frame cut
// by its link's loss is dropped with its bytes.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "runtime/early_arrivals.h"

using namespace taiji;

namespace {

constexpr uint64_t kItem = 128;  // what the pool charges per held item besides payload and name

struct Pool {
  std::vector<int> paused;
  std::vector<int> resumed;
  Metrics metrics{0, 3, 16};
  EarlyArrivals early;

  explicit Pool(uint64_t cap)
      : early({3, cap, cap, &metrics, [this](int src) { paused.push_back(src); },
               [this](int src) { resumed.push_back(src); }}) {}

  // A data frame of `bytes` from src for key, received whole; keep: its op has not started.
  std::unique_ptr<EarlyArrivals::Data> data(int src, const EarlyArrivals::Key& key, uint64_t bytes,
                                            bool keep = true) {
    FrameHeader h;
    h.src_rank = static_cast<uint32_t>(src);
    h.op_version = key.second;
    h.payload_len = bytes;
    uint8_t* target = nullptr;
    REQUIRE(early.begin_data(src, key, h, &target).is_ok());
    REQUIRE(early.arriving(src));
    if (bytes > 0) std::memset(target, src + 1, bytes);
    return early.complete(src, key, keep);
  }
};

FrameHeader ready_from(int src) {
  FrameHeader h;
  h.type = MsgType::Ready;
  h.src_rank = static_cast<uint32_t>(src);
  return h;
}

}  // namespace

TEST_CASE("early arrivals: held bytes are counted exactly and claimed in full", "[early]") {
  Pool p(1 << 20);
  const EarlyArrivals::Key key{"op", 1};
  p.data(1, key, 100);
  p.early.hold_ready(2, key, ready_from(2));
  CHECK(p.early.bytes() == 100 + 2 * (kItem + 2));
  CHECK(p.early.holds(key));
  CHECK_FALSE(p.early.holds({"op", 2}));

  EarlyArrivals::Claimed c = p.early.claim(key);
  REQUIRE(c.readies.size() == 1);
  CHECK(c.readies[0].src_rank == 2);
  REQUIRE(c.data.size() == 1);
  CHECK(c.data[0]->payload == std::vector<uint8_t>(100, 2));
  CHECK(c.data[0]->complete);
  CHECK(p.early.bytes() == 0);
  CHECK_FALSE(p.early.holds(key));
  CHECK(p.paused.empty());
}

TEST_CASE("early arrivals: a payload over the largest accepted is refused before allocation", "[early]") {
  Pool p(1000);
  FrameHeader h;
  h.payload_len = 1001;
  uint8_t* target = nullptr;
  Status s = p.early.begin_data(1, {"big", 3}, h, &target);
  CHECK(s.code() == Code::Protocol);
  CHECK(s.message() == "early data for 'big' version 3 of 1001 bytes exceeds the early-arrival cap 1000");
  CHECK(target == nullptr);
  CHECK_FALSE(p.early.arriving(1));
  CHECK(p.early.bytes() == 0);
}

TEST_CASE("early arrivals: reads pause past the cap, once per sender, and resume below it", "[early]") {
  Pool p(1000);
  p.data(1, {"a", 1}, 600);
  CHECK(p.paused.empty());
  p.data(1, {"a", 2}, 600);  // 1200 + items held: past the cap
  CHECK(p.paused == std::vector<int>{1});
  p.early.hold_ready(1, {"a", 3}, ready_from(1));  // already paused: not again
  p.early.hold_ready(2, {"a", 3}, ready_from(2));
  CHECK(p.paused == std::vector<int>{1, 2});
  CHECK(p.metrics.link_counters()[1].read_pauses.load() == 1);
  CHECK(p.metrics.link_counters()[2].read_pauses.load() == 1);
  CHECK(p.resumed.empty());

  p.early.claim({"a", 3});  // still above the cap: nothing resumes
  CHECK(p.resumed.empty());
  p.early.claim({"a", 1});
  CHECK(p.early.bytes() == 600 + kItem + 1);
  CHECK(p.resumed == std::vector<int>{1, 2});
}

TEST_CASE("early arrivals: a frame whose op ended meanwhile is handed back, not held", "[early]") {
  Pool p(1000);
  auto mine = p.data(1, {"x", 1}, 10, /*keep=*/false);
  REQUIRE(mine != nullptr);
  CHECK(mine->payload == std::vector<uint8_t>(10, 2));
  CHECK(p.early.bytes() == 0);
  CHECK_FALSE(p.early.holds({"x", 1}));
}

TEST_CASE("early arrivals: discarding frees what is held, an Abort included", "[early]") {
  Pool p(1 << 20);
  const EarlyArrivals::Key key{"gone", 4};
  p.data(1, key, 50);
  p.early.hold_ready(2, key, ready_from(2));
  p.early.hold_abort(2, key, {Code::Mismatch, "why"});
  p.early.hold_abort(2, key, {Code::Timeout, "later"});  // replaces the first
  CHECK(p.early.abort_for(key).code() == Code::Timeout);
  CHECK(p.early.bytes() == 50 + 3 * (kItem + 4) + 5);
  p.early.discard(key);
  CHECK(p.early.bytes() == 0);
  CHECK_FALSE(p.early.holds(key));
  CHECK(p.early.abort_for(key).is_ok());

  p.data(1, {"past", 1}, 8);
  p.data(1, {"kept", 1}, 8);
  p.early.discard_if([](const EarlyArrivals::Key& k) { return k.first == "past"; });
  CHECK_FALSE(p.early.holds({"past", 1}));
  CHECK(p.early.holds({"kept", 1}));
  CHECK(p.early.bytes() == 8 + kItem + 4);
}

TEST_CASE("early arrivals: a frame still arriving survives a discard and is dropped when its link goes",
          "[early]") {
  Pool p(1 << 20);
  const EarlyArrivals::Key key{"cut", 1};
  FrameHeader h;
  h.payload_len = 300;
  uint8_t* target = nullptr;
  REQUIRE(p.early.begin_data(1, key, h, &target).is_ok());
  CHECK(p.early.bytes() == 300 + kItem + 3);
  p.early.discard(key);  // its payload is being read into it: it stays
  CHECK(p.early.holds(key));
  CHECK(p.early.bytes() == 300 + kItem + 3);
  p.early.drop_partial(2);  // another link: nothing of this one goes
  CHECK(p.early.holds(key));
  p.early.drop_partial(1);
  CHECK_FALSE(p.early.arriving(1));
  CHECK_FALSE(p.early.holds(key));
  CHECK(p.early.bytes() == 0);
}

TEST_CASE("early arrivals: a claim leaves a frame still arriving, which then comes by itself",
          "[early]") {
  Pool p(1 << 20);
  const EarlyArrivals::Key key{"mid", 1};
  p.early.hold_ready(2, key, ready_from(2));
  FrameHeader h;
  h.payload_len = 20;
  uint8_t* target = nullptr;
  REQUIRE(p.early.begin_data(1, key, h, &target).is_ok());
  EarlyArrivals::Claimed c = p.early.claim(key);
  CHECK(c.readies.size() == 1);
  CHECK(c.data.empty());
  CHECK(p.early.holds(key));
  CHECK(p.early.bytes() == 20 + kItem + 3);
  auto late = p.early.complete(1, key, /*keep=*/false);
  REQUIRE(late != nullptr);
  CHECK(late->payload.size() == 20);
  CHECK_FALSE(p.early.holds(key));
  CHECK(p.early.bytes() == 0);
}
