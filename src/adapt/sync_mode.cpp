#include "adapt/sync_mode.h"

#include <algorithm>
#include <cmath>

namespace taiji {

const char* sync_mode_name(SyncMode mode) {
  switch (mode) {
    case SyncMode::Bsp: return "bsp";
    case SyncMode::Sma: return "sma";
    case SyncMode::Pair: return "pair";
    case SyncMode::Local: return "local";
  }
  return "unknown";
}

std::optional<SyncMode> parse_sync_mode(const std::string& text) {
  if (text == "bsp") return SyncMode::Bsp;
  if (text == "sma") return SyncMode::Sma;
  if (text == "pair" || text == "asp") return SyncMode::Pair;
  if (text == "local") return SyncMode::Local;
  return std::nullopt;
}

bool replicas_diverge(SyncMode mode) { return mode != SyncMode::Bsp; }

std::optional<LrRule> parse_lr_rule(const std::string& text) {
  if (text == "average") return LrRule::Average;
  if (text == "linear") return LrRule::Linear;
  return std::nullopt;
}

const char* lr_rule_name(LrRule rule) { return rule == LrRule::Linear ? "linear" : "average"; }

double lr_scale_for_switch(SyncMode from, SyncMode to, int size, LrRule rule) {
  return rule == LrRule::Linear ? momentum_scale_for_switch(from, to, size) : 1.0;
}

double momentum_scale_for_switch(SyncMode from, SyncMode to, int size) {
  const bool from_global = from == SyncMode::Bsp;
  const bool to_global = to == SyncMode::Bsp;
  if (from_global == to_global || size < 1) return 1.0;
  return to_global ? static_cast<double>(size) : 1.0 / static_cast<double>(size);
}

uint64_t qsr_period(double lr, double alpha, uint64_t h_base) {
  h_base = std::max<uint64_t>(h_base, 1);
  if (!(lr > 0) || !(alpha > 0)) return h_base;
  const double h = std::floor((alpha / lr) * (alpha / lr));
  if (!(h < 1e12)) return UINT64_C(1000000000000);
  return std::max<uint64_t>(h_base, static_cast<uint64_t>(h));
}

double momentum_after_switch(double configured, double scale, uint64_t step, uint64_t ramp_steps) {
  const double start = std::clamp(configured * scale, 0.0, configured);
  if (ramp_steps == 0 || step >= ramp_steps) return configured;
  const double t = static_cast<double>(step) / static_cast<double>(ramp_steps);
  return start + (configured - start) * t;
}

}  // namespace taiji
