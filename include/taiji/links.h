/* taiji links: the network between every pair of ranks, measured, and topologies computed
 * from it. Included by <taiji/taiji.h>; docs/topologies.md is the guide.
 *
 * taiji_measure_links is a collective: every rank calls it at the same point of its op
 * stream. Probes run in rounds of disjoint pairs, so no link carries two at once; each
 * rank times its own outgoing links, and the rows are then gathered, so every rank holds
 * the same matrix. taiji_optimize_topology computes, from a matrix, the strategy its cost
 * model predicts fastest for an allreduce size, with one line explaining the choice; from
 * the same matrix it is the same on every rank, ready for taiji_set_topology.
 *
 * A matrix is directed: entry (src, dst) is what src measured sending to dst. Bandwidth is
 * in bytes per second, latency in seconds (one way). The diagonal is 0; 0 elsewhere is a
 * link not measured. Matrices are immutable and may be read from any thread. */
#ifndef TAIJI_LINKS_H
#define TAIJI_LINKS_H

#include "taiji/taiji.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct taiji_link_matrix taiji_link_matrix_t;

typedef struct taiji_measure_options {
  size_t struct_size;      /* sizeof(taiji_measure_options_t), set by TAIJI_MEASURE_OPTIONS_INIT */
  uint64_t probe_bytes;    /* each bandwidth probe's message, 1 B to 1 GiB; 0: 4 MiB */
  int latency_rounds;      /* small round trips per direction, 1-100 (the fastest counts); 0: 5 */
  int bandwidth_rounds;    /* large messages per direction, 1-100 (the fastest counts); 0: 2 */
  int64_t timeout_ms;      /* the whole measurement; 0: the peer's op timeout */
  int background;          /* 1: no probes now; gather the rows the background probes
                              (TAIJI_LINK_PROBE_RATE) measured, 0 where a link has no sample */
} taiji_measure_options_t;

#define TAIJI_MEASURE_OPTIONS_INIT { sizeof(taiji_measure_options_t), 0, 0, 0, 0, 0 }

/* Measures every link of the job (a collective; blocks). options may be NULL (defaults).
 * On success the peer keeps the matrix (taiji_peer_links), this rank's row goes into the
 * metrics (taiji_link_bandwidth_bytes_per_second and taiji_link_latency_seconds, labelled
 * with the peer), and *matrix, when matrix is not NULL, is a new matrix for the caller to
 * destroy. It takes n-1 rounds (n for odd n), each of latency_rounds small and
 * bandwidth_rounds large messages per direction; with background = 1, only the gather.
 * Errors: ERR_INVALID_ARGUMENT (options out
 * of range, a call from a completion callback), else the status of the probe that failed
 * (ERR_TIMEOUT, ERR_PEER_LOST, ...), with the pair in the error text. */
TAIJI_API taiji_status_t taiji_measure_links(taiji_peer_t *peer, const taiji_measure_options_t *options,
                                             taiji_link_matrix_t **matrix);

/* The latest matrix this peer measured with its job, as a new matrix for the caller to
 * destroy; *matrix = NULL when none was measured yet. Never blocks; any thread. */
TAIJI_API taiji_status_t taiji_peer_links(const taiji_peer_t *peer, taiji_link_matrix_t **matrix);

/* A matrix from row-major arrays of size*size entries (copied), e.g. one measured before
 * or a synthetic one. latency may be NULL (all 0). ERR_INVALID_ARGUMENT for size < 1, a
 * NULL bandwidth, or an entry that is negative or not finite; taiji_peer_last_error(NULL)
 * on the calling thread then says which. */
TAIJI_API taiji_status_t taiji_link_matrix_create(int size, const double *bandwidth, const double *latency,
                                                  taiji_link_matrix_t **matrix);
/* Ranks; 0 for NULL. */
TAIJI_API int taiji_link_matrix_size(const taiji_link_matrix_t *matrix);
/* Entry (src, dst); -1 for NULL or a rank out of range. */
TAIJI_API double taiji_link_bandwidth(const taiji_link_matrix_t *matrix, int src, int dst);
TAIJI_API double taiji_link_latency(const taiji_link_matrix_t *matrix, int src, int dst);
/* Accepts NULL. */
TAIJI_API void taiji_link_matrix_destroy(taiji_link_matrix_t *matrix);

typedef struct taiji_optimize_options {
  size_t struct_size;      /* sizeof(taiji_optimize_options_t), set by TAIJI_OPTIMIZE_OPTIONS_INIT */
  uint64_t bytes;          /* the allreduce size to optimise for; 0: 16 MiB */
  uint64_t chunk_bytes;    /* the pipeline chunk the model assumes; 0: the peer's, or 1 MiB */
} taiji_optimize_options_t;

#define TAIJI_OPTIMIZE_OPTIONS_INIT { sizeof(taiji_optimize_options_t), 0, 0 }

/* The strategy the cost model predicts fastest (docs/topologies.md lists the candidates:
 * a ring over the order that avoids slow links, trees with slow ranks at the leaves, a ring
 * with slow ranks as leaves, and every built-in), as a new topology for the caller to
 * destroy. peer may be NULL (its chunk size is then not known). explanation, when not
 * NULL, gets one NUL-terminated line (cut to len) naming the winner, its predicted time
 * and bottleneck and the next best candidates. Never blocks. ERR_INVALID_ARGUMENT for a
 * NULL matrix or output, or a matrix whose size is not the peer's, with the reason in
 * taiji_peer_last_error(NULL) on the calling thread (and in explanation). */
TAIJI_API taiji_status_t taiji_optimize_topology(const taiji_peer_t *peer, const taiji_link_matrix_t *matrix,
                                                 const taiji_optimize_options_t *options,
                                                 taiji_topology_t **topology, char *explanation, size_t len);

/* The cost model's predicted seconds for an allreduce of `bytes` on `topology` over the
 * links of `matrix` (chunk 1 MiB); negative when either is NULL or their sizes differ. */
TAIJI_API double taiji_predict_allreduce(const taiji_topology_t *topology, const taiji_link_matrix_t *matrix,
                                         uint64_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* TAIJI_LINKS_H */
