#include "topology/selection.h"

#include "topology/strategies.h"
#include "topology/text.h"

namespace taiji {

const std::vector<SelectionRule>& default_selection() {
  static const std::vector<SelectionRule> rules = {
      // Two peers: a clique runs small allreduces and barriers as a direct exchange
      // (collectives/collective_op.h), one hop and the same two messages as a tree's two
      // hops. With more peers it sends n(n-1) messages against a tree's 2(n-1), which
      // measured slower at n = 3-4 on a host with fewer cores than peers.
      {1024, 2, "clique"},
      {64 << 10, INT32_MAX, "tree"},
      {UINT64_MAX, INT32_MAX, "ring"},
  };
  return rules;
}

std::string_view select_strategy(uint64_t bytes, int peers, const std::vector<SelectionRule>& rules) {
  for (const auto& rule : rules) {
    if (bytes <= rule.max_bytes && peers <= rule.max_peers) return rule.strategy;
  }
  return rules.empty() ? "ring" : rules.back().strategy;
}

uint8_t strategy_id(std::string_view name) {
  const auto& names = strategy_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<uint8_t>(i + 1);
  }
  return 0;
}

uint8_t wire_id(uint64_t digest) {
  uint8_t id = 0;
  for (int shift = 0; shift < 64; shift += 8) id ^= static_cast<uint8_t>(digest >> shift);
  return id == 0 ? 1 : id;
}

uint16_t wire_tag(uint64_t digest) { return static_cast<uint16_t>((digest >> 16) ^ (digest >> 48)); }

BoundStrategy bind_custom(Strategy s) {
  BoundStrategy b;
  b.digest = topology_digest(s);
  b.id = wire_id(b.digest);
  b.tag = wire_tag(b.digest);
  b.strategy = std::make_shared<const Strategy>(std::move(s));
  return b;
}

StrategyCache::StrategyCache(int size, std::vector<int> host_of)
    : size_(size), host_of_(std::move(host_of)), slots_(new Slot[strategy_names().size()]) {}

BoundStrategy StrategyCache::get(uint8_t id) const {
  const auto& names = strategy_names();
  if (id == 0 || id > names.size()) return {};
  Slot& slot = slots_[id - 1];
  // A build that throws (out of memory) leaves the slot unbuilt for the next call.
  std::call_once(slot.once, [&] {
    auto made = make_strategy(names[id - 1], size_, host_of_);
    if (!made.is_ok()) return;  // not defined for this cluster: stays empty
    BoundStrategy b;
    b.digest = topology_digest(made.value());
    b.id = wire_id(b.digest);
    b.tag = wire_tag(b.digest);
    b.strategy = std::make_shared<const Strategy>(std::move(made.value()));
    slot.built = std::move(b);
  });
  return slot.built;
}

}  // namespace taiji
