// measured_topology: re-optimising the topology from the measured network while training
// runs (docs/adaptive.md). The policy decides when to measure, from the gathered tables
// alone; the runtime measures, computes the best strategy (topology/link_optimizer.h) and
// swaps when the predicted gain is large enough.
#pragma once

#include <memory>

#include "adapt/policy.h"
#include "adapt/policy_params.h"
#include "common/status.h"

namespace taiji {

//   measured_topology first=0 every=0 threshold=0.8 window=5 gain=1.1 bytes=16777216
// first: the step of the first measurement (-1: none); every: measure again after this
// many steps (0: never on a schedule); threshold, window: measure again when the
// cluster's throughput stays below threshold x its mean over the window steps after the
// last measurement for two steps running; gain: swap only when the topology in force is
// predicted at least this much slower than the best; bytes: the allreduce size to
// optimise for.
Result<std::unique_ptr<Policy>> make_measured_topology(Params& p);

}  // namespace taiji
