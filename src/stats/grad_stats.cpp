#include "stats/grad_stats.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "collectives/reduce_kernels.h"

namespace taiji {

double element_as_f64(DType dtype, const void* data, size_t i) {
  switch (dtype) {
    case DType::F32: return static_cast<const float*>(data)[i];
    case DType::F64: return static_cast<const double*>(data)[i];
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    default: return std::nan("");
  }
}

const char* estimate_state_text(EstimateState s) {
  switch (s) {
    case EstimateState::Defined: return "defined";
    case EstimateState::SinglePeer: return "undefined: one peer (N = 1) gives no second batch size";
    case EstimateState::NoSamples: return "undefined: no finite step yet";
    case EstimateState::NoSignal: return "undefined: the estimated |G|^2 is not positive";
    case EstimateState::NoNoise:
      return "no noise: the estimated tr(Sigma) is not positive, the peers' gradients agree (noise scale 0)";
  }
  return "?";
}

void NoiseScaleEstimator::add(double local_sq, double global_sq, int n, double b) {
  if (n < 2) {
    est_.state = EstimateState::SinglePeer;
    return;
  }
  if (!std::isfinite(local_sq) || !std::isfinite(global_sq)) {
    est_.skipped++;
    return;
  }
  const double nn = n;
  const double g2 = (nn * global_sq - local_sq) / (nn - 1);
  const double trace = b * nn * (local_sq - global_sq) / (nn - 1);
  ema_g2_ = beta_ * ema_g2_ + (1 - beta_) * g2;
  ema_trace_ = beta_ * ema_trace_ + (1 - beta_) * trace;
  beta_power_ *= beta_;
  est_.steps++;
  est_.last_local_sq = local_sq;
  est_.last_global_sq = global_sq;
  const double correction = 1 - beta_power_;
  est_.g2 = ema_g2_ / correction;
  est_.trace_sigma = ema_trace_ / correction;
  if (est_.g2 > 0 && est_.trace_sigma > 0) {
    est_.state = EstimateState::Defined;
    est_.noise_scale = est_.trace_sigma / est_.g2;
    est_.snr = est_.g2 / (est_.trace_sigma / (nn * b));
  } else if (est_.g2 > 0 && est_.trace_sigma <= 0) {
    // tr(Sigma) >= 0 by definition; an estimate at or below 0 says the noise is too small
    // to measure against the signal, not that it is negative. 0 is the nearest value a
    // batch-size policy can act on (no larger batch is needed); a negative ratio would
    // read as a valid, tiny batch size.
    est_.state = EstimateState::NoNoise;
    est_.noise_scale = 0;
    est_.snr = std::numeric_limits<double>::infinity();
  } else {
    est_.state = EstimateState::NoSignal;
    est_.noise_scale = std::nan("");
    est_.snr = std::nan("");
  }
}

void NoiseScaleEstimator::reset() {
  ema_g2_ = 0;
  ema_trace_ = 0;
  beta_power_ = 1;
  est_ = NoiseScaleEstimate{};
}

}  // namespace taiji
