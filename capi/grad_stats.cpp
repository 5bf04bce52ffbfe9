// The C ABI for gradient statistics: the object, its results, and the allreduce that
// carries them (taiji_op_options_t.grad_stats, routed here by capi/taiji.cpp).
#include <taiji/taiji.h>

#include <cmath>
#include <cstring>

#include "handles.h"
#include "runtime/grad_stats_op.h"

using namespace taiji_capi;

struct taiji_grad_stats {
  taiji_peer_t* peer = nullptr;
  std::shared_ptr<taiji::GradStats> impl;
};

namespace taiji_capi {

taiji::Result<std::shared_ptr<taiji::RequestState>> post_with_grad_stats(
    taiji_peer_t* peer, taiji_grad_stats_t* stats, taiji::PostArgs args) {
  if (stats->peer != peer) {
    return taiji::Status{taiji::Code::InvalidArgument,
                         "options.grad_stats was created for another peer"};
  }
  return taiji::post_allreduce_with_stats(*peer->impl, std::move(args), stats->impl);
}

taiji_peer_t* grad_stats_peer(const taiji_grad_stats_t* stats) { return stats->peer; }

}  // namespace taiji_capi

extern "C" {

taiji_status_t taiji_grad_stats_create(taiji_peer_t* peer, const taiji_grad_stats_config_t* config,
                                       taiji_grad_stats_t** stats) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  if (stats == nullptr) return invalid(peer, "stats output is NULL");
  *stats = nullptr;
  if (config == nullptr) return invalid(peer, "config is NULL (the batch size is required)");
  return guarded(peer, [&]() -> taiji_status_t {
    taiji_grad_stats_config_t c = TAIJI_GRAD_STATS_CONFIG_INIT;
    if (config->struct_size < sizeof(size_t) || config->struct_size > (1u << 16)) {
      return invalid(peer, "config.struct_size is not set (use TAIJI_GRAD_STATS_CONFIG_INIT)");
    }
    std::memcpy(&c, config, std::min(config->struct_size, sizeof(c)));
    if (!(c.batch_size > 0) || !std::isfinite(c.batch_size)) {
      return invalid(peer, "config.batch_size must be finite and > 0");
    }
    if (!(c.smoothing >= 0 && c.smoothing < 1)) return invalid(peer, "config.smoothing must be in [0, 1)");
    if (c.tensors_per_step < 0) return invalid(peer, "config.tensors_per_step is negative");
    taiji::GradStatsConfig gc;
    gc.batch_size = c.batch_size;
    gc.beta = c.smoothing == 0 ? 0.95 : c.smoothing;
    gc.element_variance = c.element_variance != 0;
    gc.tensors_per_step = c.tensors_per_step;
    *stats = new taiji_grad_stats{peer, std::make_shared<taiji::GradStats>(gc, peer->impl->size())};
    return TAIJI_OK;
  });
}

void taiji_grad_stats_destroy(taiji_grad_stats_t* stats) { delete stats; }

taiji_status_t taiji_grad_stats_set_loss_scale(taiji_grad_stats_t* stats, double scale) {
  if (stats == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  return guarded(stats->peer, [&] { return record(stats->peer, stats->impl->set_loss_scale(scale)); });
}

taiji_status_t taiji_grad_stats_commit(taiji_grad_stats_t* stats) {
  if (stats == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  return guarded(stats->peer, [&] {
    stats->impl->commit();
    taiji::publish_grad_stats(stats->peer->impl->metrics(), *stats->impl);
    return TAIJI_OK;
  });
}

taiji_status_t taiji_grad_stats_reset(taiji_grad_stats_t* stats) {
  if (stats == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  return guarded(stats->peer, [&] {
    stats->impl->reset();
    taiji::publish_grad_stats(stats->peer->impl->metrics(), *stats->impl);
    return TAIJI_OK;
  });
}

taiji_status_t taiji_grad_stats_read(const taiji_grad_stats_t* stats, taiji_grad_stats_result_t* out) {
  if (stats == nullptr || out == nullptr || out->struct_size < sizeof(size_t)) {
    return TAIJI_ERR_INVALID_ARGUMENT;
  }
  const taiji::NoiseScaleEstimate e = stats->impl->estimate();
  taiji_grad_stats_result_t r = TAIJI_GRAD_STATS_RESULT_INIT;
  r.state = static_cast<taiji_grad_stats_state_t>(e.state);
  r.steps = e.steps;
  r.skipped = e.skipped;
  r.local_sq_norm = e.last_local_sq;
  r.global_sq_norm = e.last_global_sq;
  r.g2 = e.g2;
  r.trace_sigma = e.trace_sigma;
  r.noise_scale = e.noise_scale;
  r.snr = e.snr;
  const size_t n = std::min(out->struct_size, sizeof(r));
  std::memcpy(out, &r, n);
  out->struct_size = n;
  return TAIJI_OK;
}

taiji_status_t taiji_grad_stats_tensor_variance(const taiji_grad_stats_t* stats, const char* name,
                                                double* l2_norm, double* sum) {
  if (stats == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  return guarded(stats->peer, [&]() -> taiji_status_t {
    if (name == nullptr) return invalid(stats->peer, "name is NULL");
    if (!stats->impl->config().element_variance) {
      return invalid(stats->peer, "element_variance is off for this statistics object");
    }
    taiji::TensorVariance v;
    if (!stats->impl->tensor_variance(name, &v)) {
      return record(stats->peer, {taiji::Code::InvalidArgument,
                                  std::string("no allreduce named '") + name + "' has completed with these statistics"});
    }
    if (l2_norm != nullptr) *l2_norm = v.l2;
    if (sum != nullptr) *sum = v.sum;
    return TAIJI_OK;
  });
}

const char* taiji_grad_stats_state_string(taiji_grad_stats_state_t state) {
  switch (state) {
    case TAIJI_GRAD_STATS_DEFINED:
    case TAIJI_GRAD_STATS_SINGLE_PEER:
    case TAIJI_GRAD_STATS_NO_SAMPLES:
    case TAIJI_GRAD_STATS_NO_SIGNAL:
    case TAIJI_GRAD_STATS_NO_NOISE:
      return taiji::estimate_state_text(static_cast<taiji::EstimateState>(state));
  }
  return "unknown state";
}

}  // extern "C"
