#include "runtime/membership.h"

#include <string>

#include "monitor/log.h"

namespace taiji {

Membership::Membership(int rank, int size, uint32_t version)
    : rank_(rank), size_(size), version_(version) {
  current_.version = version;
  current_.rank = rank;
  current_.size = size;
  current_.host_of.assign(static_cast<size_t>(size), 0);
  publish();
}

std::shared_ptr<const Cluster> Membership::snapshot() const {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  return snapshot_;
}

void Membership::publish() {
  auto copy = std::make_shared<const Cluster>(current_);
  {
    std::lock_guard<std::mutex> lock(snapshot_mu_);
    snapshot_ = std::move(copy);
  }
  rank_.store(current_.rank, std::memory_order_relaxed);
  size_.store(current_.size, std::memory_order_relaxed);
  version_.store(current_.version, std::memory_order_relaxed);
}

void Membership::set_addresses(std::vector<std::string> addresses, std::vector<int> host_of) {
  current_.addresses = std::move(addresses);
  current_.host_of = std::move(host_of);
  publish();
}

Status Membership::change(Cluster next) {
  const auto n = static_cast<size_t>(next.size);
  if (next.version <= current_.version) {
    return {Code::InvalidArgument, "cluster version " + std::to_string(next.version) +
                                       " does not follow the current version " +
                                       std::to_string(current_.version)};
  }
  if (next.size < 1 || next.rank < 0 || next.rank >= next.size) {
    return {Code::InvalidArgument, "rank " + std::to_string(next.rank) + " is not a rank of a " +
                                       std::to_string(next.size) + "-peer cluster"};
  }
  if (next.host_of.size() != n || (next.size > 1 && next.addresses.size() != n)) {
    return {Code::InvalidArgument, "a cluster of " + std::to_string(next.size) +
                                       " ranks needs an address and a host for each"};
  }
  // Per-rank state (links, rings, early arrivals, link counters) is sized for the
  // bootstrapped ranks; growing, shrinking and renumbering come with elastic membership.
  if (next.size != current_.size || next.rank != current_.rank) {
    return {Code::Unsupported, "a membership change keeps the ranks for now: rank " +
                                   std::to_string(current_.rank) + " of " +
                                   std::to_string(current_.size) + " cannot become rank " +
                                   std::to_string(next.rank) + " of " + std::to_string(next.size)};
  }
  Cluster before = std::move(current_);
  current_ = std::move(next);
  lost_.clear();
  publish();
  log().info("cluster version {} -> {}: rank {} of {}", before.version, current_.version,
             current_.rank, current_.size);
  for (ClusterListener* l : listeners_) l->cluster_changed(before, current_);
  return {};
}

void Membership::link_lost(int rank, const Status& why) {
  if (!lost_.insert(rank).second) return;
  if (loss_policy_) loss_policy_(rank, why);
}

}  // namespace taiji
