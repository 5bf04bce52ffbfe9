// The step-time rules shared by the metrics' straggler flags (taiji_step_mark) and the
// adaptation policies (src/adapt/), so that both call the same rank a straggler.
#pragma once

#include <vector>

namespace taiji {

// Below this a step's excess over the median is noise, whatever the ratio.
inline constexpr double kStragglerMinExcessSeconds = 1e-3;

// The median of `values`; 0 when there is none.
double median_of(std::vector<double> values);

// A step of `seconds` straggles when it took more than `ratio` times the median and at
// least kStragglerMinExcessSeconds more.
bool is_straggler(double seconds, double median, double ratio);

}  // namespace taiji
