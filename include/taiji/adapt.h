/* taiji adaptation: policies that read each step's metrics and decide, identically on every
 * rank, to change the topology, resize, switch the synchronisation mode, or advise a batch
 * size and learning rate. Included by <taiji/taiji.h>; docs/adaptive.md is the guide.
 *
 * An engine belongs to one peer. taiji_adapt_step is a collective that every rank calls
 * once per step, at the same point of its op stream: it gathers every rank's record (its
 * step time, samples, link throughput, custom inputs, rank 0's gradient statistics and
 * requested size) under the reserved name "taiji.adapt", and every rank then runs the same
 * policies, in the order they were added, on the same table. Policies (built-in and
 * callbacks) must decide from the view alone: then every rank returns the same actions at
 * the same step. At most one action of each kind is returned per step; the first policy to
 * propose a kind wins. The step replaces taiji_step_mark: it records the step times into
 * the metrics the same way (do not call both).
 *
 * Topology changes, and link measurements with the swap they may lead to, are applied by
 * the step itself (all ranks change at the same point, as with taiji_set_topology) and
 * returned with applied = 1. Resize and set_sync_mode actions
 * are returned for the caller to apply, since the framework must re-synchronise its state
 * around them (taiji_resize; averaging replicas when entering BSP); advise_batch is advice.
 *
 * Thread safety: an engine is used by one thread at a time; different engines (of
 * different peers) are independent. No function here may be called from a completion
 * callback. If a call that takes a callback fails, the callback is never called. */
#ifndef TAIJI_ADAPT_H
#define TAIJI_ADAPT_H

#include "taiji/taiji.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct taiji_adapt taiji_adapt_t;
typedef struct taiji_action_list taiji_action_list_t;

typedef enum taiji_sync_mode {
  TAIJI_SYNC_BSP = 0,   /* synchronous SGD: gradients allreduced every step */
  TAIJI_SYNC_SMA = 1,   /* synchronous model averaging every step */
  TAIJI_SYNC_PAIR = 2,  /* asynchronous pair averaging (Sync-Switch's ASP) */
  TAIJI_SYNC_LOCAL = 3  /* local SGD: models averaged every H steps */
} taiji_sync_mode_t;

typedef enum taiji_action_kind {
  TAIJI_ACTION_SET_TOPOLOGY = 0, /* topology: applied by the step */
  TAIJI_ACTION_RESIZE = 1,       /* size: for the caller (taiji_resize) */
  TAIJI_ACTION_SET_SYNC_MODE = 2,/* mode, lr_scale: for the caller */
  TAIJI_ACTION_ADVISE_BATCH = 3, /* batch_scale, lr_scale: advice */
  TAIJI_ACTION_MEASURE_LINKS = 4 /* applied by the step: links measured, topology set to the
                                    best computed from them when the predicted gain is
                                    enough (topology: the one swapped to, or empty: kept) */
} taiji_action_kind_t;

/* One decision. In the array taiji_adapt_step fills, the strings belong to the engine and
 * stay valid until its next step or its destruction. Given to taiji_action_list_add, they
 * are copied before it returns. */
typedef struct taiji_action {
  size_t struct_size;        /* sizeof(taiji_action_t), set by TAIJI_ACTION_INIT */
  int kind;                  /* taiji_action_kind_t */
  int mode;                  /* taiji_sync_mode_t, for SET_SYNC_MODE */
  int size;                  /* for RESIZE */
  const char *topology;      /* for SET_TOPOLOGY: a built-in name or the explicit text form */
  double batch_scale;        /* for ADVISE_BATCH: multiply the per-rank batch by this */
  double lr_scale;           /* multiply the learning rate by this (1: unchanged) */
  const char *policy;        /* the deciding policy's name (set by the engine) */
  const char *reason;        /* why, in words (may be NULL when adding) */
  int applied;               /* 1: the step applied it (set by the engine) */
} taiji_action_t;

#define TAIJI_ACTION_INIT { sizeof(taiji_action_t), 0, 0, 0, NULL, 1.0, 1.0, NULL, NULL, 0 }

/* The gathered step, as a callback policy reads it: identical on every rank. Arrays have
 * `size` entries (per rank) and stay valid only during the callback. */
typedef struct taiji_step_view {
  size_t struct_size;                 /* sizeof(taiji_step_view_t) of the library */
  uint64_t step;                      /* steps of this engine before this one */
  int size;                           /* ranks */
  int requested_size;                 /* a size asked for from outside; 0: none */
  const double *step_seconds;         /* per rank; negative: unknown (the first step) */
  const double *samples;              /* per rank, as given to taiji_adapt_step */
  const double *link_bytes_per_second;/* per rank: mean send rate of its links */
  const unsigned char *stragglers;    /* per rank: 1 when slower than 1.5 x the median */
  double median_seconds;              /* of the known step times; 0 when none is */
  double throughput;                  /* samples per second of the cluster (slowest rank) */
  double noise_scale;                 /* rank 0's gradient noise scale; 0 when unknown */
  double snr;                         /* rank 0's gradient signal-to-noise ratio; 0 unknown */
  int sync_mode;                      /* taiji_sync_mode_t in force during the step */
  uint64_t total_samples;             /* every rank's samples so far, this step included */
  size_t n_inputs;                    /* custom input keys, sorted */
  const char *const *input_keys;      /* n_inputs keys */
  const double *inputs;               /* n_inputs x size: inputs[k * size + rank] */
} taiji_step_view_t;

/* A policy written by the user. Called by taiji_adapt_step on the calling thread, after the
 * built-ins added before it; proposes actions with taiji_action_list_add. It must decide
 * from the view alone (not from the rank, clocks or randomness) so that every rank decides
 * the same. A status other than TAIJI_OK fails the step with that status. */
typedef taiji_status_t (*taiji_adapt_policy_fn)(const taiji_step_view_t *view,
                                                taiji_action_list_t *actions, void *user_data);

/* "bsp", "sma", "pair", "local"; "" for a value off the list. Never blocks; any thread. */
TAIJI_API const char *taiji_sync_mode_name(int mode);
/* "set_topology", "resize", "set_sync_mode", "advise_batch", "measure_links"; "" off the
 * list. */
TAIJI_API const char *taiji_action_kind_name(int kind);

/* An engine for `peer`, with no policy, in BSP mode. Never blocks. Errors:
 * ERR_INVALID_ARGUMENT (NULL argument), ERR_NO_MEMORY. The engine must be destroyed before
 * its peer, and is for the membership it was created in: after a resize, make a new one. */
TAIJI_API taiji_status_t taiji_adapt_create(taiji_peer_t *peer, taiji_adapt_t **engine);
/* Frees the engine. Accepts NULL. */
TAIJI_API void taiji_adapt_destroy(taiji_adapt_t *engine);

/* Adds a built-in policy from its spec, "name key=value ...", e.g.
 * "sync_switch_online k=1.5 m=5" (names and parameters: docs/adaptive.md). Every rank
 * adds the same policies in the same order. Never blocks. Errors: ERR_INVALID_ARGUMENT
 * for an unknown policy or parameter or a bad value; the peer's last error names it. */
TAIJI_API taiji_status_t taiji_adapt_add_policy(taiji_adapt_t *engine, const char *spec);

/* Adds a user policy: fn(view, actions, user_data) each step, in order with the others.
 * user_data stays the caller's; it must live as long as the engine. Never blocks.
 * Errors: ERR_INVALID_ARGUMENT (NULL engine or fn). */
TAIJI_API taiji_status_t taiji_adapt_add_callback(taiji_adapt_t *engine, taiji_adapt_policy_fn fn,
                                                  void *user_data);

/* Proposes `action` (its struct_size set, e.g. by TAIJI_ACTION_INIT) from a callback; only
 * valid during the callback that received `actions`. kind, mode, size, topology,
 * batch_scale, lr_scale and reason are read and copied. Errors: ERR_INVALID_ARGUMENT (a
 * NULL argument, a bad struct_size, kind or mode, a SET_TOPOLOGY without topology). */
TAIJI_API taiji_status_t taiji_action_list_add(taiji_action_list_t *actions,
                                               const taiji_action_t *action);

/* Rank 0's estimates from `stats` (created on the same peer) go into every step's table,
 * for batch_advice. NULL detaches. stats must outlive the engine or be detached first.
 * Never blocks. Errors: ERR_INVALID_ARGUMENT (NULL engine, stats of another peer). */
TAIJI_API taiji_status_t taiji_adapt_set_grad_stats(taiji_adapt_t *engine, taiji_grad_stats_t *stats);

/* Sets a custom input of this rank for the next step (again for a key replaces its
 * value); the view shows every rank's value under the key. The inputs are consumed by the
 * next taiji_adapt_step, whatever its outcome. Every rank must set the same keys for a
 * step, otherwise that step fails with ERR_MISMATCH on every rank and the engine does not
 * advance. At most 16 keys per step. Never blocks. Errors: ERR_INVALID_ARGUMENT (NULL or
 * empty key, more than 16 keys, a value that is not finite). */
TAIJI_API taiji_status_t taiji_adapt_set_input(taiji_adapt_t *engine, const char *key, double value);

/* Tells the engine which mode training is in (every rank the same, at the same step), e.g.
 * after applying a SET_SYNC_MODE action the caller changed, or at start. Never blocks.
 * Errors: ERR_INVALID_ARGUMENT (a mode off the list). */
TAIJI_API taiji_status_t taiji_adapt_set_sync_mode(taiji_adapt_t *engine, int mode);
/* The mode the engine believes in force (after the last SET_SYNC_MODE it returned).
 * Returns -1 for a NULL engine. */
TAIJI_API int taiji_adapt_sync_mode(const taiji_adapt_t *engine);

/* Restarts every policy's baselines and counters (their reference throughput, their
 * streaks), e.g. after the caller applied a resize or a switch. The mode, the step count
 * and the samples total stay. Every rank resets at the same step. Never blocks. */
TAIJI_API taiji_status_t taiji_adapt_reset(taiji_adapt_t *engine);

/* One step: a blocking collective that every rank calls once per step (it takes the place
 * of taiji_step_mark). samples: what this rank trained on this step. Waits up to
 * timeout_ms (0: the peer's default op timeout) for the gather, and as long again for a
 * topology change. Up to max_actions actions are written to `actions`, an array of
 * max_actions elements whose struct_size fields the caller set (the first one's value is
 * the stride); *n_actions gets how many the step decided (at most 4, one per kind: pass
 * max_actions >= 4). Calls the callbacks on this thread. Errors: ERR_INVALID_ARGUMENT,
 * ERR_MISMATCH (ranks at different steps, in different modes, or with other custom input
 * keys: nothing changes), ERR_TIMEOUT, ERR_PEER_LOST, ERR_FINALIZED as for collectives, or
 * a callback's status. */
TAIJI_API taiji_status_t taiji_adapt_step(taiji_adapt_t *engine, double samples, int64_t timeout_ms,
                                          taiji_action_t *actions, size_t max_actions,
                                          size_t *n_actions);

/* Sync-Switch's binary search, for a job that recurs, for the smallest fraction of its
 * samples to train under BSP before switching to ASP that reaches BSP's final accuracy
 * within `tolerance`: given the n runs so far (fractions[i], accuracies[i]), *fraction gets
 * the next fraction to try (*done = 0), or the answer (*done = 1) once the interval left
 * is no wider than `resolution`. Pure; any thread. Errors: ERR_INVALID_ARGUMENT (NULL
 * output, arrays NULL with n > 0, resolution not in (0, 1]). */
TAIJI_API taiji_status_t taiji_adapt_find_bsp_fraction(const double *fractions,
                                                       const double *accuracies, size_t n,
                                                       double bsp_accuracy, double tolerance,
                                                       double resolution, double *fraction,
                                                       int *done);

#ifdef __cplusplus
}
#endif

#endif /* TAIJI_ADAPT_H */
