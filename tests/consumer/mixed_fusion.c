/* Fusion on rank 0 only (TAIJI_FUSION, set per rank by test_mixed_fusion.sh): rank 0
 * holds each small allreduce for a negotiation that the others never join, while they run
 * it at once; rank 0 must see their frames and run the op the same way. Twice: alone, and
 * with a topology swap posted after it that completes first, so that the op must keep the
 * topology it was posted under (the automatic one), not take the new one. Between them,
 * the deadline: an op that leaves fusion late keeps what is left of its deadline. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep under -std=c11 */
#include <taiji/taiji.h>

#include <stdio.h>
#include <time.h>

enum { COUNT = 1024 };

static int rank, size;

static int check(taiji_peer_t *peer, const char *what, taiji_status_t s) {
  if (s == TAIJI_OK) return 1;
  fprintf(stderr, "rank %d: %s: %s: %s\n", rank, what, taiji_status_name(s), taiji_peer_last_error(peer));
  return 0;
}

static int run_case(taiji_peer_t *peer, const char *name, const taiji_topology_t *swap_to) {
  static float in[COUNT], out[COUNT];
  for (int i = 0; i < COUNT; ++i) in[i] = (float)(rank + 1 + i);
  taiji_op_options_t opt = TAIJI_OP_OPTIONS_INIT;
  opt.timeout_ms = 20000;
  taiji_request_t *req = NULL, *swap = NULL;
  if (!check(peer, name, taiji_allreduce(peer, name, in, out, COUNT, TAIJI_F32, TAIJI_SUM, &opt, &req))) {
    return 0;
  }
  int ok = 1;
  if (swap_to != NULL) ok &= check(peer, "set_topology", taiji_set_topology(peer, swap_to, &opt, &swap));
  if (swap != NULL) {
    ok &= check(peer, "set_topology (wait)", taiji_request_wait(swap, 30000));
    taiji_request_free(swap);
  }
  ok &= check(peer, name, taiji_request_wait(req, 30000));
  taiji_request_free(req);
  for (int i = 0; ok && i < COUNT; ++i) {
    const float want = (float)(size * (size + 1) / 2 + size * i);
    if (out[i] != want) {
      fprintf(stderr, "rank %d: %s: element %d is %g, want %g\n", rank, name, i, out[i], want);
      ok = 0;
    }
  }
  return ok;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Rank 0 posts an op with a DEADLINE_MS deadline, which waits for a fusion round; rank 1
 * posts it LATE_MS later, unfused, so that rank 0's op leaves fusion then; rank 2 never
 * posts it. Both time out, rank 0 by its own deadline, not LATE_MS + DEADLINE_MS after its
 * post. A barrier keeps rank 2 in the job meanwhile (its departure would end the op
 * sooner, as PEER_LOST). */
enum { DEADLINE_MS = 1500, LATE_MS = 1200 };
static int deadline_case(taiji_peer_t *peer) {
  static float in[4], out[4];
  taiji_op_options_t opt = TAIJI_OP_OPTIONS_INIT;
  opt.timeout_ms = DEADLINE_MS;
  int ok = 1;
  if (rank == 1) {
    const struct timespec late = {LATE_MS / 1000, (LATE_MS % 1000) * 1000000L};
    nanosleep(&late, NULL);
  }
  if (rank < 2) {
    const double start = now_ms();
    taiji_status_t s = taiji_allreduce(peer, "mixed.deadline", in, out, 4, TAIJI_F32, TAIJI_SUM, &opt, NULL);
    const double took = now_ms() - start;
    if (s != TAIJI_ERR_TIMEOUT) {
      fprintf(stderr, "rank %d: mixed.deadline: %s, want TAIJI_ERR_TIMEOUT\n", rank, taiji_status_name(s));
      ok = 0;
    } else if (took < 0.8 * DEADLINE_MS || took > DEADLINE_MS + 0.5 * LATE_MS) {
      fprintf(stderr, "rank %d: mixed.deadline: timed out after %.0f ms, deadline %d ms\n", rank, took,
              DEADLINE_MS);
      ok = 0;
    }
  }
  opt.timeout_ms = 30000;
  return check(peer, "mixed.deadline end", taiji_barrier(peer, "mixed.end", &opt, NULL)) && ok;
}

int main(void) {
  taiji_config_t cfg = TAIJI_CONFIG_INIT;
  taiji_peer_t *peer = NULL;
  if (taiji_peer_init(&cfg, &peer) != TAIJI_OK) {
    fprintf(stderr, "init: %s\n", taiji_peer_last_error(NULL));
    return 1;
  }
  rank = taiji_peer_rank(peer);
  size = taiji_peer_size(peer);
  taiji_topology_t *ring = NULL;
  int ok = check(peer, "ring", taiji_topology_from_text(peer, "ring", 0, &ring));
  ok = ok && run_case(peer, "mixed.alone", NULL);
  /* Before the swap: only ops on the automatic topology are fused. */
  ok = ok && deadline_case(peer);
  ok = ok && run_case(peer, "mixed.swap", ring);
  taiji_topology_destroy(ring);
  ok &= check(peer, "finalize", taiji_peer_finalize(peer));
  taiji_peer_destroy(peer);
  if (ok) printf("rank %d of %d ok\n", rank, size);
  return ok ? 0 : 1;
}
