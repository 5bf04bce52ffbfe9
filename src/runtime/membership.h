// The membership: the one current Cluster of a peer, and the path every component follows
// when it changes. Components read the cluster through this object (the I/O thread reads
// current() in place; other threads read rank, size and version, or a snapshot), never a
// copy of their own, and those with per-membership state listen for changes.
//
// A change is fired on the I/O thread with a higher version: the cluster is replaced in
// place, so the transports, which read it where they stamp and check frames, refuse the
// old version from then on; then every listener is told in the order it registered (the
// host backend, op posting, the peer).
// Losing a link is an event of the membership too: the ops that need the lost rank fail
// (the engine's part), and the membership decides what the peer does next: a sticky
// PeerLost for the peer, until taiji_shrink continues on fewer ranks with a new Peer.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "common/cluster.h"
#include "common/status.h"

namespace taiji {

class Membership {
 public:
  // Before bootstrap has learnt the addresses; version 1 for a job's first members, higher
  // for a membership a resize or shrink made.
  Membership(int rank, int size, uint32_t version);

  // Any thread.
  int rank() const { return rank_.load(std::memory_order_relaxed); }
  int size() const { return size_.load(std::memory_order_relaxed); }
  uint32_t version() const { return version_.load(std::memory_order_relaxed); }
  std::shared_ptr<const Cluster> snapshot() const;

  // I/O thread, or before the loop runs: the current cluster, at a fixed address.
  const Cluster& current() const { return current_; }
  // Before the loop runs: the addresses and hosts bootstrap learnt (rank, size and
  // version stay).
  void set_addresses(std::vector<std::string> addresses, std::vector<int> host_of);
  // Before the loop runs. Listeners are told in this order and must outlive the peer's loop.
  void add_listener(ClusterListener* listener) { listeners_.push_back(listener); }
  // I/O thread: the membership-change path. InvalidArgument (nothing changes) unless the
  // version rises, rank is within size and addresses and hosts are given for every rank;
  // Unsupported for a change of rank or size (a resize or shrink makes a new Peer
  // instead: runtime/elastic.h).
  Status change(Cluster next);

  // What the peer does when a link is lost without a Bye; set before the loop runs.
  void set_loss_policy(std::function<void(int rank, const Status& why)> policy) {
    loss_policy_ = std::move(policy);
  }
  // I/O thread: the link to `rank` went down without a Bye.
  void link_lost(int rank, const Status& why);
  // I/O thread: ranks lost on this membership.
  const std::set<int>& lost() const { return lost_; }

  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

 private:
  void publish();

  Cluster current_;
  std::vector<ClusterListener*> listeners_;
  std::function<void(int, const Status&)> loss_policy_;
  std::set<int> lost_;
  std::atomic<int> rank_;
  std::atomic<int> size_;
  std::atomic<uint32_t> version_;
  mutable std::mutex snapshot_mu_;
  std::shared_ptr<const Cluster> snapshot_;  // under snapshot_mu_
};

}  // namespace taiji
