// Synchronisation modes and the rules for changing between them, shared by the policy
// engine and by the bindings that train under them. Pure functions: no I/O, no peer.
//
//   BSP    synchronous SGD: gradients allreduced every step
//   SMA    synchronous model averaging (KungFu SMA, CrossBow): models averaged every step
//   PAIR   asynchronous pair averaging (AD-PSGD; Sync-Switch's ASP): each step averages
//          with one random peer's latest saved model, fetched one-sidedly
//   LOCAL  local SGD: models averaged every H steps (constant H, or the QSR rule)
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace taiji {

enum class SyncMode : uint8_t { Bsp = 0, Sma = 1, Pair = 2, Local = 3 };
constexpr int kSyncModeCount = 4;

// "bsp", "sma", "pair", "local".
const char* sync_mode_name(SyncMode mode);
// The mode named by `text` (the names above; "asp" is taken for "pair"), or nothing.
std::optional<SyncMode> parse_sync_mode(const std::string& text);

// Whether a mode's replicas may differ between ranks (everything but BSP): entering BSP
// from one of them starts by averaging the replicas.
bool replicas_diverge(SyncMode mode);

// Linear learning-rate scaling (Goyal et al.; Sync-Switch found anything else diverges):
// the rate moves with the batch one update sees. BSP's update sees every rank's batch,
// the others' one rank's.
double lr_scale_for_switch(SyncMode from, SyncMode to, int size);

// QSR (Gu et al. 2023): the local-SGD period for learning rate `lr`,
// H = max(h_base, floor((alpha / lr)^2)). h_base >= 1.
uint64_t qsr_period(double lr, double alpha, uint64_t h_base);

// Momentum after a switch, as Sync-Switch found best: scaled by the same factor as the
// learning rate at the switch, then ramped linearly back to its configured value over
// `ramp_steps` steps. step: steps since the switch (0 at the switch).
double momentum_after_switch(double configured, double scale, uint64_t step, uint64_t ramp_steps);

}  // namespace taiji
