// A peer's shared-memory mailbox with any bytes in it: ShmTransport as rank 0 of two, with
// rank 1's segment mapped as it would be after rank 1's offer, then polled.
//
// Input: the mailbox's published end (u64, little endian), then up to kShmMailboxBytes of
// mailbox content (the rest stays zero). Rank 1 has sent no TCP frame after its offer, so
// records tagged 1 are deliverable (shm_transport.h).
//
// Whatever rank 1 wrote, every frame the transport hands to the op engine must be one a
// TCP link would deliver too: it passes decode_header, comes from rank 1, is an op or ring
// frame, and its payload can be read whole where the transport says it lies. After a frame
// that breaks a rule the transport drops rank 1 with a Protocol error naming it and
// delivers nothing more. Anything else aborts: it is a bug.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/byte_order.h"
#include "transport/frame.h"
#include "transport/shm_ring.h"
#include "transport/shm_transport.h"

namespace {

using namespace taiji;

constexpr uint32_t kVersion = 7;
constexpr uint64_t kRing = kShmMinRingBytes;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_mailbox: %s\n", what);
    std::abort();
  }
}

FrameLimits limits() {
  FrameLimits l;
  l.world_size = 2;
  l.cluster_version = kVersion;
  return l;
}

// Checks every frame the transport delivers; takes each payload into a buffer of its own.
struct Engine : ReceiveHandler {
  bool dropped = false;
  int delivered = 0;
  std::vector<uint8_t> buffer;

  Status accept_frame(int src, const FrameHeader& h, const std::string& name,
                      const uint8_t* in_memory, uint8_t** target) override {
    check(!dropped, "a frame after the link was dropped");
    check(src == 1 && h.src_rank == 1, "a frame from the wrong rank");
    uint8_t raw[kHeaderSize];
    encode_header(h, raw);
    FrameHeader again;
    check(decode_header(raw, limits(), &again).is_ok(), "a header TCP would refuse");
    check(h.type != MsgType::Hello && h.type != MsgType::Auth && h.type != MsgType::Bye,
          "a connection frame from the mailbox");
    check(name.size() == h.name_len, "a name of the wrong length");
    // A payload read in place must be readable whole (a sanitizer or a fault says if not).
    if (in_memory != nullptr) {
      volatile uint8_t sum = 0;
      for (uint64_t i = 0; i < h.payload_len; ++i) sum = static_cast<uint8_t>(sum + in_memory[i]);
    }
    buffer.assign(h.payload_len, 0);
    *target = buffer.data();
    return {};
  }
  void frame_done(int, const FrameHeader&, const std::string&) override { ++delivered; }
  void link_down(int, bool, const Status&) override { dropped = true; }
};

// Records what the transport sends and drops.
struct Wire : Transport {
  ShmTransport* shm = nullptr;
  std::vector<Status> drops;
  void send(int, OutMessage) override {}
  void pause_reading(int) override {}
  void resume_reading(int) override {}
  uint64_t queued_bytes(int) const override { return 0; }
  void drop(int rank, const Status& why) override {
    check(why.code() == Code::Protocol, "a drop that is not a Protocol error");
    check(why.message().rfind("rank 1: ", 0) == 0, "a drop that does not name rank 1");
    drops.push_back(why);
    shm->link_down(rank, false, why);
  }
  void shutdown(std::function<void()> done) override { done(); }
  void close_now(std::function<void()> done) override { done(); }
  void defer(std::function<void()> fn) override { fn(); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  auto created = ShmSegment::create(kRing);
  if (!created.is_ok()) return 0;
  ShmSegment rank1 = std::move(created.value());
  std::memcpy(rank1.mailbox(), data + 8, std::min<size_t>(size - 8, kShmMailboxBytes));

  Engine engine;
  Wire wire;
  const Cluster cluster{limits().cluster_version, 0, 2, {}, {0, 0}};
  ShmOptions options;
  options.cluster = &cluster;
  options.limits = limits();
  options.ring_bytes = kRing;
  ShmTransport shm(options, &wire, &engine);
  wire.shm = &shm;

  // Rank 1's offer, as TCP would deliver it (its TCP frame 1).
  FrameHeader offer;
  offer.type = MsgType::ShmOffer;
  offer.src_rank = 1;
  offer.cluster_version = kVersion;
  offer.name_len = 3;
  offer.payload_len = kShmOfferBytes;
  uint8_t* target = nullptr;
  check(shm.accept_frame(1, offer, "shm", nullptr, &target).is_ok(), "the offer refused");
  encode_offer(rank1.info(), target);
  shm.frame_done(1, offer, "shm");
  check(wire.drops.empty(), "the offer dropped the link");

  rank1.mail_tail().store(get64(data));
  shm.set_polling(true);
  for (int round = 0; round < 3 && wire.drops.empty(); ++round) shm.poll();
  shm.set_polling(false);
  shm.poll();
  check(wire.drops.size() <= 1, "dropped more than once");
  return 0;
}
