// Groups of posts (taiji_group_start / taiji_group_end): a thread's posts between the two
// are held, then handed to the I/O thread together, so that the loop takes them up in one
// go. Fusion then sees a whole batch in its first negotiation round, and the loop is
// woken once instead of once per op. Groups are per calling thread and nest; only the
// outermost end hands the posts over. A thread that exits with a group open leaves its
// posts held until the peer closes, which fails them.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/op_engine.h"

namespace taiji {

// This thread's identity for groups: unlike std::thread::id, never reused by a later
// thread, which must not inherit a group a dead thread left open.
uint64_t group_thread_token();

struct HeldPost {
  std::shared_ptr<PostedOp> op;
  std::function<void()> task;  // what the loop runs to start it
};

class PostGroups {
 public:
  enum class Hold { Held, NotHeld, Closed };

  // Opens a group (or one more level of it) on the calling thread.
  void start();
  // Closes one level; once the outermost closes, *out gets its posts in posting order.
  // InvalidArgument when the calling thread has no group open.
  Status end(std::vector<HeldPost>* out);
  // Whether the calling thread has a group open and the peer is not closing.
  bool open() const;
  // Keeps the post if the calling thread has a group open (its request then reports
  // being held by this thread); Closed: the peer is closing, the post must fail.
  Hold hold(HeldPost& post);
  // Whether some thread holds the op (name, version); for diagnostics (a scan).
  bool holds(const std::string& name, uint64_t version) const;
  // The posts held by every thread (the peer is closing); later posts are refused and
  // the groups stay open, empty, until their ends.
  std::vector<HeldPost> close();

 private:
  struct Group {
    int depth = 0;
    std::vector<HeldPost> posts;
  };
  mutable std::mutex mu_;
  std::map<uint64_t, Group> groups_;  // by group_thread_token(), under mu_
  bool closed_ = false;               // under mu_
  // Threads with a group open: posts skip the lock while none is.
  std::atomic<int> open_{0};
};

}  // namespace taiji
