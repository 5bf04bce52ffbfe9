// Gradient statistics through the C API with real peers: exact against a serial fp64
// reference on fixed inputs, and statistically true on synthetic gradients g_i = G + noise
// whose covariance is known.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common.h"
#include "harness.h"

using namespace taiji_test;

namespace {

bool close_rel(double got, double want, double rel) {
  return std::fabs(got - want) <= rel * std::max(std::fabs(want), 1e-300);
}

// Integer-valued gradients: every sum is exact in fp64, so the runtime and the reference
// agree up to the order of fp64 additions.
// A signal common to all ranks plus a per-rank deviation of comparable size: tr(Sigma) is a
// difference of two sums, and with a small deviation it would measure fp64 cancellation in
// the reference (an element-wise mean by 3 rounds) rather than the runtime.
double grad_value(int rank, int step, int tensor, size_t i) {
  const int signal = static_cast<int>((step * 3 + tensor * 5 + i * 11) % 17) - 8;
  const int noise = static_cast<int>((rank * 7 + step + i * 3) % 5) - 2;
  return static_cast<double>(signal + 3 * noise);
}

struct Expected {
  double g2 = 0, tr = 0, local = 0, global = 0;
  std::vector<double> var_l2, var_sum;  // per tensor, last step
};

Expected reference(int n, int steps, int tensors, size_t len, double b, double beta, double scale) {
  Expected e;
  double ema_g2 = 0, ema_tr = 0, power = 1;
  e.var_l2.assign(tensors, 0);
  e.var_sum.assign(tensors, 0);
  for (int s = 0; s < steps; ++s) {
    double local = 0, global = 0;
    for (int t = 0; t < tensors; ++t) {
      double l2 = 0, vsum = 0;
      for (size_t i = 0; i < len; ++i) {
        double sum = 0, sq = 0;
        for (int r = 0; r < n; ++r) {
          double g = grad_value(r, s, t, i) / scale;
          sum += g;
          sq += g * g;
        }
        const double mean = sum / n;
        local += sq / n;
        global += mean * mean;
        const double var = sq / n - mean * mean;
        l2 += var * var;
        vsum += var;
      }
      e.var_l2[t] = std::sqrt(l2);
      e.var_sum[t] = vsum;
    }
    const double g2 = (n * global - local) / (n - 1);
    const double tr = b * n * (local - global) / (n - 1);
    ema_g2 = beta * ema_g2 + (1 - beta) * g2;
    ema_tr = beta * ema_tr + (1 - beta) * tr;
    power *= beta;
    e.local = local;
    e.global = global;
  }
  e.g2 = ema_g2 / (1 - power);
  e.tr = ema_tr / (1 - power);
  return e;
}

// A statistics object with the defaults and 8 samples per peer per step; nullptr (and a
// recorded failure) if it cannot be made.
taiji_grad_stats_t* create_stats(taiji_peer_t* peer, int rank, Failures& failures) {
  taiji_grad_stats_config_t cfg = TAIJI_GRAD_STATS_CONFIG_INIT;
  cfg.batch_size = 8;
  taiji_grad_stats_t* stats = nullptr;
  failures.expect_status(rank, "create", taiji_grad_stats_create(peer, &cfg, &stats), TAIJI_OK);
  return stats;
}

}  // namespace

TEST_CASE("grad stats: results equal a serial fp64 reference", "[grad_stats]") {
  const int n = GENERATE(2, 3, 4);
  const bool avg = GENERATE(false, true);
  const double scale = GENERATE(1.0, 8.0);
  // tree: each rank reads its input once, whole; ring: a chunk per rank, so each rank's
  // norm is counted partly where it starts a chain and partly where it reduces (and a small
  // chunk size gives several chunks per chain).
  const char* topology = GENERATE("tree", "ring");
  CAPTURE(n, avg, scale, topology);
  EnvOverride chunks("TAIJI_CHUNK_BYTES", "4K");
  constexpr int kSteps = 5, kTensors = 2;
  constexpr size_t kLen = 2000;  // 16 KB: several chunks
  constexpr double kBatch = 32, kBeta = 0.9;
  const Expected want = reference(n, kSteps, kTensors, kLen, kBatch, kBeta, scale);
  Failures failures;
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    taiji_grad_stats_config_t cfg = TAIJI_GRAD_STATS_CONFIG_INIT;
    cfg.batch_size = kBatch;
    cfg.smoothing = kBeta;
    cfg.element_variance = 1;
    taiji_grad_stats_t* stats = nullptr;
    if (!failures.expect_status(rank, "create", taiji_grad_stats_create(peer, &cfg, &stats), TAIJI_OK)) return;
    failures.expect_status(rank, "loss scale", taiji_grad_stats_set_loss_scale(stats, scale), TAIJI_OK);
    taiji_op_options_t opt = op_options(20000, topology);
    opt.grad_stats = stats;
    std::vector<double> buf(kLen);
    for (int s = 0; s < kSteps; ++s) {
      for (int t = 0; t < kTensors; ++t) {
        for (size_t i = 0; i < kLen; ++i) buf[i] = grad_value(rank, s, t, i);
        const std::string name = "grad" + std::to_string(t);
        // In place, as frameworks do.
        failures.expect_status(rank, name, taiji_allreduce(peer, name.c_str(), buf.data(), buf.data(), kLen,
                                                           TAIJI_F64, avg ? TAIJI_AVG : TAIJI_SUM, &opt, nullptr),
                               TAIJI_OK);
      }
      failures.expect_status(rank, "commit", taiji_grad_stats_commit(stats), TAIJI_OK);
    }
    taiji_grad_stats_result_t r = TAIJI_GRAD_STATS_RESULT_INIT;
    failures.expect_status(rank, "read", taiji_grad_stats_read(stats, &r), TAIJI_OK);
    failures.expect(rank, r.state == TAIJI_GRAD_STATS_DEFINED, taiji_grad_stats_state_string(r.state));
    failures.expect(rank, r.steps == kSteps, "steps " + std::to_string(r.steps));
    failures.expect(rank, close_rel(r.local_sq_norm, want.local, 1e-12), "S_local " + std::to_string(r.local_sq_norm));
    failures.expect(rank, close_rel(r.global_sq_norm, want.global, 1e-12), "S " + std::to_string(r.global_sq_norm));
    failures.expect(rank, close_rel(r.g2, want.g2, 1e-12), "|G|^2 " + std::to_string(r.g2));
    failures.expect(rank, close_rel(r.trace_sigma, want.tr, 1e-12), "tr " + std::to_string(r.trace_sigma));
    failures.expect(rank, close_rel(r.noise_scale, want.tr / want.g2, 1e-12), "noise scale");
    failures.expect(rank, close_rel(r.snr, want.g2 / (want.tr / (n * kBatch)), 1e-12), "snr");
    for (int t = 0; t < kTensors; ++t) {
      double l2 = 0, sum = 0;
      const std::string name = "grad" + std::to_string(t);
      failures.expect_status(rank, "variance", taiji_grad_stats_tensor_variance(stats, name.c_str(), &l2, &sum),
                             TAIJI_OK);
      failures.expect(rank, close_rel(l2, want.var_l2[t], 1e-12) && close_rel(sum, want.var_sum[t], 1e-12),
                      name + " variance " + std::to_string(l2) + " / " + std::to_string(sum));
    }
    taiji_grad_stats_destroy(stats);
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("grad stats: the noise scale of synthetic gradients is within 5% of the truth",
          "[grad_stats]") {
  const int n = GENERATE(2, 4, 8);
  const double b = GENERATE(4.0, 32.0);
  CAPTURE(n, b);
  constexpr size_t kDim = 2048;
  constexpr int kSteps = 150;
  // G_j and the per-sample variances sigma_j^2 are known; the true B_simple is
  // tr(Sigma)/|G|^2. |G| is sized so that B_simple is about 3b: noise and signal comparable.
  std::vector<double> G(kDim), sigma(kDim);
  double trace = 0, g2 = 0;
  for (size_t j = 0; j < kDim; ++j) {
    sigma[j] = 1.0 + 0.5 * std::cos(0.01 * j);
    G[j] = std::sin(0.003 * j + 0.5);
    trace += sigma[j] * sigma[j];
    g2 += G[j] * G[j];
  }
  const double shrink = std::sqrt(trace / (3 * b) / g2);
  for (double& v : G) v *= shrink;
  const double truth = trace / (g2 * shrink * shrink);
  Failures failures;
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    taiji_grad_stats_config_t cfg = TAIJI_GRAD_STATS_CONFIG_INIT;
    cfg.batch_size = b;
    cfg.smoothing = 0.98;
    cfg.tensors_per_step = 1;
    taiji_grad_stats_t* stats = nullptr;
    if (!failures.expect_status(rank, "create", taiji_grad_stats_create(peer, &cfg, &stats), TAIJI_OK)) return;
    taiji_op_options_t opt = op_options(20000);
    opt.grad_stats = stats;
    std::mt19937_64 rng(1234 + rank);
    std::normal_distribution<double> normal(0, 1);
    std::vector<float> grad(kDim);
    for (int s = 0; s < kSteps; ++s) {
      // The mean of b samples: noise with variance sigma_j^2 / b.
      for (size_t j = 0; j < kDim; ++j) {
        grad[j] = static_cast<float>(G[j] + sigma[j] / std::sqrt(b) * normal(rng));
      }
      if (!failures.expect_status(rank, "allreduce",
                                  taiji_allreduce(peer, "grad", grad.data(), grad.data(), kDim, TAIJI_F32,
                                                  TAIJI_AVG, &opt, nullptr),
                                  TAIJI_OK)) {
        break;
      }
    }
    taiji_grad_stats_result_t r = TAIJI_GRAD_STATS_RESULT_INIT;
    failures.expect_status(rank, "read", taiji_grad_stats_read(stats, &r), TAIJI_OK);
    failures.expect(rank, r.steps == kSteps, "steps " + std::to_string(r.steps));
    failures.expect(rank, std::fabs(r.noise_scale / truth - 1) < 0.05,
                    "noise scale " + std::to_string(r.noise_scale) + ", truth " + std::to_string(truth));
    // The same estimate appears in the peer's metrics.
    const std::string json = metrics_json(peer);
    if (failures.expect(rank, !json.empty(), "no metrics snapshot")) {
      failures.expect(rank, json.find("taiji_grad_noise_scale") != std::string::npos &&
                                json.find("taiji_grad_snr") != std::string::npos,
                      "the metrics lack the gradient statistics");
    }
    taiji_grad_stats_destroy(stats);
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("grad stats: identical gradients on every peer report no noise", "[grad_stats]") {
  // Every peer holds the same gradient, of values k/4 <= 2: every float add, the divide by
  // 3 and every fp64 square and sum are exact, so S_local == S however each is summed, and
  // tr(Sigma) is exactly 0. No negative or undefined noise scale may come out, and the
  // metrics gauges say the same as soon as the step is committed.
  Failures failures;
  auto lines = run_peers(3, [&](taiji_peer_t* peer, int rank) {
    taiji_grad_stats_config_t cfg = TAIJI_GRAD_STATS_CONFIG_INIT;
    cfg.batch_size = 16;
    taiji_grad_stats_t* stats = nullptr;
    if (!failures.expect_status(rank, "create", taiji_grad_stats_create(peer, &cfg, &stats), TAIJI_OK)) return;
    taiji_op_options_t opt = op_options(20000);
    opt.grad_stats = stats;
    // One step: the gauges must show it once it is committed.
    std::vector<float> g(1000);
    for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 7) * 0.25f;
    failures.expect_status(rank, "allreduce",
                           taiji_allreduce(peer, "same", g.data(), g.data(), g.size(), TAIJI_F32, TAIJI_AVG,
                                           &opt, nullptr),
                           TAIJI_OK);
    failures.expect_status(rank, "commit", taiji_grad_stats_commit(stats), TAIJI_OK);
    taiji_grad_stats_result_t r = TAIJI_GRAD_STATS_RESULT_INIT;
    failures.expect_status(rank, "read", taiji_grad_stats_read(stats, &r), TAIJI_OK);
    failures.expect(rank, r.state == TAIJI_GRAD_STATS_NO_NOISE,
                    std::string("state: ") + taiji_grad_stats_state_string(r.state));
    failures.expect(rank, r.steps == 1, "steps " + std::to_string(r.steps));
    failures.expect(rank, r.trace_sigma == 0 && r.g2 > 0,
                    "tr(Sigma) " + std::to_string(r.trace_sigma) + ", |G|^2 " + std::to_string(r.g2));
    failures.expect(rank, r.noise_scale == 0, "noise scale " + std::to_string(r.noise_scale));
    failures.expect(rank, std::isinf(r.snr) && r.snr > 0, "snr " + std::to_string(r.snr));
    failures.expect(rank, std::string(taiji_grad_stats_state_string(r.state)).find("no noise") == 0,
                    taiji_grad_stats_state_string(r.state));
    const std::string json = metrics_json(peer);
    if (failures.expect(rank, !json.empty(), "no metrics snapshot")) {
      // {"name":"taiji_grad_noise_scale","labels":{},"value":V}; NaN and infinities are null.
      const size_t at = json.find("\"taiji_grad_noise_scale\"");
      const size_t value = json.find("\"value\":", at == std::string::npos ? json.size() : at);
      const std::string v = value == std::string::npos ? "" : json.substr(value + 8, json.find('}', value) - value - 8);
      failures.expect(rank, !v.empty() && v != "null" && std::stod(v) == 0, "noise scale gauge: '" + v + "'");
    }
    taiji_grad_stats_destroy(stats);
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("grad stats: bad use is refused clearly", "[grad_stats]") {
  Failures failures;
  auto lines = run_peers(2, [&](taiji_peer_t* peer, int rank) {
    taiji_grad_stats_config_t cfg = TAIJI_GRAD_STATS_CONFIG_INIT;
    taiji_grad_stats_t* stats = nullptr;
    failures.expect_status(rank, "no batch size", taiji_grad_stats_create(peer, &cfg, &stats),
                           TAIJI_ERR_INVALID_ARGUMENT);
    failures.expect(rank, std::string(taiji_peer_last_error(peer)).find("batch_size") != std::string::npos,
                    taiji_peer_last_error(peer));
    cfg.batch_size = 8;
    cfg.smoothing = 1;
    failures.expect_status(rank, "smoothing 1", taiji_grad_stats_create(peer, &cfg, &stats),
                           TAIJI_ERR_INVALID_ARGUMENT);
    cfg.smoothing = 0;
    if (!failures.expect_status(rank, "create", taiji_grad_stats_create(peer, &cfg, &stats), TAIJI_OK)) return;
    taiji_grad_stats_result_t r = TAIJI_GRAD_STATS_RESULT_INIT;
    taiji_grad_stats_read(stats, &r);
    failures.expect(rank, r.state == TAIJI_GRAD_STATS_NO_SAMPLES && std::isnan(r.noise_scale),
                    "fresh object is not NO_SAMPLES");
    taiji_op_options_t opt = op_options(20000);
    opt.grad_stats = stats;
    int32_t i = 1;
    failures.expect_status(rank, "integer gradients",
                           taiji_allreduce(peer, "ints", &i, &i, 1, TAIJI_I32, TAIJI_SUM, &opt, nullptr),
                           TAIJI_ERR_INVALID_ARGUMENT);
    float f = 1;
    failures.expect_status(rank, "MAX allreduce",
                           taiji_allreduce(peer, "max", &f, &f, 1, TAIJI_F32, TAIJI_MAX, &opt, nullptr),
                           TAIJI_ERR_INVALID_ARGUMENT);
    failures.expect_status(rank, "broadcast", taiji_broadcast(peer, "b", &f, 1, TAIJI_F32, 0, &opt, nullptr),
                           TAIJI_ERR_INVALID_ARGUMENT);
    failures.expect_status(rank, "loss scale 0", taiji_grad_stats_set_loss_scale(stats, 0),
                           TAIJI_ERR_INVALID_ARGUMENT);
    failures.expect_status(rank, "variance off", taiji_grad_stats_tensor_variance(stats, "x", nullptr, nullptr),
                           TAIJI_ERR_INVALID_ARGUMENT);
    // An overflow on one peer skips the step on every peer.
    float g = rank == 0 ? INFINITY : 1.0f;
    failures.expect_status(rank, "inf", taiji_allreduce(peer, "g", &g, &g, 1, TAIJI_F32, TAIJI_SUM, &opt, nullptr),
                           TAIJI_OK);
    taiji_grad_stats_commit(stats);
    taiji_grad_stats_read(stats, &r);
    failures.expect(rank, r.skipped == 1 && r.steps == 0, "the non-finite step was not skipped");
    taiji_grad_stats_destroy(stats);
    // The element variance reads the input before posting: a NULL one must be refused
    // there, not read.
    cfg.element_variance = 1;
    if (!failures.expect_status(rank, "create with variance", taiji_grad_stats_create(peer, &cfg, &stats),
                                TAIJI_OK)) {
      return;
    }
    opt.grad_stats = stats;
    failures.expect_status(rank, "NULL input",
                           taiji_allreduce(peer, "null", nullptr, &f, 1, TAIJI_F32, TAIJI_SUM, &opt, nullptr),
                           TAIJI_ERR_INVALID_ARGUMENT);
    failures.expect(rank, std::string(taiji_peer_last_error(peer)).find("send buffer is NULL") != std::string::npos,
                    taiji_peer_last_error(peer));
    failures.expect_status(rank, "empty name",
                           taiji_allreduce(peer, "", &f, &f, 1, TAIJI_F32, TAIJI_SUM, &opt, nullptr),
                           TAIJI_ERR_INVALID_ARGUMENT);
    // Statistics belong to an allreduce; other kinds and a topology swap refuse them.
    failures.expect_status(rank, "broadcast", taiji_broadcast(peer, "b", &f, 1, TAIJI_F32, 0, &opt, nullptr),
                           TAIJI_ERR_INVALID_ARGUMENT);
    failures.expect(rank, std::string(taiji_peer_last_error(peer)).find("allreduce only") != std::string::npos,
                    taiji_peer_last_error(peer));
    failures.expect_status(rank, "set_topology", taiji_set_topology(peer, nullptr, &opt, nullptr),
                           TAIJI_ERR_INVALID_ARGUMENT);
    failures.expect(rank, std::string(taiji_peer_last_error(peer)).find("allreduce only") != std::string::npos,
                    taiji_peer_last_error(peer));
    taiji_grad_stats_destroy(stats);
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("grad stats: a gradient that fails ends its statistics at once, on every peer",
          "[grad_stats]") {
  // Counts differ: the gradient fails with a mismatch on both ranks, wherever its reduction
  // had got to; the statistics' own reductions must not wait for the op timeout.
  constexpr int64_t kTimeoutMs = 30000;
  Failures failures;
  auto lines = run_peers(2, [&](taiji_peer_t* peer, int rank) {
    taiji_grad_stats_t* stats = create_stats(peer, rank, failures);
    if (stats == nullptr) return;
    taiji_op_options_t opt = op_options(kTimeoutMs);
    opt.grad_stats = stats;
    const size_t len = rank == 0 ? 4096 : 4097;
    std::vector<float> buf(len, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    failures.expect_status(rank, "mismatched gradient",
                           taiji_allreduce(peer, "g", buf.data(), buf.data(), len, TAIJI_F32, TAIJI_SUM, &opt,
                                           nullptr),
                           TAIJI_ERR_MISMATCH);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
    failures.expect(rank, ms < kTimeoutMs / 3, "the failed op took " + std::to_string(ms) + " ms");
    // The next step works and is counted.
    std::vector<float> ok(64, static_cast<float>(rank + 1));
    failures.expect_status(rank, "next gradient",
                           taiji_allreduce(peer, "g2", ok.data(), ok.data(), ok.size(), TAIJI_F32, TAIJI_SUM, &opt,
                                           nullptr),
                           TAIJI_OK);
    failures.expect_status(rank, "commit", taiji_grad_stats_commit(stats), TAIJI_OK);
    taiji_grad_stats_result_t r = TAIJI_GRAD_STATS_RESULT_INIT;
    failures.expect_status(rank, "read", taiji_grad_stats_read(stats, &r), TAIJI_OK);
    // S_local = (1 + 4) / 2 per element, S = 3^2 per element (SUM of 1 and 2).
    failures.expect(rank, r.local_sq_norm == 64 * 2.5 && r.global_sq_norm == 64 * 9.0 / 4,
                    "S_local " + std::to_string(r.local_sq_norm) + ", S " + std::to_string(r.global_sq_norm));
    taiji_grad_stats_destroy(stats);
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("grad stats: a topology swap posted right after a gradient does not split its statistics",
          "[grad_stats]") {
  // The norm companion goes out when a rank's norms are counted: on a leaf of the
  // gradient's reduction at once, on the root only once the leaves' data arrived. Here
  // the leaves post their swap 50 ms after the gradient and rank 0 posts it at once, so
  // rank 0's companion would meet the swap and theirs would not.
  constexpr int n = 3;
  Failures failures;
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    taiji_grad_stats_t* stats = create_stats(peer, rank, failures);
    if (stats == nullptr) return;
    taiji_topology_t* ring = nullptr;
    if (!failures.expect_status(rank, "ring", taiji_topology_from_text(peer, "ring", 0, &ring), TAIJI_OK)) return;
    taiji_op_options_t opt = op_options(20000);
    std::vector<float> g(64, static_cast<float>(rank + 1));
    // The same size without statistics: the digest the gradient must report.
    taiji_request_t* plain = nullptr;
    failures.expect_status(rank, "plain", taiji_allreduce(peer, "plain", g.data(), g.data(), g.size(), TAIJI_F32,
                                                          TAIJI_SUM, &opt, &plain), TAIJI_OK);
    failures.expect_status(rank, "plain wait", taiji_request_wait(plain, 20000), TAIJI_OK);
    const uint64_t want_digest = taiji_request_topology_digest(plain);
    taiji_request_free(plain);
    std::fill(g.begin(), g.end(), static_cast<float>(rank + 1));
    if (rank != 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    opt.grad_stats = stats;
    taiji_request_t* grad = nullptr;
    failures.expect_status(rank, "post gradient", taiji_allreduce(peer, "X", g.data(), g.data(), g.size(), TAIJI_F32,
                                                                  TAIJI_SUM, &opt, &grad), TAIJI_OK);
    if (rank != 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    opt.grad_stats = nullptr;
    taiji_request_t* swap = nullptr;
    failures.expect_status(rank, "post swap", taiji_set_topology(peer, ring, &opt, &swap), TAIJI_OK);
    if (grad != nullptr) {
      failures.expect_status(rank, "gradient", taiji_request_wait(grad, 20000), TAIJI_OK);
      failures.expect(rank, want_digest != 0 && taiji_request_topology_digest(grad) == want_digest,
                      "gradient digest " + std::to_string(taiji_request_topology_digest(grad)) + ", plain " +
                          std::to_string(want_digest));
      taiji_request_free(grad);
    }
    if (swap != nullptr) {
      failures.expect_status(rank, "swap", taiji_request_wait(swap, 20000), TAIJI_OK);
      taiji_request_free(swap);
    }
    failures.expect(rank, g[0] == 6.0f, "wrong sum");
    taiji_topology_destroy(ring);
    taiji_grad_stats_destroy(stats);
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("grad stats: the gradient's own deadline bounds its statistics", "[grad_stats]") {
  // Rank 1 never posts the gradient: rank 0's request must end at its 300 ms deadline,
  // not at the peer's 20 s default that the companions would otherwise get.
  constexpr int n = 2;
  Failures failures;
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    taiji_grad_stats_t* stats = create_stats(peer, rank, failures);
    if (stats == nullptr) return;
    if (rank == 0) {
      taiji_op_options_t opt = op_options(300);
      opt.grad_stats = stats;
      std::vector<float> g(64, 1.0f);
      const auto start = Clock::now();
      failures.expect_status(rank, "orphan gradient", taiji_allreduce(peer, "orphan", g.data(), g.data(), g.size(),
                                                                      TAIJI_F32, TAIJI_SUM, &opt, nullptr),
                             TAIJI_ERR_TIMEOUT);
      failures.expect(rank, ms_since(start) < 5000, "took " + std::to_string(ms_since(start)) + " ms");
    }
    taiji_op_options_t sync = op_options(20000);
    failures.expect_status(rank, "barrier", taiji_barrier(peer, "after", &sync, nullptr), TAIJI_OK);
    taiji_grad_stats_destroy(stats);
  });
  failures.add_all(lines);
  check_no_failures(failures);
}

TEST_CASE("grad stats: abort ends a gradient with ERR_ABORTED, as for any op", "[grad_stats]") {
  // One rank posts a gradient the other never does, then aborts. As the root of its
  // reduction (one of the two cases) its norms are never counted, so its companion is
  // posted only as the gradient fails, when the aborted peer refuses it.
  constexpr int n = 2;
  const int poster = GENERATE(0, 1);
  CAPTURE(poster);
  Failures failures;
  PeerOptions options;
  // The aborting rank's links close under the other, which may then report it lost.
  options.finalize_ok = [](int, taiji_status_t s) { return s == TAIJI_OK || s == TAIJI_ERR_PEER_LOST; };
  auto lines = run_peers(n, [&](taiji_peer_t* peer, int rank) {
    if (rank != poster) {
      // Stays until the poster has aborted: a finalized peer would fail its op first.
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      return;
    }
    taiji_grad_stats_t* stats = create_stats(peer, rank, failures);
    if (stats == nullptr) return;
    taiji_op_options_t opt = op_options(20000);
    opt.grad_stats = stats;
    std::vector<float> g(64, 1.0f);
    taiji_request_t* req = nullptr;
    if (failures.expect_status(rank, "post", taiji_allreduce(peer, "orphan", g.data(), g.data(), g.size(), TAIJI_F32,
                                                             TAIJI_SUM, &opt, &req), TAIJI_OK)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      taiji_peer_abort(peer);
      failures.expect_status(rank, "aborted gradient", taiji_request_wait(req, 5000), TAIJI_ERR_ABORTED);
      taiji_request_free(req);
    }
    taiji_grad_stats_destroy(stats);
  }, options);
  failures.add_all(lines);
  check_no_failures(failures);
}
