// SIGPIPE for threads that borrow a peer's loop.
//
// A write to a connection whose other end has gone raises SIGPIPE in the writing thread,
// and its default action kills the process. The I/O thread blocks it for good. A caller
// that runs the loop while it waits (runtime/loop_baton.h) must hand its own signal mask
// back when it returns; blocking and restoring around every wait cost three system calls,
// a fifth of a 4-byte allreduce through shared memory, where most waits write to no socket
// at all. So the waiter installs a LazySigpipeBlock, and everything that may write to a
// socket without MSG_NOSIGNAL (libuv's queued writes) calls block_sigpipe_here() first:
// the first such call blocks SIGPIPE on this thread until the LazySigpipeBlock ends. With
// none installed it does nothing. The TCP transport's immediate writes use MSG_NOSIGNAL
// and need none of this, so a small op over TCP waits without touching the mask.
#pragma once

#include <signal.h>

namespace taiji {

class LazySigpipeBlock {
 public:
  LazySigpipeBlock();
  // Restores the thread's mask; a SIGPIPE raised meanwhile is taken off the thread first.
  ~LazySigpipeBlock();
  LazySigpipeBlock(const LazySigpipeBlock&) = delete;
  LazySigpipeBlock& operator=(const LazySigpipeBlock&) = delete;

  void block();
  bool blocked() const { return blocked_; }

 private:
  LazySigpipeBlock* outer_;
  bool blocked_ = false;
  sigset_t old_;
};

void block_sigpipe_here();
// For a thread that owns a loop for its whole life (the I/O thread): blocked, never restored.
void block_sigpipe_for_good();

}  // namespace taiji
