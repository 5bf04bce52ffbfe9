// The transport interface the runtime drives: framed messages to and from ranks. TCP is
// the first implementation; shared memory and NCCL come later behind the same interface.
// Everything here runs on the owning peer's I/O thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/frame.h"

namespace taiji {

struct OutMessage {
  FrameHeader header;  // name_len and payload_len are filled in by send()
  std::string name;
  // Borrowed payload: must stay valid until on_sent runs (unless `owned` is used instead).
  const uint8_t* payload = nullptr;
  size_t payload_len = 0;
  std::vector<uint8_t> owned;  // when non-empty, the payload (payload/payload_len ignored)
  // The payload, wherever it lives.
  const uint8_t* payload_data() const { return owned.empty() ? payload : owned.data(); }
  size_t payload_size() const { return owned.empty() ? payload_len : owned.size(); }
  // Runs once the transport no longer reads the payload: sent, or failed/cancelled.
  std::function<void(const Status&)> on_sent;
};

class ReceiveHandler {
 public:
  virtual ~ReceiveHandler() = default;
  // A frame's header and name arrived and passed validation. Set *target to where its
  // payload_len bytes go, or to nullptr to have the payload read and dropped. A non-ok
  // status is a protocol violation: the connection is closed with that error.
  // in_memory: the payload, when it already sits in this process's memory (a shared-
  // memory ring) and stays there until frame_done returns; nullptr when it is still to
  // be read. The handler may then set *target to nullptr and read it there in frame_done
  // (one copy less).
  virtual Status accept_frame(int src, const FrameHeader& h, const std::string& name,
                              const uint8_t* in_memory, uint8_t** target) = 0;
  // The whole payload is in *target (as returned by accept_frame).
  virtual void frame_done(int src, const FrameHeader& h, const std::string& name) = 0;
  // The connection to src is gone; `graceful` when src said Bye first. Called once.
  virtual void link_down(int src, bool graceful, const Status& why) = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual void send(int dst, OutMessage msg) = 0;
  // Back-pressure: stop and restart reading frames from src. A frame already begun is read
  // to its end first (its frame_done may be what frees the room).
  virtual void pause_reading(int src) = 0;
  virtual void resume_reading(int src) = 0;
  // Bytes queued for dst and not yet handed to the kernel.
  virtual uint64_t queued_bytes(int dst) const = 0;
  // Closes the link to one rank now (cancelling its queued writes); link_down follows.
  virtual void drop(int rank, const Status& why) = 0;
  // Flushes queued writes, says Bye, closes every connection. on_closed runs when all
  // handles are closed.
  virtual void shutdown(std::function<void()> on_closed) = 0;
  // Closes every connection at once, cancelling queued writes.
  virtual void close_now(std::function<void()> on_closed) = 0;
  // Runs fn on the loop soon, never inside the caller (on_sent callbacks go this way).
  virtual void defer(std::function<void()> fn) = 0;
};

}  // namespace taiji
