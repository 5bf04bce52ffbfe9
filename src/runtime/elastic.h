// Elastic membership: a job resized in place (taiji_resize) or continued without lost
// ranks (taiji_shrink). Each change makes a new Peer for the new membership, with the next
// cluster version, rendezvoused under that version's keys (runtime/elastic_keys.h), and
// retires the old one: its ops finish or fail, its links close, the store it served moves
// over. A new Peer counts automatic op versions afresh, which is what survivors and
// joiners need to agree on them. docs/elastic.md has the protocol.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "bootstrap/store.h"
#include "common/status.h"
#include "runtime/peer.h"

namespace taiji {

struct ResizeOutcome {
  bool changed = false;
  bool detached = false;  // this rank is not in the new membership: it must finalize
};

// What a process keeps across its memberships, beside the current Peer. One per process's
// peer handle; its calls must not run concurrently with each other or with other calls on
// the peer (they replace it).
class Elastic {
 public:
  explicit Elastic(uint32_t joined_version) : joined_version_(joined_version) {}

  uint32_t joined_version() const { return joined_version_; }

  // A collective of the current members, all proposing new_size (else Mismatch everywhere,
  // nothing changes). On success *peer is the new membership's peer (or, for a detached
  // rank, the old one, finalized). timeout_ms 0: the peer's init timeout.
  Result<ResizeOutcome> resize(std::unique_ptr<Peer>* peer, int new_size, int64_t timeout_ms);
  // The survivors of lost ranks agree through the store and continue as a new membership;
  // true when the membership changed. With nobody lost, a peer a failed resize left
  // unusable starts again with the same members. timeout_ms 0: the peer's init timeout.
  Result<bool> shrink(std::unique_ptr<Peer>* peer, int64_t timeout_ms);
  // The pending request's size, 0 when none or the store does not answer (in a second).
  int requested_size(const Peer& peer);

 private:
  // Runs fn over the store client, opening (or, once after a lost connection, reopening) it.
  template <typename Fn>
  auto with_store(const Config& config, int64_t timeout_ms, Fn&& fn) -> decltype(fn(std::declval<Store&>()));
  // Retires *peer (already finalized or aborted) and starts the next membership's peer.
  Status replace(std::unique_ptr<Peer>* peer, int rank, int size, uint32_t version, int64_t timeout_ms);
  // Tells the launchers "<version> <size>"; a launcher may be watching, so a failure is
  // logged and the change goes on (a grow then waits for its joiners until the deadline).
  void announce(const Config& config, uint32_t version, int size, int64_t timeout_ms);

  const uint32_t joined_version_;
  std::mutex store_mu_;
  std::unique_ptr<Store> store_;  // under store_mu_
  // Shrink rounds already run at the current membership (a failed round is not reused).
  uint32_t shrink_round_ = 0;
  uint32_t shrink_version_ = 0;   // the membership shrink_round_ counts for
  // The highest version a change started a peer for, failed ones included: their keys in
  // the store may hold addresses, so no later change reuses them.
  uint32_t tried_version_ = 0;
};

}  // namespace taiji
