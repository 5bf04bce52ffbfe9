// One adaptation step on a peer: the collective that gathers every rank's record, the
// engine's evaluation on the gathered table, and the actions the runtime applies itself.
//
// The record is a fixed-width row of f64 per rank, allgathered under the reserved name
// "taiji.adapt"; every rank then holds the same table and runs the same policies on it,
// so every rank decides the same at the same step with no further agreement. The step
// also does what a step mark does: this rank's step time travels in the record and the
// gathered times go into the metrics.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "adapt/policy.h"
#include "common/status.h"

namespace taiji {

class Peer;

// At most this many custom inputs per step (they are part of the fixed-width record).
constexpr size_t kMaxAdaptInputs = 16;

struct AdaptRecordInputs {
  double samples = 0;
  bool have_grad_stats = false;
  double noise_scale = 0;
  double snr = 0;
  int requested_size = 0;                // read by rank 0 only; 0: none
  std::map<std::string, double> inputs;  // at most kMaxAdaptInputs
};

// Gathers, checks that every rank is at the same step with the same mode and the same
// input keys (Code::Mismatch on every rank otherwise, and the engine does not step),
// evaluates the engine, and applies a set_topology action (marking it applied). Blocks up
// to timeout_ms (0: the peer's default op timeout) for the gather and as long again for a
// topology change. *table (may be null) gets the gathered table.
Status adapt_step(Peer& peer, Engine& engine, const AdaptRecordInputs& in, int64_t timeout_ms,
                  StepTable* table, std::vector<Action>* actions);

}  // namespace taiji
