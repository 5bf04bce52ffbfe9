// An allreduce of gradients with its statistics. The gradient's own reduction counts each
// peer's squared norm (fp64) as it first reads each chunk of the input, and the result's
// squared norm over the chunks whose reduction ends on this peer, fused into the combine
// (collectives/sum_squares.h): no pass of its own over the buffer. Both are summed over the
// peers by a two-element companion allreduce posted as soon as they are counted, while the
// gradient's broadcast half is still running, so no round trip is added at the end. With element variance on, another
// allreduce sums the squared gradients. The caller's request completes when all of them
// have, with the statistics updated.
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

// Sets the peer's gradient-statistics gauges from the current estimates: after each
// tensor, and after a commit or reset, so the gauges never lag a step.
void publish_grad_stats(Metrics& metrics, const GradStats& stats);

// Posts the allreduce in args (Sum or Avg of a float dtype) with its statistics.
Result<std::shared_ptr<RequestState>> post_allreduce_with_stats(Peer& peer, PostArgs args,
                                                                std::shared_ptr<GradStats> stats);

}  // namespace taiji
