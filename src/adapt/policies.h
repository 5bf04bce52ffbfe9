// The built-in policies, made from a spec string "name key=value key=value ...".
// docs/adaptive.md describes each one, its parameters and the findings it follows.
//
//   sync_switch_offline fraction=F total_samples=N
//   sync_switch_online k=1.5 m=5
//   adaptive_topology threshold=0.8 window=10 candidates=slow_leaf/ring input=KEY
//   batch_advice interval=1 tolerance=0.25 min_scale=0.25 max_scale=16
//   elastic schedule=STEP:SIZE,STEP:SIZE poll=1
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "adapt/policy.h"
#include "common/status.h"

namespace taiji {

// A built-in policy from its spec. Errors are InvalidArgument naming the fault: an
// unknown policy (with the known names), an unknown parameter (with the known ones), a
// value that does not parse or is out of range.
Result<std::unique_ptr<Policy>> make_policy(const std::string& spec);

// The names make_policy knows.
const std::vector<std::string>& policy_names();

// A binary tree (one pair, reduce and broadcast over the same tree) over `order`: order[0]
// is the root and order[i]'s parent is order[(i - 1) / 2], so the last ranks of the order
// are leaves. In the explicit text form of topology/text.h.
std::string tree_text(const std::vector<int>& order);

// Sync-Switch's search, for a job that recurs, for the smallest fraction of the training
// (in samples) to run under BSP before switching to ASP that still reaches BSP's accuracy.
// Each run of the job reports (fraction, final accuracy); a fraction is good when its
// accuracy is at least bsp_accuracy - tolerance. The search keeps the interval between the
// largest bad fraction below the smallest good one (0 and 1, BSP itself, to start with)
// and halves it; it is done when the interval is no wider than `resolution`, and the
// answer is then the smallest good fraction.
struct FractionSearch {
  bool done = false;
  double fraction = 1;  // the next to try, or the answer when done
};
FractionSearch find_bsp_fraction(const std::vector<double>& fractions,
                                 const std::vector<double>& accuracies, double bsp_accuracy,
                                 double tolerance, double resolution);

}  // namespace taiji
