// Gradient statistics computed where the gradients are reduced: the gradient noise scale of
// McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", appendix A.1) and
// the signal-to-noise ratio, from per-peer squared norms that ride along with the allreduce.
//
// With N peers each computing a gradient g_i over a batch of b samples, and the reduced mean
// gradient g = (1/N) sum g_i over N*b samples:
//   S_local = (1/N) sum ||g_i||^2      (an estimate of ||G||^2 + tr(Sigma)/b)
//   S       = ||g||^2                  (an estimate of ||G||^2 + tr(Sigma)/(N*b))
//   |G|^2   = (N*S - S_local) / (N - 1)           unbiased
//   tr(Sigma) = b*N*(S_local - S) / (N - 1)       unbiased
// Each is smoothed with a bias-corrected exponential moving average (separately: the ratio
// of the averages, not the average of ratios, since single-step estimates can be negative),
// and B_simple = tr(Sigma)/|G|^2; the SNR at the current batch B = N*b is |G|^2/(tr(Sigma)/B).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "collectives/sum_squares.h"
#include "common/dtype.h"

namespace taiji {

// The elements of a reduced buffer as fp64 (for S and the variance), f16/bf16 widened.
double element_as_f64(DType dtype, const void* data, size_t i);

enum class EstimateState {
  Defined = 0,
  SinglePeer,   // N = 1: nothing to compare against
  NoSamples,    // no finite step yet (or just reset)
  NoSignal,     // the smoothed |G|^2 is not positive: the noise scale is unbounded
  NoNoise,      // the smoothed tr(Sigma) is not positive: the peers' gradients differ no
                // more than the estimate's own noise, so the noise scale is 0
};
const char* estimate_state_text(EstimateState s);

struct NoiseScaleEstimate {
  EstimateState state = EstimateState::NoSamples;
  uint64_t steps = 0;            // finite steps folded into the averages
  uint64_t skipped = 0;          // non-finite steps left out
  double last_local_sq = 0;      // S_local of the last finite step
  double last_global_sq = 0;     // S of the last finite step
  double g2 = 0;                 // smoothed |G|^2
  double trace_sigma = 0;        // smoothed tr(Sigma)
  // NaN unless Defined or NoNoise, so readers copy them as they are.
  double noise_scale = std::numeric_limits<double>::quiet_NaN();  // B_simple; 0 when NoNoise
  double snr = std::numeric_limits<double>::quiet_NaN();          // at B = N*b; +inf when NoNoise
};

class NoiseScaleEstimator {
 public:
  // beta: smoothing factor of the moving averages, in [0, 1).
  explicit NoiseScaleEstimator(double beta = 0.95) : beta_(beta) {}

  // One step: local_sq = S_local, global_sq = S (each summed over every tensor of the step),
  // n peers, b samples per peer. Non-finite inputs are counted as skipped.
  void add(double local_sq, double global_sq, int n, double b);
  void reset();
  NoiseScaleEstimate estimate() const { return est_; }

 private:
  double beta_;
  double ema_g2_ = 0;
  double ema_trace_ = 0;
  double beta_power_ = 1;  // beta^steps, for the bias correction
  NoiseScaleEstimate est_;
};

}  // namespace taiji
