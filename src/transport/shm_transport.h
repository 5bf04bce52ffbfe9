// Shared memory for peers on the same host, layered over the TCP transport.
//
// Each TCP link stays: it carries the handshake, the ring offers, frames too large for the
// mailbox (below) and doorbells, and tells a lost peer. After connecting, each peer offers every same-host peer a ring
// (transport/shm_ring.h) for its direction; once the receiver has mapped it, the payload of a
// Data or ModelReply frame of at least kShmMinPayload bytes is copied into the ring and only
// a small ShmData frame ("payload at position P, length L") goes in the mailbox. The
// receiver turns it back into the frame it stands for (a ModelReply when it names no op,
// transport/frame.h), validates that, copies the bytes straight into the target and
// returns the ring space.
// When the ring is full, frames to that rank wait, in order, until the receiver frees room
// and wakes the sender with a ShmReply "credit" frame (sent only when asked for, through a
// flag in the ring). The credit travels in the stream from the receiver, which this rank
// may have stopped reading (early-arrival backpressure); so waiting frames are also
// retried on every poll and on the loop's tick, reading the freed room from the ring. A
// payload larger than the ring never fits (a payload never wraps): it goes over TCP in the
// same ordered stream.
//
// Cost: one user copy on each side instead of two kernel copies and a syscall per socket
// buffer. The receiver's copy goes
// away where the op can read the payload in the ring (accept_frame's in_memory: a reduce
// step with one child combines straight from it), so the ring's bytes are released only
// after frame_done.
//
// Small frames take the segment's mailbox (shm_ring.h) instead of TCP once the ring is up:
// every frame of at most kShmMaxRecord bytes, the ShmData frames included. A receiver
// that polls (the peer's spin window, runtime/progress.h) reads them with no system call and says so in the
// segment; while it does not, the sender rings a ShmBell over TCP after each record. One
// ordered stream stays: each record carries how many frames the sender had handed to TCP
// before it, and the receiver delivers it only once it has taken that many TCP frames,
// and before it takes the next (a record tagged with fewer is a protocol error). A 4-byte
// allreduce between two processes then costs two small memory copies instead of a TCP
// write and read on each side. Records are checked like TCP frames, and more: their
// length against the frame's, their type (only op and ring frames), their rank.
//
// A lost peer is noticed through its TCP link, exactly as without shared memory. Ring
// positions and lengths from a peer are checked like every other frame field, and so is
// the position a receiver says it consumed: a bad one closes the link with a Protocol
// error.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "common/cluster.h"
#include "monitor/link_counters.h"
#include "transport/shm_ring.h"
#include "transport/transport.h"

namespace taiji {

struct ShmOptions {
  // The membership (rank, size, version), read where needed: it changes in place.
  const Cluster* cluster = nullptr;
  FrameLimits limits;             // world_size and cluster_version come from the cluster
  uint64_t ring_bytes = 8 << 20;  // per directed pair
  bool enabled = true;            // false: offer no ring and decline offers
  LinkCounters* link_counters = nullptr;
  // Asks the loop to call poll() soon, from outside any frame delivery (after reading
  // from a rank resumes with mail waiting).
  std::function<void()> request_poll;
};

// Payloads below this go over TCP: the doorbell would cost as much as the copy saves.
constexpr uint64_t kShmMinPayload = 4096;

class ShmTransport final : public Transport, public ReceiveHandler {
 public:
  // `inner` carries everything; frames received on it must be delivered to this object.
  ShmTransport(ShmOptions options, Transport* inner, ReceiveHandler* handler);
  ~ShmTransport() override;

  // Offers a ring to every rank whose host index equals this rank's. Call on the I/O
  // thread once the links are up.
  void start(const std::vector<int>& host_of);
  // Whether payloads to dst go through shared memory now (dst accepted our ring).
  bool active_to(int dst) const;
  // The I/O thread starts or stops polling: while on, senders ring no doorbell. After
  // turning it off, call poll() once more (a record may have come in between).
  void set_polling(bool on);
  // Delivers the mail that may be delivered now, after retry_waiting().
  void poll();
  // Sends what the rings have room for now of the frames waiting for room. Call on the
  // I/O thread's tick too: the loop may not poll.
  void retry_waiting();
  // Frames delivered from mailboxes so far: a sign of traffic for a polling loop.
  uint64_t mail_delivered() const { return mail_delivered_; }

  // Transport
  void send(int dst, OutMessage msg) override;
  void pause_reading(int src) override;
  void resume_reading(int src) override;
  uint64_t queued_bytes(int dst) const override;
  void drop(int rank, const Status& why) override { inner_->drop(rank, why); }
  void shutdown(std::function<void()> on_closed) override;
  void close_now(std::function<void()> on_closed) override;
  void defer(std::function<void()> fn) override { inner_->defer(std::move(fn)); }

  // ReceiveHandler
  Status accept_frame(int src, const FrameHeader& h, const std::string& name,
                      const uint8_t* in_memory, uint8_t** target) override;
  void frame_done(int src, const FrameHeader& h, const std::string& name) override;
  void link_down(int src, bool graceful, const Status& why) override;

 private:
  struct Link {
    std::unique_ptr<ShmProducer> out;       // our ring to this rank
    bool out_active = false;                 // the rank mapped it
    std::unique_ptr<ShmConsumer> in;        // this rank's ring to us
    uint8_t rx[kShmOfferBytes] = {};         // payload of a ShmOffer or ShmData frame
    std::deque<OutMessage> waiting;         // behind a full ring, in order
    uint64_t waiting_bytes = 0;
    uint64_t ring_frames = 0;                // sent through the ring
    uint64_t tcp_frames = 0;                 // bulk, but too large for the ring's free room
    uint64_t waits = 0;                      // times the ring was full
    uint64_t tcp_sent = 0;                   // frames handed to TCP for this rank
    uint64_t tcp_done = 0;                   // frames from this rank taken from TCP
    uint64_t mail_frames = 0;                // sent through the mailbox
    uint64_t bells = 0;                      // ShmBells rung for them
    bool paused = false;                     // the handler wants no frames from it now
    bool down = false;                       // link_down reported: nothing more
    bool delivering = false;                 // inside deliver_mail
    bool tcp_in_frame = false;               // a TCP frame's payload is being read
  };

  // Sends msg, through the ring when it is bulk and the ring is up. False (msg untouched)
  // when it must wait for room.
  bool try_send(int dst, OutMessage& msg);
  // Sends a frame through the mailbox if it fits, else over TCP.
  void emit(int dst, OutMessage msg);
  void to_tcp(int dst, OutMessage msg);
  // Delivers dst's records that may come before the next TCP frame from it, of those
  // published when it starts (at most one mailbox); with `any_time`, even while paused
  // (the next TCP frame is being taken: order first). From a rank that keeps to the
  // protocol, that takes at most a mailbox of frames and a ring of payloads past the
  // early-arrival cap.
  Status deliver_mail(int src, bool any_time);
  Status deliver_record(int src, const ShmRecord& rec);
  // Gives the handler a frame whose payload lies in shared memory, copied to where it
  // wants it or read in place; `counted` bytes go to the link's counters.
  Status hand_over(int src, const FrameHeader& h, const std::string& name,
                   const uint8_t* payload, uint64_t counted);
  Status dispatch_accept(int src, const FrameHeader& h, const std::string& name,
                         const uint8_t* in_memory, uint8_t** target);
  void dispatch_done(int src, const FrameHeader& h, const std::string& name);
  // Sends dst's waiting frames, in order, as far as the ring has room.
  void send_waiting(int dst);
  // Hands every waiting frame to TCP (in order), e.g. before a Bye or after a link is gone.
  void flush_waiting(int dst);

  // The frame limits, with the current cluster's size and version.
  FrameLimits limits() const;
  void on_offer(int src, const std::string& name);
  void on_reply(int src, const FrameHeader& h);
  void on_data(int src, const FrameHeader& h, const std::string& name);

  ShmOptions opt_;
  Transport* inner_;
  ReceiveHandler* handler_;
  std::vector<Link> links_;
  bool polling_ = false;
  uint64_t mail_delivered_ = 0;
};

}  // namespace taiji
