#include "monitor/step_rules.h"

#include <algorithm>

namespace taiji {

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

bool is_straggler(double seconds, double median, double ratio) {
  return seconds > ratio * median && seconds - median > kStragglerMinExcessSeconds;
}

}  // namespace taiji
