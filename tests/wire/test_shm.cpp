// Shared memory against a fake rank 1 on the same host: rank 0 offers it a ring, maps the
// ring rank 1 offers back and takes an op's payload from it; a ring that cannot be mapped
// is declined and TCP carries the data; ring positions, lengths and offers that are not
// exactly right close the link with an error naming rank 1, and rank 0 stays healthy.
// Frames in rank 1's mailbox are taken only in their place in the TCP stream, and
// malformed or misplaced ones close the link the same way.
#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fake_member.h"
#include "live_peers.h"
#include "log_capture.h"
#include "member_ops.h"
#include "raw_socket.h"
#include "transport/shm_ring.h"

using namespace taiji;
using namespace wire;

namespace {

FrameHeader control(MsgType type) {
  FrameHeader h;
  h.type = type;
  h.src_rank = 1;
  h.cluster_version = kClusterVersion;
  return h;
}

struct Job {
  Rendezvous rv;
  FakeMember fake;
  std::unique_ptr<Peer> victim;
};

// Rank 0 and the fake rank 1 connected; rank 0 has offered its ring (checked).
std::string start(const std::string& job_id, Job* job) {
  std::string error;
  job->rv = start_rendezvous(&error);
  if (!error.empty()) return error;
  error = start_with_fake(base_config(0, job->rv.address, job_id), "", &job->fake, &job->victim);
  if (!error.empty()) return error;
  Frame offer;
  Status s = job->fake.await(MsgType::ShmOffer, "shm", 0, after_ms(kBoundMs), &offer);
  if (!s.is_ok()) return "rank 0 offered no ring to a rank on its host: " + s.message();
  if (offer.payload.size() != kShmOfferBytes) return "rank 0's offer has a wrong payload size";
  return {};
}

// Offers rank 0 a ring and returns its answer (1: mapped, 0: declined).
std::string offer(Job& job, const ShmSegmentInfo& info, uint32_t* answer) {
  std::vector<uint8_t> payload(kShmOfferBytes);
  encode_offer(info, payload.data());
  job.fake.send(frame(control(MsgType::ShmOffer), "shm", payload));
  Frame reply;
  Status s = job.fake.await(MsgType::ShmReply, "shm", 0, after_ms(kBoundMs), &reply);
  if (!s.is_ok()) return "no ShmReply: " + s.message();
  *answer = reply.header.chunk;
  return {};
}

// start(), then rank 1 makes a ring of its own; with `map`, offers it (its first TCP frame
// after the handshake) and checks that rank 0 mapped it.
std::string start_with_ring(const std::string& job_id, Job* job, bool map,
                            std::unique_ptr<ShmProducer>* ring) {
  std::string error = start(job_id, job);
  if (!error.empty()) return error;
  auto seg = ShmSegment::create(kShmMinRingBytes);
  if (!seg.is_ok()) return "no ring: " + seg.status().message();
  if (map) {
    uint32_t answer = 9;
    error = offer(*job, seg.value().info(), &answer);
    if (!error.empty()) return error;
    if (answer != 1) return "rank 0 declined a valid ring";
  }
  *ring = std::make_unique<ShmProducer>(std::move(seg.value()));
  return {};
}

// Posts "w" on rank 0, lets `send_data` deliver rank 1's chunk after its Ready, and checks
// the exact sum.
std::string allreduce(Job& job, const std::function<void(const Frame& ready)>& send_data) {
  std::array<float, 2> out{};
  std::shared_ptr<RequestState> request;
  return allreduce_checked(*job.victim, job.fake, &out, [&](const Frame& ready) {
    job.fake.send(member_ready(ready));
    send_data(ready);
  }, &request);
}

std::vector<uint8_t> shm_data(const Frame& ready, ShmDescriptor where) {
  FrameHeader h = member_data(ready.header);
  h.type = MsgType::ShmData;
  std::vector<uint8_t> payload(kShmDescriptorBytes);
  encode_descriptor(where, payload.data());
  return frame(h, kOp, payload);
}

// Writes frame (h, name, payload) into rank 1's mailbox, tagged to follow its
// tcp_before-th TCP frame.
bool mail(ShmProducer& ring, uint64_t tcp_before, FrameHeader h, const std::string& name,
          const std::vector<uint8_t>& payload) {
  h.name_len = static_cast<uint16_t>(name.size());
  h.payload_len = payload.size();
  uint8_t header[kHeaderSize];
  encode_header(h, header);
  return ring.post(tcp_before, header, name, payload.data(), payload.size());
}

std::vector<uint8_t> bell() { return frame(control(MsgType::ShmBell), "shm"); }

// A fault: rank 1's Data frame, changed by `edit`, in the mailbox after its first TCP
// frame, then a bell.
std::function<std::vector<uint8_t>(const Frame&, ShmProducer*)> mailed_data(
    std::function<void(FrameHeader&)> edit) {
  return [edit](const Frame& ready, ShmProducer* ring) {
    FrameHeader h = member_data(ready.header);
    edit(h);
    mail(*ring, 1, h, kOp, theirs());
    return bell();
  };
}

}  // namespace

TEST_CASE("shm: rank 0 takes mail from rank 1 only in its place in the TCP stream", "[shm]") {
  LogCapture log;
  Job job;
  std::unique_ptr<ShmProducer> rank1_ring;
  std::string error = start_with_ring("wire-shm-mail", &job, true, &rank1_ring);  // TCP frame 1
  INFO(error);
  REQUIRE(error.empty());
  ShmProducer& ring = *rank1_ring;
  std::array<float, 2> out{};
  std::shared_ptr<RequestState> request;
  Frame ready;
  error = post_op(*job.victim, job.fake, &out, &request, &ready);
  INFO(error);
  REQUIRE(error.empty());
  job.fake.send(member_ready(ready));  // TCP frame 2
  // Rank 1's data, to follow its fourth TCP frame: the bell (frame 3) makes rank 0 look,
  // but it must hold the data back.
  REQUIRE(mail(ring, 4, member_data(ready.header), kOp, theirs()));
  job.fake.send(bell());
  Status s;
  CHECK_FALSE(request->wait_for(300, &s));
  job.fake.send(bell());  // frame 4: now the data is next
  REQUIRE(request->wait_for(kBoundMs, &s));
  INFO(s.message());
  REQUIRE(s.is_ok());
  const std::array<float, 2> want = {kMine[0] + kTheirs[0], kMine[1] + kTheirs[1]};
  CHECK(out == want);
  // A second op with both of rank 1's frames, Ready and data, in the mailbox after the
  // four TCP frames, and one bell (frame 5) for both.
  std::array<float, 2> out2{};
  error = post_op(*job.victim, job.fake, &out2, &request, &ready);
  INFO(error);
  REQUIRE(error.empty());
  FrameHeader their_ready = ready.header;  // as member_ready() sends it over TCP
  their_ready.src_rank = 1;
  REQUIRE(mail(ring, 4, their_ready, kOp, {}));
  REQUIRE(mail(ring, 4, member_data(ready.header), kOp, theirs()));
  job.fake.send(bell());
  REQUIRE(request->wait_for(kBoundMs, &s));
  INFO(s.message());
  REQUIRE(s.is_ok());
  CHECK(out2 == want);
  CHECK(ring.segment().mail_head().load() == ring.segment().mail_tail().load());
  CHECK(job.victim->async_error().is_ok());
  CHECK(log.take().empty());
}

TEST_CASE("shm: rank 1 flooding its mailbox does not keep rank 0 from its deadlines", "[shm]") {
  LogCapture log;
  Job job;
  std::unique_ptr<ShmProducer> rank1_ring;
  std::string error = start_with_ring("wire-shm-flood", &job, true, &rank1_ring);  // TCP frame 1
  INFO(error);
  REQUIRE(error.empty());
  ShmProducer& ring = *rank1_ring;
  std::array<float, 2> out{};
  PostArgs a;
  a.name = kOp;
  a.send = kMine.data();
  a.recv = out.data();
  a.count = out.size();
  a.dtype = DType::F32;
  a.redop = RedOp::Sum;
  a.timeout_ms = 300;
  auto posted = job.victim->post(std::move(a));
  REQUIRE(posted.is_ok());
  Frame ready;
  REQUIRE(job.fake.await(MsgType::Ready, kOp, posted.value()->version(), after_ms(kBoundMs), &ready)
              .is_ok());
  // Answers cost rank 0 nothing and never pause its reads: only the length of each mailbox
  // pass bounds what it delivers. Rank 1 never sends its data, so the op must time out.
  FrameHeader answer = ready.header;
  answer.type = MsgType::Answer;
  answer.src_rank = 1;
  answer.chunk = 0;
  REQUIRE(mail(ring, 2, answer, kOp, {}));
  job.fake.send(bell());  // frame 2: the mail after it is due now
  std::thread flood([&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (std::chrono::steady_clock::now() < until) {
      if (!mail(ring, 2, answer, kOp, {})) std::this_thread::yield();
    }
  });
  Status s;
  const bool ended = posted.value()->wait_for(1500, &s);
  flood.join();
  CHECK(ended);
  INFO(s.message());
  CHECK(s.code() == Code::Timeout);
}

TEST_CASE("shm: rank 0 takes a payload from the ring rank 1 offered", "[shm]") {
  LogCapture log;
  Job job;
  std::string error = start("wire-shm-valid", &job);
  INFO(error);
  REQUIRE(error.empty());
  auto seg = ShmSegment::create(kShmMinRingBytes);
  REQUIRE(seg.is_ok());
  ShmSegmentInfo info = seg.value().info();
  uint32_t answer = 9;
  error = offer(job, info, &answer);
  INFO(error);
  REQUIRE(error.empty());
  REQUIRE(answer == 1);
  ShmSegment& ring = seg.value();
  // Rank 0 must track the ring's position: each payload goes right after the previous one
  // or, as the ring is empty, at its first byte again (the start of the next lap).
  const uint64_t len = sizeof(kTheirs);
  const uint64_t positions[] = {0, len, kShmMinRingBytes, kShmMinRingBytes + len, 2 * kShmMinRingBytes};
  for (uint64_t pos : positions) {
    error = allreduce(job, [&](const Frame& ready) {
      std::memcpy(ring.data() + pos % ring.capacity(), theirs().data(), len);
      job.fake.send(shm_data(ready, {pos, len}));
    });
    INFO("payload at " << pos << ": " << error);
    REQUIRE(error.empty());
  }
  CHECK(log.take().empty());
}

TEST_CASE("shm: a ring rank 0 cannot map is declined and TCP carries the data", "[shm]") {
  LogCapture log;
  Job job;
  std::string error = start("wire-shm-decline", &job);
  INFO(error);
  REQUIRE(error.empty());
  auto seg = ShmSegment::create(kShmMinRingBytes);
  REQUIRE(seg.is_ok());
  ShmSegmentInfo info = seg.value().info();
  info.nonce ^= 0x5a5a;
  uint32_t answer = 9;
  error = offer(job, info, &answer);
  INFO(error);
  REQUIRE(error.empty());
  CHECK(answer == 0);
  error = allreduce(job, [&](const Frame& ready) {
    job.fake.send(frame(member_data(ready.header), kOp, theirs()));
  });
  INFO(error);
  CHECK(error.empty());
  CHECK(job.victim->async_error().is_ok());
  CHECK(log.take().empty());
}

TEST_CASE("shm: bad ring frames from rank 1 close its link with an error naming it", "[shm]") {
  struct Fault {
    std::string what;
    bool map_ring;  // rank 1 offers a ring first
    std::function<std::vector<uint8_t>(const Frame& ready, ShmProducer* ring)> frames;
    std::string says;
  };
  const std::vector<Fault> faults = {
      {"payload in a ring never offered", false,
       [](const Frame& r, ShmProducer*) { return shm_data(r, {0, 8}); },
       "rank 1: ShmData without a shared-memory ring"},
      {"position other than the next one", true,
       [](const Frame& r, ShmProducer*) { return shm_data(r, {64, 8}); },
       "rank 1: shared-memory payload at ring position 64, expected 0"},
      {"length beyond the ring", true,
       [](const Frame& r, ShmProducer*) { return shm_data(r, {0, kShmMinRingBytes + 8}); },
       "rank 1: shared-memory payload length " + std::to_string(kShmMinRingBytes + 8) + " out of range"},
      {"length not a multiple of the dtype", true,
       [](const Frame& r, ShmProducer*) { return shm_data(r, {0, 6}); },
       "rank 1: ShmData: payload_len 6 not a multiple of dtype size 4"},
      {"a second offer", true,
       [](const Frame&, ShmProducer*) {
         return frame(control(MsgType::ShmOffer), "shm", std::vector<uint8_t>(kShmOfferBytes, 1));
       },
       "rank 1: second ShmOffer"},
      {"a reply that answers nothing", false,
       [](const Frame&, ShmProducer*) {
         FrameHeader h = control(MsgType::ShmReply);
         h.chunk = 7;
         return frame(h, "shm");
       },
       "rank 1: ShmReply with answer 7"},
      {"an offer of the wrong size", false,
       [](const Frame&, ShmProducer*) {
         return frame(control(MsgType::ShmOffer), "shm", std::vector<uint8_t>(8, 1));
       },
       "rank 1: ShmOffer with a 8-byte payload"},
      // The mailbox. Rank 1 has sent one TCP frame (its offer) when these are written, and
      // rank 0 has taken it; the bell makes rank 0 look even if it is not polling.
      {"a doorbell with no mailbox", false, [](const Frame&, ShmProducer*) { return bell(); },
       "rank 1: ShmBell without a mailbox"},
      {"mail placed before a TCP frame already taken", true,
       [](const Frame& r, ShmProducer* ring) {
         mail(*ring, 0, member_data(r.header), kOp, theirs());
         return bell();
       },
       "rank 1: mailbox frame after 0 TCP frames arrived after 1"},
      {"a malformed record", true,
       [](const Frame&, ShmProducer* ring) {
         ring->segment().mailbox()[4] = 7;  // kind 7, in an otherwise empty record
         ring->segment().mail_tail().store(128);
         return bell();
       },
       "rank 1: malformed mailbox record (kind 7"},
      {"a frame header that fails validation", true, mailed_data([](FrameHeader& h) { h.magic = 0x12345678; }),
       "rank 1: mailbox: bad magic 0x12345678"},
      {"a handshake frame", true,
       [](const Frame&, ShmProducer* ring) {
         mail(*ring, 1, control(MsgType::Hello), "job", {});
         return bell();
       },
       "rank 1: frame of type 1 in the mailbox"},
      {"a frame claiming another rank", true, mailed_data([](FrameHeader& h) { h.src_rank = 0; }),
       "rank 1: mailbox frame claims rank 0"},
      {"a record longer than its frame", true,
       [](const Frame& r, ShmProducer* ring) {
         FrameHeader h = member_data(r.header);
         h.name_len = 1;
         h.payload_len = 4;  // the record holds 8 payload bytes
         uint8_t header[kHeaderSize];
         encode_header(h, header);
         ring->post(1, header, kOp, theirs().data(), 8);
         return bell();
       },
       "rank 1: mailbox record of 73 bytes holds a frame of 69"},
  };
  for (const Fault& f : faults) {
    DYNAMIC_SECTION(f.what) {
      LogCapture log;
      Job job;
      std::unique_ptr<ShmProducer> ring;
      std::string error = start_with_ring("wire-shm-fault", &job, f.map_ring, &ring);
      INFO(error);
      REQUIRE(error.empty());
      std::array<float, 2> out{};
      std::shared_ptr<RequestState> request;
      Frame ready;
      error = post_op(*job.victim, job.fake, &out, &request, &ready);
      INFO(error);
      REQUIRE(error.empty());
      std::vector<uint8_t> bad = f.frames(ready, ring.get());
      job.fake.send(concat({member_ready(ready), bad}));
      CHECK(job.fake.socket().wait_closed(after_ms(kBoundMs)) != RawSocket::Closed::StillOpen);
      Status s;
      REQUIRE(request->wait_for(kBoundMs, &s));
      CHECK(s.code() == Code::PeerLost);
      CHECK_THAT(s.message(), Catch::Contains(f.says));
      std::vector<LogLine> lines = log.take_at_least(1, kBoundMs);
      CHECK(count_containing(lines, "link to rank 1 lost: " + f.says) == 1);
      auto t0 = Clock::now();
      job.victim.reset();
      CHECK(ms_between(t0, Clock::now()) < 5000);
    }
  }
}
