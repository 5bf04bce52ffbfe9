// The model store's service: serves this peer's store (adapt/model_store.h) to the other
// ranks from the I/O thread, so that the owner's caller never takes part, and runs this
// peer's own requests for other ranks' models. One-sided on the wire: a ModelRequest
// names the model, the version and the size the requester expects; the owner answers
// with ModelReply frames of at most one chunk each, read straight into the requester's
// buffer, or with one ModelReply that carries the error (transport/frame.h).
//
// Bounds, so that no requester can make the owner queue without limit: the owner sends
// one reply at a time to each rank and keeps at most kMaxWaitingRequests more from it
// (beyond that it refuses with an error, unless kMaxQueuedForAnswer is already queued for
// that rank: then it drops the request and the requester meets its deadline). A reply
// sends the stored bytes in place: the version stays alive, even if evicted meanwhile,
// until its last chunk is sent.
//
// Requester side: every request has a deadline, checked on the loop's tick; a lost link
// fails that rank's requests at once; closing the peer fails the rest. A request whose
// reply is being read into its buffer completes only once that frame ends, so that the
// caller never gets its buffer back while the transport still writes into it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "adapt/model_store.h"
#include "runtime/request.h"
#include "runtime/router.h"

namespace taiji {

class ModelService final : public ReceiveHandler {
 public:
  // A rank's requests the owner holds while it replies to that rank's earlier one.
  static constexpr size_t kMaxWaitingRequests = 64;
  // The longest error text a reply may carry.
  static constexpr uint64_t kMaxReasonBytes = 4096;

  // chunk_bytes: the largest payload of one reply frame (the peers' chunk, at most their
  // max payload).
  ModelService(int rank, int size, ModelStore* store, uint64_t chunk_bytes);
  void set_transport(Transport* transport) { transport_ = transport; }
  void serve(Router& router);

  // I/O thread. Sends the request to `rank` (not this one); `state` completes when the
  // whole model is in buf, or with the error. now_ms and deadline_ms: the loop's clock.
  void start(int rank, std::string name, uint64_t version, uint8_t* buf, uint64_t bytes,
             uint64_t now_ms, uint64_t deadline_ms, std::shared_ptr<RequestState> state);
  // I/O thread: fails the requests past their deadline.
  void tick(uint64_t now_ms);
  // I/O thread: fails every request in flight, and every later one, with `why`.
  void close(const Status& why);
  // I/O thread: requests in flight (tests, the finalize wait).
  size_t pending() const { return pending_.size(); }

  Status accept_frame(int src, const FrameHeader& h, const std::string& name,
                      const uint8_t* in_memory, uint8_t** target) override;
  void frame_done(int src, const FrameHeader& h, const std::string& name) override;
  void link_down(int src, bool graceful, const Status& why) override;

 private:
  struct Pending {
    int rank = 0;
    std::string name;
    uint64_t version = 0;
    uint8_t* buf = nullptr;
    uint64_t bytes = 0;
    uint64_t received = 0;
    uint64_t started_ms = 0;
    uint64_t deadline_ms = 0;
    std::shared_ptr<RequestState> state;
    int frames_open = 0;       // reply frames being read into buf or reason
    bool failed = false;       // completes with `failure` once frames_open is 0
    Status failure;
    std::string reason;        // an error reply's text
  };
  struct Ask {
    uint32_t id = 0;
    std::string name;
    uint64_t version = 0;
    uint64_t bytes = 0;
  };
  struct Serving {
    std::deque<Ask> waiting;
    bool sending = false;      // a reply's chunks are still with the transport
  };

  // By value: the status may be the erased request's own failure.
  void finish(uint32_t id, Status status);
  void fail_or_defer(uint32_t id, Status why);
  // Owner side: replies to src's next waiting request, if it is not sending one already.
  void pump(int src);
  void reply_error(int src, const Ask& ask, const Status& why);
  std::string describe(const Pending& p) const;

  const int rank_;
  ModelStore* store_;
  const uint64_t chunk_bytes_;
  Transport* transport_ = nullptr;
  std::map<uint32_t, Pending> pending_;
  uint32_t next_id_ = 1;
  std::vector<Serving> serving_;
  // Per source rank, whether each ModelReply accepted and not yet done was counted in its
  // request's frames_open (oldest first: a link delivers its frames in order).
  std::vector<std::deque<uint32_t>> open_frames_;
  std::vector<bool> down_;   // ranks whose link is gone: no request reaches them
  bool closed_ = false;
  Status closed_why_;
};

}  // namespace taiji
