#include <catch2/catch.hpp>

#include <array>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "common/dtype.h"
#include "transport/frame.h"

using namespace taiji;

namespace {

using Bytes = std::array<uint8_t, kHeaderSize>;

Bytes encode(const FrameHeader& h) {
  Bytes b{};
  encode_header(h, b.data());
  return b;
}

bool same(const FrameHeader& a, const FrameHeader& b) {
  return a.magic == b.magic && a.protocol == b.protocol && a.type == b.type &&
         a.op_kind == b.op_kind && a.cluster_version == b.cluster_version &&
         a.src_rank == b.src_rank && a.dtype == b.dtype && a.redop == b.redop &&
         a.name_len == b.name_len && a.root == b.root && a.op_version == b.op_version &&
         a.count == b.count && a.chunk == b.chunk && a.stage == b.stage &&
         a.strategy == b.strategy && a.strategy_tag == b.strategy_tag && a.offset == b.offset &&
         a.payload_len == b.payload_len;
}

FrameLimits limits4() {
  FrameLimits l;
  l.world_size = 4;
  l.cluster_version = 7;
  l.max_name_len = 256;
  l.max_payload = 64ull << 20;
  return l;
}

// A valid Data frame under limits4().
FrameHeader data_header() {
  FrameHeader h;
  h.type = MsgType::Data;
  h.op_kind = OpKind::Allreduce;
  h.cluster_version = 7;
  h.src_rank = 2;
  h.dtype = static_cast<uint8_t>(DType::F32);
  h.redop = static_cast<uint8_t>(RedOp::Sum);
  h.name_len = 5;
  h.root = 1;
  h.op_version = 42;
  h.count = 1000;
  h.chunk = 3;
  h.stage = 1;
  h.strategy = 0;
  h.offset = 4096;
  h.payload_len = 4000;
  return h;
}

FrameHeader sentinel() {
  FrameHeader s;
  s.magic = 0xDEADBEEF;
  s.count = 0x5555;
  s.payload_len = 77;
  return s;
}

// Decodes h's encoding and requires a Protocol error containing `fragment`, with *out
// left untouched.
void require_error(const FrameHeader& h, const FrameLimits& l, const std::string& fragment) {
  Bytes b = encode(h);
  FrameHeader out = sentinel();
  Status s = decode_header(b.data(), l, &out);
  INFO("expected: " << fragment << "; got: " << s.message());
  REQUIRE_FALSE(s.is_ok());
  CHECK(s.code() == Code::Protocol);
  CHECK(s.message().find(fragment) != std::string::npos);
  CHECK(same(out, sentinel()));
}

void require_ok(const FrameHeader& h, const FrameLimits& l) {
  Bytes b = encode(h);
  FrameHeader out = sentinel();
  Status s = decode_header(b.data(), l, &out);
  INFO(s.message());
  REQUIRE(s.is_ok());
  CHECK(same(out, h));
}

}  // namespace

TEST_CASE("every header field round-trips", "[frame]") {
  FrameHeader h;
  h.type = MsgType::Data;
  h.op_kind = OpKind::Broadcast;
  h.cluster_version = 0xC1C2C3C4;
  h.src_rank = 0xFFFFFFFE;
  h.dtype = static_cast<uint8_t>(DType::U64);
  h.redop = 0xEE;  // not checked outside Allreduce
  h.name_len = 0xFFFF;
  h.root = 0x89ABCDEF;
  h.op_version = 0xFEDCBA9876543210ull;
  h.count = 0x0123456789ABCDEFull;
  h.chunk = 0xA1B2C3D4;
  h.stage = 1;
  h.strategy = 0xF5;
  h.offset = 0x8877665544332211ull;
  h.payload_len = 0xFFFFFFFFFFFFFFF8ull;

  FrameLimits l;
  l.world_size = 0xFFFFFFFF;
  l.cluster_version = 0xC1C2C3C4;
  l.max_name_len = 0xFFFF;
  l.max_payload = std::numeric_limits<uint64_t>::max();
  require_ok(h, l);

  for (MsgType t : {MsgType::Hello, MsgType::Ready, MsgType::Abort, MsgType::Bye}) {
    FrameHeader g = h;
    g.type = t;
    g.dtype = 0xAB;  // only Data frames carry an element type
    g.stage = 0xCD;
    g.root = 0xFFFFFFFF;
    g.payload_len = 13;
    require_ok(g, l);
  }
}

TEST_CASE("encoding puts each field little-endian at its offset", "[frame]") {
  FrameHeader h;
  h.type = MsgType::Data;
  h.op_kind = OpKind::Allreduce;
  h.cluster_version = 0x01020304;
  h.src_rank = 0x0A0B0C0D;
  h.dtype = static_cast<uint8_t>(DType::I32);
  h.redop = static_cast<uint8_t>(RedOp::Max);
  h.name_len = 0x0102;
  h.root = 0x11223344;
  h.op_version = 0x0102030405060708ull;
  h.count = 0x1112131415161718ull;
  h.chunk = 0x21222324;
  h.stage = 1;
  h.strategy = 0x7F;
  h.offset = 0x3132333435363738ull;
  h.payload_len = 0x4142434445464748ull;
  const Bytes want = {
      0x54, 0x4A, 0x30, 0x31,                          // magic "TJ01"
      0x01, 0x00,                                      // protocol
      0x03,                                            // type Data
      0x01,                                            // op_kind Allreduce
      0x04, 0x03, 0x02, 0x01,                          // cluster_version
      0x0D, 0x0C, 0x0B, 0x0A,                          // src_rank
      0x06,                                            // dtype i32
      0x03,                                            // redop max
      0x02, 0x01,                                      // name_len
      0x44, 0x33, 0x22, 0x11,                          // root
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // op_version
      0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,  // count
      0x24, 0x23, 0x22, 0x21,                          // chunk
      0x01,                                            // stage
      0x7F,                                            // strategy
      0x00, 0x00,                                      // strategy_tag
      0x38, 0x37, 0x36, 0x35, 0x34, 0x33, 0x32, 0x31,  // offset
      0x48, 0x47, 0x46, 0x45, 0x44, 0x43, 0x42, 0x41,  // payload_len
  };
  CHECK(encode(h) == want);
  CHECK(std::memcmp(want.data(), "TJ01", 4) == 0);

  FrameLimits l;
  l.world_size = 0x7FFFFFFF;
  l.cluster_version = 0x01020304;
  l.max_name_len = 0x0102;
  l.max_payload = std::numeric_limits<uint64_t>::max();
  FrameHeader out;
  REQUIRE(decode_header(want.data(), l, &out).is_ok());
  CHECK(same(out, h));
}

TEST_CASE("decode rejects each invalid field", "[frame]") {
  const FrameLimits l = limits4();
  require_ok(data_header(), l);
  FrameHeader h = data_header();

  SECTION("magic") {
    h.magic = 0x12345678;
    require_error(h, l, "bad magic 0x12345678");
  }
  SECTION("protocol") {
    h.protocol = 2;
    require_error(h, l, "protocol 2");
  }
  SECTION("type") {
    h.type = static_cast<MsgType>(0);
    require_error(h, l, "bad type 0");
    h.type = static_cast<MsgType>(kMaxMsgType + 1);
    require_error(h, l, "bad type " + std::to_string(kMaxMsgType + 1));
  }
  SECTION("model store frames") {
    FrameHeader m = data_header();
    m.type = MsgType::ModelRequest;
    m.op_kind = OpKind::None;
    m.payload_len = 0;
    require_ok(m, l);
    m.payload_len = 1;
    require_error(m, l, "payload_len 1 in a ModelRequest frame (expected 0)");
    m.type = MsgType::ModelReply;
    require_ok(m, l);
    m.stage = 2;
    require_error(m, l, "bad stage 2 in a ModelReply frame");
    // Through the ring it would come back as a Data frame.
    m.stage = 0;
    m.op_kind = OpKind::Broadcast;
    require_error(m, l, "op_kind " + std::to_string(static_cast<int>(OpKind::Broadcast)) +
                            " in a ModelReply frame (expected 0)");
    m.type = MsgType::Device;
    m.op_kind = OpKind::None;
    m.payload_len = 16;
    m.stage = 3;
    require_ok(m, l);
    m.stage = 4;
    require_error(m, l, "bad stage 4 in a Device frame");
  }
  SECTION("op_kind") {
    h.op_kind = static_cast<OpKind>(kMaxOpKind + 1);
    require_error(h, l, "bad op_kind " + std::to_string(kMaxOpKind + 1));
    for (MsgType t : {MsgType::Data, MsgType::Ready, MsgType::Abort}) {
      h.type = t;
      h.op_kind = OpKind::None;
      require_error(h, l, "op_kind 0");
    }
    for (MsgType t : {MsgType::Hello, MsgType::Bye}) {
      h.type = t;
      h.op_kind = OpKind::None;
      require_ok(h, l);
    }
  }
  SECTION("src_rank") {
    h.src_rank = 4;
    require_error(h, l, "src_rank 4");
  }
  SECTION("cluster_version") {
    h.cluster_version = 8;
    require_error(h, l, "cluster_version 8");
  }
  SECTION("name_len") {
    h.name_len = 257;
    require_error(h, l, "name_len 257 exceeds cap 256");
    h.name_len = 256;
    require_ok(h, l);
    h.name_len = 0;
    require_error(h, l, "name_len 0");
    h.type = MsgType::Ready;
    require_error(h, l, "name_len 0");
    h.type = MsgType::Hello;
    h.op_kind = OpKind::None;
    require_ok(h, l);
  }
  SECTION("payload_len") {
    h.payload_len = 99999999999ull;
    require_error(h, l, "payload_len 99999999999 exceeds cap 67108864");
    h.payload_len = 64ull << 20;
    require_ok(h, l);
    h.type = MsgType::Abort;
    h.payload_len = (64ull << 20) + 1;
    require_error(h, l, "payload_len 67108865 exceeds cap");
  }
  SECTION("dtype") {
    h.dtype = kDTypeCount;
    require_error(h, l, "bad dtype 10");
  }
  SECTION("redop, only for Allreduce") {
    h.redop = kRedOpCount;
    require_error(h, l, "bad redop 5");
    h.op_kind = OpKind::Broadcast;
    require_ok(h, l);
  }
  SECTION("root") {
    h.root = 4;
    require_error(h, l, "root 4");
  }
  SECTION("stage") {
    h.stage = 2;
    require_error(h, l, "bad stage 2");
  }
  SECTION("payload multiple of the element size") {
    h.dtype = static_cast<uint8_t>(DType::F64);
    h.payload_len = 12;
    require_error(h, l, "payload_len 12 not a multiple of dtype size 8");
    h.payload_len = 16;
    require_ok(h, l);
    h.dtype = static_cast<uint8_t>(DType::U8);
    h.payload_len = 13;
    require_ok(h, l);
  }
  SECTION("checks run in the documented order") {
    // Bad magic and bad everything else: magic is reported.
    h.magic = 0;
    h.protocol = 9;
    h.src_rank = 99;
    require_error(h, l, "bad magic 0x00000000");
    h.magic = kFrameMagic;
    require_error(h, l, "protocol 9");
    h.protocol = kProtocolVersion;
    h.cluster_version = 1;
    require_error(h, l, "src_rank 99");
    h.src_rank = 0;
    require_error(h, l, "cluster_version 1");
    h.cluster_version = 7;
    h.payload_len = 1ull << 40;
    h.dtype = 200;
    require_error(h, l, "payload_len");
  }
}

TEST_CASE("decode survives random and mutated headers", "[frame]") {
  std::mt19937_64 rng(0x7A1F2A3E);
  std::uniform_int_distribution<int> byte(0, 255);
  FrameLimits l = limits4();

  // A decoded header must re-encode to exactly the bytes it came from.
  auto check = [&](const Bytes& b) {
    FrameHeader out = sentinel();
    Status s = decode_header(b.data(), l, &out);
    if (s.is_ok()) {
      REQUIRE(encode(out) == b);
    } else {
      REQUIRE(s.code() == Code::Protocol);
      REQUIRE_FALSE(s.message().empty());
      REQUIRE(same(out, sentinel()));
    }
    return s.is_ok();
  };

  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    Bytes b;
    for (uint8_t& x : b) x = static_cast<uint8_t>(byte(rng));
    if (i % 2 == 0) {
      // Keep magic and protocol so later checks get reached.
      Bytes valid = encode(data_header());
      std::memcpy(b.data(), valid.data(), 6);
    }
    accepted += check(b) ? 1 : 0;
  }

  const FrameHeader bases[] = {data_header(), [] {
                                 FrameHeader h;
                                 h.type = MsgType::Hello;
                                 h.cluster_version = 7;
                                 h.src_rank = 3;
                                 h.name_len = 0;
                                 return h;
                               }()};
  for (const FrameHeader& base : bases) {
    const Bytes valid = encode(base);
    for (size_t pos = 0; pos < kHeaderSize; ++pos) {
      for (int v = 0; v < 256; ++v) {
        Bytes b = valid;
        b[pos] = static_cast<uint8_t>(v);
        accepted += check(b) ? 1 : 0;
      }
    }
  }
  CHECK(accepted > 1000);
}
