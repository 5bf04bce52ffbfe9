// A cluster: one membership of a job. Its version names it: it rises with every change of
// membership, travels in handshakes and frames, and a peer or a frame of another version
// is refused. Plain data, so that every layer can read it; runtime/membership.h owns the
// one instance and tells components when it changes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace taiji {

struct Cluster {
  uint32_t version = 1;
  int rank = 0;
  int size = 1;
  std::vector<std::string> addresses;  // by rank: "host:port" to dial (none for one rank)
  std::vector<int> host_of;            // by rank: host index, numbered by first appearance
};

// A component with state per membership (per-rank tables, limits, labels). It reads the
// current cluster where it needs it, never a copy, and is told when it changes.
class ClusterListener {
 public:
  // I/O thread: the membership is now `now` (its version above `before`'s). A change
  // keeps rank and size for now; once it may not, per-rank state follows it here, before
  // anything of the new version arrives.
  virtual void cluster_changed(const Cluster& before, const Cluster& now) = 0;

 protected:
  ~ClusterListener() = default;
};

}  // namespace taiji
