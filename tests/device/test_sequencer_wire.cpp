// The sequencer's byte format at its edges: every malformed message is a Protocol error,
// is never read past its end, and changes nothing on the coordinator or the client.
#include <catch2/catch.hpp>

#include <random>

#include "sequencer_job.h"

using namespace taiji;
using namespace taiji::seq_test;

namespace {

// Spells messages field by field, independently of the implementation's encoder.
struct Bytes {
  std::vector<uint8_t> b;
  Bytes& u8(uint64_t v) {
    b.push_back(static_cast<uint8_t>(v));
    return *this;
  }
  Bytes& le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  Bytes& str(const std::string& s) {
    le(s.size(), 2);
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& spec(uint8_t kind, uint8_t dtype, uint8_t redop, uint64_t count, int32_t root) {
    return u8(kind).u8(dtype).u8(redop).le(count, 8).le(static_cast<uint32_t>(root), 4);
  }
};

Bytes header(uint32_t records) { return Bytes{}.u8(1).le(records, 4); }

Code receive(Sequencer& seq, const std::vector<uint8_t>& m) { return seq.receive(0, m.data(), m.size()).code(); }
Code read(SequencerClient& c, const std::vector<uint8_t>& m) {
  return c.read_order(m.data(), m.size()).status().code();
}

// A coordinator of 3 ranks with one id given and op 'p' pending, a message from rank 0
// with every kind of record, and an order message with every kind of entry but RunFull.
struct Fixture {
  Job job{3};
  std::vector<uint8_t> announcements, order;

  Fixture() {
    for (int r = 0; r < 3; ++r) REQUIRE(job.send(r, {{"a", 1, spec(4)}}).is_ok());
    REQUIRE(job.order().size() == 1);
    REQUIRE(job.send(1, {{"p", 1, spec(4)}}).is_ok());
    job.clients[0].announce("a", 2, spec(4), announcements);
    job.clients[0].announce("new", 1, {OpKind::Reduce, DType::I64, RedOp::Min, 3, 2}, announcements);
    job.clients[0].withdraw("x", 1, announcements);
    REQUIRE(announcements.size() == 5 + 13 + (1 + 2 + 3 + 8 + 15) + (1 + 2 + 1 + 8));

    Job other(3);
    for (int r = 0; r < 3; ++r) REQUIRE(other.send(r, {{"a", 1, spec(4)}, {"a", 2, spec(4)}}).is_ok());
    for (int r = 0; r < 3; ++r) REQUIRE(other.send(r, {{"m", 1, spec(r == 1 ? 2 : 4)}}).is_ok());
    REQUIRE(other.send(2, {{"w", 5, spec(4)}}).is_ok());
    std::vector<uint8_t> withdrawal;
    other.clients[2].withdraw("w", 5, withdrawal);
    REQUIRE(other.seq.receive(2, withdrawal.data(), withdrawal.size()).is_ok());
    order = other.seq.take_order();
  }

  // Whether `seq` is still as the fixture left it: the same pending op, the same id, no batch.
  static void unchanged(Sequencer& seq) {
    CHECK(seq.pending() == 1);
    CHECK(seq.cached() == 1);
    CHECK(seq.take_order().empty());
  }
};

}  // namespace

TEST_CASE("sequencer wire: the fixture's messages are valid", "[sequencer]") {
  Fixture f;
  Sequencer seq = f.job.seq;
  REQUIRE(receive(seq, f.announcements) == Code::Ok);
  CHECK(seq.pending() == 3);  // 'p', 'new' and 'a' version 2 wait for the other ranks
  SequencerClient client;
  auto got = client.read_order(f.order.data(), f.order.size());
  REQUIRE(got.is_ok());
  const std::string why = "ranks disagree on 'm' version 1: ranks 0,2 allreduce f32 sum count 4, "
                          "rank 1 allreduce f32 sum count 2";
  CHECK(got.value() == Entries{run("a", 1), run("a", 2), failed("m", 1, OrderEntry::Verdict::Mismatch, why),
                               failed("w", 5, OrderEntry::Verdict::Withdrawn,
                                      "rank 2 withdrew it (timed out) before every rank had posted it; "
                                      "posted by rank 2")});
  CHECK(SequencerClientAccess::ids(client) == 1);
}

TEST_CASE("sequencer wire: every truncation, and a byte too many, is a Protocol error", "[sequencer]") {
  Fixture f;
  for (size_t len = 0; len <= f.announcements.size(); ++len) {
    std::vector<uint8_t> cut(f.announcements.begin(), f.announcements.begin() + len);
    if (len == f.announcements.size()) cut.push_back(0);
    Sequencer seq = f.job.seq;
    INFO("announcements cut at " << len);
    CHECK(receive(seq, cut) == Code::Protocol);
    Fixture::unchanged(seq);
  }
  for (size_t len = 0; len <= f.order.size(); ++len) {
    std::vector<uint8_t> cut(f.order.begin(), f.order.begin() + len);
    if (len == f.order.size()) cut.push_back(0);
    SequencerClient client;
    INFO("order cut at " << len);
    CHECK(read(client, cut) == Code::Protocol);
    CHECK(SequencerClientAccess::ids(client) == 0);
  }
}

TEST_CASE("sequencer wire: malformed announcements are Protocol errors", "[sequencer]") {
  Fixture f;
  std::vector<std::pair<const char*, std::vector<uint8_t>>> bad = {
      {"unknown format", Bytes{}.u8(2).le(0, 4).b},
      {"no count", Bytes{}.u8(1).le(0, 3).b},
      {"unknown record", header(1).u8(9).b},
      {"an order record", header(1).u8(0x12).le(0, 4).le(1, 8).b},
      {"kind none", header(1).u8(1).str("z").le(1, 8).spec(0, 0, 0, 1, 0).b},
      {"kind past the list", header(1).u8(1).str("z").le(1, 8).spec(11, 0, 0, 1, 0).b},
      {"dtype past the list", header(1).u8(1).str("z").le(1, 8).spec(1, 10, 0, 1, 0).b},
      {"redop past the list", header(1).u8(1).str("z").le(1, 8).spec(1, 0, 5, 1, 0).b},
      {"a root on allreduce", header(1).u8(1).str("z").le(1, 8).spec(1, 0, 0, 1, 1).b},
      {"a reduction on broadcast", header(1).u8(1).str("z").le(1, 8).spec(2, 0, 3, 1, 0).b},
      {"a negative root", header(1).u8(1).str("z").le(1, 8).spec(2, 0, 0, 1, -1).b},
      {"a name past the end", header(1).u8(1).le(40, 2).le(0, 8).le(0, 8).b},
      {"an unknown id", header(1).u8(2).le(1, 4).le(1, 8).b},
      {"more records than counted", header(1).u8(3).str("z").le(1, 8).u8(3).str("y").le(1, 8).b},
      {"fewer records than counted", header(3).u8(3).str("z").le(1, 8).b},
  };
  for (const auto& [what, msg] : bad) {
    INFO(what);
    Sequencer seq = f.job.seq;
    CHECK(receive(seq, msg) == Code::Protocol);
    Fixture::unchanged(seq);
  }
  // The same spelling, well formed, is taken: the checks above fail for the reason named.
  Sequencer seq = f.job.seq;
  CHECK(receive(seq, header(2).u8(1).str("z").le(1, 8).spec(5, 8, 2, 1, 7).u8(2).le(0, 4).le(9, 8).b) == Code::Ok);
  CHECK(seq.pending() == 3);
  CHECK(receive(seq, header(0).b) == Code::Ok);
}

TEST_CASE("sequencer wire: malformed orders are Protocol errors and teach no id", "[sequencer]") {
  const auto define = [](Bytes b, uint32_t id, const std::string& name) {
    return b.u8(0x11).le(id, 4).le(1, 8).str(name).spec(1, 0, 0, 4, 0);
  };
  std::vector<std::pair<const char*, std::vector<uint8_t>>> bad = {
      {"empty", {}},
      {"unknown format", Bytes{}.u8(0).le(0, 4).b},
      {"unknown entry", header(1).u8(0x16).b},
      {"an announcement record", header(1).u8(2).le(0, 4).le(1, 8).b},
      {"a definition out of order", define(header(1), 1, "a").b},
      {"two ids for one op", define(define(header(2), 0, "a"), 1, "a").b},
      {"a run by an unknown id", define(header(2), 0, "a").u8(0x12).le(1, 4).le(2, 8).b},
      {"a bad spec", header(1).u8(0x11).le(0, 4).le(1, 8).str("a").spec(1, 0, 0, 4, 3).b},
      {"a why past the end", header(1).u8(0x14).str("a").le(1, 8).le(100, 2).b},
  };
  for (const auto& [what, msg] : bad) {
    INFO(what);
    SequencerClient client;
    CHECK(read(client, msg) == Code::Protocol);
    CHECK(SequencerClientAccess::ids(client) == 0);
  }
  SequencerClient client;
  auto got = client.read_order(header(0).b.data(), 5);
  REQUIRE(got.is_ok());
  CHECK(got.value().empty());
  auto ok = define(header(3), 0, "a").u8(0x12).le(0, 4).le(2, 8).u8(0x13).str("b").le(3, 8).b;
  got = client.read_order(ok.data(), ok.size());
  REQUIRE(got.is_ok());
  CHECK(got.value() == Entries{run("a", 1), run("a", 2), run("b", 3)});
  // A definition of an id the client already knows is refused too.
  CHECK(read(client, define(header(1), 0, "c").b) == Code::Protocol);
  CHECK(SequencerClientAccess::ids(client) == 1);
}

TEST_CASE("sequencer wire: flipped bytes never crash; a refused message changes nothing", "[sequencer]") {
  Fixture f;
  // Returns whether the coordinator and the client each refused its message.
  auto try_both = [&](const std::vector<uint8_t>& a, const std::vector<uint8_t>& o) {
    Sequencer seq = f.job.seq;
    const Code c = receive(seq, a);
    REQUIRE((c == Code::Ok || c == Code::Protocol));
    if (c == Code::Protocol) Fixture::unchanged(seq);
    SequencerClient client;
    const Code d = read(client, o);
    REQUIRE((d == Code::Ok || d == Code::Protocol));
    if (d == Code::Protocol) CHECK(SequencerClientAccess::ids(client) == 0);
    return std::make_pair(c == Code::Protocol, d == Code::Protocol);
  };
  // Every byte, flipped a few ways. Flips in names, versions and counts make other valid
  // messages (the links deliver what was sent; there is no checksum); a flip in the header
  // never does.
  const size_t longest = std::max(f.announcements.size(), f.order.size());
  for (size_t at = 0; at < longest; ++at) {
    for (uint8_t x : {0x01, 0x80, 0xFF}) {
      auto a = f.announcements;
      auto o = f.order;
      if (at < a.size()) a[at] ^= x;
      if (at < o.size()) o[at] ^= x;
      auto [a_refused, o_refused] = try_both(a, o);
      if (at < 5) {
        INFO("header byte " << at << " ^ " << int(x));
        CHECK(a_refused);
        CHECK(o_refused);
      }
    }
  }
  // Then several bytes at once, anywhere.
  std::mt19937 rng(7);
  for (int i = 0; i < 3000; ++i) {
    auto a = f.announcements;
    auto o = f.order;
    for (int k = 1 + rng() % 3; k > 0; --k) {
      a[rng() % a.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
      o[rng() % o.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
    }
    try_both(a, o);
  }
}
