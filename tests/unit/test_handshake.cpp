// The connection handshake as a pure exchange of frames: completion with and without a job
// secret, and refusal of every wrong secret, replay, reflection and out-of-order frame,
// and of going on without random nonces.
// RAND_set_rand_method, deprecated but the one way to make RAND_bytes fail.
#define OPENSSL_SUPPRESS_DEPRECATED

#include <catch2/catch.hpp>
#include <openssl/rand.h>

#include <string>
#include <vector>

#include "transport/handshake.h"

using namespace taiji;

namespace {

const std::string kSecret = "0123456789abcdef0123456789abcdef";

HandshakeParams params(int rank, std::string secret, std::string job = "job") {
  HandshakeParams p;
  p.rank = rank;
  p.size = 4;
  p.cluster_version = 7;
  p.job_id = std::move(job);
  p.secret = std::move(secret);
  return p;
}

// What h sends as its connection opens.
std::vector<OutMessage> started(Handshake& h) {
  std::vector<OutMessage> out;
  REQUIRE(h.start(&out).is_ok());
  return out;
}

// Delivers every frame in `frames` to `to`; returns the first error, and what `to` sends back.
Status deliver(Handshake& to, const std::vector<OutMessage>& frames, std::vector<OutMessage>* replies) {
  for (const OutMessage& m : frames) {
    Status s = to.on_frame(m.header, m.name, m.owned, replies);
    if (!s.is_ok()) return s;
  }
  return {};
}

struct Pair {
  Handshake dialer;
  Handshake acceptor;
  Status dialer_status;
  Status acceptor_status;
};

// Runs the whole exchange between a dialer of rank 3 and an acceptor of rank 1. What an
// acceptor sends as it fails (a refusal) still reaches the dialer, as it does on a socket.
void run(Pair& p) {
  std::vector<OutMessage> to_acceptor = started(p.dialer);
  for (int round = 0; round < 4 && !to_acceptor.empty(); ++round) {
    std::vector<OutMessage> to_dialer;
    p.acceptor_status = deliver(p.acceptor, to_acceptor, &to_dialer);
    if (!p.acceptor_status.is_ok()) {
      std::vector<OutMessage> ignored;
      p.dialer_status = deliver(p.dialer, to_dialer, &ignored);
      return;
    }
    to_acceptor.clear();
    p.dialer_status = deliver(p.dialer, to_dialer, &to_acceptor);
    if (!p.dialer_status.is_ok()) return;
  }
}

Pair handshake_pair(const std::string& dialer_secret, const std::string& acceptor_secret) {
  return Pair{Handshake(params(3, dialer_secret), Handshake::Role::Dialer, 1),
              Handshake(params(1, acceptor_secret), Handshake::Role::Acceptor), {}, {}};
}

}  // namespace

TEST_CASE("handshake: without a secret, one Hello each way", "[handshake]") {
  Pair p = handshake_pair("", "");
  std::vector<OutMessage> hello = started(p.dialer);
  REQUIRE(hello.size() == 1);
  CHECK(hello[0].header.type == MsgType::Hello);
  CHECK(hello[0].owned.empty());
  std::vector<OutMessage> reply;
  REQUIRE(deliver(p.acceptor, hello, &reply).is_ok());
  REQUIRE(reply.size() == 1);
  CHECK(p.acceptor.done());
  CHECK(p.acceptor.peer_rank() == 3);
  std::vector<OutMessage> none;
  REQUIRE(deliver(p.dialer, reply, &none).is_ok());
  CHECK(none.empty());
  CHECK(p.dialer.done());
  CHECK(p.dialer.peer_rank() == 1);
}

TEST_CASE("handshake: with the same secret both ends authenticate", "[handshake]") {
  Pair p = handshake_pair(kSecret, kSecret);
  run(p);
  REQUIRE(p.dialer_status.is_ok());
  REQUIRE(p.acceptor_status.is_ok());
  CHECK(p.dialer.done());
  CHECK(p.acceptor.done());
}

TEST_CASE("handshake: a different or missing secret is refused", "[handshake]") {
  SECTION("different secrets: the dialer refuses the acceptor's proof") {
    Pair p = handshake_pair(kSecret, "another secret of 32 bytes......");
    run(p);
    CHECK(p.dialer_status.code() == Code::Auth);
    CHECK_FALSE(p.dialer.done());
    CHECK_FALSE(p.acceptor.done());
  }
  SECTION("the dialer has none") {
    Pair p = handshake_pair("", kSecret);
    run(p);
    CHECK(p.acceptor_status.code() == Code::Auth);
    CHECK(p.acceptor_status.message().find("offers no authentication") != std::string::npos);
    CHECK_FALSE(p.acceptor.done());
    // The acceptor said why before closing: the dialer, which lacks the secret, learns it.
    CHECK(p.dialer_status.code() == Code::Auth);
    CHECK(p.dialer_status.message() ==
          "rank 1 refused the connection: its job has a secret and this peer has none (set TAIJI_SECRET_FILE)");
    CHECK_FALSE(p.dialer.done());
  }
  SECTION("the acceptor has none") {
    Pair p = handshake_pair(kSecret, "");
    run(p);
    CHECK(p.acceptor_status.code() == Code::Auth);
    CHECK_FALSE(p.acceptor.done());
    CHECK(p.dialer_status.code() == Code::Auth);
    CHECK(p.dialer_status.message() == "rank 1 refused the connection: this peer has a job secret and it has none");
  }
  SECTION("a refusal carries one byte naming the side without a secret, nothing else") {
    Handshake acceptor(params(1, kSecret), Handshake::Role::Acceptor);
    Handshake dialer(params(3, ""), Handshake::Role::Dialer, 1);
    std::vector<OutMessage> replies;
    CHECK(deliver(acceptor, started(dialer), &replies).code() == Code::Auth);
    REQUIRE(replies.size() == 1);
    CHECK(replies[0].header.type == MsgType::Refuse);
    CHECK(replies[0].owned == std::vector<uint8_t>{static_cast<uint8_t>(RefuseReason::DialerHasNoSecret)});
  }
  SECTION("a refusal with a reason this version does not know is a protocol error") {
    Handshake dialer(params(3, ""), Handshake::Role::Dialer, 1);
    std::vector<OutMessage> hello = started(dialer);
    OutMessage refuse = hello[0];
    refuse.header.type = MsgType::Refuse;
    refuse.header.src_rank = 1;
    refuse.owned = {99};
    std::vector<OutMessage> none;
    Status s = deliver(dialer, {refuse}, &none);
    CHECK(s.code() == Code::Protocol);
    CHECK(s.message().find("(99)") != std::string::npos);
  }
}

TEST_CASE("handshake: an attacker cannot replay or reflect proofs", "[handshake]") {
  // A genuine exchange, recorded.
  Handshake d1(params(3, kSecret), Handshake::Role::Dialer, 1);
  Handshake a1(params(1, kSecret), Handshake::Role::Acceptor);
  std::vector<OutMessage> hello = started(d1);
  std::vector<OutMessage> from_a1;
  REQUIRE(deliver(a1, hello, &from_a1).is_ok());
  std::vector<OutMessage> from_d1;
  REQUIRE(deliver(d1, from_a1, &from_d1).is_ok());
  REQUIRE(from_d1.size() == 1);
  REQUIRE(from_d1[0].header.type == MsgType::Auth);

  SECTION("replaying the recorded dialer frames to a new acceptor") {
    Handshake a2(params(1, kSecret), Handshake::Role::Acceptor);
    std::vector<OutMessage> ignored;
    REQUIRE(deliver(a2, hello, &ignored).is_ok());  // fresh nonce from a2
    Status s = deliver(a2, from_d1, &ignored);
    CHECK(s.code() == Code::Auth);
    CHECK_FALSE(a2.done());
  }
  SECTION("reflecting the acceptor's own proof back to it") {
    Handshake a2(params(1, kSecret), Handshake::Role::Acceptor);
    std::vector<OutMessage> from_a2;
    REQUIRE(deliver(a2, hello, &from_a2).is_ok());
    REQUIRE(from_a2.size() == 2);
    std::vector<OutMessage> reflected{std::move(from_a2[1])};
    std::vector<OutMessage> ignored;
    CHECK(deliver(a2, reflected, &ignored).code() == Code::Auth);
  }
}

TEST_CASE("handshake: frames out of place are protocol errors", "[handshake]") {
  std::vector<OutMessage> ignored;
  SECTION("Auth before Hello") {
    Handshake a(params(1, kSecret), Handshake::Role::Acceptor);
    OutMessage auth;
    auth.header.type = MsgType::Auth;
    auth.header.src_rank = 3;
    auth.name = "job";
    auth.owned.assign(kMacBytes, 0);
    CHECK(a.on_frame(auth.header, auth.name, auth.owned, &ignored).code() == Code::Protocol);
  }
  SECTION("a second Hello after the first") {
    Handshake d(params(3, kSecret), Handshake::Role::Dialer, 1);
    Handshake a(params(1, kSecret), Handshake::Role::Acceptor);
    std::vector<OutMessage> hello = started(d);
    REQUIRE(deliver(a, hello, &ignored).is_ok());
    CHECK(deliver(a, hello, &ignored).code() == Code::Protocol);
  }
  SECTION("a Hello naming another job") {
    Handshake d(params(3, "", "other"), Handshake::Role::Dialer, 1);
    Handshake a(params(1, ""), Handshake::Role::Acceptor);
    Status s = deliver(a, started(d), &ignored);
    CHECK(s.code() == Code::Protocol);
    CHECK(s.message().find("names job 'other'") != std::string::npos);
  }
  SECTION("a Hello from a lower rank on an accepted connection") {
    Handshake d(params(0, ""), Handshake::Role::Dialer, 1);
    Handshake a(params(1, ""), Handshake::Role::Acceptor);
    CHECK(deliver(a, started(d), &ignored).code() == Code::Protocol);
  }
  SECTION("the dialled rank answered as another rank") {
    Handshake d(params(3, ""), Handshake::Role::Dialer, 1);
    Handshake a(params(2, ""), Handshake::Role::Acceptor);
    std::vector<OutMessage> reply;
    REQUIRE(deliver(a, started(d), &reply).is_ok());
    CHECK(deliver(d, reply, &ignored).code() == Code::Protocol);
  }
  SECTION("nothing is accepted after a failure") {
    Handshake d(params(3, kSecret), Handshake::Role::Dialer, 1);
    Handshake a(params(1, ""), Handshake::Role::Acceptor);
    std::vector<OutMessage> hello = started(d);
    CHECK_FALSE(deliver(a, hello, &ignored).is_ok());
    Handshake d2(params(3, ""), Handshake::Role::Dialer, 1);
    CHECK_FALSE(deliver(a, started(d2), &ignored).is_ok());
    CHECK_FALSE(a.done());
  }
}

namespace {

// OpenSSL's random source fails while this lives.
class FailingRandom {
 public:
  FailingRandom() : saved_(RAND_get_rand_method()) { RAND_set_rand_method(&failing_); }
  ~FailingRandom() { RAND_set_rand_method(saved_); }
  FailingRandom(const FailingRandom&) = delete;
  FailingRandom& operator=(const FailingRandom&) = delete;

 private:
  static int fail(unsigned char*, int) { return 0; }
  static int no_status() { return 0; }
  const RAND_METHOD* saved_;
  RAND_METHOD failing_{nullptr, fail, nullptr, nullptr, fail, no_status};
};

}  // namespace

TEST_CASE("handshake: without random nonces neither end goes on", "[handshake]") {
  // Zero nonces would make a recorded handshake replayable.
  Pair p = handshake_pair(kSecret, kSecret);
  Handshake dialer(params(2, kSecret), Handshake::Role::Dialer, 1);
  std::vector<OutMessage> hello = started(p.dialer);
  FailingRandom no_random;
  std::vector<OutMessage> none;
  Status s = dialer.start(&none);
  CHECK(s.code() == Code::Internal);
  CHECK(s.message() == "handshake: no random bytes for a nonce (RAND_bytes failed)");
  CHECK(none.empty());
  s = deliver(p.acceptor, hello, &none);
  CHECK(s.code() == Code::Internal);
  CHECK(none.empty());
  CHECK_FALSE(p.acceptor.done());
}
