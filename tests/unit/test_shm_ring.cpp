// The shared-memory ring: placement, a producer and a consumer over a real segment mapped
// twice (as two processes would), refusal of every position or length that is not exactly
// the next one, and refusal of segments that are not the one offered.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/byte_order.h"
#include "common/dtype.h"
#include "transport/frame.h"
#include "transport/shm_ring.h"

using namespace taiji;

namespace {

constexpr uint64_t kCap = kShmMinRingBytes;

std::vector<uint8_t> pattern(uint64_t len, uint8_t seed) {
  std::vector<uint8_t> v(len);
  for (uint64_t i = 0; i < len; ++i) v[i] = static_cast<uint8_t>(seed * 31 + i * 7 + (i >> 8));
  return v;
}

struct Pair {
  std::unique_ptr<ShmProducer> producer;
  std::unique_ptr<ShmConsumer> consumer;
};

Pair make_pair() {
  auto created = ShmSegment::create(kCap);
  REQUIRE(created.is_ok());
  ShmSegmentInfo info = created.value().info();
  auto opened = ShmSegment::open(info);
  REQUIRE(opened.is_ok());
  Pair p;
  p.producer = std::make_unique<ShmProducer>(std::move(created.value()));
  p.consumer = std::make_unique<ShmConsumer>(std::move(opened.value()));
  return p;
}

using PushFn = bool (ShmProducer::*)(const uint8_t* src, uint64_t len, ShmDescriptor* out);

// A ring filled by two unreleased payloads of half its capacity each, at a and b.
struct FullRing {
  Pair p;
  std::vector<uint8_t> half;
  ShmDescriptor a;
  ShmDescriptor b;
};

FullRing fill_with_halves(uint8_t seed, PushFn push) {
  FullRing r{make_pair(), pattern(kCap / 2, seed), {}, {}};
  REQUIRE((r.p.producer.get()->*push)(r.half.data(), r.half.size(), &r.a));
  REQUIRE((r.p.producer.get()->*push)(r.half.data(), r.half.size(), &r.b));
  return r;
}

}  // namespace

TEST_CASE("shm placement: a payload that would cross the end starts at the next lap", "[shm]") {
  CHECK(shm_place(0, 100, 1000) == 0);
  CHECK(shm_place(900, 100, 1000) == 900);
  CHECK(shm_place(901, 100, 1000) == 1000);
  CHECK(shm_place(1999, 1, 1000) == 1999);
  CHECK(shm_place(1999, 2, 1000) == 2000);
  CHECK(shm_place(5000, 1000, 1000) == 5000);
}

TEST_CASE("shm offer and descriptor round-trip", "[shm]") {
  ShmSegmentInfo info{123456, 77, 1ull << 33, 0x0123456789abcdefull};
  uint8_t buf[kShmOfferBytes];
  encode_offer(info, buf);
  ShmSegmentInfo back = decode_offer(buf);
  CHECK(back.pid == info.pid);
  CHECK(back.fd == info.fd);
  CHECK(back.capacity == info.capacity);
  CHECK(back.nonce == info.nonce);
  uint8_t d[kShmDescriptorBytes];
  encode_descriptor({0xfedcba9876543210ull, 4096}, d);
  ShmDescriptor where = decode_descriptor(d);
  CHECK(where.position == 0xfedcba9876543210ull);
  CHECK(where.length == 4096);
}

TEST_CASE("shm ring carries payloads in order through wrap-around and refuses when full", "[shm]") {
  Pair p = make_pair();
  // Sizes chosen so the ring wraps several times with a skipped tail at the end. The
  // consumer lags one payload behind, so the ring is rarely empty; when a payload does not
  // fit, the held one is consumed first and the payload starts over at the next lap.
  const uint64_t sizes[] = {4096, 30000, 20000, 17000, 1, 40000, 8, 32769, 12345, 33333};
  std::vector<uint8_t> held_bytes;
  ShmDescriptor held;
  bool holding = false;
  auto consume_held = [&] {
    REQUIRE(p.consumer->check(held, 1ull << 30).is_ok());
    CHECK(std::memcmp(p.consumer->at(held), held_bytes.data(), held.length) == 0);
    p.consumer->release(held);
    holding = false;
  };
  uint64_t expected_end = 0;
  int skips = 0, restarts = 0;
  for (int round = 0; round < 3; ++round) {
    uint8_t seed = 0;
    for (uint64_t len : sizes) {
      auto bytes = pattern(len, static_cast<uint8_t>(seed++ + round));
      ShmDescriptor where;
      if (holding && !p.producer->push(bytes.data(), len, &where)) {
        consume_held();
        restarts++;
      }
      if (!holding) {
        REQUIRE(p.producer->push(bytes.data(), len, &where));
        CHECK(where.position == shm_lap_start(expected_end, kCap));
      } else {
        CHECK(where.position == shm_place(expected_end, len, kCap));
        if (where.position != expected_end) skips++;
        consume_held();
      }
      CHECK(where.length == len);
      held = where;
      held_bytes = bytes;
      holding = true;
      expected_end = where.position + len;
    }
  }
  consume_held();
  CHECK(skips > 0);
  CHECK(restarts > 0);
}

TEST_CASE("shm ring starts over at its first byte whenever the consumer caught up", "[shm]") {
  Pair p = make_pair();
  auto bytes = pattern(kCap, 4);
  auto consume = [&](const ShmDescriptor& d) {
    REQUIRE(p.consumer->check(d, kCap).is_ok());
    CHECK(std::memcmp(p.consumer->at(d), bytes.data(), d.length) == 0);
    p.consumer->release(d);
  };
  ShmDescriptor first, a, b, c, d;
  REQUIRE(p.producer->push(bytes.data(), 1000, &first));
  CHECK(first.position == 0);
  consume(first);
  // Empty: the next payload goes to byte 0 again, at the start of the next lap.
  REQUIRE(p.producer->push(bytes.data(), 1000, &a));
  CHECK(a.position == kCap);
  // Not empty: payloads follow each other. The skipped rest of the first lap counts as
  // free, so the lap can be filled to its end, but not one byte past it.
  REQUIRE(p.producer->push(bytes.data(), 2000, &b));
  CHECK(b.position == kCap + 1000);
  CHECK_FALSE(p.producer->push(bytes.data(), kCap - 2999, &c));
  REQUIRE(p.producer->push(bytes.data(), kCap - 3000, &c));
  CHECK(c.position == kCap + 3000);
  CHECK_FALSE(p.producer->push(bytes.data(), 1, &d));
  consume(a);
  consume(b);
  consume(c);
  // Empty again, and already at a lap start.
  REQUIRE(p.producer->push(bytes.data(), 3000, &d));
  CHECK(d.position == 2 * kCap);
  consume(d);
  REQUIRE(p.producer->push(bytes.data(), kCap, &d));
  CHECK(d.position == 3 * kCap);
  consume(d);
}

TEST_CASE("shm ring refuses a payload while unreleased ones fill it", "[shm]") {
  auto [p, big, a, b] = fill_with_halves(9, &ShmProducer::push);
  ShmDescriptor c;
  CHECK(b.position == kCap / 2);
  CHECK_FALSE(p.producer->push(big.data(), 1, &c));
  REQUIRE(p.consumer->check(a, kCap).is_ok());
  p.consumer->release(a);
  REQUIRE(p.producer->push(big.data(), big.size(), &c));
  CHECK(c.position == kCap);
  CHECK_FALSE(p.producer->push(big.data(), 1, &c));
  REQUIRE(p.consumer->check(b, kCap).is_ok());
  CHECK(std::memcmp(p.consumer->at(b), big.data(), big.size()) == 0);
  p.consumer->release(b);
  REQUIRE(p.consumer->check(c, kCap).is_ok());
  CHECK(std::memcmp(p.consumer->at(c), big.data(), big.size()) == 0);
  CHECK_FALSE(p.producer->push(big.data(), kCap + 1, &c));
  CHECK_FALSE(p.producer->push(big.data(), 0, &c));
}

TEST_CASE("shm ring takes a payload of its whole capacity only when empty", "[shm]") {
  Pair p = make_pair();
  auto whole = pattern(kCap, 3);
  ShmDescriptor where;
  REQUIRE(p.producer->push(whole.data(), kCap, &where));
  CHECK(where.position == 0);
  REQUIRE(p.consumer->check(where, kCap).is_ok());
  CHECK(std::memcmp(p.consumer->at(where), whole.data(), kCap) == 0);
  CHECK_FALSE(p.producer->push(whole.data(), 1, &where));
  p.consumer->release({0, kCap});
  REQUIRE(p.producer->push(whole.data(), 1, &where));
  CHECK(where.position == kCap);
  // Not empty: the whole capacity does not fit beside one byte.
  CHECK_FALSE(p.producer->push(whole.data(), kCap, &where));
  p.consumer->release(where);
  // Empty, mid-lap: it starts over at the next lap.
  REQUIRE(p.producer->push(whole.data(), kCap, &where));
  CHECK(where.position == 2 * kCap);
  REQUIRE(p.consumer->check(where, kCap).is_ok());
  CHECK(std::memcmp(p.consumer->at(where), whole.data(), kCap) == 0);
}

TEST_CASE("shm consumer refuses every descriptor but the next one", "[shm]") {
  Pair p = make_pair();
  auto bytes = pattern(1000, 1);
  ShmDescriptor first;
  REQUIRE(p.producer->push(bytes.data(), 1000, &first));
  auto refused = [&](ShmDescriptor d, uint64_t max_payload, const std::string& words) {
    Status s = p.consumer->check(d, max_payload);
    CHECK(s.code() == Code::Protocol);
    CHECK_THAT(s.message(), Catch::Contains(words));
  };
  refused({1, 1000}, 1 << 20, "expected 0");
  refused({kCap, 1000}, 1 << 20, "expected 0");
  refused({0, 0}, 1 << 20, "length 0");
  refused({0, kCap + 1}, 1ull << 30, "out of range");
  refused({0, 1000}, 999, "out of range");
  REQUIRE(p.consumer->check(first, 1 << 20).is_ok());
  p.consumer->release(first);
  // The next payload must follow the first (one that would cross the end must skip it) or
  // start over at the next lap.
  const std::string lap = std::to_string(kCap);
  refused({0, 1000}, 1 << 20, "expected 1000 or " + lap);
  refused({999, 1000}, 1 << 20, "expected 1000 or " + lap);
  refused({2 * kCap, 1000}, 1 << 20, "expected 1000 or " + lap);
  CHECK(p.consumer->check({1000, kCap - 1000}, 1 << 20).is_ok());
  CHECK(p.consumer->check({kCap, 1000}, 1 << 20).is_ok());
  refused({1000, kCap - 999}, 1 << 20, "expected " + lap);
  CHECK(p.consumer->check({kCap, kCap - 999}, 1 << 20).is_ok());
}

TEST_CASE("shm open refuses a segment that is not the one offered", "[shm]") {
  auto created = ShmSegment::create(kCap);
  REQUIRE(created.is_ok());
  ShmSegmentInfo info = created.value().info();
  CHECK(info.pid == static_cast<uint32_t>(getpid()));
  CHECK(info.capacity == kCap);

  ShmSegmentInfo wrong_nonce = info;
  wrong_nonce.nonce ^= 1;
  CHECK(ShmSegment::open(wrong_nonce).status().code() == Code::Protocol);
  ShmSegmentInfo wrong_size = info;
  wrong_size.capacity = kCap * 2;
  CHECK(ShmSegment::open(wrong_size).status().code() == Code::Protocol);
  ShmSegmentInfo tiny = info;
  tiny.capacity = 16;
  CHECK(ShmSegment::open(tiny).status().code() == Code::Protocol);
  ShmSegmentInfo no_fd = info;
  no_fd.fd = 1000000;
  CHECK(ShmSegment::open(no_fd).status().code() == Code::Io);
  // A descriptor that is not a ring is never opened, whatever its size.
  int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  REQUIRE(null_fd >= 0);
  ShmSegmentInfo not_ring = info;
  not_ring.fd = static_cast<uint32_t>(null_fd);
  Status refused = ShmSegment::open(not_ring).status();
  CHECK(refused.code() == Code::Protocol);
  CHECK_THAT(refused.message(), Catch::Contains("is not a ring (/dev/null)"));
  close(null_fd);

  // Once the creator closed its descriptor the segment cannot be found any more.
  created.value().close_fd();
  CHECK_FALSE(ShmSegment::open(info).is_ok());
  CHECK(ShmSegment::create(16).status().code() == Code::InvalidArgument);
}

TEST_CASE("shm segment is sealed at its size; an unsealed one is refused", "[shm]") {
  // A peer that could shrink the ring would make the other side's next copy a SIGBUS.
  auto created = ShmSegment::create(kCap);
  REQUIRE(created.is_ok());
  const ShmSegmentInfo info = created.value().info();
  const std::string path = "/proc/self/fd/" + std::to_string(info.fd);
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(fd >= 0);
  CHECK(ftruncate(fd, 4096) != 0);
  close(fd);
  REQUIRE(ShmSegment::open(info).is_ok());

  int unsealed = memfd_create("taiji-ring", MFD_CLOEXEC);
  REQUIRE(unsealed >= 0);
  REQUIRE(ftruncate(unsealed, static_cast<off_t>(4096 + kShmMailboxBytes + kCap)) == 0);
  ShmSegmentInfo forged = info;
  forged.fd = static_cast<uint32_t>(unsealed);
  Status refused = ShmSegment::open(forged).status();
  CHECK(refused.code() == Code::Protocol);
  CHECK_THAT(refused.message(), Catch::Contains("is not sealed at its size"));
  close(unsealed);
}

TEST_CASE("ShmData frames carry exactly a descriptor and are checked like Data when they name an op", "[shm]") {
  FrameLimits l;
  l.world_size = 4;
  FrameHeader h;
  h.type = MsgType::ShmData;
  h.op_kind = OpKind::Allreduce;
  h.dtype = 0;
  h.name_len = 3;
  h.payload_len = kShmDataPayload;
  uint8_t buf[kHeaderSize];
  FrameHeader out;
  encode_header(h, buf);
  REQUIRE(decode_header(buf, l, &out).is_ok());
  CHECK(out.type == MsgType::ShmData);

  h.payload_len = 24;
  encode_header(h, buf);
  Status s = decode_header(buf, l, &out);
  CHECK(s.code() == Code::Protocol);
  CHECK_THAT(s.message(), Catch::Contains("ShmData"));

  h.payload_len = kShmDataPayload;
  h.root = 4;
  encode_header(h, buf);
  CHECK_THAT(decode_header(buf, l, &out).message(), Catch::Contains("root 4"));

  // Without an op it stands for a ModelReply: the Data fields are not its, and the
  // receiver checks the ModelReply it rebuilds (shm_transport.cpp).
  h.op_kind = OpKind::None;
  h.root = 4;
  h.dtype = 200;
  encode_header(h, buf);
  REQUIRE(decode_header(buf, l, &out).is_ok());
  CHECK(out.type == MsgType::ShmData);
  CHECK(out.op_kind == OpKind::None);
  CHECK(out.root == 4);
  CHECK(out.dtype == 200);
  h.payload_len = 24;
  encode_header(h, buf);
  CHECK_THAT(decode_header(buf, l, &out).message(),
             Catch::Contains("payload_len 24 in a ShmData frame (expected 16)"));
}

TEST_CASE("shm ring owes a credit exactly to a producer that found it full", "[shm]") {
  auto [p, half, a, b] = fill_with_halves(5, &ShmProducer::push_or_ask);
  ShmDescriptor c;
  REQUIRE(p.consumer->check(a, kCap).is_ok());
  CHECK_FALSE(p.consumer->release(a));  // nobody asked
  REQUIRE(p.producer->push_or_ask(half.data(), half.size(), &c));
  CHECK_FALSE(p.producer->push_or_ask(half.data(), 1, &c));
  REQUIRE(p.consumer->check(b, kCap).is_ok());
  CHECK(p.consumer->release(b));        // the producer asked: it gets one wake-up
  REQUIRE(p.producer->push(half.data(), 1, &c));
  CHECK(c.position == 3 * (kCap / 2));
  CHECK(p.producer->max_waiting_payload() == kCap);
}

namespace {

// A frame as the transport writes it into a mailbox: encoded header, name, payload.
struct MailFrame {
  uint8_t header[kHeaderSize];
  std::string name;
  std::vector<uint8_t> payload;
};

MailFrame mail_frame(uint64_t payload_len, uint8_t seed) {
  MailFrame f;
  FrameHeader h;
  h.type = MsgType::Data;
  h.op_kind = OpKind::Broadcast;
  h.dtype = static_cast<uint8_t>(DType::U8);
  h.chunk = seed;
  f.name = "mail/" + std::to_string(seed);
  f.payload = pattern(payload_len, seed);
  h.name_len = static_cast<uint16_t>(f.name.size());
  h.payload_len = payload_len;
  encode_header(h, f.header);
  return f;
}

bool post(ShmProducer& producer, uint64_t tcp_before, const MailFrame& f) {
  return producer.post(tcp_before, f.header, f.name, f.payload.data(), f.payload.size());
}

// Checks that rec holds exactly f.
void check_record(const ShmRecord& rec, uint64_t tcp_before, const MailFrame& f) {
  REQUIRE(rec.frame != nullptr);
  CHECK(rec.tcp_before == tcp_before);
  REQUIRE(rec.frame_len == kHeaderSize + f.name.size() + f.payload.size());
  CHECK(std::memcmp(rec.frame, f.header, kHeaderSize) == 0);
  CHECK(std::memcmp(rec.frame + kHeaderSize, f.name.data(), f.name.size()) == 0);
  if (!f.payload.empty()) {
    CHECK(std::memcmp(rec.frame + kHeaderSize + f.name.size(), f.payload.data(), f.payload.size()) == 0);
  }
}

// The record header the producer writes (shm_ring.h): u32 length, u32 kind, u64 tag.
void put_record(uint8_t* at, uint32_t len, uint32_t kind, uint64_t tcp_before) {
  put32(at, len);
  put32(at + 4, kind);
  put64(at + 8, tcp_before);
}

}  // namespace

TEST_CASE("shm mailbox carries frames in order through many laps", "[shm]") {
  Pair p = make_pair();
  // Record sizes that do not divide the mailbox, so laps end in skips at varying places;
  // the consumer lags up to three records behind.
  const uint64_t payloads[] = {0, 4, 100, 3000, 7000, 64, 1, 5000};
  std::vector<std::pair<uint64_t, MailFrame>> in_flight;
  uint64_t sent = 0, received = 0;
  auto take_one = [&] {
    ShmRecord rec;
    REQUIRE(p.consumer->peek(&rec, p.consumer->mail_end()).is_ok());
    REQUIRE(!in_flight.empty());
    check_record(rec, in_flight.front().first, in_flight.front().second);
    p.consumer->pop();
    in_flight.erase(in_flight.begin());
    received++;
  };
  for (int i = 0; i < 400; ++i) {
    const MailFrame f = mail_frame(payloads[i % 8], static_cast<uint8_t>(i));
    const uint64_t tag = 1000 + static_cast<uint64_t>(i) / 3;
    REQUIRE(post(*p.producer, tag, f));
    in_flight.emplace_back(tag, f);
    sent++;
    CHECK(p.consumer->has_mail());
    if (in_flight.size() > 3) take_one();
  }
  while (!in_flight.empty()) take_one();
  ShmRecord none;
  REQUIRE(p.consumer->peek(&none, p.consumer->mail_end()).is_ok());
  CHECK(none.frame == nullptr);
  CHECK_FALSE(p.consumer->has_mail());
  CHECK(received == sent);
  // 400 records averaging over 2 KiB went through a 64 KiB mailbox: many laps.
  CHECK(p.producer->segment().mail_tail().load() > 10 * kShmMailboxBytes);
}

TEST_CASE("shm mailbox refuses a record that does not fit, and takes it after a pop", "[shm]") {
  Pair p = make_pair();
  const MailFrame big = mail_frame(kShmMaxRecord - kShmRecordHeader - kHeaderSize - 8, 1);
  REQUIRE(big.name.size() == 6);
  // Records of exactly kShmMaxRecord bytes: eight fill the mailbox.
  const MailFrame full = mail_frame(kShmMaxRecord - kShmRecordHeader - kHeaderSize - 6, 2);
  for (int i = 0; i < 8; ++i) REQUIRE(post(*p.producer, 0, full));
  const uint64_t tail = p.producer->segment().mail_tail().load();
  CHECK(tail == kShmMailboxBytes);
  CHECK_FALSE(post(*p.producer, 0, mail_frame(0, 3)));
  CHECK(p.producer->segment().mail_tail().load() == tail);  // nothing written
  ShmRecord rec;
  REQUIRE(p.consumer->peek(&rec, p.consumer->mail_end()).is_ok());
  check_record(rec, 0, full);
  p.consumer->pop();
  CHECK(post(*p.producer, 5, big));
  // Larger than a record may be: never taken, whatever the room.
  Pair q = make_pair();
  CHECK_FALSE(post(*q.producer, 0, mail_frame(kShmMaxRecord, 4)));
  CHECK_FALSE(q.consumer->has_mail());
}

TEST_CASE("shm mailbox: the reader's polling promise is seen by the writer", "[shm]") {
  Pair p = make_pair();
  CHECK_FALSE(p.producer->reader_polls());
  p.consumer->set_polling(true);
  CHECK(p.producer->reader_polls());
  p.consumer->set_polling(false);
  CHECK_FALSE(p.producer->reader_polls());
}

TEST_CASE("shm mailbox reader refuses every malformed record", "[shm]") {
  struct Fault {
    std::string what;
    std::function<void(ShmSegment& seg)> write;  // publishes something wrong
    std::string says;
  };
  auto publish = [](ShmSegment& seg, uint64_t tail) { seg.mail_tail().store(tail); };
  const std::vector<Fault> faults = {
      {"end not on a record boundary", [&](ShmSegment& s) { publish(s, 100); }, "mailbox end 100"},
      {"end past a whole mailbox", [&](ShmSegment& s) { publish(s, kShmMailboxBytes + 64); },
       "mailbox end " + std::to_string(kShmMailboxBytes + 64)},
      {"unknown kind", [&](ShmSegment& s) { put_record(s.mailbox(), 128, 7, 0); publish(s, 128); },
       "kind 7"},
      {"shorter than a frame header", [&](ShmSegment& s) { put_record(s.mailbox(), 40, 0, 0); publish(s, 64); },
       "40 bytes"},
      {"longer than a record may be",
       [&](ShmSegment& s) { put_record(s.mailbox(), kShmMaxRecord + 64, 0, 0); publish(s, 2 * kShmMaxRecord); },
       std::to_string(kShmMaxRecord + 64) + " bytes"},
      {"longer than what was published",
       [&](ShmSegment& s) { put_record(s.mailbox(), 200, 0, 0); publish(s, 192); }, "200 bytes"},
      {"a skip that does not end the lap",
       [&](ShmSegment& s) { put_record(s.mailbox(), 64, 1, 0); publish(s, 128); }, "skip of 64 bytes"},
  };
  for (const Fault& f : faults) {
    DYNAMIC_SECTION(f.what) {
      Pair p = make_pair();
      f.write(p.producer->segment());
      ShmRecord rec;
      Status s = p.consumer->peek(&rec, p.consumer->mail_end());
      CHECK(s.code() == Code::Protocol);
      CHECK_THAT(s.message(), Catch::Contains(f.says));
      CHECK(rec.frame == nullptr);
    }
  }
  SECTION("a record crossing the end of the lap") {
    Pair p = make_pair();
    // Fill to 64 bytes short of the lap's end with real records, then claim 128 bytes.
    const MailFrame f = mail_frame(kShmMaxRecord - kShmRecordHeader - kHeaderSize - 6, 1);
    for (int i = 0; i < 7; ++i) REQUIRE(post(*p.producer, 0, f));
    for (int i = 0; i < 7; ++i) {
      ShmRecord rec;
      REQUIRE(p.consumer->peek(&rec, p.consumer->mail_end()).is_ok());
      p.consumer->pop();
    }
    ShmSegment& seg = p.producer->segment();
    const uint64_t at = kShmMailboxBytes - 64;
    put_record(seg.mailbox() + at, 128, 0, 0);
    publish(seg, at + 128);
    // The consumer is at 7 * kShmMaxRecord: pad up to `at` with a valid record first.
    const uint64_t pad = at - 7 * kShmMaxRecord;
    put_record(seg.mailbox() + 7 * kShmMaxRecord, static_cast<uint32_t>(pad), 0, 0);
    std::memcpy(seg.mailbox() + 7 * kShmMaxRecord + kShmRecordHeader, f.header, kHeaderSize);
    ShmRecord rec;
    REQUIRE(p.consumer->peek(&rec, p.consumer->mail_end()).is_ok());
    REQUIRE(rec.frame != nullptr);
    p.consumer->pop();
    Status s = p.consumer->peek(&rec, p.consumer->mail_end());
    CHECK(s.code() == Code::Protocol);
    CHECK_THAT(s.message(), Catch::Contains("128 bytes"));
  }
}
