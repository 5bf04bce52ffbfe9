#include "adapt/link_policy.h"

#include <cmath>
#include <sstream>
#include <string>

namespace taiji {

namespace {

// The step that follows a measurement pays for it (probes, a swap) and is not a reference.
constexpr int kStepsSkippedAfterMeasuring = 1;
// Steps in a row below the threshold before the cluster counts as slowed: one slow step is
// often a hiccup (a checkpoint, a collection) rather than the network.
constexpr int kSlowStepsToAct = 2;

class MeasuredTopology final : public Policy {
 public:
  MeasuredTopology(int64_t first, uint64_t every, double threshold, uint64_t window, double gain, uint64_t bytes)
      : first_(first), every_(every), threshold_(threshold), window_(window), gain_(gain), bytes_(bytes) {}

  std::string name() const override { return "measured_topology"; }

  Status on_step(const StepView& v, std::vector<Action>* actions) override {
    const uint64_t step = v.table->step;
    std::string why;
    if (!measured_ && first_ >= 0 && step >= static_cast<uint64_t>(first_)) {
      why = "first measurement (step " + std::to_string(step) + ")";
    } else if (measured_ && every_ > 0 && step >= last_ + every_) {
      why = "scheduled: " + std::to_string(step - last_) + " steps since the last measurement";
    } else if (measured_) {
      why = slowed(v);
    }
    if (why.empty()) return {};
    Action a;
    a.kind = ActionKind::MeasureLinks;
    a.min_gain = gain_;
    a.bytes = bytes_;
    a.reason = why;
    actions->push_back(std::move(a));
    measured_ = true;
    restart(step);
    return {};
  }

  void reset() override {
    // A new membership: measure it at once when the first measurement was wanted.
    measured_ = false;
    restart(0);
  }

 private:
  // Empty while the throughput holds; else why the network is to be measured again.
  std::string slowed(const StepView& v) {
    if (skip_ > 0 || v.throughput <= 0) {
      if (skip_ > 0) --skip_;
      return {};
    }
    if (seen_ < window_) {
      sum_ += v.throughput;
      if (++seen_ == window_) reference_ = sum_ / static_cast<double>(window_);
      return {};
    }
    slow_ = v.throughput < threshold_ * reference_ ? slow_ + 1 : 0;
    if (slow_ < kSlowStepsToAct) return {};
    std::ostringstream why;
    why << "throughput " << v.throughput << " samples/s, below " << threshold_ << " x the reference "
        << reference_ << " for " << slow_ << " steps";
    return why.str();
  }

  void restart(uint64_t step) {
    last_ = step;
    skip_ = kStepsSkippedAfterMeasuring;
    seen_ = 0;
    sum_ = 0;
    reference_ = 0;
    slow_ = 0;
  }

  const int64_t first_;
  const uint64_t every_;
  const double threshold_;
  const uint64_t window_;
  const double gain_;
  const uint64_t bytes_;
  bool measured_ = false;
  uint64_t last_ = 0;
  int skip_ = 0;
  uint64_t seen_ = 0;
  double sum_ = 0;
  double reference_ = 0;
  int slow_ = 0;
};

}  // namespace

Result<std::unique_ptr<Policy>> make_measured_topology(Params& p) {
  double first = 0, threshold = 0.8, gain = 1.1;
  uint64_t every = 0, window = 5, bytes = uint64_t{16} << 20;
  if (Status s = p.number("first", -1, 1e12, &first); !s.is_ok()) return s;
  if (first != std::floor(first)) return p.bad("first", "must be a whole number");
  if (Status s = p.integer("every", 0, 1000000000, &every); !s.is_ok()) return s;
  if (Status s = p.number("threshold", 0, 1, &threshold); !s.is_ok()) return s;
  if (Status s = p.integer("window", 1, 1000000, &window); !s.is_ok()) return s;
  if (Status s = p.number("gain", 1, 1e6, &gain); !s.is_ok()) return s;
  if (Status s = p.integer("bytes", 1, uint64_t{1} << 40, &bytes); !s.is_ok()) return s;
  return std::unique_ptr<Policy>(
      new MeasuredTopology(static_cast<int64_t>(first), every, threshold, window, gain, bytes));
}

}  // namespace taiji
