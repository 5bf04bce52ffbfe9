// Adaptation policies and the engine that runs them at step boundaries.
//
// Pure logic: the runtime gathers every rank's record into a StepTable (one collective per
// step), and every rank runs the same policies on the same table, so every rank reaches the
// same actions at the same step without a second round of agreement. Policies must
// therefore be deterministic functions of the tables they have seen: no clocks, no
// randomness, no rank-local state.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "adapt/sync_mode.h"
#include "common/status.h"

namespace taiji {

// What every rank contributed to one step, identical on every rank once gathered.
struct StepTable {
  uint64_t step = 0;  // steps since the engine was created (0 first)
  int size = 0;
  // Per rank (size entries). A negative step time is unknown (a rank's first step).
  std::vector<double> step_seconds;
  std::vector<double> samples;                // samples each rank trained on this step
  std::vector<double> link_bytes_per_second;  // mean send rate of each rank's links
  int requested_size = 0;                     // a size asked for from outside; 0: none
  // Gradient statistics (rank 0's, so that every rank reads the same); 0 when unknown.
  double noise_scale = 0;
  double snr = 0;
  SyncMode sync_mode = SyncMode::Bsp;
  std::vector<std::string> input_keys;        // sorted
  std::vector<std::vector<double>> inputs;    // [key][rank]
};

// A table and what the engine derives from it, as the policies see it.
struct StepView {
  const StepTable* table = nullptr;
  double median_seconds = 0;     // over the ranks whose time is known; 0 when none is
  std::vector<bool> stragglers;  // step time > straggler_ratio x median (and 1 ms more)
  // Samples per second of the whole cluster: this step's samples over the slowest rank's
  // step time (a synchronous step lasts as long as its slowest rank); 0 when unknown.
  double throughput = 0;
  uint64_t total_samples = 0;  // every rank's samples over every step, this one included
  bool times_known = false;    // every rank's step time is known

  // The inputs under `key` per rank, or null when no rank set that key.
  const std::vector<double>* input(const std::string& key) const;
};

enum class ActionKind : uint8_t { SetTopology = 0, Resize = 1, SetSyncMode = 2, AdviseBatch = 3, MeasureLinks = 4 };
constexpr int kActionKindCount = 5;
// "set_topology", "resize", "set_sync_mode", "advise_batch", "measure_links".
const char* action_kind_name(ActionKind kind);

struct Action {
  ActionKind kind = ActionKind::AdviseBatch;
  SyncMode mode = SyncMode::Bsp;  // set_sync_mode
  int size = 0;                   // resize
  std::string topology;           // set_topology: a built-in name or the explicit text form;
                                  // measure_links: the runtime sets the one it swapped to
  double batch_scale = 1;         // advise_batch: multiply the per-rank batch by this
  double lr_scale = 1;            // set_sync_mode, advise_batch: multiply the learning rate
  // measure_links: the runtime measures every link, computes the best strategy for an
  // allreduce of `bytes` and swaps to it when the time predicted on the topology in force
  // is at least min_gain x the best's.
  double min_gain = 1.1;
  uint64_t bytes = uint64_t{16} << 20;
  std::string policy;             // filled by the engine with the deciding policy's name
  std::string reason;
  bool applied = false;           // set by the runtime when it applied the action itself
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string name() const = 0;
  // Appends this step's proposals. An error fails the step (it should then fail the same
  // way on every rank, which a deterministic policy does).
  virtual Status on_step(const StepView& view, std::vector<Action>* actions) = 0;
  // Forgets every baseline and counter: after a resize or a switch the old ones no longer
  // describe the cluster.
  virtual void reset() {}
  // Whether the table of step `step` needs the size requested from outside, which costs
  // rank 0 a store round trip; only then is it read.
  virtual bool wants_requested_size(uint64_t /*step*/) const { return false; }
};

// Runs the policies in the order they were added and resolves conflicts deterministically:
// at most one action of each kind per step, and the first policy to propose a kind wins
// (add the policy that should prevail first). Proposals that would change nothing (a
// switch to the current mode, a resize to the current size) are dropped before that.
class Engine {
 public:
  static constexpr double kDefaultStragglerRatio = 1.5;

  void add(std::unique_ptr<Policy> policy);
  size_t policy_count() const { return policies_.size(); }

  // Derives the view, runs every policy, resolves conflicts. A set_sync_mode action
  // becomes the engine's mode at once (the caller applies it before the next step).
  Status step(const StepTable& table, std::vector<Action>* out);

  // The view the engine derives from a table, with the running total of samples.
  StepView derive(const StepTable& table) const;

  // Whether any policy needs the requested size in the table of step `step`.
  bool wants_requested_size(uint64_t step) const;

  SyncMode sync_mode() const { return mode_; }
  void set_sync_mode(SyncMode mode) { mode_ = mode; }
  uint64_t total_samples() const { return total_samples_; }
  uint64_t steps() const { return steps_; }
  // Resets every policy; the mode, the step count and the samples total stay.
  void reset();

  double straggler_ratio = kDefaultStragglerRatio;

 private:
  std::vector<std::unique_ptr<Policy>> policies_;
  SyncMode mode_ = SyncMode::Bsp;
  uint64_t total_samples_ = 0;
  uint64_t steps_ = 0;
};

// The median of the non-negative values; 0 when there is none.
double median_of_known(const std::vector<double>& values);

}  // namespace taiji
