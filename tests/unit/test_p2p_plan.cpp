// A send and a recv as state machines: the sender's chunks go straight from its input to
// the one receiver, the receiver takes them only from that sender, once each, into its
// output; and the names the two sides file the op under.
#include <catch2/catch.hpp>

#include <cstring>
#include <numeric>
#include <vector>

#include "collectives/collective_op.h"
#include "runtime/p2p_key.h"

using namespace taiji;

namespace {

CollectiveSpec side(OpKind kind, int rank, int peer, const void* send, void* recv, uint64_t count) {
  CollectiveSpec spec;
  spec.kind = kind;
  spec.dtype = DType::I32;
  spec.count = count;
  spec.rank = rank;
  spec.size = 4;
  spec.peer = peer;
  spec.send = send;
  spec.recv = recv;
  spec.chunk_bytes = 1024;  // 256 elements
  return spec;
}

}  // namespace

TEST_CASE("p2p plan: chunks go from the sender's input straight into the receiver's output", "[p2p_plan]") {
  constexpr uint64_t count = 1000;  // four chunks, the last one shorter
  std::vector<int32_t> in(count), out(count, -1);
  std::iota(in.begin(), in.end(), 7);
  CollectiveOp send(side(OpKind::Send, 3, 1, in.data(), nullptr, count));
  CollectiveOp recv(side(OpKind::Recv, 1, 3, nullptr, out.data(), count));
  CHECK(send.sources().empty());
  CHECK(send.destinations() == std::vector<int>{1});
  CHECK(recv.sources() == std::vector<int>{3});
  CHECK(recv.destinations().empty());
  REQUIRE(send.chunks() == recv.chunks());
  CHECK(send.chunks() == 4);

  std::vector<ChunkSend> sends;
  send.start(&sends);
  CHECK(send.done());  // its part ends once everything is handed out
  REQUIRE(sends.size() == 4);
  std::vector<ChunkSend> none;
  recv.start(&none);
  CHECK(none.empty());
  CHECK(recv.waiting_on() == std::vector<int>{3});
  uint64_t total = 0;
  for (const ChunkSend& c : sends) {
    CHECK(c.dst == 1);
    CHECK(c.data == reinterpret_cast<const uint8_t*>(in.data()) + c.offset * 4);  // no copy
    uint8_t* into = nullptr;
    // From another rank, or as a broadcast stage: refused, nothing written.
    CHECK_FALSE(recv.target(2, c.chunk, c.stage, c.offset, c.bytes, &into).is_ok());
    CHECK_FALSE(recv.target(3, c.chunk, Stage::Broadcast, c.offset, c.bytes, &into).is_ok());
    CHECK_FALSE(recv.target(3, c.chunk, c.stage, c.offset + 1, c.bytes, &into).is_ok());
    REQUIRE(recv.target(3, c.chunk, c.stage, c.offset, c.bytes, &into).is_ok());
    CHECK(into == reinterpret_cast<uint8_t*>(out.data()) + c.offset * 4);
    std::memcpy(into, c.data, c.bytes);
    std::vector<ChunkSend> more;
    recv.delivered(3, c.chunk, c.stage, &more);
    CHECK(more.empty());
    CHECK_THAT(recv.target(3, c.chunk, c.stage, c.offset, c.bytes, &into).message(),
               Catch::Contains("duplicate chunk"));
    total += c.bytes;
  }
  CHECK(total == count * 4);
  CHECK(recv.done());
  CHECK(recv.waiting_on().empty());
  CHECK(out == in);
}

TEST_CASE("p2p plan: an empty message is one empty chunk", "[p2p_plan]") {
  CollectiveOp send(side(OpKind::Send, 0, 2, nullptr, nullptr, 0));
  CollectiveOp recv(side(OpKind::Recv, 2, 0, nullptr, nullptr, 0));
  std::vector<ChunkSend> sends;
  send.start(&sends);
  REQUIRE(sends.size() == 1);
  CHECK(sends[0].bytes == 0);
  uint8_t* into = nullptr;
  REQUIRE(recv.target(0, 0, Stage::Reduce, 0, 0, &into).is_ok());
  std::vector<ChunkSend> more;
  recv.delivered(0, 0, Stage::Reduce, &more);
  CHECK(recv.done());
}

TEST_CASE("p2p plan: each pair and direction has its own name, apart from collectives'", "[p2p_plan]") {
  CHECK(p2p_key("x", 0, 1) == "taiji.p2p/0>1/x");
  CHECK(p2p_key("x", 0, 1) != p2p_key("x", 1, 0));
  CHECK(p2p_key("x", 1, 23) != p2p_key("x", 12, 3));
  CHECK(p2p_user_name(p2p_key("a/b>c", 12, 3)) == "a/b>c");
  CHECK(p2p_user_name("grad/w") == "grad/w");
  CHECK(p2p_key("", 2147483647, 2147483647).size() <= kP2pKeyOverhead);
}
