// The gradient-noise-scale estimator against a serial fp64 reference written out here, and
// the squared-norm kernels against a plain loop.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "collectives/reduce_kernels.h"
#include "stats/grad_stats.h"

using namespace taiji;

namespace {

bool close_rel(double got, double want, double rel = 1e-12) {
  return std::fabs(got - want) <= rel * std::max(std::fabs(want), 1e-300);
}

// The formulas of McCandlish et al. (appendix A.1), each smoothed with a bias-corrected EMA.
struct Reference {
  double beta;
  double ema_g2 = 0, ema_tr = 0, power = 1;
  double g2 = 0, tr = 0;
  void add(double local, double global, int n, double b) {
    double est_g2 = (n * global - local) / (n - 1);
    double est_tr = (local - global) / (1.0 / b - 1.0 / (n * b));
    ema_g2 = beta * ema_g2 + (1 - beta) * est_g2;
    ema_tr = beta * ema_tr + (1 - beta) * est_tr;
    power *= beta;
    g2 = ema_g2 / (1 - power);
    tr = ema_tr / (1 - power);
  }
};

}  // namespace

TEST_CASE("gradstats: squared norms in fp64 for every float dtype", "[gradstats]") {
  const size_t n = 1037;  // not a multiple of the unroll
  std::vector<float> f32(n);
  std::vector<double> f64(n);
  std::vector<uint16_t> f16(n), bf16(n);
  double want32 = 0, want64 = 0, want16 = 0, wantbf = 0;
  for (size_t i = 0; i < n; ++i) {
    f32[i] = static_cast<float>(std::sin(0.37 * i) * 3.5);
    f64[i] = std::cos(0.11 * i) * 1e3;
    f16[i] = f32_to_f16(f32[i]);
    bf16[i] = f32_to_bf16(f32[i]);
    want32 += double(f32[i]) * double(f32[i]);
    want64 += f64[i] * f64[i];
    want16 += double(f16_to_f32(f16[i])) * double(f16_to_f32(f16[i]));
    wantbf += double(bf16_to_f32(bf16[i])) * double(bf16_to_f32(bf16[i]));
  }
  CHECK(close_rel(squared_norm(DType::F32, f32.data(), n), want32));
  CHECK(close_rel(squared_norm(DType::F64, f64.data(), n), want64));
  CHECK(close_rel(squared_norm(DType::F16, f16.data(), n), want16));
  CHECK(close_rel(squared_norm(DType::BF16, bf16.data(), n), wantbf));
  CHECK(squared_norm(DType::F32, f32.data(), 0) == 0);
  CHECK(std::isnan(squared_norm(DType::I32, f32.data(), n)));
}

TEST_CASE("gradstats: a combine that counts norms on the way gives the plain combine's result",
          "[gradstats]") {
  // Sizes around the 8 KiB blocks the counting combine works in.
  const size_t n = GENERATE(size_t{1}, size_t{1000}, size_t{2048}, size_t{2049}, size_t{5000});
  const RedOp op = GENERATE(RedOp::Sum, RedOp::Avg);
  CAPTURE(n, static_cast<int>(op));
  std::vector<float> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<float>(std::sin(0.37 * i) * 3.5);
    b[i] = static_cast<float>(std::cos(0.21 * i) * 2.0);
  }
  std::vector<float> plain = a, counted = a;
  reduce_into(DType::F32, op, plain.data(), b.data(), n);
  double before = 0.5, after = 0.25;  // added to, not overwritten
  reduce_into_counting(DType::F32, op, counted.data(), b.data(), n, &before, &after);
  CHECK(counted == plain);
  CHECK(close_rel(before - 0.5, squared_norm(DType::F32, a.data(), n)));
  CHECK(close_rel(after - 0.25, squared_norm(DType::F32, plain.data(), n)));
  std::vector<float> only = a;
  reduce_into_counting(DType::F32, op, only.data(), b.data(), n, nullptr, nullptr);
  CHECK(only == plain);
}

TEST_CASE("gradstats: estimates equal the serial reference", "[gradstats]") {
  const double beta = GENERATE(0.0, 0.5, 0.95);
  const int n = GENERATE(2, 3, 8);
  const double b = 16;
  CAPTURE(beta, n);
  NoiseScaleEstimator est(beta);
  Reference ref{beta};
  for (int step = 1; step <= 40; ++step) {
    // S_local above S, as for real gradients, with a drift and a wobble.
    const double global = 2.0 + 0.01 * step + 0.3 * std::sin(step);
    const double local = global + 1.5 + 0.2 * std::cos(1.7 * step);
    est.add(local, global, n, b);
    ref.add(local, global, n, b);
    const NoiseScaleEstimate e = est.estimate();
    REQUIRE(e.state == EstimateState::Defined);
    CHECK(e.steps == static_cast<uint64_t>(step));
    CHECK(close_rel(e.g2, ref.g2));
    CHECK(close_rel(e.trace_sigma, ref.tr));
    CHECK(close_rel(e.noise_scale, ref.tr / ref.g2));
    CHECK(close_rel(e.snr, ref.g2 / (ref.tr / (n * b))));
    CHECK(e.last_local_sq == local);
    CHECK(e.last_global_sq == global);
  }
}

TEST_CASE("gradstats: undefined estimates say why; non-finite steps are skipped", "[gradstats]") {
  NoiseScaleEstimator est(0.9);
  CHECK(est.estimate().state == EstimateState::NoSamples);
  CHECK(std::isnan(est.estimate().noise_scale));
  CHECK(std::isnan(est.estimate().snr));
  est.add(3, 1, 1, 8);
  CHECK(est.estimate().state == EstimateState::SinglePeer);
  CHECK(est.estimate().steps == 0);
  CHECK(std::isnan(est.estimate().noise_scale));
  CHECK(std::isnan(est.estimate().snr));

  NoiseScaleEstimator skip(0.9);
  skip.add(std::numeric_limits<double>::infinity(), 1, 4, 8);
  skip.add(std::nan(""), 1, 4, 8);
  CHECK(skip.estimate().state == EstimateState::NoSamples);
  CHECK(skip.estimate().skipped == 2);
  skip.add(3, 2, 4, 8);
  CHECK(skip.estimate().state == EstimateState::Defined);
  CHECK(skip.estimate().steps == 1);

  // S_local much larger than N*S: the |G|^2 estimate is negative.
  NoiseScaleEstimator noise(0.9);
  noise.add(10, 1, 2, 8);
  CHECK(noise.estimate().state == EstimateState::NoSignal);
  CHECK(std::isnan(noise.estimate().noise_scale));

  // Identical gradients on every peer (S_local == S): no noise to measure.
  NoiseScaleEstimator same(0.9);
  same.add(4, 4, 4, 8);
  CHECK(same.estimate().state == EstimateState::NoNoise);
  CHECK(same.estimate().noise_scale == 0);
  CHECK(same.estimate().snr == std::numeric_limits<double>::infinity());
  CHECK(same.estimate().trace_sigma == 0);
  // S_local below S (a sampling accident): the tr(Sigma) estimate is negative, and a
  // negative noise scale must not come out.
  same.add(3, 4, 4, 8);
  CHECK(same.estimate().state == EstimateState::NoNoise);
  CHECK(same.estimate().trace_sigma < 0);
  CHECK(same.estimate().noise_scale == 0);
  // Noise large enough to outweigh the earlier steps makes it defined again.
  for (int i = 0; i < 20; ++i) same.add(8, 3, 4, 8);
  CHECK(same.estimate().state == EstimateState::Defined);
  CHECK(same.estimate().noise_scale > 0);

  noise.reset();
  CHECK(noise.estimate().state == EstimateState::NoSamples);
  CHECK(std::isnan(noise.estimate().noise_scale));
  CHECK(noise.estimate().steps == 0);
  CHECK(std::string(estimate_state_text(EstimateState::SinglePeer)).find("N = 1") != std::string::npos);
}
