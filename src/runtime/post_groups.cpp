#include "runtime/post_groups.h"

namespace taiji {

void PostGroups::start() {
  std::lock_guard<std::mutex> lock(mu_);
  Group& g = groups_[std::this_thread::get_id()];
  if (g.depth++ == 0) open_.fetch_add(1);
}

Status PostGroups::end(std::vector<HeldPost>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = groups_.find(std::this_thread::get_id());
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
  return groups_.count(std::this_thread::get_id()) != 0;
}

bool PostGroups::hold(HeldPost& post) {
  if (open_.load() == 0) return false;
  const std::thread::id self = std::this_thread::get_id();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = groups_.find(self);
  if (it == groups_.end()) return false;
  post.op->request->hold(self);
  it->second.posts.push_back(std::move(post));
  return true;
}

std::vector<HeldPost> PostGroups::take_all() {
  std::vector<HeldPost> all;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [thread, group] : groups_) {
    for (HeldPost& p : group.posts) all.push_back(std::move(p));
    group.posts.clear();
  }
  return all;
}

}  // namespace taiji
