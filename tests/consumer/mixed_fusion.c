/* Fusion on one rank only (TAIJI_FUSION, set per rank by test_mixed_fusion.sh): rank 0
 * holds each small allreduce for a negotiation that rank 1 never joins, while rank 1 runs
 * it at once; rank 0 must see rank 1's frames and run the op the same way. Twice: alone,
 * and with a topology swap posted after it that completes first, so that the op must keep
 * the topology it was posted under (the automatic one), not take the new one. */
#include <taiji/taiji.h>

#include <stdio.h>

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
  ok = ok && run_case(peer, "mixed.swap", ring);
  taiji_topology_destroy(ring);
  ok &= check(peer, "finalize", taiji_peer_finalize(peer));
  taiji_peer_destroy(peer);
  if (ok) printf("rank %d of %d ok\n", rank, size);
  return ok ? 0 : 1;
}
