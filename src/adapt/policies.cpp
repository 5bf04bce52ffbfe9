// The built-in policies. Each is small and keeps only what it needs of the tables it has
// seen; every decision is a function of the gathered tables alone, so that every rank
// decides the same.
#include "adapt/policies.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <sstream>

#include "adapt/link_policy.h"
#include "adapt/policy_params.h"
#include "monitor/step_rules.h"

namespace taiji {

namespace {

std::string fmt(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// ---- sync_switch_offline -------------------------------------------------------------
// Sync-Switch's offline policy: BSP first (it reaches good accuracy), then ASP (it is
// faster) once `fraction` of the training samples are done; the learning rate follows the
// linear scaling rule (lr_rule: sync_mode.h). The switch fires on the step that crosses the threshold, so it
// needs no state and a later reset does not repeat it.
class SyncSwitchOffline final : public Policy {
 public:
  SyncSwitchOffline(double fraction, double total, LrRule rule) : fraction_(fraction), total_(total), rule_(rule) {}
  std::string name() const override { return "sync_switch_offline"; }
  Status on_step(const StepView& v, std::vector<Action>* actions) override {
    const double threshold = fraction_ * total_;
    double step_samples = 0;
    for (double s : v.table->samples) step_samples += std::max(s, 0.0);
    const double before = static_cast<double>(v.total_samples) - step_samples;
    if (v.table->sync_mode != SyncMode::Bsp || before >= threshold ||
        static_cast<double>(v.total_samples) < threshold) {
      return {};
    }
    Action a;
    a.kind = ActionKind::SetSyncMode;
    a.mode = SyncMode::Pair;
    a.lr_scale = lr_scale_for_switch(SyncMode::Bsp, SyncMode::Pair, v.table->size, rule_);
    a.reason = std::to_string(v.total_samples) + " of " + fmt(total_) + " samples done (fraction " +
               fmt(fraction_) + ")";
    actions->push_back(std::move(a));
    return {};
  }

 private:
  double fraction_;
  double total_;
  LrRule rule_;
};

// ---- sync_switch_online --------------------------------------------------------------
// Sync-Switch's online policy for stragglers: BSP waits for the slowest rank every step,
// ASP does not. A rank slower than k x median for m steps in a row moves the cluster to
// pair averaging; m steps in a row without any straggler move it back to BSP.
// Each rank's time for the median rank's sample count: step seconds / samples x the median
// samples. A rank that reports no samples keeps its raw step time.
std::vector<double> step_equivalents(const StepTable& t) {
  const double typical = median_of_known(t.samples);
  std::vector<double> out(t.step_seconds);
  for (size_t r = 0; r < out.size() && r < t.samples.size(); ++r) {
    if (t.samples[r] > 0 && typical > 0 && out[r] >= 0) out[r] = out[r] / t.samples[r] * typical;
  }
  return out;
}

class SyncSwitchOnline final : public Policy {
 public:
  SyncSwitchOnline(double k, uint64_t m, LrRule rule) : k_(k), m_(m), rule_(rule) {}
  std::string name() const override { return "sync_switch_online"; }
  Status on_step(const StepView& v, std::vector<Action>* actions) override {
    const StepTable& t = *v.table;
    if (!v.times_known) return {};
    slow_.resize(static_cast<size_t>(t.size), 0);
    // Judged per sample: in an asynchronous mode a check spans however many local steps a
    // rank took since the last one, so a fast rank's interval holds more samples. With
    // every rank's samples equal (a synchronous step) this is the step time itself.
    const std::vector<double> per_step = step_equivalents(t);
    const double median = median_of_known(per_step);
    int worst = -1;
    bool any = false;
    for (size_t r = 0; r < slow_.size(); ++r) {
      const double s = per_step[r];
      const bool slow = is_straggler(s, median, k_);
      slow_[r] = slow ? slow_[r] + 1 : 0;
      any = any || slow;
      if (slow_[r] >= m_ && worst < 0) worst = static_cast<int>(r);
    }
    calm_ = any ? 0 : calm_ + 1;
    Action a;
    a.kind = ActionKind::SetSyncMode;
    if (t.sync_mode == SyncMode::Bsp && worst >= 0) {
      a.mode = SyncMode::Pair;
      a.reason = "rank " + std::to_string(worst) + " slower than " + fmt(k_) + "x the median for " +
                 std::to_string(slow_[static_cast<size_t>(worst)]) + " steps";
    } else if (t.sync_mode == SyncMode::Pair && calm_ >= m_) {
      a.mode = SyncMode::Bsp;
      a.reason = "no straggler for " + std::to_string(calm_) + " steps";
    } else {
      return {};
    }
    a.lr_scale = lr_scale_for_switch(t.sync_mode, a.mode, t.size, rule_);
    actions->push_back(std::move(a));
    reset();
    return {};
  }
  void reset() override {
    slow_.clear();
    calm_ = 0;
  }

 private:
  double k_;
  uint64_t m_;
  LrRule rule_;
  std::vector<uint64_t> slow_;  // per rank, consecutive slow steps
  uint64_t calm_ = 0;           // consecutive steps without a straggler
};

// ---- adaptive_topology ---------------------------------------------------------------
// KungFu's adaptive strategies: after each (re)start, the mean of each rank's throughput
// over `window` steps is its reference; afterwards a rank votes when its throughput falls
// below threshold x its reference, and a majority of votes moves the cluster to the next
// candidate topology, whose reference is then measured afresh. "slow_leaf" is a binary
// tree with the rank that fell furthest at a leaf, so it relays nobody's data.
class AdaptiveTopology final : public Policy {
 public:
  AdaptiveTopology(double threshold, uint64_t window, std::vector<std::string> candidates, std::string input)
      : threshold_(threshold), window_(window), candidates_(std::move(candidates)), input_(std::move(input)) {}
  std::string name() const override { return "adaptive_topology"; }
  Status on_step(const StepView& v, std::vector<Action>* actions) override {
    const StepTable& t = *v.table;
    if (t.size < 2 || (input_.empty() && !v.times_known)) return {};
    // A rank's own throughput: samples per second of its step (KungFu times its allreduces
    // the same way), or the framework's figure under input=KEY.
    std::vector<double> own(static_cast<size_t>(t.size), 0);
    for (size_t r = 0; r < own.size(); ++r) {
      if (t.step_seconds[r] > 0) own[r] = t.samples[r] / t.step_seconds[r];
    }
    const std::vector<double>* view = &own;
    if (!input_.empty()) {
      view = v.input(input_);
      if (view == nullptr) return {};
    }
    if (sum_.size() != static_cast<size_t>(t.size)) reset();
    sum_.resize(static_cast<size_t>(t.size), 0);
    link_sum_.resize(static_cast<size_t>(t.size), 0);
    if (measured_ < window_) {
      for (size_t r = 0; r < sum_.size(); ++r) {
        sum_[r] += (*view)[r];
        link_sum_[r] += t.link_bytes_per_second[r];
      }
      ++measured_;
      return {};
    }
    int votes = 0;
    for (size_t r = 0; r < sum_.size(); ++r) {
      const double reference = sum_[r] / static_cast<double>(window_);
      if (reference > 0 && (*view)[r] / reference < threshold_) ++votes;
    }
    // The framework's own figure names the slowest rank. Step times do not: under a
    // synchronous strategy every rank's step slows alike, so the rank to move is then the
    // one whose links' send rate fell furthest.
    int slowest = input_.empty() ? slowest_by(link_sum_, t.link_bytes_per_second) : -1;
    if (slowest < 0) slowest = slowest_by(sum_, *view);
    if (slowest < 0) slowest = t.size - 1;
    if (2 * votes <= t.size) return {};
    const std::string& next = candidates_[next_ % candidates_.size()];
    ++next_;
    Action a;
    a.kind = ActionKind::SetTopology;
    if (next == "slow_leaf") {
      std::vector<int> order;
      for (int r = 0; r < t.size; ++r) {
        if (r != slowest) order.push_back(r);
      }
      order.push_back(slowest);
      a.topology = tree_text(order);
    } else {
      a.topology = next;
    }
    a.reason = std::to_string(votes) + " of " + std::to_string(t.size) + " ranks below " + fmt(threshold_) +
               "x their reference throughput; slowest rank " + std::to_string(slowest) + " -> " + next;
    actions->push_back(std::move(a));
    reset();
    return {};
  }
  void reset() override {
    sum_.clear();
    link_sum_.clear();
    measured_ = 0;
  }

 private:
  // The rank whose value fell furthest below its reference (sums over the window); -1
  // when no rank has a reference.
  int slowest_by(const std::vector<double>& sums, const std::vector<double>& now) const {
    int slowest = -1;
    double lowest = 0;
    for (size_t r = 0; r < sums.size(); ++r) {
      const double reference = sums[r] / static_cast<double>(window_);
      if (!(reference > 0)) continue;
      const double ratio = now[r] / reference;
      if (slowest < 0 || ratio < lowest) {
        slowest = static_cast<int>(r);
        lowest = ratio;
      }
    }
    return slowest;
  }

  double threshold_;
  uint64_t window_;
  std::vector<std::string> candidates_;
  std::string input_;
  std::vector<double> sum_;       // per rank, over the reference window
  std::vector<double> link_sum_;  // per rank, its links' mean send rate over the window
  uint64_t measured_ = 0;
  size_t next_ = 0;          // kept across resets: candidates are tried in turn
};

// ---- batch_advice ---------------------------------------------------------------------
// The gradient noise scale B (McCandlish et al.) is the batch beyond which a larger batch
// stops paying for itself, so the advice is the cluster batch B (KungFu's adaptive batch).
// The learning rate follows AdaScale's gain for that scale S, as adaptdl computes it:
// r = (B/b + 1) / (B/(S b) + 1), b the current cluster batch.
class BatchAdvice final : public Policy {
 public:
  BatchAdvice(uint64_t interval, double tolerance, double min_scale, double max_scale)
      : interval_(interval), tolerance_(tolerance), min_scale_(min_scale), max_scale_(max_scale) {}
  std::string name() const override { return "batch_advice"; }
  Status on_step(const StepView& v, std::vector<Action>* actions) override {
    const StepTable& t = *v.table;
    if (t.step % interval_ != 0 || !(t.noise_scale > 0)) return {};
    double batch = 0;
    for (double s : t.samples) batch += std::max(s, 0.0);
    if (!(batch > 0)) return {};
    const double scale = std::clamp(t.noise_scale / batch, min_scale_, max_scale_);
    if (std::fabs(scale - 1) <= tolerance_) return {};
    const double ratio = t.noise_scale / batch;
    Action a;
    a.kind = ActionKind::AdviseBatch;
    a.batch_scale = scale;
    a.lr_scale = (ratio + 1) / (ratio / scale + 1);
    a.reason = "noise scale " + fmt(t.noise_scale) + " vs cluster batch " + fmt(batch);
    actions->push_back(std::move(a));
    return {};
  }

 private:
  uint64_t interval_;
  double tolerance_;
  double min_scale_;
  double max_scale_;
};

// ---- elastic ---------------------------------------------------------------------------
// Resizes when a size was requested from outside (taiji-run, the store) that differs from
// the current one, or when a scheduled step comes; the request wins over the schedule. The
// request is read every `poll` steps (poll=0: never), since each read costs rank 0 a
// store round trip.
class ElasticPolicy final : public Policy {
 public:
  ElasticPolicy(std::vector<std::pair<uint64_t, int>> schedule, uint64_t poll)
      : schedule_(std::move(schedule)), poll_(poll) {}
  std::string name() const override { return "elastic"; }
  bool wants_requested_size(uint64_t step) const override { return poll_ > 0 && step % poll_ == 0; }
  Status on_step(const StepView& v, std::vector<Action>* actions) override {
    const StepTable& t = *v.table;
    Action a;
    a.kind = ActionKind::Resize;
    if (wants_requested_size(t.step) && t.requested_size > 0 && t.requested_size != t.size) {
      a.size = t.requested_size;
      a.reason = "size " + std::to_string(a.size) + " requested";
    } else {
      for (const auto& [step, size] : schedule_) {
        if (step == t.step && size != t.size) {
          a.size = size;
          a.reason = "scheduled at step " + std::to_string(step);
        }
      }
      if (a.size == 0) return {};
    }
    actions->push_back(std::move(a));
    return {};
  }

 private:
  std::vector<std::pair<uint64_t, int>> schedule_;
  uint64_t poll_;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

using Maker = Result<std::unique_ptr<Policy>> (*)(Params&);

// lr_rule=average|linear (sync_mode.h), average when not given.
Status lr_rule_param(Params& p, LrRule* rule) {
  std::string text = "average";
  if (Status s = p.text("lr_rule", &text); !s.is_ok()) return s;
  auto parsed = parse_lr_rule(text);
  if (!parsed) return p.bad("lr_rule", "must be average or linear, got '" + text + "'");
  *rule = *parsed;
  return {};
}

Result<std::unique_ptr<Policy>> make_offline(Params& p) {
  double fraction = -1, total = -1;
  if (Status s = p.number("fraction", 0, 1, &fraction); !s.is_ok()) return s;
  if (Status s = p.number("total_samples", 1, 1e18, &total); !s.is_ok()) return s;
  LrRule rule = LrRule::Average;
  if (Status s = lr_rule_param(p, &rule); !s.is_ok()) return s;
  if (!p.has("fraction") || !p.has("total_samples")) {
    return Status{Code::InvalidArgument, "sync_switch_offline: fraction and total_samples are required"};
  }
  return std::unique_ptr<Policy>(new SyncSwitchOffline(fraction, total, rule));
}

Result<std::unique_ptr<Policy>> make_online(Params& p) {
  double k = 1.5;
  uint64_t m = 5;
  if (Status s = p.number("k", 1, 1e6, &k); !s.is_ok()) return s;
  if (Status s = p.integer("m", 1, 1000000, &m); !s.is_ok()) return s;
  LrRule rule = LrRule::Average;
  if (Status s = lr_rule_param(p, &rule); !s.is_ok()) return s;
  return std::unique_ptr<Policy>(new SyncSwitchOnline(k, m, rule));
}

Result<std::unique_ptr<Policy>> make_topology(Params& p) {
  double threshold = 0.8;
  uint64_t window = 10;
  std::string candidates = "slow_leaf/ring", input;
  if (Status s = p.number("threshold", 0, 1, &threshold); !s.is_ok()) return s;
  if (Status s = p.integer("window", 1, 1000000, &window); !s.is_ok()) return s;
  if (Status s = p.text("candidates", &candidates); !s.is_ok()) return s;
  if (Status s = p.text("input", &input); !s.is_ok()) return s;
  std::vector<std::string> list = split(candidates, '/');
  for (const auto& c : list) {
    if (c.empty()) return p.bad("candidates", "has an empty name (names are separated by '/')");
  }
  return std::unique_ptr<Policy>(new AdaptiveTopology(threshold, window, std::move(list), input));
}

Result<std::unique_ptr<Policy>> make_batch(Params& p) {
  uint64_t interval = 1;
  double tolerance = 0.25, min_scale = 0.25, max_scale = 16;
  if (Status s = p.integer("interval", 1, 1000000000, &interval); !s.is_ok()) return s;
  if (Status s = p.number("tolerance", 0, 1e6, &tolerance); !s.is_ok()) return s;
  if (Status s = p.number("min_scale", 1e-6, 1, &min_scale); !s.is_ok()) return s;
  if (Status s = p.number("max_scale", 1, 1e6, &max_scale); !s.is_ok()) return s;
  return std::unique_ptr<Policy>(new BatchAdvice(interval, tolerance, min_scale, max_scale));
}

Result<std::unique_ptr<Policy>> make_elastic(Params& p) {
  std::string text;
  uint64_t poll = 1;
  if (Status s = p.text("schedule", &text); !s.is_ok()) return s;
  if (Status s = p.integer("poll", 0, 1000000000, &poll); !s.is_ok()) return s;
  std::vector<std::pair<uint64_t, int>> schedule;
  if (!text.empty()) {
    for (const std::string& item : split(text, ',')) {
      const size_t colon = item.find(':');
      uint64_t step = 0;
      int size = 0;
      const char* b = item.data();
      const char* e = b + item.size();
      bool ok = colon != std::string::npos;
      if (ok) {
        auto r1 = std::from_chars(b, b + colon, step);
        auto r2 = std::from_chars(b + colon + 1, e, size);
        ok = r1.ec == std::errc() && r1.ptr == b + colon && r2.ec == std::errc() && r2.ptr == e && size >= 1;
      }
      if (!ok) return p.bad("schedule", "item '" + item + "' is not STEP:SIZE with SIZE >= 1");
      schedule.emplace_back(step, size);
    }
  }
  return std::unique_ptr<Policy>(new ElasticPolicy(std::move(schedule), poll));
}

const std::vector<std::pair<std::string, Maker>>& makers() {
  static const std::vector<std::pair<std::string, Maker>> table = {
      {"sync_switch_offline", make_offline}, {"sync_switch_online", make_online},
      {"adaptive_topology", make_topology},  {"batch_advice", make_batch},
      {"elastic", make_elastic},           {"measured_topology", make_measured_topology},
  };
  return table;
}

}  // namespace

const std::vector<std::string>& policy_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& [name, maker] : makers()) out.push_back(name);
    return out;
  }();
  return names;
}

Result<std::unique_ptr<Policy>> make_policy(const std::string& spec) {
  std::istringstream in(spec);
  std::string name, word;
  in >> name;
  std::map<std::string, std::string> values;
  while (in >> word) {
    const size_t eq = word.find('=');
    if (eq == std::string::npos || eq == 0) {
      return Status{Code::InvalidArgument, name + ": '" + word + "' is not key=value"};
    }
    if (!values.emplace(word.substr(0, eq), word.substr(eq + 1)).second) {
      return Status{Code::InvalidArgument, name + ": " + word.substr(0, eq) + " given twice"};
    }
  }
  for (const auto& [known, maker] : makers()) {
    if (known != name) continue;
    Params params(name, std::move(values));
    auto made = maker(params);
    if (!made.is_ok()) return made.status();
    if (Status s = params.finish(); !s.is_ok()) return s;
    return made;
  }
  std::string list;
  for (const auto& n : policy_names()) list += (list.empty() ? "" : ", ") + n;
  return Status{Code::InvalidArgument, "unknown policy '" + name + "' (built-ins: " + list + ")"};
}

std::string tree_text(const std::vector<int>& order) {
  const size_t n = order.size();
  std::vector<int> parent(n, -1);
  for (size_t i = 1; i < n; ++i) parent[static_cast<size_t>(order[i])] = order[(i - 1) / 2];
  std::string parents;
  for (size_t r = 0; r < n; ++r) parents += (r ? "," : "") + std::to_string(parent[r]);
  return "pairs=1;n=" + std::to_string(n) + ";R0:" + parents + "|B0:" + parents;
}

FractionSearch find_bsp_fraction(const std::vector<double>& fractions,
                                 const std::vector<double>& accuracies, double bsp_accuracy,
                                 double tolerance, double resolution) {
  double good = 1;  // BSP all the way is good by definition
  for (size_t i = 0; i < fractions.size() && i < accuracies.size(); ++i) {
    if (accuracies[i] >= bsp_accuracy - tolerance) good = std::min(good, fractions[i]);
  }
  double bad = 0;
  bool bad_seen = false;
  for (size_t i = 0; i < fractions.size() && i < accuracies.size(); ++i) {
    if (accuracies[i] < bsp_accuracy - tolerance && fractions[i] < good) {
      bad = std::max(bad, fractions[i]);
      bad_seen = true;
    }
  }
  // Zero (ASP from the start) is only known bad once tried; it is the search's lower end.
  if (good - bad <= resolution && (bad_seen || good <= resolution)) return {true, good};
  return {false, (bad + good) / 2};
}

}  // namespace taiji
