/* taiji gradient statistics computed inside the allreduce. Included by <taiji/taiji.h>. */
#ifndef TAIJI_GRAD_STATS_H
#define TAIJI_GRAD_STATS_H

#include "taiji/taiji.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A gradient-statistics object accumulates, step by step, what the allreduces attached to it
 * (taiji_op_options_t.grad_stats) measure about the gradients, and estimates the gradient
 * noise scale of McCandlish et al. 2018 (appendix A.1):
 *   S_local = mean over the N peers of ||g_i||^2  (each g_i over b samples)
 *   S       = ||mean gradient||^2                (over N*b samples)
 *   |G|^2   = (N*S - S_local)/(N - 1),   tr(Sigma) = b*N*(S_local - S)/(N - 1)
 * each smoothed by a bias-corrected exponential moving average, then
 *   noise_scale (B_simple) = tr(Sigma)/|G|^2,   snr = |G|^2/(tr(Sigma)/(N*b)).
 * Each peer's ||g_i||^2 is counted in fp64 inside the gradient's own reduction (no extra
 * pass over the data); the local norms are then summed by a small two-element allreduce
 * posted once they are counted; S comes from the result. An attached allreduce must be TAIJI_SUM or TAIJI_AVG of a float dtype (F32, F64,
 * F16, BF16); its request completes once the statistics are updated. A step with a
 * non-finite norm on any peer (an overflow under a loss scale) is skipped on every peer.
 * Every peer attaches the same tensors and ends steps at the same points.
 * All functions are thread-safe and never block. */

typedef struct taiji_grad_stats_config {
  size_t struct_size;   /* sizeof(taiji_grad_stats_config_t), set by the INIT macro */
  double batch_size;    /* b: samples per peer per step; required, > 0 */
  double smoothing;     /* moving-average factor in [0, 1); 0: the default 0.95 */
  int element_variance; /* 1: also the element-wise variance across peers, E[g^2] - E[g]^2,
                           per tensor (costs a second, fp64 reduction of g^2) */
  int tensors_per_step; /* 0: a step ends at taiji_grad_stats_commit; k > 0: after every k
                           attached allreduces */
} taiji_grad_stats_config_t;

#define TAIJI_GRAD_STATS_CONFIG_INIT { sizeof(taiji_grad_stats_config_t), 0, 0, 0, 0 }

typedef enum taiji_grad_stats_state {
  TAIJI_GRAD_STATS_DEFINED = 0,     /* the estimates below hold */
  TAIJI_GRAD_STATS_SINGLE_PEER = 1, /* N = 1: there is no second batch size to compare */
  TAIJI_GRAD_STATS_NO_SAMPLES = 2,  /* no finite step yet, or just reset */
  TAIJI_GRAD_STATS_NO_SIGNAL = 3,   /* the smoothed |G|^2 is not positive: the noise scale and
                                       the SNR are undefined (NaN) */
  TAIJI_GRAD_STATS_NO_NOISE = 4     /* the smoothed tr(Sigma) is not positive (|G|^2 is): the
                                       peers' gradients differ no more than the estimate's own
                                       noise; noise_scale is 0 and snr +infinity */
} taiji_grad_stats_state_t;

typedef struct taiji_grad_stats_result {
  size_t struct_size;             /* set by the caller (INIT macro); fields past it are left */
  taiji_grad_stats_state_t state;
  uint64_t steps;                 /* finite steps folded into the estimates */
  uint64_t skipped;               /* non-finite steps left out */
  double local_sq_norm;           /* S_local of the last step (loss scale taken out) */
  double global_sq_norm;          /* S of the last step */
  double g2;                      /* smoothed |G|^2 */
  double trace_sigma;             /* smoothed tr(Sigma) */
  double noise_scale;             /* B_simple = trace_sigma / g2 (DEFINED), 0 (NO_NOISE), else NaN */
  double snr;                     /* g2 / (trace_sigma / (N*b)) (DEFINED), +inf (NO_NOISE), else NaN */
} taiji_grad_stats_result_t;

#define TAIJI_GRAD_STATS_RESULT_INIT { sizeof(taiji_grad_stats_result_t), TAIJI_GRAD_STATS_NO_SAMPLES, 0, 0, 0, 0, 0, 0, 0, 0 }

/* Creates a statistics object for this peer. ERR_INVALID_ARGUMENT (text from
 * taiji_peer_last_error(peer)) for a missing or non-positive batch size or a smoothing
 * outside [0, 1). The object refers to its peer: once the peer is destroyed, only
 * taiji_grad_stats_read and taiji_grad_stats_destroy may be called on it. */
TAIJI_API taiji_status_t taiji_grad_stats_create(taiji_peer_t *peer,
                                                 const taiji_grad_stats_config_t *config,
                                                 taiji_grad_stats_t **stats);
/* Releases the handle; allreduces still running keep what they need. Accepts NULL. */
TAIJI_API void taiji_grad_stats_destroy(taiji_grad_stats_t *stats);
/* The loss scale the gradients are multiplied by (mixed precision); it is divided out of
 * every norm and variance. Default 1; must be finite and > 0. */
TAIJI_API taiji_status_t taiji_grad_stats_set_loss_scale(taiji_grad_stats_t *stats, double scale);
/* Ends a step: the tensors completed since the last commit count as one step. Call it once
 * every attached allreduce of the step has completed. */
TAIJI_API taiji_status_t taiji_grad_stats_commit(taiji_grad_stats_t *stats);
/* Forgets every estimate (after a resize or a change of synchronisation). */
TAIJI_API taiji_status_t taiji_grad_stats_reset(taiji_grad_stats_t *stats);
/* Reads the current estimates into *out (set out->struct_size first). */
TAIJI_API taiji_status_t taiji_grad_stats_read(const taiji_grad_stats_t *stats,
                                               taiji_grad_stats_result_t *out);
/* The element-wise variance across peers of the tensor reduced under `name` at its last
 * step: its L2 norm and its sum (either pointer may be NULL). ERR_INVALID_ARGUMENT when
 * element_variance is off or no allreduce of that name has completed yet. */
TAIJI_API taiji_status_t taiji_grad_stats_tensor_variance(const taiji_grad_stats_t *stats,
                                                          const char *name, double *l2_norm,
                                                          double *sum);
/* A sentence describing a state ("undefined: one peer (N = 1) ..."). Never NULL. */
TAIJI_API const char *taiji_grad_stats_state_string(taiji_grad_stats_state_t state);

#ifdef __cplusplus
}
#endif

#endif /* TAIJI_GRAD_STATS_H */
