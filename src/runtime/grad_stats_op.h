// An allreduce of gradients with its statistics: each peer's squared norm (fp64, before the
// reduction) goes out in a one-element companion allreduce posted together with the
// gradient's, so no extra round trip is added; the mean gradient's squared norm is taken
// from the result. With element variance on, a third allreduce sums the squared gradients.
// The caller's request completes when all of them have, with the statistics updated.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "runtime/peer.h"
#include "stats/grad_stats.h"

namespace taiji {

struct GradStatsConfig {
  double batch_size = 0;        // b: samples per peer per step, > 0
  double beta = 0.95;           // smoothing of the moving averages, [0, 1)
  bool element_variance = false;
  int tensors_per_step = 0;     // 0: steps end at commit(); k > 0: after every k tensors
};

// Element-wise variance across peers of one tensor, E[g^2] - E[g]^2, at its last step.
struct TensorVariance {
  double l2 = 0;   // ||var||_2
  double sum = 0;  // sum of the variances (= S_local - S of the tensor)
  uint64_t updates = 0;
};

// Thread-safe: reductions complete on the I/O thread, callers read from any thread.
class GradStats {
 public:
  GradStats(GradStatsConfig config, int world_size);
  const GradStatsConfig& config() const { return config_; }
  int world_size() const { return world_size_; }

  Status set_loss_scale(double scale);
  double loss_scale() const;
  // A tensor's reductions finished: its S_local and S (loss scale already taken out).
  void add_tensor(const std::string& name, double local_sq, double global_sq,
                  const TensorVariance* variance);
  // Ends the step: folds the tensors added since the last commit into the estimates.
  void commit();
  // Forgets everything (after a resize or a change of synchronisation).
  void reset();
  NoiseScaleEstimate estimate() const;
  bool tensor_variance(const std::string& name, TensorVariance* out) const;

 private:
  void commit_locked();

  const GradStatsConfig config_;
  const int world_size_;
  mutable std::mutex mu_;
  double loss_scale_ = 1;
  double step_local_ = 0;
  double step_global_ = 0;
  int step_tensors_ = 0;
  NoiseScaleEstimator estimator_;
  std::map<std::string, TensorVariance> variance_;
};

// Posts the allreduce in args (Sum or Avg of a float dtype) with its statistics.
Result<std::shared_ptr<RequestState>> post_allreduce_with_stats(Peer& peer, PostArgs args,
                                                                std::shared_ptr<GradStats> stats);

}  // namespace taiji
