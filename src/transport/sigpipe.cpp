#include "transport/sigpipe.h"

#include <pthread.h>

#include <ctime>

namespace taiji {

namespace {
thread_local LazySigpipeBlock* t_installed = nullptr;

sigset_t sigpipe_set() {
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  return pipe;
}
}  // namespace

LazySigpipeBlock::LazySigpipeBlock() : outer_(t_installed) {
  sigemptyset(&old_);
  t_installed = this;
}

LazySigpipeBlock::~LazySigpipeBlock() {
  t_installed = outer_;
  if (!blocked_ || sigismember(&old_, SIGPIPE) == 1) return;
  const sigset_t pipe = sigpipe_set();
  sigset_t pending;
  sigpending(&pending);
  if (sigismember(&pending, SIGPIPE) == 1) {
    timespec now{0, 0};
    sigtimedwait(&pipe, nullptr, &now);
  }
  pthread_sigmask(SIG_SETMASK, &old_, nullptr);
}

void LazySigpipeBlock::block() {
  if (blocked_) return;
  blocked_ = true;
  const sigset_t pipe = sigpipe_set();
  pthread_sigmask(SIG_BLOCK, &pipe, &old_);
}

void block_sigpipe_here() {
  if (t_installed != nullptr) t_installed->block();
}

void block_sigpipe_for_good() {
  const sigset_t pipe = sigpipe_set();
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
}

}  // namespace taiji
