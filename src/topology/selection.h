// Which strategy an op uses. The default choice is a table (by message size), not code;
// TAIJI_TOPOLOGY, a swap at run time, or the per-op option override it. Each strategy has
// a one-byte id that travels in frames so peers can check they agree; it is folded from
// the graphs' digest, so equal graphs agree however they were named or built.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "topology/graph.h"

namespace taiji {

struct SelectionRule {
  uint64_t max_bytes;       // rule applies to messages up to this size
  int max_peers;            // and to worlds up to this size
  std::string_view strategy;
};

// clique up to 1 KiB on 2 peers (one hop: allreduce and barrier run as a direct
// exchange there), tree up to 64 KiB (fewest hops), ring above (bandwidth-optimal).
const std::vector<SelectionRule>& default_selection();
std::string_view select_strategy(uint64_t bytes, int peers, const std::vector<SelectionRule>& rules);

// A built-in's position in strategy_names() + 1 (what StrategyCache::get takes); 0 for a
// name that is not a built-in.
uint8_t strategy_id(std::string_view name);
// What frames carry of a digest: 24 bits, so peers on different graphs almost surely
// see a mismatch (the swap itself compares whole digests). The id is never 0.
uint8_t wire_id(uint64_t digest);
uint16_t wire_tag(uint64_t digest);

// A strategy ready for ops: the graphs, their digest and their wire id.
struct BoundStrategy {
  std::shared_ptr<const Strategy> strategy;
  uint64_t digest = 0;
  uint8_t id = 0;     // frame strategy byte: wire_id(digest)
  uint16_t tag = 0;   // frame strategy_tag: wire_tag(digest)
};
BoundStrategy bind_custom(Strategy s);

// The built-in strategies for one cluster (world size and host map), each built on first
// use and read-only afterwards; any thread may call get. Built lazily because each is
// n^2 parents: all of them at n = 1024 took 395 MB and 2.3 s at start-up, mostly for
// strategies a job never uses.
class StrategyCache {
 public:
  StrategyCache(int size, std::vector<int> host_of);
  // The built-in with that id (from strategy_id); an empty result for an unknown id.
  BoundStrategy get(uint8_t id) const;

 private:
  struct Slot {
    std::once_flag once;
    BoundStrategy built;
  };
  int size_;
  std::vector<int> host_of_;
  std::unique_ptr<Slot[]> slots_;  // one per strategy_names() entry
};

}  // namespace taiji
