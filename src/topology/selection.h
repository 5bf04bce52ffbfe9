// Which built-in strategy an op uses. The default choice is a table (by message size),
// not code, and TAIJI_TOPOLOGY or the per-op option overrides it by name. Each strategy
// has a small id that travels in frames so peers can check they agree.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "topology/graph.h"

namespace taiji {

struct SelectionRule {
  uint64_t max_bytes;       // rule applies to messages up to this size
  std::string_view strategy;
};

// tree below 64 KiB (fewest hops), ring above (bandwidth-optimal).
const std::vector<SelectionRule>& default_selection();
std::string_view select_strategy(uint64_t bytes, const std::vector<SelectionRule>& rules);

// 0 for an unknown name.
uint8_t strategy_id(std::string_view name);

// The built-in strategies for one world size, built once; read-only afterwards, so
// any thread may use it.
class StrategyCache {
 public:
  explicit StrategyCache(int size);
  // The strategy with that id (from strategy_id); nullptr for an unknown id.
  std::shared_ptr<const Strategy> get(uint8_t id) const;

 private:
  std::vector<std::shared_ptr<const Strategy>> built_;
};

}  // namespace taiji
