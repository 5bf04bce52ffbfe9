#include "adapt/policy.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "monitor/step_rules.h"

namespace taiji {

const std::vector<double>* StepView::input(const std::string& key) const {
  const auto& keys = table->input_keys;
  auto it = std::lower_bound(keys.begin(), keys.end(), key);
  if (it == keys.end() || *it != key) return nullptr;
  return &table->inputs[static_cast<size_t>(it - keys.begin())];
}

const char* action_kind_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::SetTopology: return "set_topology";
    case ActionKind::Resize: return "resize";
    case ActionKind::SetSyncMode: return "set_sync_mode";
    case ActionKind::AdviseBatch: return "advise_batch";
    case ActionKind::MeasureLinks: return "measure_links";
  }
  return "unknown";
}

double median_of_known(const std::vector<double>& values) {
  std::vector<double> known;
  for (double v : values) {
    if (v >= 0) known.push_back(v);
  }
  return median_of(std::move(known));
}

void Engine::add(std::unique_ptr<Policy> policy) { policies_.push_back(std::move(policy)); }

StepView Engine::derive(const StepTable& table) const {
  StepView v;
  v.table = &table;
  v.median_seconds = median_of_known(table.step_seconds);
  v.stragglers.assign(static_cast<size_t>(table.size), false);
  v.times_known = !table.step_seconds.empty();
  double slowest = 0;
  for (size_t r = 0; r < table.step_seconds.size(); ++r) {
    const double t = table.step_seconds[r];
    if (t < 0) {
      v.times_known = false;
      continue;
    }
    slowest = std::max(slowest, t);
    v.stragglers[r] = is_straggler(t, v.median_seconds, straggler_ratio);
  }
  double samples = 0;
  for (double s : table.samples) samples += std::max(s, 0.0);
  v.throughput = v.times_known && slowest > 0 ? samples / slowest : 0;
  v.total_samples = total_samples_ + static_cast<uint64_t>(std::llround(samples));
  return v;
}

Status Engine::step(const StepTable& table, std::vector<Action>* out) {
  out->clear();
  const StepView view = derive(table);
  std::array<bool, kActionKindCount> taken{};
  for (const auto& policy : policies_) {
    std::vector<Action> proposed;
    if (Status s = policy->on_step(view, &proposed); !s.is_ok()) {
      return {s.code(), "policy " + policy->name() + ": " + s.message()};
    }
    for (Action& a : proposed) {
      const auto k = static_cast<size_t>(a.kind);
      if (k >= taken.size() || taken[k]) continue;
      if (a.kind == ActionKind::SetSyncMode && a.mode == mode_) continue;
      if (a.kind == ActionKind::Resize && (a.size < 1 || a.size == table.size)) continue;
      if (a.kind == ActionKind::SetTopology && a.topology.empty()) continue;
      taken[k] = true;
      a.policy = policy->name();
      a.applied = false;
      if (a.kind == ActionKind::SetSyncMode) mode_ = a.mode;
      out->push_back(std::move(a));
    }
  }
  total_samples_ = view.total_samples;
  ++steps_;
  return {};
}

bool Engine::wants_requested_size(uint64_t step) const {
  for (const auto& p : policies_) {
    if (p->wants_requested_size(step)) return true;
  }
  return false;
}

void Engine::reset() {
  for (auto& p : policies_) p->reset();
}

}  // namespace taiji
