// The lazy SIGPIPE block a thread holds while it runs a peer's loop: the mask changes only
// once something may write to a socket, it comes back exactly as it was, and a SIGPIPE
// raised meanwhile never reaches the thread.
#include <catch2/catch.hpp>

#include <pthread.h>
#include <signal.h>

#include <atomic>

#include "transport/sigpipe.h"

using namespace taiji;

namespace {

std::atomic<int> delivered{0};
void count(int) { delivered.fetch_add(1); }

bool sigpipe_blocked() {
  sigset_t now;
  pthread_sigmask(SIG_BLOCK, nullptr, &now);
  return sigismember(&now, SIGPIPE) == 1;
}

bool sigpipe_pending() {
  sigset_t pending;
  sigpending(&pending);
  return sigismember(&pending, SIGPIPE) == 1;
}

// Counts SIGPIPEs instead of dying of them, and starts with SIGPIPE unblocked.
struct Counting {
  struct sigaction before = {};
  sigset_t mask_before;
  Counting() {
    struct sigaction sa = {};
    sa.sa_handler = count;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, &before);
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_UNBLOCK, &pipe, &mask_before);
  }
  ~Counting() {
    pthread_sigmask(SIG_SETMASK, &mask_before, nullptr);
    sigaction(SIGPIPE, &before, nullptr);
  }
};

}  // namespace

TEST_CASE("sigpipe: nothing blocked until something may write", "[sigpipe]") {
  Counting counting;
  {
    LazySigpipeBlock lazy;
    CHECK_FALSE(sigpipe_blocked());
    CHECK_FALSE(lazy.blocked());
  }
  CHECK_FALSE(sigpipe_blocked());
  block_sigpipe_here();  // none installed: no effect
  CHECK_FALSE(sigpipe_blocked());
}

TEST_CASE("sigpipe: blocked from the first write, restored after, a raised one swallowed", "[sigpipe]") {
  Counting counting;
  const int before = delivered.load();
  {
    LazySigpipeBlock lazy;
    block_sigpipe_here();
    CHECK(lazy.blocked());
    CHECK(sigpipe_blocked());
    block_sigpipe_here();  // again: still one block
    pthread_kill(pthread_self(), SIGPIPE);
    CHECK(sigpipe_pending());
    CHECK(delivered.load() == before);
  }
  CHECK_FALSE(sigpipe_blocked());
  CHECK_FALSE(sigpipe_pending());
  CHECK(delivered.load() == before);
  block_sigpipe_here();  // uninstalled again
  CHECK_FALSE(sigpipe_blocked());
}

TEST_CASE("sigpipe: a thread that blocked SIGPIPE itself keeps it blocked and pending", "[sigpipe]") {
  Counting counting;
  const int before = delivered.load();
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  {
    LazySigpipeBlock lazy;
    block_sigpipe_here();
    pthread_kill(pthread_self(), SIGPIPE);
  }
  CHECK(sigpipe_blocked());
  CHECK(sigpipe_pending());  // the thread's own business: left for it
  // Take it off before unblocking, so the count stays as it was.
  timespec now{0, 0};
  CHECK(sigtimedwait(&pipe, nullptr, &now) == SIGPIPE);
  CHECK(delivered.load() == before);
}
