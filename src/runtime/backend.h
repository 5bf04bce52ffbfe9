// The seam between posting an op and executing it. An op is given to a backend chosen at
// post time, by where its buffers live: today the host backend (runtime/host_backend.h:
// the op engine and the collectives over the transports); a device backend (NCCL) goes
// beside it, not inside it. Posting, versions, the topology gate and groups stay above
// the seam and are the same for every backend.
#pragma once

#include <memory>

#include "common/status.h"
#include "runtime/op_engine.h"

namespace taiji {

class Backend {
 public:
  virtual ~Backend() = default;
  // Any thread, at post: whether this backend runs the op (its buffers are its memory).
  virtual bool accepts(const PostedOp& op) const = 0;
  // I/O thread: starts the op, which runs to its end and completes its request. `fusable`:
  // it uses the automatic topology, so the backend may batch it with others; any other op
  // is given its graphs (runtime/op_poster.h) before it starts.
  virtual void start(std::shared_ptr<PostedOp> op, bool fusable) = 0;
  // I/O thread: no op in flight.
  virtual bool idle() const = 0;
  // I/O thread, periodically: deadlines.
  virtual void tick() = 0;
  // I/O thread: ends every op in flight with `why`; later ops fail with it too.
  virtual void fail_all(const Status& why) = 0;
  // I/O thread: the transports closed every link; nothing more arrives.
  virtual void links_closed() = 0;
};

}  // namespace taiji
