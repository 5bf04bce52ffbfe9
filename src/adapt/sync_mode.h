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
// the rate moves with the batch one update of the shared model sees. Which model that is
// decides the factor:
//   Average  the model is the ranks' average (every mode here): a rank's step of rate r
//            on its own batch moves the average by r / size, which is what BSP's rate r
//            on size batches gives per batch, so the local rate stays (factor 1). Dividing
//            it as well slows the average size times over: on the digits MLP with a slow
//            rank, pair averaging then needed 2.5x the samples to reach BSP's accuracy.
//   Linear   Sync-Switch's asynchronous SGD, where a parameter server applies each
//            worker's update to the one model: the update sees one rank's batch, so
//            leaving BSP divides the rate by size and entering it multiplies by size.
enum class LrRule : uint8_t { Average = 0, Linear = 1 };
// "average", "linear", or nothing.
std::optional<LrRule> parse_lr_rule(const std::string& text);
const char* lr_rule_name(LrRule rule);
double lr_scale_for_switch(SyncMode from, SyncMode to, int size, LrRule rule = LrRule::Average);

// The momentum's factor at a switch, for the scale-then-ramp policy: the linear factor
// whatever the learning-rate rule, since asynchrony itself acts as momentum (Mitliagkas
// et al. 2016) and Sync-Switch found scaling the explicit one down, then ramping it back,
// best (0.912 against 0.833).
double momentum_scale_for_switch(SyncMode from, SyncMode to, int size);

// QSR (Gu et al. 2023): the local-SGD period for learning rate `lr`,
// H = max(h_base, floor((alpha / lr)^2)). h_base >= 1.
uint64_t qsr_period(double lr, double alpha, uint64_t h_base);

// Momentum after a switch, as Sync-Switch found best: scaled by the same factor as the
// learning rate at the switch, then ramped linearly back to its configured value over
// `ramp_steps` steps. step: steps since the switch (0 at the switch).
double momentum_after_switch(double configured, double scale, uint64_t step, uint64_t ramp_steps);

}  // namespace taiji
