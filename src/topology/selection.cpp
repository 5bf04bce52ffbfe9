#include "topology/selection.h"

#include <array>

namespace taiji {

namespace {
constexpr std::array<std::string_view, 3> kNames = {"ring", "tree", "star"};
}

const std::vector<SelectionRule>& default_selection() {
  static const std::vector<SelectionRule> rules = {
      {64 << 10, "tree"},
      {UINT64_MAX, "ring"},
  };
  return rules;
}

std::string_view select_strategy(uint64_t bytes, const std::vector<SelectionRule>& rules) {
  for (const auto& rule : rules) {
    if (bytes <= rule.max_bytes) return rule.strategy;
  }
  return rules.empty() ? "ring" : rules.back().strategy;
}

uint8_t strategy_id(std::string_view name) {
  for (size_t i = 0; i < kNames.size(); ++i) {
    if (kNames[i] == name) return static_cast<uint8_t>(i + 1);
  }
  return 0;
}

StrategyCache::StrategyCache(int size) {
  for (auto name : kNames) {
    auto made = make_strategy(name, size);
    built_.push_back(made.is_ok() ? std::make_shared<const Strategy>(std::move(made.value()))
                                  : nullptr);
  }
}

std::shared_ptr<const Strategy> StrategyCache::get(uint8_t id) const {
  if (id == 0 || id > built_.size()) return nullptr;
  return built_[id - 1];
}

}  // namespace taiji
