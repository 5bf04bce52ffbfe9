// Shared memory against a fake rank 1 on the same host: rank 0 offers it a ring, maps the
// ring rank 1 offers back and takes an op's payload from it; a ring that cannot be mapped
// is declined and TCP carries the data; ring positions, lengths and offers that are not
// exactly right close the link with an error naming rank 1, and rank 0 stays healthy.
#include <catch2/catch.hpp>

#include <array>
#include <cstring>
#include <functional>
#include <string>
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

}  // namespace

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
  };
  for (const Fault& f : faults) {
    DYNAMIC_SECTION(f.what) {
      LogCapture log;
      Job job;
      std::string error = start("wire-shm-fault", &job);
      INFO(error);
      REQUIRE(error.empty());
      auto seg = ShmSegment::create(kShmMinRingBytes);
      REQUIRE(seg.is_ok());
      if (f.map_ring) {
        uint32_t answer = 9;
        error = offer(job, seg.value().info(), &answer);
        INFO(error);
        REQUIRE(error.empty());
        REQUIRE(answer == 1);
      }
      ShmProducer ring(std::move(seg.value()));
      std::array<float, 2> out{};
      std::shared_ptr<RequestState> request;
      Frame ready;
      error = post_op(*job.victim, job.fake, &out, &request, &ready);
      INFO(error);
      REQUIRE(error.empty());
      std::vector<uint8_t> bad = f.frames(ready, &ring);
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
