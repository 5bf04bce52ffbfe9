#include "runtime/post_groups.h"

namespace taiji {

uint64_t group_thread_token() {
  static std::atomic<uint64_t> next{1};
  thread_local const uint64_t token = next.fetch_add(1);
  return token;
}

void PostGroups::start() {
  std::lock_guard<std::mutex> lock(mu_);
  Group& g = groups_[group_thread_token()];
  if (g.depth++ == 0) open_.fetch_add(1);
}

Status PostGroups::end(std::vector<HeldPost>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = groups_.find(group_thread_token());
  if (it == groups_.end()) {
    return {Code::InvalidArgument, "no group is open on this thread (taiji_group_end without taiji_group_start)"};
  }
  if (--it->second.depth > 0) return {};
  *out = std::move(it->second.posts);
  groups_.erase(it);
  open_.fetch_sub(1);
  return {};
}

bool PostGroups::open() const {
  if (open_.load() == 0) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return !closed_ && groups_.count(group_thread_token()) != 0;
}

PostGroups::Hold PostGroups::hold(HeldPost& post) {
  if (open_.load() == 0) return Hold::NotHeld;
  const uint64_t self = group_thread_token();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = groups_.find(self);
  if (it == groups_.end()) return Hold::NotHeld;
  // Checked under the lock close() takes: a post cannot slip in after it.
  if (closed_) return Hold::Closed;
  post.op->request->hold(self);
  it->second.posts.push_back(std::move(post));
  return Hold::Held;
}

bool PostGroups::holds(const std::string& name, uint64_t version) const {
  if (open_.load() == 0) return false;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [thread, group] : groups_) {
    for (const HeldPost& p : group.posts) {
      if (p.op->version == version && p.op->name == name) return true;
    }
  }
  return false;
}

std::vector<HeldPost> PostGroups::close() {
  std::vector<HeldPost> all;
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  for (auto& [thread, group] : groups_) {
    for (HeldPost& p : group.posts) all.push_back(std::move(p));
    group.posts.clear();
  }
  return all;
}

}  // namespace taiji
