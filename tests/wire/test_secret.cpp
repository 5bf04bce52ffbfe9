// With a job secret. Attackers that get through the Hello but cannot prove the secret are
// closed, and nothing they send after it is ever acted on; a rank 1 without the secret
// (or with another one) cannot join, and rank 0's start-up error says why. A fake rank 1
// that holds the secret is the control: it joins, and the very Data frame the attackers
// send is summed when it comes from a member.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <vector>

#include "attack_runner.h"
#include "collectives/collective_op.h"
#include "fake_member.h"
#include "topology/selection.h"

using namespace taiji;
using namespace wire;

namespace {

constexpr int64_t kInitTimeoutMs = 1500;
constexpr const char* kPoisonOp = "wire.poison";
constexpr uint64_t kPoisonCount = 64;  // what AttackedPair::healthy() reduces: 64 i32

// A job secret file (0600) in a private directory, removed with it.
class Secrets {
 public:
  Secrets() {
    char tmpl[] = "/tmp/taiji-wire-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    dir_ = tmpl;
    job_ = dir_ + "/job.key";
    int fd = open(job_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    const std::string bytes = job_secret();
    REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
    close(fd);
  }
  ~Secrets() {
    std::remove(job_.c_str());
    rmdir(dir_.c_str());
  }
  const std::string& job_file() const { return job_; }
  static std::string job_secret() { return "0123456789abcdef0123456789abcdef"; }
  static std::string other_secret() { return "fedcba9876543210fedcba9876543210"; }

 private:
  std::string dir_;
  std::string job_;
};

std::vector<uint8_t> nonce() {
  std::vector<uint8_t> n(32);
  RAND_bytes(n.data(), static_cast<int>(n.size()));
  return n;
}

std::vector<uint8_t> bogus_auth() {
  FrameHeader h;
  h.type = MsgType::Auth;
  h.src_rank = 1;
  h.cluster_version = kClusterVersion;
  return frame(h, kJob, std::vector<uint8_t>(32, 0x5A));
}

// Reads rank 0's answer to a Hello with a nonce: its own Hello, then its Auth.
std::string expect_hello_and_auth(RawSocket& s) {
  const MsgType want[] = {MsgType::Hello, MsgType::Auth};
  for (MsgType t : want) {
    Frame f;
    Status st = read_frame(s, member_limits(), after_ms(kCloseBoundMs), &f);
    if (!st.is_ok()) return "no handshake reply from rank 0: " + st.message();
    if (f.header.type != t || f.payload.size() != 32) {
      return "rank 0 replied with a frame of type " + std::to_string(static_cast<int>(f.header.type));
    }
  }
  return {};
}

// The chunk rank 1 sends rank 0 for version `version` of the check allreduce under the
// "star" topology: the exact frame a member would send, carrying `fill` in every byte.
std::vector<uint8_t> poison_frame(uint64_t version, uint8_t fill) {
  StrategyCache strategies(2, {0, 0});
  BoundStrategy star = strategies.get(strategy_id("star"));
  auto bounds = plan_chunks(kPoisonCount, sizeof(int32_t), star.strategy->pairs.size(), 1 << 20);
  FrameHeader h;
  h.type = MsgType::Data;
  h.op_kind = OpKind::Allreduce;
  h.src_rank = 1;
  h.cluster_version = kClusterVersion;
  h.dtype = static_cast<uint8_t>(DType::I32);
  h.redop = static_cast<uint8_t>(RedOp::Sum);
  h.op_version = version;
  h.count = kPoisonCount;
  h.strategy = star.id;
  h.strategy_tag = star.tag;
  return frame(h, kPoisonOp, std::vector<uint8_t>((bounds[1] - bounds[0]) * sizeof(int32_t), fill));
}

// Rank 0 alone with a job secret, rank 1 played by `fake`; returns rank 0's create result
// and how long it took.
struct Joined {
  Result<std::unique_ptr<Peer>> victim = Status{Code::Internal, "not started"};
  Status fake_handshake;
  double ms = 0;
};

template <typename Dial>
Joined join_secret_job(const Rendezvous& rv, const std::string& job, const std::string& secret_file,
                       FakeMember* fake, Dial dial) {
  Config e = base_config(0, rv.address, job);
  e.secret_file = secret_file;
  e.init_timeout_ms = kInitTimeoutMs;
  auto resolved = resolve(e);
  REQUIRE(resolved.is_ok());
  Config c = resolved.value();
  Joined j;
  auto start = Clock::now();
  auto created = std::async(std::launch::async, [c] { return Peer::create(c); });
  std::string error = fake->dial(rv.address, job);
  if (error.empty()) j.fake_handshake = dial(*fake);
  j.victim = created.get();
  j.ms = ms_between(start, Clock::now());
  INFO(error);
  REQUIRE(error.empty());
  return j;
}

}  // namespace

TEST_CASE("secret: an attacker without the secret is closed at its Auth", "[secret]") {
  Secrets secrets;
  const std::vector<Attack> attacks = {
      {"Hello with a nonce, then a wrong Auth", hello(kJob, 1, nonce()),
       "rank 1 failed authentication (a different or no job secret)", false,
       [](RawSocket& s) {
         std::string wrong = expect_hello_and_auth(s);
         if (wrong.empty() && !s.send_all(bogus_auth())) wrong = "rank 0 closed before the Auth";
         return wrong;
       }},
      {"Hello without a nonce", hello(),
       "Hello from rank 1 offers no authentication, but this job has a secret"},
      {"Auth before any Hello", bogus_auth(), "handshake expected a Hello, got a frame of type 6"},
      {"a valid Hello followed by garbage", concat({hello(kJob, 1, nonce()), garbage(64)}),
       "bad magic 0xa5a5a5a5"},
  };
  for (const Attack& a : attacks) {
    DYNAMIC_SECTION(a.what) {
      AttackedPair f({kHandshakeMs, 64, secrets.job_file()});
      repeat_attack(f, a, 16);
    }
  }
}

TEST_CASE("secret: a Data frame right after a bogus Auth is never acted on", "[secret]") {
  Secrets secrets;
  AttackedPair f({kHandshakeMs, 64, secrets.job_file()});
  size_t before = 0;
  auto start = Clock::now();
  constexpr int kWarmup = 20;
  for (uint64_t version = 1; version <= kWarmup + kRepeats; ++version) {
    if (version == kWarmup + 1) {
      before = resident_bytes();
      start = Clock::now();
    }
    std::string error;
    RawSocket s = RawSocket::connect_to(f.target(), &error);
    REQUIRE(s.valid());
    // All in one write: the Data frame is already buffered when the Auth fails.
    s.send_all(concat({hello(kJob, 1, nonce()), bogus_auth(), poison_frame(version, 0x7F)}));
    REQUIRE(s.wait_closed(after_ms(kCloseBoundMs)) != RawSocket::Closed::StillOpen);
    std::string wrong = expect_refusals(f.take_log(1), 1, "rank 1 failed authentication (a different or no job secret)");
    INFO("version " << version << ": " << wrong);
    REQUIRE(wrong.empty());
    // The op the poison names, posted afterwards: only the real partner's data counts.
    wrong = f.healthy(kPoisonOp);
    INFO("version " << version << ": " << wrong);
    REQUIRE(wrong.empty());
  }
  const size_t after = resident_bytes();
  std::printf("wire secret: %-60s %d in %5.2f s, RSS %+.0f KiB\n", "Data after a bogus Auth, then the op",
              kRepeats, ms_between(start, Clock::now()) / 1000,
              (static_cast<double>(after) - static_cast<double>(before)) / 1024);
  CHECK(after < before + 2 * kMiB);
}

TEST_CASE("secret: a fake rank 1 holding the secret joins, and its Data counts", "[secret]") {
  Secrets secrets;
  LogCapture log;
  std::string error;
  Rendezvous rv = start_rendezvous(&error);
  REQUIRE(error.empty());
  FakeMember fake;
  Joined j = join_secret_job(rv, "wire-secret-member", secrets.job_file(), &fake, [&](FakeMember& m) {
    return m.handshake("wire-secret-member", secrets.job_secret(), after_ms(kCloseBoundMs));
  });
  INFO(j.fake_handshake.message() << " / " << j.victim.status().message());
  REQUIRE(j.fake_handshake.is_ok());
  REQUIRE(j.victim.is_ok());
  Peer& victim = *j.victim.value();
  // The same Data frame the attackers send after their bogus Auth, from a member this time.
  std::vector<int32_t> in(kPoisonCount, 3);
  std::vector<int32_t> out(kPoisonCount, 0);
  PostArgs a;
  a.name = kPoisonOp;
  a.send = in.data();
  a.recv = out.data();
  a.count = kPoisonCount;
  a.dtype = DType::I32;
  a.redop = RedOp::Sum;
  auto posted = victim.post(std::move(a));
  REQUIRE(posted.is_ok());
  Frame ready;
  REQUIRE(fake.await(MsgType::Ready, kPoisonOp, 1, after_ms(kCloseBoundMs), &ready).is_ok());
  REQUIRE(fake.send(concat({member_ready(ready), poison_frame(1, 0x01)})));
  Status s;
  REQUIRE(posted.value()->wait_for(kCloseBoundMs, &s));
  INFO(s.message());
  REQUIRE(s.is_ok());
  CHECK(out == std::vector<int32_t>(kPoisonCount, 3 + 0x01010101));
  CHECK(log.take().empty());
}

TEST_CASE("secret: a rank 1 without the secret cannot join", "[secret]") {
  Secrets secrets;
  LogCapture log;
  std::string error;
  Rendezvous rv = start_rendezvous(&error);
  REQUIRE(error.empty());
  const std::string set_up = "connection set-up timed out; no link to rank(s): 1";

  SECTION("no secret: its Hello carries no nonce") {
    FakeMember fake;
    Joined j = join_secret_job(rv, "wire-no-secret", secrets.job_file(), &fake, [](FakeMember& m) {
      return m.handshake("wire-no-secret", "", after_ms(kCloseBoundMs));
    });
    REQUIRE_FALSE(j.victim.is_ok());
    const std::string& why = j.victim.status().message();
    INFO(why);
    CHECK(why.find(set_up) != std::string::npos);
    CHECK(why.find("Hello from rank 1 offers no authentication, but this job has a secret") != std::string::npos);
    CHECK(j.ms < kInitTimeoutMs + 3000);
    CHECK_FALSE(j.fake_handshake.is_ok());
  }
  SECTION("another secret: its Auth is refused") {
    FakeMember fake;
    Joined j = join_secret_job(rv, "wire-other-secret", secrets.job_file(), &fake, [](FakeMember& m) {
      if (!m.send(hello("wire-other-secret", 1, nonce()))) return Status{Code::Io, "closed"};
      std::string wrong = expect_hello_and_auth(m.socket());
      if (!wrong.empty()) return Status{Code::Io, wrong};
      FrameHeader h;
      h.type = MsgType::Auth;
      h.src_rank = 1;
      h.cluster_version = kClusterVersion;
      m.send(frame(h, "wire-other-secret", std::vector<uint8_t>(32, 0x33)));
      return Status{};
    });
    REQUIRE(j.fake_handshake.is_ok());
    REQUIRE_FALSE(j.victim.is_ok());
    const std::string& why = j.victim.status().message();
    INFO(why);
    CHECK(why.find(set_up) != std::string::npos);
    CHECK(why.find("rank 1 failed authentication (a different or no job secret)") != std::string::npos);
    CHECK(j.ms < kInitTimeoutMs + 3000);
  }
  SECTION("another secret, as a real dialer: it hangs up on rank 0's proof") {
    FakeMember fake;
    Joined j = join_secret_job(rv, "wire-hang-up", secrets.job_file(), &fake, [&](FakeMember& m) {
      Status s = m.handshake("wire-hang-up", secrets.other_secret(), after_ms(kCloseBoundMs));
      m.socket().close();
      return s;
    });
    INFO(j.fake_handshake.message());
    CHECK(j.fake_handshake.message() == "rank 0 failed authentication (a different or no job secret)");
    REQUIRE_FALSE(j.victim.is_ok());
    const std::string& why = j.victim.status().message();
    INFO(why);
    CHECK(why.find(set_up) != std::string::npos);
    CHECK(j.ms < kInitTimeoutMs + 3000);
  }
}
